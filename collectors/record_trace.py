"""Device events of a profiler window from Kineto's own chrome trace (`kineto_results.save`).

`kineto_results.events()` makes a pybind `KinetoEvent` for every host op, runtime call and
device activity (about 3 per kernel), and every field read is another call: on an H100 that was
1.9 s per 100k kernels. `save()` writes the same activities from C++, and a typed msgspec decode
reads back only the few fields the recorder needs, skipping the rest unbuilt. Measured on an
H100 it is nonetheless slower (the JSON holds every op and flow of the window too: 2.2 s against
1.5 s per 100k kernels), so the recorder uses it only when DLPT_DEVICE_EVENTS=trace.

How the fields line up with the live tree (checked against torch 2.13 on CPU, and on the GPU by
`bench/bench_record.py --compare`, which records with both sources):
- an op's `args["External id"]` is its tree node's `correlation_id`; a device event's
  `External id` is `KinetoEvent.linked_correlation_id()` (the launching op) and its
  `args.correlation` is `KinetoEvent.correlation_id()` (the runtime call's, as in the tree);
- `ts` is microseconds with three decimals since `baseTimeNanoseconds`: `base + round(ts*1e3)`
  is the tree's `start_time_ns` to the nanosecond (a float64 of ~4e12 µs keeps 0.25 ns);
- `args.device`/`args.stream` are `device_index()`/`device_resource_id()`, `args.bytes` is
  `nbytes()` for copies and sets.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import msgspec


class _Args(msgspec.Struct, gc=False):
    correlation: int = -1
    external: int = msgspec.field(name="External id", default=-1)
    bytes: int = 0
    device: int = -1
    stream: int = -1


class _Event(msgspec.Struct, gc=False):
    cat: str = ""
    name: str = ""
    ts: int | float = 0
    dur: int | float = 0
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]
    baseTimeNanoseconds: int = 0


_DECODER = msgspec.json.Decoder(_Trace)
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class DeviceColumns:
    """One window's device activities as columns, in the trace's order."""

    __slots__ = ("cat", "name", "corr", "linked", "device", "stream", "start", "dur", "nbytes", "skipped")

    def __init__(self) -> None:
        self.cat: list[str] = []
        self.name: list[str] = []
        self.corr: list[int] = []
        self.linked: list[int] = []
        self.device: list[int] = []
        self.stream: list[int] = []
        self.start: list[int] = []
        self.dur: list[int] = []
        self.nbytes: list[int] = []
        self.skipped: dict[str, int] = {}


def _tmp_dir() -> str:
    # tmpfs where there is one: the file is written and read once, a disk adds nothing.
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def read_trace(kr: Any) -> _Trace | None:
    """`kr`'s chrome trace, decoded; None where it cannot be written or read strictly. torch
    writes a result's trace once only ("Trace is already saved")."""
    fd, path = tempfile.mkstemp(prefix="dlpt-window-", suffix=".json", dir=_tmp_dir())
    os.close(fd)
    try:
        kr.save(path)
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, RuntimeError):
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        tr = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return tr


def device_columns(kr: Any) -> DeviceColumns | None:
    """The device events of `kr` (a live `_ProfilerResult`), or None where its trace cannot be
    written or read strictly (the caller then falls back to `kr.events()`)."""
    tr = read_trace(kr)
    if tr is None:
        return None
    base = tr.baseTimeNanoseconds or 0
    out = DeviceColumns()
    dev = [e for e in tr.traceEvents if e.cat in DEVICE_CATS and e.args is not None]
    skipped = out.skipped
    for e in tr.traceEvents:
        c = e.cat
        if c.startswith("gpu_") and c not in DEVICE_CATS:
            skipped[c] = skipped.get(c, 0) + 1  # gpu_user_annotation spans are not GPU time
    del tr
    args = [e.args for e in dev]
    out.cat = [e.cat for e in dev]
    out.name = [e.name for e in dev]
    out.corr = [a.correlation for a in args]
    out.linked = [a.external for a in args]
    out.device = [a.device for a in args]
    out.stream = [a.stream for a in args]
    out.nbytes = [max(a.bytes, 0) for a in args]
    out.start = [base + round(e.ts * 1000) for e in dev]
    out.dur = [round(e.dur * 1000) for e in dev]
    return out
