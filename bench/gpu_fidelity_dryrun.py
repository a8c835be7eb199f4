"""A CPU dry run of bench/gpu_fidelity_prog.py's Python flow (threads, the custom Function, the
rounds, the truth JSON) for a machine without a GPU: small sizes, CPU tensors, and stand-ins for
CUDA events, `_sleep`, graphs and synchronize. It checks the program runs to its end before a
device call is spent on it; its numbers mean nothing. Under `dlpt record` (cpu_time) it also
shows where the host ops of each marked line land:

    python bench/gpu_fidelity_dryrun.py /tmp/truth.json 3
    dlpt record -o /tmp/dry.dlpt bench/gpu_fidelity_dryrun.py /tmp/truth.json 3
    python bench/gpu_fidelity.py --analyze /tmp/dry.dlpt --truth /tmp/truth.json --metric cpu_time
"""

import contextlib
import os
import sys

import torch

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_fidelity_prog.py")


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self) -> None:
        pass

    def elapsed_time(self, other: "FakeEvent") -> float:
        return 1.0


class FakeGraph:
    def replay(self) -> None:
        pass


def main() -> None:
    with open(SRC) as f:
        src = f.read()
    for old, new in (("N_ADD = 1 << 28", "N_ADD = 1 << 10"), ("N_MM = 8192", "N_MM = 64"),
                     ("N_COPY = 256 << 20", "N_COPY = 1024"), ('torch.device("cuda")', 'torch.device("cpu")'),
                     ("pin_memory=True", "pin_memory=False")):
        if old not in src:
            raise SystemExit(f"gpu_fidelity_prog.py changed: {old!r} not found; update this dry run")
        src = src.replace(old, new)
    torch.cuda.Event = FakeEvent
    torch.cuda._sleep = lambda cycles: None
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.CUDAGraph = FakeGraph
    torch.cuda.graph = lambda g, **k: contextlib.nullcontext()
    torch.cuda.get_device_name = lambda i=0: "cpu (dry run)"
    sys.argv = [SRC, *sys.argv[1:]]
    # Compiled under the program's own file name, so that lines (and dlpt's rows) are the program's.
    exec(compile(src, SRC, "exec"), {"__name__": "__main__", "__file__": SRC})


if __name__ == "__main__":
    main()
