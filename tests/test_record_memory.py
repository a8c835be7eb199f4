"""collectors/record/memory.py: the native memory figures into metric columns, a named remainder,
meta and a timeline (the native side runs on GPU machines: bench/gpu_cases/memory_truth.py)."""

from __future__ import annotations

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.record.memory import add_memory, series
from dlpt.frames import Frame, FrameTable, source_frame
from dlpt.header import Header
from dlpt.memory import BEFORE_RECORDING
from dlpt.metrics import COL


def col(*v):
    return np.asarray(v, dtype=np.int64).tobytes()


def raw(**over):
    d = {"recorded": True, "error": "",
         "alloc_node": col(1, 2), "alloc_bytes": col(3 << 20, 1 << 20), "alloc_count": col(3, 1),
         "peak_device": col(0, 0), "peak_node": col(1, 2), "peak_bytes": col(2 << 20, 1 << 20),
         "pool_device": col(0), "pool_node": col(2), "pool_bytes": col(20 << 20),
         "oom_node": col(1), "oom_bytes": col(2 << 20),
         "dev_id": col(0), "dev_peak": col((3 << 20) + 4096), "dev_before": col(4096),
         "dev_reserved_peak": col(40 << 20), "dev_peak_node": col(2), "dev_peak_step": col(3),
         "dev_peak_time": col(0), "dev_allocated": col(0), "dev_reserved": col(0),
         "dev_unmatched_frees": col(1), "dev_unmatched_bytes": col(512),
         "series_bin": col(0, 3), "series_hi_alloc": col(10, 30), "series_hi_reserved": col(20, 40),
         "series_last_alloc": col(5, 25), "series_last_reserved": col(20, 40),
         "series_t0": 0, "series_width": 1000, "end": 0, "oom_device": 0, "oom_requested": 1 << 40,
         "oom_free": 1 << 30, "ooms": 1, "events": 9, "live_blocks": 2, "approx": 0}
    d.update(over)
    return d


def tree():
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    n1 = b.child(0, frames.intern(source_frame("/x/model.py", 10, "f")))
    n2 = b.child(n1, frames.intern(source_frame("/x/model.py", 12, "g")))
    return frames, b, np.array([0, n1, n2])


def test_columns_remainder_and_meta():
    frames, b, nmap = tree()
    out, meta = ActivityColumns(), Header()
    add_memory(raw(), nmap, b, frames, out, meta)
    prof = build_profile(b, frames, out, meta)
    inc, exc = prof.cct.inclusive, prof.cct.exclusive
    assert inc[0, COL["alloc_bytes"]] == 4 << 20 and inc[0, COL["alloc_count"]] == 4
    # Every byte of the peak is on a line or on the named remainder.
    assert inc[0, COL["peak_bytes"]] == meta["memory"]["peak_allocated"] == (3 << 20) + 4096
    rest = [i for i, f in enumerate(prof.cct.frame.tolist()) if prof.frames[f].name.endswith(BEFORE_RECORDING + ">")]
    assert len(rest) == 1 and exc[rest[0], COL["peak_bytes"]] == 4096
    m = meta["memory"]
    assert m["peak_at"] == "/x/model.py:12" and m["peak_step"] == 3 and m["peak_reserved"] == 40 << 20
    assert m["graph_pools"] == 20 << 20 and m["graph_pool_lines"] == [{"at": "/x/model.py:12", "bytes": 20 << 20}]
    assert m["oom"]["lines"] == [{"at": "/x/model.py:10", "bytes": 2 << 20}]
    assert m["devices"]["0"]["unmatched_frees"] == 1


def test_series_carries_levels_through_empty_bins():
    t, a, r = series(raw())
    assert t == [0, 1000, 2000, 3000]
    # Bins 1 and 2 had no event: they hold what bin 0 ended with; bin 3 starts from it too.
    assert a == [10, 5, 5, 30] and r == [20, 20, 20, 40]


def test_not_recorded():
    frames, b, nmap = tree()
    out, meta = ActivityColumns(), Header()
    add_memory(raw(recorded=False), nmap, b, frames, out, meta)
    assert meta == Header() and out.extra == {}
    add_memory(raw(recorded=False, error="the CUDA allocator has no trace hook"), nmap, b, frames, out, meta)
    assert meta["memory"] == {"recorded": False, "why": "the CUDA allocator has no trace hook"}
    add_memory(None, nmap, b, frames, out, meta)
