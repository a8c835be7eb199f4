"""torch.compile(mode="reduce-overhead") training: forward and backward replayed as CUDA graphs."""
import torch
import torch.nn as nn

dev = torch.device("cuda")
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev)
cmlp = torch.compile(mlp, mode="reduce-overhead")
x = torch.randn(256, 1024, device=dev)
for _ in range(4):
    torch.compiler.cudagraph_mark_step_begin()  # each iteration a new step of the graph trees
    cmlp(x).sum().backward()  # warm-up: compile, record the graphs
torch.cuda.synchronize()
for _ in range(5):
    torch.compiler.cudagraph_mark_step_begin()
    y = cmlp(x)  # CASE: compiled forward
    y.sum().backward()  # CASE: backward
torch.cuda.synchronize()
