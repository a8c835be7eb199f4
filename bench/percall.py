"""Per-call costs on this machine: the clock, and one tiny op with and without dlpt's collector
(host side only, so it runs without a GPU too)."""
import time

import torch

from dlpt.collectors.record import native

n = 200_000
t0 = time.perf_counter_ns()
for _ in range(n):
    time.perf_counter_ns()
print(f"perf_counter_ns: {(time.perf_counter_ns() - t0) / n:.0f} ns/call")
torch.set_num_threads(1)
x = torch.ones(4)


def loop(k: int) -> float:
    t = time.perf_counter()
    for _ in range(k):
        x.add_(1)
    return (time.perf_counter() - t) / k * 1e9


mod = native.load(quiet=True)
loop(10_000)
for rnd in range(3):
    base = loop(100_000)
    mod.start(False, False, True)
    rec = loop(100_000)
    mod.stop()
    print(f"x.add_(1): {base:.0f} ns unprofiled, {rec:.0f} ns recorded: +{rec - base:.0f} ns per op")
