"""dlpt/waits.py against its inputs: the `window`, `gpu_idle` and `memory` meta of one profile or
of a merged profile's ranks, summed here with plain Python from the dicts themselves. Written
for the mutants tools/mutate.py found alive in waits.py (docs/MUTATION.md)."""

from __future__ import annotations

import pytest
from conftest import synthetic_profile

from dlpt.frames import Frame
from dlpt.header import Header
from dlpt.waits import IDLE_PARTS, memory_peak, rank_window, waits

KERNEL = [([Frame("python", "step (t.py:3)", "t.py", 3, "step"), Frame("kernel", "k")], 1000)]

RANKS = [
    {"window": {"start": 100, "end": 5100},
     "gpu_idle": {"devices": {"0": {"window": 4000}, "1": {"window": 3000}}, "busy": 5000, "idle": 2000,
                  "host": 700, "sync": 600, "start-up": 300, "unattributed": 250, "queued": 150,
                  "after_sync": 40, "skipped": {"short": 3, "overlap": 1}}},
    {"window": {"start": 0, "end": 1, "wall": 700}},  # a phase's window: its wall, not its span; no GPU
    {"window": {"start": 0, "end": 9000},
     "gpu_idle": {"devices": {"0": {"window": 8000}}, "busy": 7000, "idle": 1000, "host": 1000,
                  "after_sync": 5, "skipped": {"short": 2}},
     "memory": {"peak_allocated": 10}},
    {"gpu_idle": {"devices": {"0": {}}}},  # an older profile: no window, no figures, each counts 0
]


def merged():
    prof = synthetic_profile(KERNEL)
    prof.meta["ranks"] = RANKS
    return prof


def test_a_merged_profiles_waits_are_its_ranks_summed() -> None:
    w = waits(merged())
    with_gpu = [r["gpu_idle"] for r in RANKS if "gpu_idle" in r]
    assert w.wall == max(r["window"].get("wall", r["window"]["end"] - r["window"]["start"]) for r in RANKS
                         if "window" in r)
    assert w.devices == sum(len(g["devices"]) for g in with_gpu)
    assert w.device_time == sum(d.get("window", 0) for g in with_gpu for d in g["devices"].values())
    assert w.busy == sum(g.get("busy", 0) for g in with_gpu)
    assert w.idle == sum(g.get("idle", 0) for g in with_gpu)
    assert w.idle_parts == {k: sum(g.get(k, 0) for g in with_gpu) for k in IDLE_PARTS}
    assert w.after_sync == sum(g.get("after_sync", 0) for g in with_gpu)
    assert w.skipped == {"short": 5, "overlap": 1}
    assert w.busy_share == pytest.approx(w.busy / w.device_time)
    js = w.to_json()
    assert (js["wall_time"], js["gpu_busy_time"], js["gpu_idle_time"]) == (w.wall, w.busy, w.idle)
    assert js["idle"] == {k: sum(g.get(k, 0) for g in with_gpu) for k in IDLE_PARTS}


def test_a_profile_without_gpu_figures_has_none() -> None:
    prof = synthetic_profile(KERNEL)
    prof.meta["window"] = {"start": 10, "end": 30}
    w = waits(prof)
    assert (w.wall, w.busy, w.idle, w.device_time, w.busy_share) == (20, None, None, None, None)
    assert "idle" not in w.to_json()
    # busy known, the window not: no share rather than a division by zero
    w.busy, w.device_time = 5, 0
    assert w.busy_share is None
    prof.meta["window"] = {"start": 30, "end": 30}  # an empty window is 0, not "unknown"
    assert waits(prof).wall == 0


@pytest.mark.parametrize("meta, want", [
    ({"window": {"start": 3, "end": 10}}, 7),
    ({"window": {"start": 3, "end": 10, "wall": 4}}, 4),
    ({"window": {"start": 3}}, None),
    ({"window": {"end": 3}}, None),
    ({}, None),
])
def test_rank_window(meta, want) -> None:
    assert rank_window(Header.from_dict(meta)) == (want, None)
    gi = {"busy": 1}
    assert rank_window(Header.from_dict({**meta, "gpu_idle": gi})) == (want, gi)
    assert rank_window(Header.from_dict({**meta, "gpu_idle": [1]})) == (want, None)


MEMORY = [
    {"memory": {"peak_allocated": 300, "peak_reserved": 400, "peak_at": "a.py:1", "peak_step": 2,
                "graph_pools": 7, "before_recording": 11}},
    {"memory": {"peak_allocated": 0, "peak_at": "no peak: skipped"}},
    {"memory": {"peak_allocated": 500, "peak_reserved": 900, "peak_at": "b.py:9", "peak_step": 5,
                "graph_pools": 1, "before_recording": 2, "oom": {"bytes": 3}}},
    {"memory": {"peak_allocated": 200, "peak_at": "c.py:4", "peak_step": 1}},
    {"memory": "not a dict"},
]


def test_memory_peak_sums_the_ranks_and_names_the_largest() -> None:
    prof = synthetic_profile(KERNEL)
    prof.meta["ranks"] = MEMORY
    prof.meta["timeline"] = {"allocated": [1, 2]}  # a merged profile has no one series
    got = memory_peak(prof)
    mems = [m["memory"] for m in MEMORY if isinstance(m["memory"], dict) and m["memory"]["peak_allocated"]]
    largest = max(mems, key=lambda m: m["peak_allocated"])
    assert got is not None
    assert got.peak_allocated == sum(m["peak_allocated"] for m in mems)
    for k in ("peak_reserved", "graph_pools", "before_recording"):
        assert getattr(got, k) == sum(m.get(k, 0) for m in mems), k
    assert (got.peak_at, got.peak_step, got.oom) == (largest["peak_at"], largest["peak_step"], largest["oom"])
    assert got.series == []
    assert got.to_json()["peak_allocated"] == got.peak_allocated


def test_memory_peak_of_one_profile_keeps_its_series() -> None:
    prof = synthetic_profile(KERNEL)
    prof.meta.update(MEMORY[0], timeline={"allocated": [5, 300, 20]})
    got = memory_peak(prof)
    assert got is not None and got.series == [5, 300, 20] and got.peak_allocated == 300
    assert memory_peak(synthetic_profile(KERNEL)) is None
