"""Activation checkpointing: the forward run again inside backward, reentrant and not."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

dev = torch.device("cuda")
blocks = [nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev) for _ in range(2)]
x = torch.randn(1024, 1024, device=dev, requires_grad=True)


def first(h):
    return blocks[0](h)  # CASE: reentrant block


def second(h):
    return blocks[1](h)  # CASE: non-reentrant block


for _ in range(5):
    h = checkpoint(first, x, use_reentrant=True)  # CASE: reentrant checkpoint call
    h = checkpoint(second, h, use_reentrant=False)  # CASE: non-reentrant checkpoint call
    h.square().mean().backward()  # CASE: loss backward
torch.cuda.synchronize()
