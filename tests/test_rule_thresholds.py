"""Each rule of dlpt/findings.py at its thresholds, on figures set by hand (dlpt/evidence.py's
Split: the steady state's time in parts): a verdict at the threshold where the rule says "at
least", none just below it, and the parts the verdict adds up. Written for the mutants
tools/mutate.py found alive in findings.py (docs/MUTATION.md)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import synthetic_profile

from dlpt import findings as fd
from dlpt.evidence import Evidence, Lines, Split, Traits
from dlpt.frames import Frame
from dlpt.waits import Waits

D = 100_000  # the devices' time, ns

PROF = synthetic_profile([([Frame("python", "step (t.py:3)", "t.py", 3, "step"), Frame("kernel", "k")], 10),
                          ([Frame("python", "load (t.py:8)", "t.py", 8, "load"), Frame("kernel", "k")], 10)])


def ev(traits: Traits | None = None, phased_of: str = "run", **split) -> Evidence:
    lines = Lines(PROF)
    n = len(lines.labels)
    arrays = {k: np.zeros(n) for k in ("lines_loader", "lines_launch", "lines_python", "lines_short")}
    return Evidence(PROF, PROF, Waits(wall=D, device_time=D, idle=D // 2), lines,
                    Split(**{"device": D, **arrays, **split}), traits or Traits(), phased=phased_of != "run")


def test_gpu_bound_busy_and_queued_above_seventy_percent() -> None:
    at = int(fd.GPU_BUSY_ABOVE * D)
    assert fd.gpu_bound(ev(busy=at)) is None  # "above": not at
    assert fd.gpu_bound(ev(busy=at - 100, queued=99)) is None
    f = fd.gpu_bound(ev(busy=at - 100, queued=101, comm_wait=600, pageable=300))
    assert f is not None
    # the share explained: computing (busy less its waits and copies) and the queue
    assert f.share == pytest.approx((at - 100 - 600 - 300 + 101) / D)
    assert "waits in collectives and pageable copies left out" not in f.figure  # 0.9%: said from 1%
    assert "between kernels already launched" not in f.figure  # 0.1% queued


def test_gpu_bound_says_the_parts_of_one_percent_and_more() -> None:
    one = D // 100
    f = fd.gpu_bound(ev(busy=80_000, comm_wait=one // 2, pageable=one - one // 2, queued=one))
    assert "(its waits in collectives and pageable copies left out)" in f.figure
    assert ", 1.0% of it between kernels already launched" in f.figure
    f = fd.gpu_bound(ev(busy=80_000, comm_wait=one // 2, pageable=one // 2 - 1, queued=one - 1))
    assert "left out" not in f.figure and "between kernels" not in f.figure
    f = fd.gpu_bound(ev(Traits(compiled=True, graphed=True), busy=80_000))
    assert "(the program is already compiled and CUDA-graphed)" in f.figure


def test_launch_bound_at_its_three_thresholds() -> None:
    k = fd.LAUNCH_MIN_KERNELS
    short = np.array([0.0, 5.0])

    def rule(launch=fd.LAUNCH_SHARE * D, kernels=k, short_kernels=int(fd.LAUNCH_SHORT_SHARE * k)):
        return fd.launch_bound(ev(launch=launch, kernels=kernels, short_kernels=short_kernels, lines_short=short))

    f = rule()
    assert f is not None and f.share == pytest.approx(fd.LAUNCH_SHARE)
    assert f.figure.startswith(f"GPU idle {fd.LAUNCH_SHARE:.0%} of the run's GPU time between launches")
    # No idle on launching lines: the lines of the short kernels are named.
    assert f.lines == [Lines(PROF).labels[1]]
    assert rule(launch=fd.LAUNCH_SHARE * D - 1) is None
    assert rule(kernels=k - 1, short_kernels=k - 1) is None
    assert rule(short_kernels=int(fd.LAUNCH_SHORT_SHARE * k) - 1) is None


def test_launch_bound_with_longer_kernels_where_the_host_launches_slower_than_they_run() -> None:
    """Fewer than half the kernels short, yet the launching lines' host time per launch above
    their kernels' GPU time each: the host cannot keep the GPU fed (nanoGPT at batch 64)."""
    k = fd.LAUNCH_MIN_KERNELS
    few = int(fd.LAUNCH_SHORT_SHARE * k) - 1

    def rule(host: float, gpu: float = 1_000.0 * k, kernels: int = k):
        return fd.launch_bound(ev(launch=fd.LAUNCH_SHARE * D, kernels=k, short_kernels=few, lines_short=np.array([0.0, 5.0]),
                                  launch_kernels=kernels, launch_gpu=gpu, launch_host=host))

    # The pace alone idles the GPU 1 - GPU/host of the time: at least LAUNCH_SHARE of it.
    at = 1_000.0 * k / (1.0 - fd.LAUNCH_SHARE)
    f = rule(host=at)
    assert f is not None and f.share == pytest.approx(fd.LAUNCH_SHARE)
    assert f.figure.endswith(f"the launching lines' {k} kernels ran 1.0 us each on the GPU against 1.2 us of host "
                             "time per launch")
    assert rule(host=at * 0.999) is None
    assert rule(host=1_000.0 * k * 1.1) is None  # host a little slower than its kernels: bursts, not the pace
    assert rule(host=1e9, kernels=0) is None  # no kernel on the launching lines: no pace to compare
    # Mostly short: the pace is not asked for, nor said.
    f = fd.launch_bound(ev(launch=fd.LAUNCH_SHARE * D, kernels=k, short_kernels=k, lines_short=np.array([0.0, 5.0]),
                           launch_kernels=k, launch_gpu=1e9, launch_host=1.0))
    assert f is not None and "launching lines'" not in f.figure


def test_host_bound_and_sync_at_their_thresholds() -> None:
    assert fd.host_bound(ev(python=fd.HOST_SHARE * D - 1, lines_python=np.array([1.0, 0.0]))) is None
    assert fd.host_bound(ev(python=fd.HOST_SHARE * D, lines_python=np.array([1.0, 0.0]))) is not None
    assert fd.sync_in_loop(ev(after_sync=int(fd.SYNC_SHARE * D) - 1)) is None


def test_dataloader_wait_at_its_thresholds() -> None:
    lines = np.array([0.0, 7.0])
    idle = D // 2
    need = max(fd.LOADER_DEVICE_SHARE * D, fd.LOADER_IDLE_SHARE * idle)
    assert fd.dataloader_wait(ev(loader=need, lines_loader=lines)) is not None
    assert fd.dataloader_wait(ev(loader=need - 1, lines_loader=lines)) is None
    # No idle figure (an older profile): no verdict, rather than a comparison with None.
    e = ev(loader=need, lines_loader=lines)
    e.w.idle = None
    assert fd.dataloader_wait(e) is None


def copies(count: list[int] | None) -> Evidence:
    """Line t.py:20 copying 3 MiB from pageable memory, 30 us on the device in all: one activity
    row, standing for `count` copies where the row has a count (a recording's rows)."""
    from dlpt.cct import TreeBuilder
    from dlpt.collectors.assembly import ActivityColumns, build_profile
    from dlpt.frames import FrameTable
    from dlpt.metrics import HTOD

    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    line = b.child(0, frames.intern(Frame("python", "copy (t.py:20)", "t.py", 20, "copy")))
    leaf = frames.intern(Frame("kernel", "Memcpy HtoD (Pageable -> Device)"))
    cols = ActivityColumns(node=[b.child(line, leaf)], kind=[HTOD], name=[leaf], device=[0], stream=[7], start=[0],
                           duration=[30_000], nbytes=[3 << 20], count=count or [])
    return build_profile(b, frames, cols, {})


def pageable(prof, wall: int | None, device_time: int) -> fd.Finding | None:
    return fd.pageable_copies(Evidence(prof, prof, Waits(wall=wall, device_time=device_time), Lines(prof),
                                       Split(device=device_time), Traits(), phased=False))


def test_pageable_copies_against_the_wall_else_the_devices_time() -> None:
    prof = copies(None)
    # 30 us of a 2 ms wall = 1.5% < 2%: none, though 30 us is 30% of the devices' 100 us.
    assert pageable(prof, 2_000_000, 100_000) is None
    # 30 us of a 1 ms wall = 3.0% >= 2%.
    f = pageable(prof, 1_000_000, 100_000)
    assert f.lines == ["t.py:20"]
    assert f.figure == ("host-to-device copies from pageable memory 30.0 us (3.0% of the wall time, 3.0 MiB "
                        "in 1 copy)")
    # No wall (a profile without a window): the devices' time stands in: 30 of 100 us = 30.0%.
    assert "(30.0% of the wall time" in pageable(prof, None, 100_000).figure


def test_pageable_copies_count_a_recordings_rows_by_their_count() -> None:
    # One row standing for 40 copies: "in 40 copies", not one.
    assert "3.0 MiB in 40 copies" in pageable(copies([40]), 1_000_000, 100_000).figure
    # One copy is said in the singular ("in 1 copies" read wrong), as dataloader-wait's count is.
    assert pageable(copies([1]), 1_000_000, 100_000).figure.endswith("3.0 MiB in 1 copy)")


def test_findings_are_listed_largest_share_first_the_runs_last(monkeypatch) -> None:
    # Four rules' verdicts, given in this order: 20% of the steady state, none (no share: 0),
    # the run's compile verdict (90% of the run), 50% of the steady state. Listed: the steady
    # state's by share, 50%, 20%, 0; then the run's, whatever its share.
    made = [fd.Finding("a", share=0.2, of="steady state"), fd.Finding("none", share=None, of="steady state"),
            fd.Finding("compile", share=0.9, of="run"), fd.Finding("b", share=0.5, of="steady state")]
    monkeypatch.setattr(fd, "RULES", tuple((f.rule, lambda e, f=f: f) for f in made) + (("never", lambda e: None),))
    monkeypatch.setattr(fd, "evidence", lambda profile: ev(phased_of="steady state"))
    assert [f.rule for f in fd.findings(PROF)] == ["b", "a", "none", "compile"]


def test_a_kept_diagnosis_is_given_back_as_it_was() -> None:
    # A command judged the steady state already (meta.diagnosis): those verdicts, not the rules'
    # on this profile (which has none of these); entries that are not verdicts are skipped.
    from dataclasses import replace

    kept = fd.Finding("gpu-bound", ["t.py:3"], "busy 95%", "more work per kernel", 0.95, "steady state")
    prof = replace(PROF, meta=replace(PROF.meta, diagnosis=[kept.to_json(), "junk"]))
    assert fd.findings(prof) == [kept]

