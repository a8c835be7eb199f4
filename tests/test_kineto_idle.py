"""Idle, sync and host time of imported Kineto traces: on the real H200 traces, the totals equal a
computation straight from the JSON (written here on its own: the standard library's decoder, a
sort-and-merge loop) and the tree conserves them; on small traces, where each figure lands."""

from __future__ import annotations

import json
import re

import pytest
from conftest import raw_events, trace_path
from kineto_builder import TraceBuilder

from dlpt import idle
from dlpt.collectors.kineto import import_traces
from dlpt.metrics import COL
from dlpt.waits import waits

GPU = {"kernel", "gpu_memcpy", "gpu_memset"}
SYNC = re.compile(r"^(cuda|cu|hip)\w*Synchronize$")


def _ns(us) -> int:
    return round(us * 1000)


def _truth(events):
    """Per device: window (first start, last end) and busy (the union's length); the sum of the
    synchronize calls; the host time of each Python thread (the union of its Python events)."""
    per_dev: dict[int, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU:
            s = _ns(e["ts"])
            per_dev.setdefault(e["args"]["device"], []).append((s, s + _ns(e["dur"])))
    devices = {}
    for d, iv in per_dev.items():
        iv.sort()
        busy, cur_s, cur_e = 0, None, None
        for s, e in iv:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        window = max(e for _, e in iv) - min(s for s, _ in iv)
        devices[d] = {"window": window, "busy": busy, "idle": window - busy}
    sync = sum(_ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
               and SYNC.match(e["name"]))
    return devices, sync


def test_real_traces_idle_and_sync_equal_the_json(trace_name):
    prof = import_traces(str(trace_path(trace_name)))
    devices, sync = _truth(raw_events(trace_name))
    gi = prof.meta["gpu_idle"]
    for d, t in devices.items():
        got = gi["devices"][str(d)]
        assert (got["window"], got["busy"], got["idle"]) == (t["window"], t["busy"], t["idle"]), d
        assert got["start-up"] == 0  # a trace's window starts at the device's first activity
    assert gi["idle"] == sum(t["idle"] for t in devices.values())
    assert gi["busy"] == sum(t["busy"] for t in devices.values())
    exc = prof.cct.exclusive.sum(axis=0)
    assert int(exc[COL["sync_time"]]) == sync > 0
    # Conservation: the tree holds all the idle, split into host, sync, start-up and unattributed.
    assert int(exc[COL["gpu_idle_time"]]) == gi["idle"] == (gi["host"] + gi["sync"] + gi["start-up"] + gi["unattributed"]
                                                         + gi["queued"])
    assert int(prof.cct.inclusive[0, COL["gpu_idle_time"]]) == gi["idle"]
    assert gi["skipped"] == {}
    w = waits(prof)
    assert w.wall == prof.meta["window"]["end"] - prof.meta["window"]["start"] >= max(t["window"] for t in devices.values())
    assert 0 < w.busy_share < 1
    assert len(prof.meta["timeline"]["t"]) == len(prof.meta["timeline"]["gpu_busy"]) <= idle.TIMELINE_BINS


def test_real_traces_host_time_is_each_python_threads_busy_time(trace_name):
    """The self times of nested Python events add up to the time the thread had any open."""
    prof = import_traces(str(trace_path(trace_name)))
    by_thread: dict[tuple, list[tuple[int, int]]] = {}
    for e in raw_events(trace_name):
        if e.get("ph") == "X" and e.get("cat") == "python_function":
            s = _ns(e["ts"])
            by_thread.setdefault((e["pid"], e["tid"]), []).append((s, s + _ns(e["dur"])))
    total = 0
    for iv in by_thread.values():
        iv.sort()
        reach = None
        for s, e in iv:
            if reach is None or s >= reach:
                total += e - s
                reach = e
            # else: inside the open top-level event (an overrun is clipped to it by nesting)
    assert int(prof.cct.exclusive[:, COL["host_time"]].sum()) == total > 0


def _one_line_program(tmp_path):
    """A loop of 4 steps: line 10 launches a 10 us kernel; line 11 sleeps 100 us (`time.sleep`);
    line 12 synchronizes (50 us in cudaStreamSynchronize under aten::item)."""
    tb = TraceBuilder()
    t = 1000.0
    tb.py(5, "main", t - 10, 4 * 200 + 20)
    for _ in range(4):
        tb.py(10, "step", t, 20)
        tb.kernel(t + 2, 5, t + 10, 10)
        tb.py(11, "step", t + 20, 100)
        tb.py(12, "step", t + 120, 60)
        tb.op("aten::item", t + 121, 55)
        tb.runtime("cudaStreamSynchronize", t + 122, 50)
        t += 200
    return import_traces(str(tb.write(tmp_path / "p.pt.trace.json.gz")))


def _by_line(prof, metric):
    out: dict[int, int] = {}
    for i in range(len(prof.cct.parent)):
        f = prof.frame_of(i)
        for j in prof.cct.path(i)[::-1]:
            g = prof.frame_of(j)
            if g.kind == "python" and g.line:
                out[g.line] = out.get(g.line, 0) + int(prof.cct.exclusive[i, COL[metric]])
                break
        else:
            if f.kind == "unattributed":
                out[f.name] = out.get(f.name, 0) + int(prof.cct.exclusive[i, COL[metric]])
    return {k: v for k, v in out.items() if v}


def test_idle_lands_on_the_lines_running_during_each_gap(tmp_path):
    prof = _one_line_program(tmp_path)
    gi = prof.meta["gpu_idle"]
    # Window: the first kernel's start (1010 us) to the last one's end (1620): 610 us, 40 busy.
    assert (gi["idle"], gi["busy"]) == (570_000, 40_000)
    idle_by = _by_line(prof, "gpu_idle_time")
    # Each of the 3 gaps (190 us, from a kernel's end to the next one's start): line 11 runs
    # 100 us of it, line 12 60 (its own time, aten::item's and the synchronize inside), main
    # (line 5) 20 between the steps, and line 10 7.5 until its cudaLaunchKernel (t+2.5, 5 us)
    # returns; from then to the kernel's start (t+10) the work is queued: 2.5 us, not the host's.
    queued = f"<unattributed: {idle.IDLE_QUEUED}>"
    assert idle_by == {11: 300_000, 12: 180_000, 5: 60_000, 10: 22_500, queued: 7_500}
    assert gi["queued"] == 7_500
    assert sum(idle_by.values()) == gi["idle"]
    assert gi["sync"] == 3 * 50_000 and gi["unattributed"] == 0
    sync_by = _by_line(prof, "sync_time")
    assert sync_by == {12: 4 * 50_000}
    host_by = _by_line(prof, "host_time")
    assert host_by[11] == 4 * 100_000 and host_by[12] == 4 * 60_000 and host_by[10] == 4 * 20_000
    assert host_by[5] == 4 * 200 * 1000 + 20_000 - 4 * 180_000


def test_bad_gpu_events_and_clocks_are_counted_never_raised(tmp_path):
    tb = TraceBuilder()
    tb.py(3, "f", 0, 50)
    tb.kernel(1, 2, 20, 10)
    corr = tb.runtime("cudaLaunchKernel", 30, 1)
    tb.gpu("kernel", "void late<1>()", 25, 10, corr)  # overlaps and out of order
    tb.events.append({"ph": "X", "cat": "kernel", "name": "void nodev<1>()", "pid": "?", "tid": "?", "ts": 40,
                      "dur": 5, "args": {"stream": 7, "correlation": 1}})  # no device id anywhere
    tb.events.append({"ph": "X", "cat": "kernel", "name": "void neg<1>()", "pid": 0, "tid": 7, "ts": 40,
                      "dur": -5, "args": {"device": 0, "stream": 7, "correlation": 2}})
    prof = import_traces(str(tb.write(tmp_path / "bad.pt.trace.json.gz")))
    gi = prof.meta["gpu_idle"]
    assert gi["devices"]["0"]["window"] == 15_000 and gi["devices"]["0"]["busy"] == 15_000
    assert gi["skipped"] == {idle.NO_DEVICE: 1}
    assert prof.meta["skipped_events"] >= 1  # the negative duration, counted by the reader
    # Host events on a clock far from the GPU's: nothing blamed, all of it said.
    tb = TraceBuilder()
    tb.py(3, "f", 0, 50)
    tb.op("aten::add", 1, 3)
    corr = tb.runtime("cudaLaunchKernel", 2, 1)
    tb.gpu("kernel", "void a<1>()", 1e6, 10, corr)
    corr = tb.runtime("cudaLaunchKernel", 3, 1)
    tb.gpu("kernel", "void b<1>()", 1e6 + 50, 10, corr)
    prof = import_traces(str(tb.write(tmp_path / "clock.pt.trace.json.gz")))
    gi = prof.meta["gpu_idle"]
    assert idle.HOST_CLOCK in gi["skipped"] and gi["unattributed"] == gi["idle"] == 40_000
    assert int(prof.cct.exclusive[:, COL["gpu_idle_time"]].sum()) == 40_000


def test_trace_without_gpu_work_has_a_host_window_and_no_idle(tmp_path):
    tb = TraceBuilder()
    tb.py(3, "f", 10, 50)
    tb.py(4, "g", 20, 10)
    prof = import_traces(str(tb.write(tmp_path / "cpu.pt.trace.json.gz")))
    assert prof.meta["window"]["end"] - prof.meta["window"]["start"] == 50_000
    assert "gpu_idle" not in prof.meta
    w = waits(prof)
    assert w.wall == 50_000 and w.busy is None and w.host_time == 50_000
    json.dumps(prof.meta.to_dict())  # the meta stays JSON


@pytest.mark.parametrize("name", ["hipStreamSynchronize", "cuCtxSynchronize", "cudaEventSynchronize"])
def test_other_synchronize_calls_count(tmp_path, name):
    tb = TraceBuilder()
    tb.py(3, "f", 0, 100)
    tb.kernel(1, 2, 5, 10)
    tb.op("aten::item", 10, 50)
    tb.runtime(name, 11, 40)
    prof = import_traces(str(tb.write(tmp_path / "s.pt.trace.json.gz")))
    assert int(prof.cct.exclusive[:, COL["sync_time"]].sum()) == 40_000
