"""Probe: which kernels of a compiled graph carry stack traces in Inductor's provenance map (torch on this machine)."""
import json, os, sys
import torch, torch.nn as nn
import torch._inductor.config as c
level = int(sys.argv[1]); which = sys.argv[2]
c.trace.provenance_tracking_level = level
from torch._inductor.output_code import CompiledFxGraph
orig = CompiledFxGraph.post_compile
def pc(graph, ex, consts, kw):
    src = graph.source_code or ""
    keys = [l.split("[Provenance debug handles] ")[1].strip() for l in src.splitlines() if "[Provenance debug handles]" in l]
    raw = json.loads(graph.inductor_provenance_stack_traces_str or "{}")
    print("GRAPH bwd=", kw.get("is_backward"), "comments", len(keys), "raw", len(raw), "empty-in-raw", sum(1 for k in keys if not raw.get(k)))
    for k in keys:
        v = raw.get(k)
        print("   ", k, "MISSING" if v is None else len(v), (v[0].strip().splitlines()[-2:] if v else ""))
    for k in raw:
        if k not in keys:
            print("    rawonly", k, len(raw[k]))
    out = os.environ.get("OUT")
    if out:
        n = len(os.listdir(out))
        open(os.path.join(out, f"g{n}_{'bwd' if kw.get('is_backward') else 'fwd'}.py"), "w").write(src)
        open(os.path.join(out, f"g{n}_{'bwd' if kw.get('is_backward') else 'fwd'}.json"), "w").write(graph.inductor_provenance_stack_traces_str or "")
    return orig(graph, ex, consts, kw)
CompiledFxGraph.post_compile = pc
dev = "cuda"
if which == "mlp":
    class MLP(nn.Module):
        def __init__(s):
            super().__init__(); s.ln = nn.LayerNorm(256); s.fc = nn.Linear(256, 1024); s.gelu = nn.GELU(); s.proj = nn.Linear(1024, 256); s.drop = nn.Dropout(0.1)
        def forward(s, x):
            h = s.ln(x)
            h = s.fc(h)
            h = s.gelu(h)
            h = s.proj(h)
            return x + s.drop(h)
    m = MLP().to(dev)
    x = torch.randn(8, 64, 256, device=dev, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.compile(m)(x)
    y.float().sum().backward()
else:
    sys.path.insert(0, os.path.join(os.getcwd(), "shared/programs/nanoGPT"))
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(block_size=256, vocab_size=65, n_layer=2, n_head=6, n_embd=384, dropout=0.2, bias=False)).to(dev)
    idx = torch.randint(0, 65, (64, 256), device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, loss = torch.compile(m)(idx, idx)
    loss.backward()
torch.cuda.synchronize()
