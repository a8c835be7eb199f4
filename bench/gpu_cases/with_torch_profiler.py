"""A program that runs torch.profiler itself, recorded by dlpt: both use CUPTI."""
import torch
from torch.profiler import ProfilerActivity, profile

x = torch.randn(2048, 2048, device="cuda")
for _ in range(5):
    y = x @ x  # LINE:before
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(5):
        y = x @ x  # LINE:inside
    torch.cuda.synchronize()
print("torch.profiler saw", sum(1 for e in p.events() if e.device_type.name == "CUDA"), "CUDA events")
for _ in range(5):
    y = x @ x  # LINE:after
torch.cuda.synchronize()
