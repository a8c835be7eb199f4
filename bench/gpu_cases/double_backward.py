"""A gradient penalty: backward with create_graph=True, then backward through the graph it made."""
import torch
import torch.nn as nn

dev = torch.device("cuda")
net = nn.Sequential(nn.Linear(1024, 4096), nn.Tanh(), nn.Linear(4096, 1)).to(dev)
x = torch.randn(2048, 1024, device=dev, requires_grad=True)
for _ in range(5):
    out = net(x)  # CASE: forward
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)  # CASE: grad with create_graph
    g.square().sum().backward()  # CASE: penalty backward
torch.cuda.synchronize()
