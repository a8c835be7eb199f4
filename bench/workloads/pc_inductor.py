import torch
import torch.nn as nn


class Block(nn.Module):
    def forward(self, x):
        y = x.view(-1, 1024)  # VIEW LINE
        heavy = torch.sin(y) ** 7 * torch.cos(y * 1.3) ** 5 + torch.tanh(y).exp()  # HEAVY LINE
        light = heavy + 1.0  # LIGHT LINE
        return light * 0.5


m = torch.compile(Block())
x = torch.randn(64 << 20, device="cuda")
for _ in range(30):
    out = m(x)
torch.cuda.synchronize()
print(out.sum().item())
