"""Profiles recorded by `dlpt record` on the GPU machine (H200) (`bench/run.py gpu-cases`): the placements seen on the
GPU, held on CPU. Each program marks its lines with `# CASE: ...` (bench/gpu_cases/)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import dlpt
from dlpt.metrics import COL
from dlpt.transforms import hide_library_unless
from dlpt.viewers.hotspots import summary
from dlpt.views import flat

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def case_line(program: str, label: str) -> int:
    for i, text in enumerate((ROOT / "bench" / "gpu_cases" / f"{program}.py").read_text().splitlines(), 1):
        m = re.search(r"# CASE: (.*)$", text)
        if m and m.group(1).strip() == label:
            return i
    raise AssertionError(f"no CASE {label!r} in {program}.py")


def load(program: str) -> dlpt.Profile:
    return dlpt.load(str(DATA / f"gpu_case_{program}.dlpt"))


def line_rows(prof: dlpt.Profile, program: str) -> dict[int, np.ndarray]:
    """Self metrics of each line of the program (flat by line, library frames hidden)."""
    fv = flat(hide_library_unless(prof, False), "line")
    out: dict[int, np.ndarray] = {}
    for g, fr in enumerate(fv.frame):
        if fr.kind == "python" and os.path.basename(fr.file) == f"{program}.py":
            out[fr.line] = out.get(fr.line, 0) + fv.exclusive[g]
    return out


def leaves_under_line(prof: dlpt.Profile, program: str, line: int) -> set[str]:
    """Names of the GPU activities whose innermost source line is `line`."""
    view = hide_library_unless(prof, False)
    fv = flat(view, "line")
    groups = {g for g, fr in enumerate(fv.frame) if fr.line == line and os.path.basename(fr.file) == f"{program}.py"}
    return {view.frame_of(i).name for i in range(len(view.cct))
            if view.frame_of(i).kind in ("kernel", "memcpy", "memset") and fv.owner[i] in groups}


@pytest.mark.parametrize("program", ["copies", "cudagraph", "threaded"])
def test_everything_at_a_source_line(program):
    prof = load(program)
    s = summary(prof)
    assert s["gpu_time"] > 0 and s["unattributed"] == {}
    assert s["attributed_to_source"] == s["gpu_time"]
    # That the tree's metrics are the activities' is recomputed row by row in test_oracles.py.


def test_each_copy_on_its_own_line():
    prof = load("copies")
    expect = {"pageable HtoD": "Memcpy HtoD (Pageable -> Device)", "pinned HtoD": "Memcpy HtoD (Pinned -> Device)",
              "DtoD": "Memcpy DtoD (Device -> Device)", "DtoH": "Memcpy DtoH (Device -> Pageable)"}
    rows = line_rows(prof, "copies")
    for label, name in expect.items():
        ln = case_line("copies", label)
        assert leaves_under_line(prof, "copies", ln) == {name}, label
        assert rows[ln][COL["copy_count"]] == 3  # three loop iterations
    dtoh = rows[case_line("copies", "DtoH")]
    assert dtoh[COL["dtoh_time"]] == dtoh[COL["gpu_time"]] > 0


def test_copy_bytes_on_each_line():
    """Byte counts of copies, from CUPTI's memcpy records (torch's live profiler events lack
    them). Each line copies a 2048×2048 float32 tensor (16 MiB), three times."""
    prof = load("copies")
    assert prof.meta["collector"]["cupti"]
    rows = line_rows(prof, "copies")
    mib16 = 2048 * 2048 * 4
    for label, col in (("pageable HtoD", "htod_bytes"), ("pinned HtoD", "htod_bytes"), ("DtoD", "dtod_bytes"),
                       ("DtoH", "dtoh_bytes")):
        row = rows[case_line("copies", label)]
        assert row[COL[col]] == 3 * mib16, label
        assert sum(row[COL[c]] for c in ("htod_bytes", "dtoh_bytes", "dtod_bytes")) == 3 * mib16, label
    # Rows are per (node, name): each line's three copies are one row of count 3.
    a = prof.activities
    copies = a.kind != 0
    assert int(a.count[copies].sum()) == 12 and int(a.bytes[copies].sum()) == 12 * mib16


def test_graph_replays_under_the_replay_line():
    prof = load("cudagraph")
    rows = line_rows(prof, "cudagraph")
    replay = rows[case_line("cudagraph", "replay")]
    # Five replays of the captured MLP: the same kernels five times, no op of their own.
    assert replay[COL["kernel_count"]] > 0 and replay[COL["kernel_count"]] % 5 == 0
    names = leaves_under_line(prof, "cudagraph", case_line("cudagraph", "replay"))
    assert any("gemm" in n or "Kernel" in n for n in names)


def test_thread_work_under_the_start_line():
    prof = load("threaded")
    view = hide_library_unless(prof, False)
    start = case_line("threaded", "thread start")
    threads = [i for i in range(len(view.cct)) if view.frame_of(i).kind == "thread"]
    assert threads
    for t in threads:
        path = view.call_path(t)
        assert path[-2].has_source and path[-2].line == start
    in_threads = sum(int(view.cct.inclusive[t, COL["gpu_time"]]) for t in threads)
    assert in_threads > 0.95 * view.cct.inclusive[0, COL["gpu_time"]]
