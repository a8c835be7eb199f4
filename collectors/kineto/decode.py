"""Typed, selective decoding of Kineto (chrome trace) JSON.

Decoding every field of every event into dicts is what makes generic trace tools slow: a
146 MB trace has hundreds of thousands of events whose `args` carry shapes, strides and
concrete inputs that attribution never reads. msgspec decodes straight into the few typed fields
below and skips the rest without building them.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from dlpt.collectors.kineto.nonfinite import nonfinite_at, nonfinite_error, quote_nonfinite
from dlpt.errors import DlptError
from dlpt.metrics import KERNEL, MEMCPY_OTHER, MEMSET


# The strict types below are what torch.profiler writes; decoding into them is one C pass with
# no per-event Python work. `gc=False`: these structs cannot form reference cycles, and half a
# million GC-tracked objects made every collection while linking walk them all (about a second
# on a 500k-event trace).
class Args(msgspec.Struct, gc=False):
    correlation: int = -1
    seq: int = msgspec.field(name="Sequence number", default=-1)
    bytes: int = 0
    device: int = -1
    stream: int = -1
    name: str | None = None
    # A `[memory]` event's (collectors/kineto/memory.py): "Bytes" is signed, unlike a copy's "bytes".
    addr: int = msgspec.field(name="Addr", default=-1)
    mem_bytes: int = msgspec.field(name="Bytes", default=0)
    device_type: int = msgspec.field(name="Device Type", default=-1)
    device_id: int = msgspec.field(name="Device Id", default=-1)
    total_allocated: int = msgspec.field(name="Total Allocated", default=-1)
    total_reserved: int = msgspec.field(name="Total Reserved", default=-1)
    # A `process_labels` metadata event's: Kineto labels each process row "CPU" or "GPU N"
    # (columns.py tells device rows from host rows by it).
    labels: str | None = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: int | float | None = None
    dur: int | float = 0
    id: int | str | None = None
    args: Args | None = None


class DistributedInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None


class _TraceHeader(msgspec.Struct, kw_only=True):
    """The top-level fields of a trace besides its events, shared by the strict and lenient shapes."""

    baseTimeNanoseconds: Any = None
    distributedInfo: DistributedInfo | None = None
    deviceProperties: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    traceName: Any = None
    schemaVersion: Any = None


class Trace(_TraceHeader, kw_only=True):
    """A decoded trace. `traceEvents` always holds strict `Event`s: after a lenient decode, a
    damaged span or GPU event stays in the list as one with `ts=None` (see `_clean`), so that
    the linker counts it where it counts its own skips."""

    traceEvents: list[Event]


# Lenient shapes, for traces that the strict types reject (a string where a number belongs, a
# null duration, args that are not an object): the same fields, wire names and defaults as the
# strict types above, made from them so the trace's shape is written down once, but each field
# decoded as whatever it is; `_clean` turns each event into a strict one, or marks it damaged,
# by the linker's rules.
def _lenient(strict: type[msgspec.Struct], name: str, **types: Any) -> type[msgspec.Struct]:
    """`strict`'s fields, each typed `Any` unless `types` names its type."""
    fields = [(f.name, types.get(f.name, Any), msgspec.field(name=f.encode_name, default=f.default))
              for f in msgspec.structs.fields(strict)]
    return msgspec.defstruct(name, fields, gc=False)


if TYPE_CHECKING:
    # Made at run time from the strict classes' fields: to a type checker, the same fields.
    _LenientArgs = Args
    _LenientEvent = Event
else:
    _LenientArgs = _lenient(Args, "_LenientArgs")
    # Raw: args of any shape survive decoding; only those of the events that need them are
    # decoded, one by one. None: the event has no args.
    _LenientEvent = _lenient(Event, "_LenientEvent", args=msgspec.Raw)


class _LenientTrace(_TraceHeader, kw_only=True):
    traceEvents: list[_LenientEvent]


_decoder = msgspec.json.Decoder(Trace)
_lenient_decoder = msgspec.json.Decoder(_LenientTrace)
_args_decoder = msgspec.json.Decoder(_LenientArgs)
# A list of events: a slice of a large trace, or a trace in the JSON-array form.
_events_decoder = msgspec.json.Decoder(list[Event])
_lenient_events_decoder = msgspec.json.Decoder(list[_LenientEvent])

# Categories whose events the linker reads. Host span kinds, in the order that breaks ties of
# equal start and end: the outer one first.
PY, ANNOT, OP, LAUNCH = 0, 1, 2, 3
HOST_CATS = {
    "python_function": PY, "user_annotation": ANNOT, "cpu_op": OP, "Operator": OP,
    "cuda_runtime": LAUNCH, "cuda_driver": LAUNCH, "Runtime": LAUNCH,
}
GPU_CATS = {
    "kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY_OTHER, "Memcpy": MEMCPY_OTHER,
    "gpu_memset": MEMSET, "Memset": MEMSET,
}
_SPAN_CATS = frozenset(HOST_CATS)
_GPU_CATS = frozenset(GPU_CATS)
_DAMAGED = Event(ph="X", cat="cpu_op", ts=None)


def as_int(x: object, default: int = -1) -> int:
    """`x` if it is an int (not a bool), else `default`: how the importer reads an id or number
    that a damaged trace may hold as anything."""
    return x if isinstance(x, int) and not isinstance(x, bool) else default


def _number(x: object) -> bool:
    """A finite int or float (not bool): what a timestamp or duration may be."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return not (isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))))


def _hashable(x: object) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _args(raw: Any) -> _LenientArgs | None:
    if raw is None:
        return None
    try:
        a = _args_decoder.decode(raw)
    except msgspec.ValidationError:  # args that are not an object: as if there were none
        return None
    return a


def _clean(e: _LenientEvent) -> Event | None:
    """The strict event the linker would make of `e`, `_DAMAGED` (an event it counts as skipped),
    or None for one it ignores. Follows link.py's rules for each kind of event."""
    ph, cat = e.ph, e.cat
    if not isinstance(ph, str) or not isinstance(cat, str):
        return None
    if ph == "X" and (cat in _SPAN_CATS or cat in _GPU_CATS):
        if not _number(e.ts) or not (e.dur is None or _number(e.dur)) or not isinstance(e.name, str):
            return _DAMAGED
        span = cat in _SPAN_CATS
        if span and not (_hashable(e.pid) and _hashable(e.tid)):
            return _DAMAGED
        a = _args(e.args)
        args = None
        if a is not None:
            args = Args(correlation=as_int(a.correlation), seq=as_int(a.seq), bytes=as_int(a.bytes, 0),
                        device=as_int(a.device), stream=as_int(a.stream))
        # GPU events read pid/tid only as device/stream numbers; spans use them as a thread key.
        pid, tid = (e.pid, e.tid) if span else (as_int(e.pid), as_int(e.tid))
        return Event(ph=ph, cat=cat, name=e.name, pid=pid, tid=tid, ts=e.ts,
                     dur=0 if e.dur is None else e.dur, args=args)
    if (ph == "s" or ph == "f") and cat == "fwdbwd":
        if not _number(e.ts) or not (_hashable(e.pid) and _hashable(e.tid)):
            return None
        fid = e.id if not isinstance(e.id, (list, dict)) else None
        return Event(ph=ph, cat=cat, pid=e.pid, tid=e.tid, ts=e.ts, id=fid)
    if ph == "i" and e.name == "[memory]":
        return _clean_memory(e)
    if ph == "M" and e.name == "thread_name":
        a = _args(e.args)
        if a is None or not isinstance(a.name, str) or not (_hashable(e.pid) and _hashable(e.tid)):
            return None
        return Event(ph=ph, name="thread_name", pid=e.pid, tid=e.tid, args=Args(name=a.name))
    if ph == "M" and e.name == "process_labels":
        a = _args(e.args)
        if a is None or not isinstance(a.labels, str) or not _pid(e.pid):
            return None
        return Event(ph=ph, name="process_labels", pid=e.pid, args=Args(labels=a.labels))
    if ph == "X" and _pid(e.pid):
        # A kind the linker does not read: kept (pid and category only) so that columns.py can
        # count it when it sits on a device's row, as it does after a strict decode.
        return Event(ph=ph, cat=cat, pid=e.pid)
    return None


def _pid(x: object) -> bool:
    """A pid the strict `Event` could hold."""
    return isinstance(x, (int, str)) and not isinstance(x, bool)


def _clean_memory(e: _LenientEvent) -> Event | None:
    """A `[memory]` event with the fields memory.py reads as numbers, or None."""
    a = _args(e.args)
    if a is None or not _number(e.ts) or not (_hashable(e.pid) and _hashable(e.tid)):
        return None
    args = Args(addr=as_int(a.addr), mem_bytes=as_int(a.mem_bytes, 0), device_type=as_int(a.device_type),
                device_id=as_int(a.device_id), total_allocated=as_int(a.total_allocated),
                total_reserved=as_int(a.total_reserved))
    return Event(ph="i", name="[memory]", pid=e.pid, tid=e.tid, ts=e.ts, args=args)


def _decode_lenient(data: bytes | bytearray) -> Trace:
    t = _lenient_decoder.decode(data)
    events = [c for c in map(_clean, t.traceEvents) if c is not None]
    header = {f: getattr(t, f) for f in _TraceHeader.__struct_fields__}
    return Trace(traceEvents=events, **header)


def read_bytes(path: str) -> bytes:
    """The trace's JSON bytes, gunzipped when the file is gzip (by content, not by name)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DlptError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DlptError(f"{path}: is a directory with no traces in it") from None
    except OSError as e:
        raise DlptError(f"{path}: cannot read: {e.strerror or e}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DlptError(f"{path}: the gzip data is damaged or cut short ({e}); "
                            "re-export or re-copy the trace") from None
    elif path.endswith(".gz"):
        raise DlptError(f"{path}: named .gz but is not gzip data")
    if data[:3] == b"\xef\xbb\xbf":
        data = data[3:]
    elif data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        # Some tools save JSON as UTF-16 with a byte-order mark; it is still a trace.
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError:
            raise DlptError(f"{path}: UTF-16 text that does not decode; expected JSON from torch.profiler") from None
    if not data.strip():
        raise DlptError(f"{path}: the file is empty; expected a Kineto trace "
                        "(torch.profiler export_chrome_trace)")
    return data


def _decode_events(data: bytes | bytearray) -> list[Event]:
    """A JSON list of events: strictly, else field by field (`_clean`)."""
    try:
        return _events_decoder.decode(data)
    except msgspec.ValidationError:
        return [c for c in map(_clean, _lenient_events_decoder.decode(data)) if c is not None]


def _is_array(data: bytes) -> bool:
    """Is this the JSON-array form of the Chrome trace format (a bare list of events)?"""
    return data.lstrip()[:1] == b"["


def _decode_array(data: bytes) -> Trace:
    """The array form: `[{event}, {event}, ...]`, with no metadata around the events. The
    format lets a writer that was stopped leave out the closing `]`, so one is added then."""
    try:
        events = _decode_events(data)
    except msgspec.DecodeError:
        body = data.rstrip()
        if body.endswith(b"]"):
            raise
        try:
            return _decode_array(body.rstrip(b",") + b"]")
        except msgspec.DecodeError:
            pass
        raise
    return Trace(traceEvents=events)


def _decode_bytes(data: bytes) -> Trace:
    if _is_array(data):
        return _decode_array(data)
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError:
        # One odd value anywhere fails the strict decode of the whole file: read it again,
        # field by field, keeping what the linker can use.
        return _decode_lenient(data)


def decode(path: str, notes: dict[str, int] | None = None) -> Trace:
    """The trace at `path`, whole. NaN and Infinity, which JSON has no place for, are read as
    missing values (nonfinite.py says why); `notes`, when given, gets how many there were
    (`nonfinite`) and the byte of the first (`nonfinite_at`)."""
    data = read_bytes(path)
    try:
        try:
            return _decode_bytes(data)
        except msgspec.DecodeError as e:
            at = nonfinite_at(data, e)
            if at is None:
                raise
            fixed = quote_nonfinite(data)
            if fixed is None:
                raise DlptError(nonfinite_error(path, *at)) from None
            trace = _decode_bytes(fixed[0])
            if notes is not None:
                notes.update(nonfinite=fixed[1], nonfinite_at=at[0])
            return trace
    except msgspec.ValidationError as e:
        raise DlptError(f"{path}: not a Kineto trace ({e}); expected a JSON object with "
                        "'traceEvents' as written by torch.profiler, or a JSON array of trace events") from None
    except msgspec.DecodeError as e:
        what = "cut short" if "truncated" in str(e).lower() else f"not valid JSON ({e})"
        raise DlptError(f"{path}: the trace is {what}; re-export it from torch.profiler") from None
    except UnicodeDecodeError as e:
        raise DlptError(f"{path}: the trace is not UTF-8 text ({e.reason} at byte {e.start}); "
                        "expected JSON from torch.profiler") from None


# --- reading a large trace a slice of events at a time ---
# Decoding every event of a 150 MB trace at once holds the file's bytes and half a million
# structs together (about 450 MB); decoding it a slice at a time, and keeping only the linker's
# columns of each slice, holds the bytes and one slice. Small slices are also faster: the
# linker makes several passes over each slice's structs, and 1 MB of JSON (about 3,600 events,
# 2 MB of structs) stays in the CPU cache between passes; with 16 MB slices the import of a
# 523k-event trace took 1.4 s instead of 0.9 s.
CHUNK_BYTES = 1 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN = re.compile(rb"\}\s*,\s*\{")


class Sliced(NamedTuple):
    """A large trace laid out as expected: its metadata, its events a slice at a time, and where
    the events lie in its bytes (data[lo:hi], the array's contents), for the native scan."""

    meta: Trace
    slices: Iterator[list[Event]]
    data: bytes
    lo: int
    hi: int


class Unsplittable(Exception):
    """The trace could not be read in slices; read it whole (`decode`), which also says what is
    wrong with it, if anything."""


def decode_chunks(path: str, chunk_bytes: int | None = None,
                  notes: dict[str, int] | None = None) -> Sliced | None:
    """(the trace without its events, the events a slice at a time, ...), or None when the file is
    small or not laid out as expected. The iterator raises `Unsplittable` when a slice does not
    decode; the caller then starts again with `decode`.

    Slices end at a `}, {` between two events. A cut that falls inside a string or a nested
    value leaves its slice unbalanced (a JSON string cannot hold its own closing quote, and
    brackets must match), so a wrong cut is always a decode error, never a silent misreading."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    data = read_bytes(path)
    if len(data) < 2 * chunk_bytes:
        return None
    if _is_array(data):
        # The array form: the events are the whole file, and there is no metadata to read.
        first = data.index(b"[") + 1
        close = data.rfind(b"]")
        if close < first or data[close + 1:].strip():
            return None  # no closing bracket (allowed in this form): read whole, which adds one
        return Sliced(Trace(traceEvents=[]), _slices(data, first, close, chunk_bytes, notes), data, first, close)
    m = _EVENTS_KEY.search(data)
    if m is None:
        return None
    first = m.end()
    # The array's closing bracket: the last `]` in the file, unless a later value has one.
    close = len(data)
    meta = None
    for _ in range(8):
        close = data.rfind(b"]", first, close)
        if close < 0:
            return None
        meta = skeleton_meta(data, first, close)
        if meta is not None:
            break
    if meta is None:
        return None
    return Sliced(meta, _slices(data, first, close, chunk_bytes, notes), data, first, close)


def skeleton_meta(data: bytes | bytearray, first: int, close: int) -> Trace | None:
    """The trace's metadata where data[first:close] is its events array's contents: the file with
    them cut out decodes, to no events; else None. A later value's `]` can pass this too (a
    `deviceProperties` or `INFO` array after the events): the slices then do not decode, or the
    native scan finds the array's true end (scan.py)."""
    skeleton = data[:first] + data[close:]
    try:
        try:
            meta = _decoder.decode(skeleton)
        except msgspec.ValidationError:
            meta = _decode_lenient(skeleton)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    return None if meta.traceEvents else meta


def _decode_slice(buf: bytearray, offset: int, notes: dict[str, int] | None) -> list[Event]:
    """The events of one slice (`buf`, a JSON list whose byte 1 is byte `offset` + 1 of the
    file). NaN and Infinity are read as missing in this slice alone (nonfinite.py), so the file
    is not read whole for them; `notes` adds up how many, and where the first was."""
    try:
        return _decode_events(buf)
    except msgspec.DecodeError as e:
        at = nonfinite_at(buf, e)
        fixed = quote_nonfinite(buf) if at is not None else None
        if at is None or fixed is None:
            raise
        events = _decode_events(fixed[0])
        if notes is not None:
            notes.setdefault("nonfinite_at", offset + at[0])
            notes["nonfinite"] = notes.get("nonfinite", 0) + fixed[1]
        return events


def _slices(data: bytes, lo: int, hi: int, chunk_bytes: int,
            notes: dict[str, int] | None = None) -> Iterator[list[Event]]:
    view = memoryview(data)
    cur = lo
    while cur < hi:
        end = nxt = hi
        if cur + chunk_bytes < hi:
            m = _BETWEEN.search(data, cur + chunk_bytes, hi)
            if m is not None:
                end, nxt = m.start() + 1, m.end() - 1
        buf = bytearray(b"[")
        buf += view[cur:end]
        buf += b"]"
        try:
            events = _decode_slice(buf, cur - 1, notes)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            raise Unsplittable() from None
        del buf
        yield events
        cur = nxt


def trace_files(path: str) -> list[str]:
    """A trace file itself, or the trace files in a directory (per-rank files of
    tensorboard_trace_handler), sorted by name."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path)
                       if n.endswith((".json", ".json.gz")) and not n.startswith("."))
        if not names:
            raise DlptError(f"{path}: no Kineto traces (*.json, *.json.gz) in this directory")
        # tensorboard_trace_handler names its files *.pt.trace.json[.gz]; where there are such
        # files, other JSON beside them (configs, metrics) is not a trace.
        traces = [n for n in names if n.endswith((".pt.trace.json", ".pt.trace.json.gz"))]
        return [os.path.join(path, n) for n in traces or names]
    if not os.path.exists(path):
        raise DlptError(f"{path}: no such file or directory")
    return [path]
