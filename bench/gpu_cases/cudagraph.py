"""An MLP captured in a CUDA graph and replayed: replayed kernels have no op of their own."""
import torch
import torch.nn as nn

dev = torch.device("cuda")
mlp = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).to(dev)
x = torch.randn(64, 1024, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        mlp(x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = mlp(x)
torch.cuda.synchronize()
for _ in range(5):
    g.replay()  # CASE: replay
    t = y.sum()  # CASE: eager sum
torch.cuda.synchronize()
