"""The collector's CUPTI half compiles. A recording on this machine builds collector.cpp without
DLPT_CUPTI (a CPU torch), so the code that reads CUPTI's records — kernels, copies, NCCL
kernels for comm wait — would meet the compiler only on a GPU machine. Where CUDA's headers are
installed (nvcc's toolkit, as here), it is compiled with the flags the real build adds for CUPTI,
syntax only."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dlpt.collectors.record.native import SOURCE, _record_types  # noqa: E402


def cuda_include() -> str | None:
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    for root in filter(None, roots):
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cupti.h")) and os.path.isfile(os.path.join(inc, "cupti_activity.h")):
            return inc
    return None


def test_the_cupti_half_compiles(tmp_path: Path) -> None:
    inc = cuda_include()
    if inc is None:
        pytest.skip("no CUDA headers with CUPTI here: the CUPTI half compiles on GPU machines only")
    from torch.utils.cpp_extension import include_paths

    # A CPU build of torch ships c10/cuda's headers without the one its CMake generates.
    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cmd = [os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only", "-w", f"-I{tmp_path}",
           *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}",
           "-DDLPT_CUPTI", "-DDLPT_INTERNAL_FRAMES", f"-I{inc}", *_record_types(inc),
           "-DTORCH_EXTENSION_NAME=dlpt_collector", SOURCE]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
