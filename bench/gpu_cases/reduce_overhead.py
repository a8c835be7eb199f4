"""torch.compile(mode="reduce-overhead") training: forward and backward replayed as CUDA graphs."""
import torch
import torch.nn as nn

dev = torch.device("cuda")
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.SGD(mlp.parameters(), lr=1e-3)
cmlp = torch.compile(mlp, mode="reduce-overhead")
x = torch.randn(256, 1024, device=dev)


def step():
    # Gradients are set to None each step: accumulating into the last replay's outputs, which
    # the next replay overwrites, is an error with CUDA graphs.
    y = cmlp(x)  # CASE: compiled forward
    y.sum().backward()  # CASE: backward
    opt.step()  # CASE: optimizer step
    opt.zero_grad(set_to_none=True)


for _ in range(4):
    step()  # warm-up: compile, record the graphs
torch.cuda.synchronize()
for _ in range(5):
    step()  # CASE: steps
torch.cuda.synchronize()
