"""Small compiled training programs for `bench/run.py gpu-compiled` (GPU; CPU works for a smoke run).

    python bench/workloads/compiled_models.py --mode reduce-overhead   # 4-block transformer, CUDA graphs
    python bench/workloads/compiled_models.py --mode graph-break       # the same with a break per block
    python bench/workloads/compiled_models.py --mode eager             # the reference run
    python bench/workloads/compiled_models.py --mode default --compile-time  # prints {"compile_s": ...}

Every model line is an ordinary line a user would write, so a profile can be checked for GPU
time on them (and not on `def` lines or on the line that calls the compiled module).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - the usual name


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, brk: bool) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.ones(t, t, device=x.device, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        if brk:
            torch._dynamo.graph_break()
        h = F.gelu(self.fc(self.ln2(x)))
        return x + self.out(h)


class Net(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 256, heads: int = 4, layers: int = 4, brk: bool = False) -> None:
        super().__init__()
        self.brk = brk
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x, self.brk)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("eager", "default", "reduce-overhead", "graph-break"), default="default")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compile-time", action="store_true", help="time the first (compiling) step only")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    net = Net(brk=a.mode == "graph-break").to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = net
    if a.mode != "eager":
        model = torch.compile(net, mode="reduce-overhead" if a.mode == "reduce-overhead" else "default")
    idx = torch.randint(0, 512, (16, 128), device=dev)
    tgt = torch.randint(0, 512, (16, 128), device=dev)
    for step in range(1 if a.compile_time else a.steps):
        t0 = time.perf_counter()
        if a.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        if a.compile_time:
            print(json.dumps({"compile_s": time.perf_counter() - t0}))
        elif step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
