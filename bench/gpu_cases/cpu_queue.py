"""A custom autograd Function whose gradient arrives on the CPU: autograd runs its backward on
the CPU queue, on the thread that called backward(), and that backward launches GPU work."""
import torch

dev = torch.device("cuda")
w = torch.randn(2048, 2048, device=dev)


class ToHost(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return (x @ w).cpu()  # CASE: to-host forward

    @staticmethod
    def backward(ctx, g):
        return g.to(dev) @ w.T  # CASE: to-host backward


x = torch.randn(2048, 2048, device=dev, requires_grad=True)
for _ in range(3):
    y = ToHost.apply(x)  # CASE: apply
    y.sum().backward()  # CASE: loss backward
torch.cuda.synchronize()
