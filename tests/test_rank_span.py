"""What a merged rank's comm wait is a share of (dlpt/findings.py `_rank_span`), from rank meta
written out here: its phase's window, else its collectives' span, else its recording window,
else its host time. Written for mutants tools/mutate.py found reached by no fast test."""

from __future__ import annotations

import numpy as np
import pytest
from test_merge_numbers import two_paths

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.evidence import evidence
from dlpt.findings import RANK_WHY, _rank_span, explaining_verdict, rank_story, rank_wait
from dlpt.frames import Frame, FrameTable
from dlpt.merge import merge_profiles
from dlpt.metrics import COL, KERNEL
from dlpt.ranks import rank_nodes


@pytest.mark.parametrize("meta, want", [
    ({"window": {"start": 0, "end": 900, "wall": 50}}, (50, "its steady time")),
    ({"window": {"start": 0, "end": 900}, "collective_span": 70}, (70, "the time between its first and last collective")),
    ({"window": {"start": 100, "end": 900}}, (800, "its wall time")),
    ({}, None),
])
def test_rank_span(meta, want) -> None:
    merged = merge_profiles([two_paths(1, 2, 0), two_paths(3, 4, 1)])
    merged.meta["phase"] = "steady"
    (r0, n0), (r1, n1) = rank_nodes(merged)
    merged.meta["ranks"] = [{"rank": r0}, {"rank": r1, **meta}]
    host = int(merged.cct.inclusive[n1, COL["host_time"]])
    assert _rank_span(merged, r1, n1) == (want or (host, "its host time"))
    assert _rank_span(merged, r0, n0) == (int(merged.cct.inclusive[n0, COL["host_time"]]), "its host time")


# ----- the rank story: which rank waited, and which straggler verdict explains it -----
# (rank_story, explaining_verdict, rank_wait; merged profiles built in this process, so
# tools/mutate.py's traced runs reach them.)

def rank(r: int, gpu: int, host: int, ops: int, wait: int, world: int = 2) -> object:
    """Rank r's profile: one user line, train.py:10, launching a `gemm` kernel of `gpu` ns, with
    `host` ns of host compute plus `wait` ns waiting in collectives (host_time = host + wait;
    comm_wait_time = wait) and `ops` ns of its ops' own host time (cpu_time)."""
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "t")))
    line = b.child(0, frames.intern(Frame("python", "train.py(10): step", "train.py", 10, "step")))
    cols = ActivityColumns()
    fid = frames.intern(Frame("kernel", "gemm"))
    for col, v in (("node", b.child(line, fid)), ("kind", KERNEL), ("name", fid), ("device", 0), ("stream", 7),
                   ("start", 0), ("duration", gpu), ("nbytes", 0)):
        getattr(cols, col).append(v)
    for metric, v in (("host_time", host + wait), ("comm_wait_time", wait), ("cpu_time", ops)):
        cols.extra[metric] = (np.array([line]), np.array([v]))
    return build_profile(b, frames, cols, {"source": "kineto", "rank": r, "world_size": world})


def verdict(r: int, excess: int, metric: str = "gpu_time", straggler: bool = True) -> dict:
    return {"rank": r, "excess": excess, "metric": metric, "straggler": straggler, "line": None}


def test_explaining_verdict_takes_the_first_whose_excess_is_half_the_wait() -> None:
    gpu, host, ops = verdict(1, 400), verdict(1, 900, "host_time"), verdict(1, 700, "cpu_time")
    # Wait 1000: half is 500. GPU 400 < 500; host 900 >= 500: host, before ops (700 >= 500 too).
    assert explaining_verdict(gpu, host, 1000, ops) is host
    # GPU 600 >= 500: the GPU's comes first.
    assert explaining_verdict(verdict(1, 600), host, 1000, ops)["metric"] == "gpu_time"
    # Exactly half (500 of 1000) is enough.
    assert explaining_verdict(verdict(1, 500), host, 1000, ops)["metric"] == "gpu_time"
    # Only ops reach half (host 300 < 500, ops 700): ops.
    assert explaining_verdict(gpu, verdict(1, 300, "host_time"), 1000, ops) is ops
    # None reaches half (400, 300, 200 of 1000): the first straggler of host, ops, GPU — host;
    # host no straggler: ops; only the GPU's: the GPU's.
    small_host, small_ops = verdict(1, 300, "host_time"), verdict(1, 200, "cpu_time")
    assert explaining_verdict(gpu, small_host, 1000, small_ops) is small_host
    assert explaining_verdict(gpu, verdict(1, 300, "host_time", False), 1000, small_ops) is small_ops
    assert explaining_verdict(gpu, None, 1000, None) is gpu
    # No straggler at all, or no verdicts: None.
    assert explaining_verdict(verdict(1, 600, straggler=False), None, 1000, None) is None
    assert explaining_verdict(None, None, 1000, None) is None


def test_a_verdict_naming_the_rank_that_waited_never_explains_its_wait() -> None:
    # GPU: rank 1, 600 of a 1000 wait; host: rank 0, 100 (below half).
    gpu, host = verdict(1, 600), verdict(0, 100, "host_time")
    assert explaining_verdict(gpu, host, 1000, None, waiter=None) is gpu
    # Rank 1 is the one that waited: its GPU verdict is passed over in both rounds; the host's
    # names rank 0, below half, so it is taken in the second.
    assert explaining_verdict(gpu, host, 1000, None, waiter=1) is host
    # Rank 0 waited: the GPU verdict names rank 1, another rank: kept.
    assert explaining_verdict(gpu, host, 1000, None, waiter=0) is gpu
    # Every verdict names the waiter: none.
    assert explaining_verdict(gpu, verdict(1, 100, "host_time"), 1000, None, waiter=1) is None


def test_the_rank_kept_waiting_by_a_gpu_straggler() -> None:
    # Rank 0: GPU 1000, host compute 2000, waits 900 (host_time 2900). Rank 1: GPU 1900, host
    # compute 2000, no wait. GPU straggler: rank 1, excess 1900 - 1000 = 900 >= 900 / 2; host
    # compute is even (no straggler); ops even. Rank 0 waited 900 of its host time 2900 (no
    # window in its meta), clearly more than rank 1's 0.
    merged = merge_profiles([rank(0, 1000, 2000, 1500, 900), rank(1, 1900, 2000, 1500, 0)])
    waited, span, of_what, who, v = rank_story(merged)
    assert (waited, span, of_what, who) == (900, 2900, "its host time", 0)
    assert (v["metric"], v["rank"], v["excess"]) == ("gpu_time", 1, 900)
    f = rank_wait(evidence(merged))
    assert f is not None and f.lines == ["train.py:10"]
    # 900 / 2900 = 31%; the verdict's line, train.py:10, has all of rank 1's 900 ns more.
    assert f.figure == ("rank 0 waited 900 ns in collectives for another rank (31% of its host time, estimated "
                        "from the ranks' start times)" + RANK_WHY
                        + "rank 1 spends 900 ns more GPU time than the others, most on train.py:10 (+900 ns)")
    assert "balance rank 1's work" in f.remedy


def test_host_ops_time_explains_where_host_time_cannot() -> None:
    # Even GPU (1000) and host compute (2000); rank 1's ops take 2500 ns of host time against
    # rank 0's 1500: excess 1000 >= 600 / 2. Rank 0 waited 600 of 2600 (23%).
    merged = merge_profiles([rank(0, 1000, 2000, 1500, 600), rank(1, 1000, 2000, 2500, 0)])
    f = rank_wait(evidence(merged))
    assert f.figure.endswith("rank 1 spends 1.0 us more host op time than the others, most on train.py:10 (+1.0 us)")
    assert "(23% of its host time" in f.figure


def test_no_rank_computing_more_is_said_so() -> None:
    # Even in everything but the wait: rank 1 waited 300 of 2300 (13%); no straggler verdict.
    merged = merge_profiles([rank(0, 1000, 2000, 1500, 0), rank(1, 1000, 2000, 1500, 300)])
    f = rank_wait(evidence(merged))
    assert f.lines == []
    assert f.figure == ("rank 1 waited 300 ns in collectives for another rank (13% of its host time, estimated "
                        "from the ranks' start times)" + RANK_WHY + "no rank computes more than the others")


def test_a_wait_under_five_percent_of_the_span_is_no_finding() -> None:
    # 100 of 2100 = 4.8% < 5%; 120 of 2120 = 5.7% >= 5%.
    assert rank_wait(evidence(merge_profiles([rank(0, 1000, 2000, 1500, 100), rank(1, 1000, 2000, 1500, 0)]))) is None
    f = rank_wait(evidence(merge_profiles([rank(0, 1000, 2000, 1500, 120), rank(1, 1000, 2000, 1500, 0)])))
    assert f is not None and "(6% of its host time" in f.figure


def test_one_rank_has_no_story() -> None:
    one = rank(0, 1000, 2000, 1500, 0)
    assert rank_story(one) is None and rank_wait(evidence(one)) is None


def test_the_rank_that_waited_most_is_by_share_of_its_span() -> None:
    # Rank 0 waited 900 of a host time 9000 (10%); rank 1 waited 400 of 1600 (25%): rank 1 is
    # the one that waited most, though rank 0 waited more ns. Rank 0 computes 8100 on the host
    # against rank 1's 1200: host straggler rank 0, excess 6900. 400 is not more than 1.5 x 900:
    # no rank excluded.
    merged = merge_profiles([rank(0, 1000, 8100, 1500, 900), rank(1, 1000, 1200, 1500, 400)])
    waited, span, of_what, who, v = rank_story(merged)
    assert (waited, span, of_what, who) == (400, 1600, "its host time", 1)
    assert (v["metric"], v["rank"], v["excess"]) == ("host_time", 0, 6900)


@pytest.mark.parametrize("w0, excluded", [(700, False), (600, False), (500, True)])
def test_the_rank_that_waited_most_is_excluded_only_past_the_margin(w0, excluded) -> None:
    # Three ranks, each with a recording window of 10000 ns (so shares follow the waits). Rank 1
    # computes 3000 on the host against 2000 on ranks 0 and 2: host straggler rank 1, excess
    # 3000 - median(2000, 2000) = 1000. Rank 1 also waited most: 900; rank 2 waited 100, rank 0
    # w0. Excluded (the one kept waiting, so not the straggler) only when 900 > 1.5 x every other
    # rank's wait: 1.5 x 700 = 1050 and 1.5 x 600 = 900 are not below 900 (the ranks took
    # turns: rank 1's host verdict stands); 1.5 x 500 = 750 is — and then no verdict is left
    # (GPU and ops even).
    parts = [rank(0, 1000, 2000, 1500, w0, 3), rank(1, 1000, 3000, 1500, 900, 3), rank(2, 1000, 2000, 1500, 100, 3)]
    merged = merge_profiles(parts)
    merged.meta["ranks"] = [{"rank": r, "window": {"start": 0, "end": 10_000}} for r in range(3)]
    waited, span, of_what, who, v = rank_story(merged)
    assert (waited, span, of_what, who) == (900, 10_000, "its wall time", 1)
    if excluded:
        assert v is None
    else:
        assert (v["metric"], v["rank"], v["excess"]) == ("host_time", 1, 1000)


def test_a_wait_of_exactly_five_percent_is_a_finding() -> None:
    # 100 of 1900 + 100 = 2000: 5% exactly (0.05 x 2000 = 100.0 in floats too): at the threshold.
    f = rank_wait(evidence(merge_profiles([rank(0, 1000, 1900, 1500, 100), rank(1, 1000, 1900, 1500, 0)])))
    assert f is not None and "(5% of its host time" in f.figure


def test_a_rank_with_no_span_is_not_the_one_that_waited_most() -> None:
    # Rank 1 has no host time and no window: span 0, its share counted 0. Rank 0 waited 300 of
    # 2300 (13%): it is the one. Host straggler: rank 0 (2000 against 0), but rank 0 waited
    # clearly more (300 > 1.5 x 0): excluded; GPU and ops even: no verdict.
    merged = merge_profiles([rank(0, 1000, 2000, 1500, 300), rank(1, 1000, 0, 1500, 0)])
    assert rank_story(merged) == (300, 2300, "its host time", 0, None)


def test_a_wait_longer_than_its_span_is_said_as_all_of_it() -> None:
    # Rank 0's phase window holds 500 ns, its estimated wait 900: 180% is said as 100%.
    merged = merge_profiles([rank(0, 1000, 2000, 1500, 900), rank(1, 1900, 2000, 1500, 0)])
    merged.meta["phase"] = "steady"
    merged.meta["ranks"] = [{"rank": 0, "window": {"start": 0, "end": 900, "wall": 500}}, {"rank": 1}]
    f = rank_wait(evidence(merged))
    assert "rank 0 waited 900 ns in collectives for another rank (100% of its steady time" in f.figure
