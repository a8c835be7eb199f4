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


lin = torch.nn.Linear(4, 4)


def nested(k: int) -> float:
    """One top-level op with nested ones (linear → t, addmm), no grad."""
    with torch.no_grad():
        t = time.perf_counter()
        for _ in range(k):
            lin(x)
        return (time.perf_counter() - t) / k * 1e9


mod = native.load(quiet=True)
loop(10_000)
nested(10_000)
for _ in range(3):
    for name, fn, k in (("x.add_(1)", loop, 100_000), ("Linear(x)", nested, 50_000)):
        base = fn(k)
        mod.start(False, False, True, "noop")
        noop = fn(k)
        mod.stop()
        mod.start(False, False, True, "")
        rec = fn(k)
        mod.stop()
        ops = mod.stats()["ops"]
        print(f"{name}: {base:.0f} ns unprofiled; +{noop - base:.0f} ns with torch's callback machinery "
              f"alone; +{rec - base:.0f} ns recorded (ops entered so far {ops})")
