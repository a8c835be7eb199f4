"""GPU proof of shares by work (an unmodified torch program): one compiled function whose fused
Triton kernel mixes a heavy pointwise line, a light pointwise line and view lines, then an
`F.scaled_dot_product_attention` call (an extern kernel in Inductor's code). It prints, from its
own CUDA events, the SDPA kernel time of all its compiled calls, for the SDPA line to be checked
against, and the work weights the fused kernel's lines should get.

    dlpt record --force -o fs.dlpt bench/gpu_cases/fused_shares.py
    dlpt report fs.dlpt --view flat --by line --top 10

Judge: the `# CASE: sdpa` line's total within 2% of SDPA_EXPECTED_NS; the `view`/`permute`
lines absent (no share); `heavy` : `light` = HEAVY_TO_LIGHT; no torch.compile row in the top 10,
and a `torch.compile:` headline line.
"""
import torch
import torch.nn.functional as F

dev = torch.device("cuda")
B, H, S, D = 8, 16, 2048, 64
N = 4096 * 4096  # elements of the pointwise part
WARM, STEPS = 3, 20


def step(x, q, k, v):
    a = x.view(4096, 4096)  # CASE: view
    b = a.permute(1, 0)  # CASE: permute
    c = torch.sin(b) * torch.cos(b) + 1.0  # CASE: heavy
    d = c * 2  # CASE: light
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # CASE: sdpa
    return d, o


x = torch.randn(N, device=dev)
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
cstep = torch.compile(step)
for _ in range(WARM):
    cstep(x, q, k, v)  # CASE: warm-up (compile)
torch.cuda.synchronize()
for _ in range(STEPS):
    cstep(x, q, k, v)  # CASE: compiled call
torch.cuda.synchronize()

# The same attention, eager, between CUDA events: the kernel the compiled code calls
# (Inductor's SDPA is a fallback to the same aten op). Timed over STEPS calls back to back, five
# times: one call between two events would count the host's launch latency as kernel time.
times = []
for _ in range(5):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(STEPS):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    e.record()
    e.synchronize()
    times.append(s.elapsed_time(e) * 1e6 / STEPS)
times.sort()
per_call = times[len(times) // 2]
calls = WARM + STEPS
print(f"SDPA_PER_CALL_NS {per_call:.0f}")
print(f"SDPA_CALLS {calls}")
print(f"SDPA_EXPECTED_NS {per_call * calls:.0f}")
# bytes each line's nodes read and write on their own: heavy = sin (2) + cos (2) + mul (3) + add (2)
# tensors of N floats; light = mul by a scalar (2); view and permute: 0
print("HEAVY_TO_LIGHT 9:2")
