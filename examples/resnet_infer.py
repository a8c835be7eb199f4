"""A small ResNet-style inference loop: the model and each batch are copied to the device
(host-to-device copies), then convolutions, batch norms and a classifier run.

    dlpt record -o infer.dlpt examples/resnet_infer.py --batches 8
    dlpt report infer.dlpt --view flat --by line

Runs on the GPU when there is one, else on the CPU (then dlpt records host op time).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = Block(width, width, 1)
        self.layer2 = Block(width, 2 * width, 2)
        self.layer3 = Block(2 * width, 4 * width, 2)
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", type=int, default=32)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = SmallResNet().eval()
    model = model.to(device)
    # The batches live on the host, as a data loader leaves them.
    data = [torch.randn(args.batch_size, 3, args.size, args.size) for _ in range(args.batches)]
    correct = 0
    with torch.inference_mode():
        for cpu_batch in data:
            batch = cpu_batch.to(device)
            logits = model(batch)
            pred = logits.argmax(dim=1)
            correct += int((pred == 0).sum())
    print(f"{args.batches} batches on {device}; class-0 predictions: {correct}")


if __name__ == "__main__":
    main()
