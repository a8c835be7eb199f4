"""The diagnosis (dlpt/findings.py): each rule on a program that has the problem and on one that
does not, as Kineto traces in torch.profiler's schema (tests/kineto_builder.py); the real traces;
and a recorder-style profile, whose activity rows aggregate many kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import trace_path
from kineto_builder import TraceBuilder

from dlpt import findings as fd
from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.kineto import import_traces
from dlpt.evidence import evidence
from dlpt.frames import Frame, FrameTable
from dlpt.idle import blame, idle_column
from dlpt.metrics import COL, KERNEL

LOADER = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py"


def _loop(tmp_path, steps=120, kernel_us=3.0, host_us=20.0, sync_us=0.0, copy=None, loader_us=0.0):
    """A training loop on one thread: per step, optionally line 30 (`for x in loader`) waiting
    in the DataLoader, line 20 copying a batch (`copy`: "Pageable" or "Pinned", 30 us), line 10
    launching one kernel after `host_us` of Python, line 12 synchronizing for `sync_us`."""
    tb = TraceBuilder()
    t = 100.0
    start = t
    for _ in range(steps):
        if loader_us:
            tb.py(30, "main", t, loader_us + 1)
            tb.py(700, "__next__", t + 0.5, loader_us, file=LOADER)
            t += loader_us + 1
        if copy:
            tb.py(20, "main", t, 35)
            tb.op("aten::copy_", t + 1, 33)
            corr = tb.runtime("cudaMemcpyAsync", t + 2, 31)
            tb.gpu("gpu_memcpy", f"Memcpy HtoD ({copy} -> Device)", t + 2.5, 30, corr, nbytes=1 << 20)
            t += 35
        tb.py(10, "main", t, host_us + 8)
        tb.kernel(t + host_us, 5, t + host_us + 6, kernel_us)
        t += host_us + 8 + max(kernel_us - 2, 0)
        if sync_us:
            tb.py(12, "main", t, sync_us + 4)
            tb.op("aten::item", t + 1, sync_us + 2)
            tb.runtime("cudaStreamSynchronize", t + 2, sync_us)
            t += sync_us + 4
    tb.py(5, "<module>", start - 1, t - start + 2)
    return import_traces(str(tb.write(tmp_path / "loop.pt.trace.json.gz")))


def _rules(prof):
    return {f.rule: f for f in fd.findings(prof)}


def test_launch_bound_with_and_without(tmp_path):
    got = _rules(_loop(tmp_path))
    f = got["launch-bound"]
    assert f.lines == ["train.py:10"]
    assert "120 of 120 kernels under 10.0 us" in f.figure and "torch.compile" in f.remedy
    # The same loop with 80 us kernels the host keeps up with: busy, not launch-bound.
    got = _rules(_loop(tmp_path, kernel_us=80.0, host_us=1.0))
    assert "launch-bound" not in got and "gpu-bound" in got
    # Few kernels: too few to call it launch-bound, however idle.
    assert "launch-bound" not in _rules(_loop(tmp_path, steps=20))


def test_sync_in_loop_with_and_without(tmp_path):
    f = _rules(_loop(tmp_path, sync_us=15.0))["sync-in-loop"]
    assert f.lines == ["train.py:12"] and ".item()" in f.remedy
    assert "sync-in-loop" not in _rules(_loop(tmp_path))
    # The same sync in a loop whose GPU stays busy (long kernels): waiting costs nothing there.
    got = _rules(_loop(tmp_path, kernel_us=400.0, host_us=1.0, sync_us=15.0))
    assert "gpu-bound" in got and "sync-in-loop" not in got


def test_pageable_copies_with_and_without(tmp_path):
    f = _rules(_loop(tmp_path, copy="Pageable"))["pageable-copies"]
    assert f.lines == ["train.py:20"] and "120 copies" in f.figure and "pin_memory" in f.remedy
    assert "pageable-copies" not in _rules(_loop(tmp_path, copy="Pinned"))


def test_dataloader_wait_with_and_without(tmp_path):
    f = _rules(_loop(tmp_path, loader_us=200.0))["dataloader-wait"]
    assert f.lines == ["train.py:30"] and "num_workers" in f.remedy
    # The same time in the user's own Python (line 10): no data loader to blame.
    assert "dataloader-wait" not in _rules(_loop(tmp_path, host_us=200.0))


@pytest.mark.parametrize("loader_us,host_us,kernel_us,holds", [
    # 30 us of loader in a 330 us host step over a 200 us kernel: the loader is 5.6% of the GPU's
    # time (over LOADER_DEVICE_SHARE) but 8.9% of its idle (under LOADER_IDLE_SHARE): the idle is
    # the host's Python.
    (30.0, 300.0, 200.0, "device"),
    # 20 us of loader before a 2 ms kernel: 71% of the (little) idle, but 1% of the GPU's time.
    (20.0, 1.0, 2000.0, "idle"),
])
def test_dataloader_wait_needs_both_shares(tmp_path, loader_us, host_us, kernel_us, holds):
    """The verdict needs the loader's idle to be both a share of the devices' time and of their
    idle: where only one of the two holds, no verdict (either threshold alone is not enough)."""
    prof = _loop(tmp_path, loader_us=loader_us, host_us=host_us, kernel_us=kernel_us)
    e = evidence(prof)
    s = e.split
    of_device = s.share(s.loader) >= fd.LOADER_DEVICE_SHARE
    of_idle = s.loader >= fd.LOADER_IDLE_SHARE * e.w.idle
    assert (of_device, of_idle) == (holds == "device", holds == "idle")  # exactly one side holds
    assert "dataloader-wait" not in _rules(prof)


def test_gpu_bound_with_and_without(tmp_path):
    f = _rules(_loop(tmp_path, kernel_us=80.0, host_us=1.0))["gpu-bound"]
    assert f.lines == ["train.py:10"] and "GPU busy 9" in f.figure
    assert "gpu-bound" not in _rules(_loop(tmp_path, kernel_us=80.0, host_us=40.0))


@pytest.mark.parametrize("name,expected", [("gpt_train", {"launch-bound"}), ("copies", {"pageable-copies", "gpu-bound"}),
                                           ("resnet_infer", {"pageable-copies"})])
def test_real_traces(name, expected):
    got = fd.findings(import_traces(str(trace_path(name))))
    assert {f.rule for f in got} == expected
    for f in got:
        assert f.lines and all(":" in x for x in f.lines)
    json.dumps([f.to_json() for f in got])
    assert set(got[0].to_json()) == {"rule", "lines", "figure", "remedy", "share", "of"}
    # No phases in these traces: each share is of the run, and distinct verdicts share it out.
    assert all(f.of == "run" and 0 < f.share <= 1 for f in got) and sum(f.share for f in got) <= 1


def test_a_recorded_style_profile_with_aggregated_rows(tmp_path):
    """A recording's activity rows each stand for many kernels: the count, not the rows, decides."""
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    line = b.child(0, frames.intern(Frame("python", "step (train.py:7)", "train.py", 7, "step")))
    leaf = frames.intern(Frame("kernel", "void k<1>()"))
    node = b.child(line, leaf)
    cols = ActivityColumns(node=[node], kind=[KERNEL], name=[leaf], device=[0], stream=[7], start=[0],
                           duration=[500 * 4000], nbytes=[0], count=[500])
    w = (0, 20_000_000)
    res = blame(len(b), {0: w}, {0: (np.array([0]), np.array([2_000_000]))}, np.array([0]), np.array([w[1]]),
                np.array([line]), np.array([0]))
    cols.extra["gpu_idle_time"] = idle_column(res, b, frames, 0)
    prof = build_profile(b, frames, cols, {"window": {"start": 0, "end": w[1]}, "gpu_idle": res.meta()})
    f = _rules(prof)["launch-bound"]
    assert f.lines == ["train.py:7"] and "500 of 500 kernels" in f.figure
    cols.count = [50]  # the same time in 50 kernels of 40 us
    prof = build_profile(b, frames, cols, {"window": {"start": 0, "end": w[1]}, "gpu_idle": res.meta()})
    assert "launch-bound" not in _rules(prof)


def test_old_profile_has_no_findings_and_no_error(tmp_path):
    prof = import_traces(str(trace_path("threaded")))
    prof.meta = {}
    assert [f.rule for f in fd.findings(prof)] == []


def _verdict(excess: int, is_straggler: bool = True, rank: int = 1) -> dict:
    return {"straggler": is_straggler, "excess": excess, "rank": rank}


def test_rank_wait_names_the_gpu_straggler_when_its_compute_explains_the_wait() -> None:
    """Measured on 2 GPUs (docs/BENCHMARKS.md, "Two GPUs"): a rank with twice the batch computed
    140.6 ms more on its GPU and spent 162.1 ms more host time, blocked on its own GPU, while the
    other waited 201.1 ms: the GPU verdict names why. A rank that slept 1 s before backward was
    3.6 ms slower on its GPU in one run: the host verdict explains the 1.04 s wait."""
    from dlpt.findings import explaining_verdict

    gpu, host = _verdict(140_560_000), _verdict(162_100_000)
    assert explaining_verdict(gpu, host, 201_100_000) is gpu
    gpu, host = _verdict(3_560_000), _verdict(586_900_000)
    assert explaining_verdict(gpu, host, 1_040_000_000) is host
    assert explaining_verdict(_verdict(1, False), host, 1_040_000_000) is host
    assert explaining_verdict(gpu, _verdict(5, False), 1_040_000_000) is gpu  # the only straggler there is
    assert explaining_verdict(None, _verdict(5, False), 10) is None


def test_rank_wait_never_names_the_rank_that_waited_and_falls_back_to_host_op_time() -> None:
    """Under torchrun on a loaded 2-core machine (gloo), rank 0 waited 32 ms for rank 1 (four
    times the batch), but the wait it sat out in DDP's finalize, inside backward, was partly
    read as its host time: the host verdict found no straggler, or named rank 0 itself. The
    ranks' op time still named rank 1 (60-270% more in five runs)."""
    from dlpt.findings import explaining_verdict

    ops = _verdict(45_000_000, rank=1)
    assert explaining_verdict(None, _verdict(2_000_000, False), 32_000_000, ops, waiter=0) is ops
    assert explaining_verdict(None, _verdict(20_000_000, rank=0), 32_000_000, ops, waiter=0) is ops
    host = _verdict(30_000_000, rank=1)
    assert explaining_verdict(None, host, 32_000_000, ops, waiter=0) is host  # the host's first, as before
    gpu = _verdict(30_000_000, rank=0)  # the waiter's GPU excess never explains its own wait
    assert explaining_verdict(gpu, _verdict(1, False), 32_000_000, _verdict(1, False), waiter=0) is None
    assert explaining_verdict(gpu, None, 32_000_000, None, waiter=1) is gpu


PROG = """\
import torch

def step(x):
    y = x @ x
    return y.sum().item()

for i in range(100):
    step(x)
print(step(x))
"""


def _recorded_sync(caller_line: int):
    """A recording whose `.item()` in step() (line 5) blocked 100 ms of a 1 s run, called from
    `caller_line` of the module: line 8 is in the loop's body, line 9 after it."""
    from dataclasses import replace

    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    mod = b.child(0, frames.intern(Frame("python", f"<module> (prog.py:{caller_line})", "prog.py", caller_line,
                                         "<module>")))
    line = b.child(mod, frames.intern(Frame("python", "step (prog.py:5)", "prog.py", 5, "step")))
    cols = ActivityColumns()
    cols.extra["sync_time"] = (np.array([line]), np.array([100_000_000]))
    cols.extra["host_time"] = (np.array([line]), np.array([1_000_000_000]))
    prof = build_profile(b, frames, cols, {"source": "record", "window": {"start": 0, "end": 1_000_000_000}})
    return replace(prof, sources={"prog.py": PROG})


def test_a_sync_outside_any_loop_is_no_finding() -> None:
    """A recording's frames are at their current lines: the sync counts when its line or a
    caller's is inside a loop of the stored source; a sync after the loop waits once."""
    f = _rules(_recorded_sync(8)).get("sync-in-loop")
    assert f is not None and f.lines == ["prog.py:5"]
    assert "sync-in-loop" not in _rules(_recorded_sync(9))
    # Without the source there is no telling: it counts, as before.
    from dataclasses import replace

    assert "sync-in-loop" in _rules(replace(_recorded_sync(9), sources={}))


def test_a_dataloader_bound_trace_gets_the_loader_verdict():
    """A real torch.profiler trace (H100, stacks on, a schedule; bench/workloads/loader_trace.py)
    of a loop whose batches take 8 × 3 ms to load in the main process: the loader verdict, its
    idle within 15% of the loop's own timer, and the GPU's idle on source lines. The truth:
    the waits of the active steps after the first, whose wait comes before the trace's first GPU
    activity (measured: −1.4%, 98.3% on source lines)."""
    from conftest import FIXTURES

    from dlpt.views import node_flags

    prof = import_traces(str(trace_path("loader_bound")))
    truth = json.loads((FIXTURES / "loader_bound.truth.json").read_text())
    got = _rules(prof)
    f = got["dataloader-wait"]
    assert "launch-bound" not in got and "host-bound" not in got
    want = sum(truth["data_s"][1:]) * 1e9
    waited = float(f.figure.split("GPU idle ", 1)[1].split(" ms")[0]) * 1e6
    assert abs(waited - want) <= 0.15 * want, (waited, want)
    assert "num_workers" in f.remedy and f.share > 0.5
    idle = prof.cct.exclusive[:, COL["gpu_idle_time"]]
    on_src, _ = node_flags(prof)
    assert idle[on_src].sum() >= 0.9 * idle.sum()


def test_host_bound_with_and_without(tmp_path):
    """The host's own Python between launches (200 us a step before a 3 us kernel, no loader):
    host-bound on that line; the same loop with its kernels long enough to keep the GPU busy is
    not, and neither is a loop whose idle is the loader's."""
    f = _rules(_loop(tmp_path, steps=20, host_us=200.0, kernel_us=30.0))["host-bound"]
    assert f.lines == ["train.py:10"] and f.share > 0.5 and "vectorize" in f.remedy
    assert "host-bound" not in _rules(_loop(tmp_path, steps=20, host_us=1.0, kernel_us=200.0))
    got = _rules(_loop(tmp_path, steps=20, loader_us=400.0, host_us=1.0, kernel_us=30.0))
    assert "dataloader-wait" in got and "host-bound" not in got


def test_distinct_verdicts_never_explain_more_than_the_whole(tmp_path):
    """A loop with a loader's wait, pageable copies, a sync and short kernels: every verdict's share
    is of one split of the GPU's time, so together they stay within it."""
    got = fd.findings(_loop(tmp_path, loader_us=100.0, copy="Pageable", sync_us=20.0))
    assert len(got) >= 2
    assert sum(f.share for f in got if f.share is not None) <= 1.0


PROG_TWO_LOOPS = PROG + "while False:\n    pass\n"  # a second loop: lines 10-11


def _recorded_path(path: list[Frame], sources: dict[str, str], sync_ns: int = 100_000_000):
    """A recording without GPU figures whose innermost frame of `path` (outermost first) blocked
    `sync_ns` (100 ms) of a 1 s run."""
    from dataclasses import replace

    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    node = 0
    for f in path:
        node = b.child(node, frames.intern(f))
    cols = ActivityColumns()
    cols.extra["sync_time"] = (np.array([node]), np.array([sync_ns]))
    cols.extra["host_time"] = (np.array([node]), np.array([1_000_000_000]))
    prof = build_profile(b, frames, cols, {"source": "record", "window": {"start": 0, "end": 1_000_000_000}})
    return replace(prof, sources=sources)


def _py(file: str, line: int, fn: str) -> Frame:
    return Frame("python", f"{fn} ({file}:{line})", file, line, fn)


@pytest.mark.parametrize("outer", [Frame("thread", "MainThread"), _py("other.py", 3, "main")])
def test_frames_that_say_nothing_are_passed_over_to_the_ones_that_do(outer) -> None:
    # Outermost a frame that says nothing of loops (a thread, not Python code; a file whose
    # source is not stored), then prog.py:9 — after PROG's loop (lines 7-8) — then step() at
    # line 5 (inside no loop). The walk goes on past the first to prog.py's: known, in no loop:
    # the sync waits once, no finding.
    path = [outer, _py("prog.py", 9, "<module>"), _py("prog.py", 5, "step")]
    assert "sync-in-loop" not in _rules(_recorded_path(path, {"prog.py": PROG}))
    # Called from line 8, in the loop's body: a finding.
    path[1] = _py("prog.py", 8, "<module>")
    assert "sync-in-loop" in _rules(_recorded_path(path, {"prog.py": PROG}))


def test_a_line_in_one_of_two_loops_is_in_a_loop() -> None:
    # Line 8 is inside the `for` (7-8), not inside the `while` (10-11): in a loop.
    path = [_py("prog.py", 8, "<module>"), _py("prog.py", 5, "step")]
    assert "sync-in-loop" in _rules(_recorded_path(path, {"prog.py": PROG_TWO_LOOPS}))


def test_without_gpu_figures_the_hosts_wait_is_judged_against_the_wall() -> None:
    # No GPU activity: the sync's share of the 1 s wall decides, at 5%. 40 ms = 4%: none (though
    # the line's 4% is past the 1% a line needs); 50 ms = 5%: a finding.
    path = [_py("prog.py", 8, "<module>"), _py("prog.py", 5, "step")]
    assert "sync-in-loop" not in _rules(_recorded_path(path, {"prog.py": PROG}, 40_000_000))
    assert "sync-in-loop" in _rules(_recorded_path(path, {"prog.py": PROG}, 50_000_000))
