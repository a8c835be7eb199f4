"""The native fold against the Python fold on a real GPU (run on the device machine).

On CPU there are no device events, so tests/test_record_native.py proves the native fold equal
to the Python one only for the tree and host ops. Here each program is recorded once on the GPU
and its one profiler result is folded both ways in one process (as that test does); the two
profiles must be identical — frames, tree, every metric, every activity (kernels, copies,
memsets; runtime-call placement, backward, threads, graph replays, Triton launches) — except
byte counts, which the native reader also reads from Kineto's own activity records.

    python bench/gpu_native_check.py      # prints one line per program; exit 1 on a difference
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import torch

from dlpt.collectors import record_native
from dlpt.collectors.torch_recorder import Recorder
from dlpt.metrics import COL

OUT = os.environ.get("OUT") or "bench-out"
dev = torch.device("cuda")


def record_both(program):
    rec = Recorder(command="check", window=None, quiet=True, window_seconds=None, window_bytes=None)
    assert rec._native is not None, "the native reader did not build"
    rec.final_free = "now"
    py = Recorder(command="check", window=None, quiet=True, window_seconds=None, window_bytes=None)
    py._native = None
    fold = rec._ingest

    def both(kr) -> None:
        py._threads = rec._threads
        py._path_roots = rec._path_roots
        py._ingest(kr)  # first: the native release empties the result
        fold(kr)

    rec._ingest = both
    rec.start()
    try:
        program()
        torch.cuda.synchronize()
    finally:
        a = rec.stop()
    b = py._finish()
    return a, b, rec, py


BYTE_COLS = [COL[m] for m in ("htod_bytes", "dtoh_bytes", "dtod_bytes")]


def differences(a, b) -> list[str]:
    """Every difference but byte counts: the native reader also finds them in Kineto's activity
    records, which torch's Python bindings do not reach (those are compared in the report)."""
    out = []
    if a.frames != b.frames:
        out.append(f"frames ({len(a.frames)} vs {len(b.frames)})")
    for k in ("parent", "frame"):
        if not np.array_equal(getattr(a.cct, k), getattr(b.cct, k)):
            out.append(f"cct.{k}")
    keep = [c for c in range(a.cct.exclusive.shape[1]) if c not in BYTE_COLS]
    if a.cct.exclusive.shape != b.cct.exclusive.shape or \
            not np.array_equal(a.cct.exclusive[:, keep], b.cct.exclusive[:, keep]):
        out.append("cct.exclusive")
    for k in ("node", "kind", "name", "device", "stream", "start", "duration"):
        if not np.array_equal(getattr(a.activities, k), getattr(b.activities, k)):
            out.append(f"activities.{k}")
    return out


def train() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(64, 256, device=dev)
    target = torch.randint(0, 10, (64,), device=dev)
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(data), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()


def copies() -> None:
    h = torch.randn(1 << 20)
    p = torch.randn(1 << 20).pin_memory()
    a = h.to(dev)
    b = p.to(dev, non_blocking=True)
    c = a.clone()
    c.copy_(b)
    z = torch.zeros(1 << 20, device=dev)
    z.fill_(1.0)
    a.cpu()
    b.to("cpu", non_blocking=True)


class Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * 2
        return y.sin()

    @staticmethod
    def backward(ctx, g):
        return g * 2


def custom_function() -> None:
    x = torch.randn(1024, device=dev, requires_grad=True)
    for _ in range(3):
        Twice.apply(x).sum().backward()


def cudagraph() -> None:
    x = torch.randn(512, 512, device=dev)
    lin = torch.nn.Linear(512, 512).to(dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            lin(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lin(x).relu()
    for _ in range(3):
        g.replay()


def threaded() -> None:
    x = torch.randn(512, 512, device=dev)

    def work() -> None:
        for _ in range(3):
            torch.mm(x, x)

    ts = [threading.Thread(target=work) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    torch.mm(x, x)


_compiled = None


def compiled() -> None:
    for _ in range(3):
        _compiled(torch.randn(256, 1024, device=dev))


def main() -> None:
    global _compiled
    if record_native.load() is None:
        raise SystemExit("the native reader did not build")
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024)).to(dev)
    _compiled = torch.compile(mlp)
    _compiled(torch.randn(256, 1024, device=dev))  # compiled before recording
    torch.cuda.synchronize()
    # What the reader finds in this torch: Kineto's own records of a window with copies.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        copies()
        torch.cuda.synchronize()
    caps = record_native.load().capabilities(p.profiler.kineto_results)
    print("reader capabilities:", caps, flush=True)
    results = {"capabilities": caps}
    bad = 0
    for prog in (train, copies, custom_function, cudagraph, threaded, compiled):
        a, b, rec, py = record_both(prog)
        diff = differences(a, b)
        tot = a.cct.exclusive.sum(axis=0)
        ptot = b.cct.exclusive.sum(axis=0)
        r = {"same": not diff, "differences": diff, "activities": int(len(a.activities)),
             "nodes": int(len(a.cct)), "gpu_time_ns": int(tot[COL["gpu_time"]]),
             "htod_bytes": int(tot[COL["htod_bytes"]]), "dtoh_bytes": int(tot[COL["dtoh_bytes"]]),
             "dtod_bytes": int(tot[COL["dtod_bytes"]]),
             "python_path_bytes": [int(ptot[c]) for c in BYTE_COLS],
             "links_native": dict(rec.link_stats), "links_python": dict(py.link_stats),
             "unlinked_backward": [rec.unlinked_backward, py.unlinked_backward]}
        results[prog.__name__] = r
        bad += bool(diff)
        print(f"{prog.__name__:16s} {'same' if not diff else 'DIFFERENT: ' + ', '.join(diff)}; "
              f"{r['activities']} activities, {r['nodes']} nodes, bytes htod/dtoh/dtod "
              f"{r['htod_bytes']}/{r['dtoh_bytes']}/{r['dtod_bytes']} (Python path {r['python_path_bytes']}); links {r['links_native']}", flush=True)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "gpu_native_check.json"), "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
