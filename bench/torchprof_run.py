"""Run a program unmodified under `torch.profiler` with Python stacks, the way a user would wrap
it by hand: the comparison point "torch.profiler with stacks" of the recording benchmarks.

    python bench/torchprof_run.py SCRIPT ARGS...

The program runs as `python SCRIPT ARGS` would (`__main__`, `sys.argv`, `sys.path[0]`). Nothing
is exported at the end: the step times the program prints are what is compared, and an export
would only add to the time after the program's last line.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: torchprof_run.py SCRIPT ARGS...")
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` sets it (it was bench/)
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts, with_stack=True):
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
