"""A torch.compile'd MLP: its Triton kernels launch from Inductor's generated code."""
import torch
import torch.nn as nn

dev = torch.device("cuda")
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.LayerNorm(1024)).to(dev)
cmlp = torch.compile(mlp)
x = torch.randn(256, 1024, device=dev)
for _ in range(3):
    cmlp(x)  # warm-up: compile
torch.cuda.synchronize()
for _ in range(5):
    y = cmlp(x)  # CASE: compiled call
    s = y.sum()  # CASE: eager sum
torch.cuda.synchronize()
