"""GPU memory from the `[memory]` events of imported Kineto traces (profile_memory=True)."""

from __future__ import annotations

import functools
import gzip
import json
import os

import numpy as np
import pytest

from dlpt.collectors.kineto import import_traces
from dlpt.memory import BEFORE_RECORDING
from dlpt.metrics import COL

DATA = os.path.join(os.path.dirname(__file__), "data", "kineto")
TRACE = os.path.join(DATA, "hta_memory_rank1.json.gz")
SPAN_CATS = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy",
             "gpu_memset"}


def count_from_json(events):
    """What the metrics must be, straight from the events: bytes and number of CUDA allocations
    in the window, each device's peak of "Total Allocated", the in-window blocks live then."""
    window = min(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") in SPAN_CATS)
    mem = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1),
                 key=lambda e: e["ts"])
    alloc = [e["args"]["Bytes"] for e in mem if e["ts"] >= window and e["args"]["Bytes"] > 0]
    peaks = {}
    for d in {e["args"]["Device Id"] for e in mem}:
        dm = [e for e in mem if e["args"]["Device Id"] == d]
        tot = [e["args"]["Total Allocated"] for e in dm]
        p = tot.index(max(tot))
        live = {}
        for e in dm[:p + 1]:
            a, b = e["args"]["Addr"], e["args"]["Bytes"]
            if b > 0 and e["ts"] >= window:
                live[a] = b
            elif b < 0:
                live.pop(a, None)
        peaks[d] = (tot[p], sum(live.values()))
    return sum(alloc), len(alloc), peaks


def row(prof, name):
    for i, f in enumerate(prof.cct.frame.tolist()):
        if prof.frames[f].name == name:
            return i
    return None


def test_real_trace_memory_equals_independent_count():
    with gzip.open(TRACE) as f:
        events = json.load(f)["traceEvents"]
    want_bytes, want_count, peaks = count_from_json(events)
    prof = import_traces(TRACE)
    inc, exc = prof.cct.inclusive, prof.cct.exclusive
    assert want_count > 1000  # the test means something
    assert inc[0, COL["alloc_bytes"]] == want_bytes
    assert inc[0, COL["alloc_count"]] == want_count
    peak = sum(p for p, _ in peaks.values())
    live = sum(v for _, v in peaks.values())
    m = prof.meta["memory"]
    assert m["peak_allocated"] == peak
    assert inc[0, COL["peak_bytes"]] == peak
    # Live at the peak, line by line, plus the named remainder from before the trace.
    before = row(prof, f"<unattributed: {BEFORE_RECORDING}>")
    assert before is not None
    assert exc[before, COL["peak_bytes"]] == peak - live == m["before_recording"]
    assert inc[0, COL["peak_bytes"]] - exc[before, COL["peak_bytes"]] == live
    assert (exc[:, [COL["alloc_bytes"], COL["alloc_count"], COL["peak_bytes"]]] >= 0).all()
    assert (exc[:, COL["peak_bytes"]] <= exc[:, COL["alloc_bytes"]])[np.arange(len(exc)) != before].all()
    # The reserved peak is the allocator's, and the timeline stays bounded and holds the peak.
    reserved = max(e["args"]["Total Reserved"] for e in events
                   if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1)
    assert m["peak_reserved"] == reserved
    tl = prof.meta["timeline"]
    assert len(tl["allocated"]) <= 2000 and max(tl["allocated"]) == peak
    assert len(tl["mem_t"]) == len(tl["allocated"]) == len(tl["reserved"])


def _trace(tmp_path, events):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    return str(p)


def _mem_event(ts, addr, nbytes, total, tid=1, device_type=1):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts,
            "args": {"Device Type": device_type, "Device Id": 0, "Addr": addr, "Bytes": nbytes, "Total Allocated": total,
                     "Total Reserved": 4 << 20}}


# c10::DeviceType as Kineto writes it: 1 CUDA; 6 HIP, what ROCm builds of torch record (issue #34:
# a TraceLens MI300X trace's memory was ignored). A CPU event (0) among them is not GPU memory.
@pytest.mark.parametrize("device_type", [1, 6])
def test_events_before_the_window_and_lone_frees_are_the_remainder(tmp_path, device_type):
    mib = 1 << 20
    _mem = functools.partial(_mem_event, device_type=device_type)
    events = [
        _mem_event(1, 900, 64 * mib, 64 * mib, device_type=0),  # host memory: never GPU memory
        _mem(5, 100, mib, 3 * mib),  # before the first op: allocated before the recording
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
        _mem(12, 200, 2 * mib, 5 * mib),  # aten::empty's
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 30, "dur": 10},
        _mem(32, 300, -mib, 4 * mib),  # a free of a block never seen allocated
        _mem(34, 400, mib, 5 * mib),  # aten::add's
        _mem(50, 500, 512, 5 * mib + 512, tid=7),  # a thread with no span around it
        {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 60, "dur": 10},
        _mem(62, 200, -2 * mib, 3 * mib + 512),
    ]
    prof = import_traces(_trace(tmp_path, events))
    exc = prof.cct.exclusive
    m = prof.meta["memory"]
    assert m["peak_allocated"] == 5 * mib + 512
    assert m["unmatched_frees"] == 1
    empty, add = row(prof, "aten::empty"), row(prof, "aten::add")
    assert exc[empty, COL["alloc_bytes"]] == exc[empty, COL["peak_bytes"]] == 2 * mib
    assert exc[add, COL["alloc_bytes"]] == exc[add, COL["peak_bytes"]] == mib
    outside = row(prof, "<unattributed: memory outside any op>")
    assert exc[outside, COL["peak_bytes"]] == 512
    before = row(prof, f"<unattributed: {BEFORE_RECORDING}>")
    assert exc[before, COL["peak_bytes"]] == 2 * mib == m["before_recording"]
    assert exc[before, COL["alloc_bytes"]] == 0
    assert prof.cct.inclusive[0, COL["peak_bytes"]] == m["peak_allocated"]
    assert prof.cct.inclusive[0, COL["alloc_count"]] == 3
    # The allocation that made the peak had no span around it.
    assert m["peak_at"] == "<unattributed: memory outside any op>"


def test_trace_without_memory_events_has_no_memory_meta():
    prof = import_traces(os.path.join(DATA, "copies.pt.trace.json.gz"))
    assert "memory" not in prof.meta
    assert not prof.cct.inclusive[0, COL["alloc_bytes"]]


def test_the_recording_begins_at_its_first_event_on_the_host_or_the_gpu(tmp_path):
    """A kernel at 3 µs, before the first host span (10 µs): the recording began with it, so an
    allocation at 5 µs is in it (no span around it), not from before it; one at 2 µs is."""
    mib = 1 << 20
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 40, "dur": 1,
         "args": {"device": 0, "stream": 7, "correlation": 2}},
        _mem_event(2, 100, mib, mib),
        _mem_event(5, 200, 2 * mib, 3 * mib),
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
    ]
    prof = import_traces(_trace(tmp_path, events))
    exc = prof.cct.exclusive
    assert exc[row(prof, f"<unattributed: {BEFORE_RECORDING}>"), COL["peak_bytes"]] == mib
    outside = row(prof, "<unattributed: memory outside any op>")
    assert exc[outside, COL["alloc_bytes"]] == exc[outside, COL["peak_bytes"]] == 2 * mib
