"""The first pass over a Kineto trace's events: host spans, GPU events, fwdbwd flows and thread
names sorted into columns (times as integer nanoseconds), which link.py then links."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

from dlpt.collectors.kineto.decode import GPU_CATS, HOST_CATS, LAUNCH, OP, Args, as_int
from dlpt.collectors.kineto.memory import MemoryEvents
from dlpt.metrics import MEMCPY_OTHER, copy_kind


def _ns(x: object) -> int | None:
    """Microseconds (as Kineto writes them, with ns decimals) to integer nanoseconds."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return None
    if isinstance(x, float) and abs(x) >= _NS_LIMIT / 1000:
        return None  # damage (the column's range check refuses it), and round() of its product may overflow
    return round(x * 1000)


# Event classes of the first pass: ph codes and category codes, looked up a column at a time.
_PH_X, _PH_S, _PH_F, _PH_M = 1, 2, 3, 4
_PH_CODE = {"X": _PH_X, "s": _PH_S, "f": _PH_F, "M": _PH_M}
_GPU0 = 8  # category codes: host span kinds + 1, GPU kinds + _GPU0, fwdbwd
_FWDBWD = 20
_CAT_CODE = {**{c: k + 1 for c, k in HOST_CATS.items()}, **{c: k + _GPU0 for c, k in GPU_CATS.items()},
             "fwdbwd": _FWDBWD}
# Nanoseconds beyond this are damage (a year is 3e16 ns): skipping them keeps every sum and
# `start + duration` inside int64.
_NS_LIMIT = 1 << 62
_KEY = attrgetter("pid", "tid")  # an event's thread key
# What an event without `args` reads as (no correlation, sequence number, device or stream; 0
# bytes). Args structs are always true, so `e.args or _NO_ARGS` picks between them.
_NO_ARGS = Args()


def _ns_column(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(nanoseconds, valid) of microsecond values, as `_ns` gives them one at a time, plus the
    int64 range check. A column of floats (what Kineto writes) goes through numpy: `rint` rounds
    half to even as `round` does, and float products are the same IEEE operation in both."""
    n = len(values)
    try:
        # None becomes NaN (invalid below, as `_ns` has it); below 2**53 every int is exact too.
        with np.errstate(over="ignore", invalid="ignore"):  # damage overflows to inf: invalid below, said by no warning
            x = np.array(values, dtype=np.float64) * 1000.0
        if not (np.abs(x) >= 2.0**53).any():
            ok = np.abs(x) < _NS_LIMIT  # false for nan and inf too
            return np.where(ok, np.rint(x), 0).astype(np.int64), ok
    except (TypeError, ValueError, OverflowError):
        pass
    kinds = set(map(type, values))
    if kinds <= {float, int, type(None)}:  # None (an event with no time) is NaN: invalid, as `_ns` has it
        with np.errstate(over="ignore", invalid="ignore"):
            x = np.asarray(values, dtype=np.float64) * 1000.0
        # Ints (an event with no `dur` has 0) are exact in float64 while the product stays
        # under 2**53; past that only Python's integers give the same answer.
        if int not in kinds or not len(x) or np.abs(x).max() < 2.0**53:
            ok = np.abs(x) < _NS_LIMIT  # false for nan and inf too
            return np.where(ok, np.rint(x), 0).astype(np.int64), ok
    ns = [_ns(v) for v in values]  # ints keep exact integer arithmetic; None and damage fail
    ok = np.fromiter((v is not None and -_NS_LIMIT < v < _NS_LIMIT for v in ns), dtype=bool, count=n)
    return np.fromiter((v if k else 0 for v, k in zip(ns, ok.tolist())), dtype=np.int64, count=n), ok


_I64_LIMIT = 1 << 63


def _int_column(values: list[int], bad: int | None) -> np.ndarray:
    """Ints as int64, each one past int64 (damage) read as `bad`, a field's value for none; with
    `bad` None, a column of Python ints instead (correlations: the reader before the columns
    linked one past int64 to a launch of the same number, so this one does too)."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        if bad is None:
            return np.array(values, dtype=object)
        return np.array([v if -_I64_LIMIT <= v < _I64_LIMIT else bad for v in values], dtype=np.int64)


# The args fields the first pass reads, by their `Args` names (scan.c writes them in this order).
ARG_FIELDS = ("correlation", "seq", "bytes", "device", "stream")


def ns_of_parts(kind: np.ndarray, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nanoseconds, valid) of microsecond values given as scan.c writes them: a kind (0 none,
    1 int, 2 float) and the int or the float's bits. The rule is `_ns`'s, a column at a time:
    an int exactly times 1000, a float's product rounded half to even, valid below 2**62 ns."""
    ns = np.zeros(len(kind), dtype=np.int64)
    ok = np.zeros(len(kind), dtype=bool)
    f = kind == 2
    if f.any():
        with np.errstate(over="ignore", invalid="ignore"):
            x = bits[f].view(np.float64) * 1000.0
        okf = np.abs(x) < _NS_LIMIT
        ns[f] = np.where(okf, np.rint(x), 0).astype(np.int64)
        ok[f] = okf
    i = kind == 1
    if i.any():
        v = bits[i]
        # |v * 1000| < 2**62, asked without the product (which could overflow int64)
        oki = (v <= _NS_LIMIT // 1000) & (v >= -(_NS_LIMIT // 1000))
        ns[i] = np.where(oki, v, 0) * 1000
        ok[i] = oki
    return ns, ok


def ph_cat_codes(tokens: list, ph: np.ndarray, cat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first pass's ph and category codes of events given as token indices (scan.c)."""
    ph_lut = np.fromiter((_PH_CODE.get(t, 0) if isinstance(t, str) else 0 for t in tokens), dtype=np.int8,
                         count=len(tokens))
    cat_lut = np.fromiter((_CAT_CODE.get(t, 0) if isinstance(t, str) else 0 for t in tokens), dtype=np.int8,
                          count=len(tokens))
    return ph_lut[ph], cat_lut[cat]


class StructBatch:
    """Decoded events (decode.py's structs), read by Columns.add: per-event codes and times as
    arrays, and the fields of a subset of events on request. scan.py's `ScanBatch` answers the
    same questions from the native scan's columns."""

    def __init__(self, events: list) -> None:
        self._ev = events
        self._name_ids: dict[str, int] = {}
        self._key_ids: dict[tuple, int] = {}
        n = len(events)
        self.ph = np.fromiter(map(_PH_CODE.get, [e.ph for e in events], repeat(0)), dtype=np.int8, count=n)
        self.cat = np.fromiter(map(_CAT_CODE.get, [e.cat for e in events], repeat(0)), dtype=np.int8, count=n)
        # Times of every event, converted once: spans, GPU events and flows are most of them,
        # and indexing the columns costs less than gathering the events of each kind first.
        self.ts = _ns_column([e.ts for e in events])
        self.dur = _ns_column([e.dur for e in events])

    def __len__(self) -> int:
        return len(self._ev)

    def events(self, idx: np.ndarray) -> list:
        ev = self._ev
        return [ev[i] for i in idx.tolist()]

    def names(self, idx: np.ndarray) -> list[str]:
        return [e.name for e in self.events(idx)]

    def cats(self, idx: np.ndarray) -> list[str]:
        return [e.cat for e in self.events(idx)]

    def ids(self, idx: np.ndarray) -> list:
        return [e.id for e in self.events(idx)]

    def keys(self, idx: np.ndarray) -> list[tuple]:
        return list(map(_KEY, self.events(idx)))

    def name_ids(self, idx: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """The names of the events at `idx` as numbers (equal names, equal numbers) and the
        names by number."""
        d = self._name_ids
        ids = [d.setdefault(n, len(d)) for n in self.names(idx)]
        return np.array(ids, dtype=np.int64), list(d)

    def key_ids(self, idx: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
        """The (pid, tid) keys of the events at `idx` as numbers, and the keys by number (one
        numbering for the batch)."""
        d = self._key_ids
        ids = [d.setdefault(k, len(d)) for k in self.keys(idx)]
        return np.array(ids, dtype=np.int64), list(d)

    def pids(self, idx: np.ndarray) -> list:
        return [e.pid for e in self.events(idx)]

    def tids(self, idx: np.ndarray) -> list:
        return [e.tid for e in self.events(idx)]

    def arg(self, field: str, idx: np.ndarray, bad: int | None) -> np.ndarray:
        """An args field of the events at `idx` as int64 (`_int_column`: one past int64 reads as
        `bad`, or stays a Python int where `bad` is None); an event without args has the field's
        default."""
        get = attrgetter(field)
        return _int_column([get(e.args or _NO_ARGS) for e in self.events(idx)], bad)


@dataclass
class GpuRows:
    """The GPU events (kernels, copies, memsets) of a trace, one row each: kind (dlpt.metrics),
    start and duration (ns, the trace's clock), correlation with the launch (-1: none), device,
    stream, bytes; and the name of each."""

    kind: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    corr: np.ndarray  # int64, or Python ints where one is past int64 (_int_column)
    device: np.ndarray
    stream: np.ndarray
    nbytes: np.ndarray
    name: list[str]

    def __len__(self) -> int:
        return len(self.kind)


class Columns:
    """The first pass: host spans, GPU events, fwdbwd flows and thread names, in event order.

    Events come in chunks (`add`), so that the decoded structs of a large trace need not all be
    alive at once (decode.py's `decode_chunks`); what is kept of each is a few numbers and its
    name. Columns are pulled out of the structs with one comprehension each and classified with
    numpy, rather than with a Python loop doing a dozen checks per event: the events are already
    typed, and damaged ones arrive with `ts=None`, so what remains to check is the values (range,
    negative durations), not the types."""

    def __init__(self) -> None:
        self.kind: list[np.ndarray] = []
        self.start: list[np.ndarray] = []
        self.end: list[np.ndarray] = []
        self.thread: list[np.ndarray] = []
        self.name: list[str] = []
        self.seq: list[np.ndarray] = []
        self.n = 0  # spans so far
        self.launch_of_corr: dict[int, int] = {}
        # GPU events: GpuRows' columns a chunk at a time, and their names
        self._gpu: tuple[list[np.ndarray], ...] = tuple([] for _ in range(7))
        self.gpu_name: list[str] = []
        self.flow_s: dict[object, tuple[int, int]] = {}
        self.flow_f: dict[object, tuple[int, int]] = {}
        self.thread_ids: dict[tuple, int] = {}
        self.thread_names: dict[tuple, str] = {}
        self.skipped = 0
        self._names: dict[str, str] = {}  # one str object per distinct GPU event name
        # The first span of each span's name: names told apart without hashing them again
        self.name_first: list[np.ndarray] = []
        self._first: dict[str, int] = {}
        self.memory = MemoryEvents()  # the allocator's `[memory]` events (profile_memory)
        # What tells device rows from host rows (`unknown_device_events`): complete events of
        # kinds the linker does not read, by (pid, category); the pids of GPU events; Kineto's
        # process labels.
        self.unknown: Counter[tuple[object, str]] = Counter()
        self.gpu_pids: set[object] = set()
        self.labels: dict[object, str] = {}
        # The first start and last end of any span or GPU event read (ns, the trace's own clock):
        # when the trace was taken, which tells ranks of one run from different runs (dlpt/runs.py).
        self.first: int | None = None
        self.last: int | None = None

    def add(self, b: StructBatch | Any) -> None:
        """One batch of events, in order: a `StructBatch`, or scan.py's `ScanBatch`."""
        ph, cat = b.ph, b.cat
        # --- spans and GPU events: validate times together ---
        cand = np.flatnonzero((ph == _PH_X) & (cat > 0) & (cat < _FWDBWD))
        (ts, ok_ts), (d, ok_d) = b.ts, b.dur
        s, d = ts[cand], d[cand]
        ok = ok_ts[cand] & ok_d[cand] & (d >= 0)
        self.skipped += len(cand) - int(ok.sum())
        if ok.any():
            lo, hi = int(s[ok].min()), int((s + d)[ok].max())
            self.first = lo if self.first is None else min(self.first, lo)
            self.last = hi if self.last is None else max(self.last, hi)
        u_idx = np.flatnonzero((ph == _PH_X) & (cat == 0))
        if len(u_idx):
            self.unknown.update(zip(b.pids(u_idx), b.cats(u_idx)))
        ccat = cat[cand]
        h_idx = np.flatnonzero(ok & (ccat <= LAUNCH + 1))
        h_rows = cand[h_idx]  # the spans' events
        h_kind = ccat[h_idx].astype(np.int64) - 1
        # Names a distinct name at a time: each span's name as a number (equal numbers, equal
        # names), the first span of each name found by numpy, and one str object per name.
        n0 = self.n
        ids, table = b.name_ids(h_rows)
        uniq, first_pos, inv = np.unique(ids, return_index=True, return_inverse=True)
        first_of = self._first.setdefault
        firsts_u = [first_of(table[u], n0 + p) for u, p in zip(uniq.tolist(), first_pos.tolist())]
        canon = [self.name[f] if f < n0 else table[u] for u, f in zip(uniq.tolist(), firsts_u)]
        self.name_first.append(np.array(firsts_u, dtype=np.int64)[inv] if len(inv)
                               else np.zeros(0, dtype=np.int64))
        self.name.extend(map(canon.__getitem__, inv.tolist()))
        h_start = s[h_idx]
        self.kind.append(h_kind)
        self.start.append(h_start)
        self.end.append(h_start + d[h_idx])
        # --- flows ---
        f_idx = np.flatnonzero(((ph == _PH_S) | (ph == _PH_F)) & (cat == _FWDBWD) & ok_ts)
        fs_ns = ts[f_idx]
        # --- thread ids: (pid, tid) keys numbered by first appearance, spans and flows together ---
        # A distinct key at a time, as names are.
        hk, keys = b.key_ids(h_rows)
        fk, _ = b.key_ids(f_idx)
        thread_ids = self.thread_ids
        lut = np.fromiter(map(thread_ids.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))
        # Only a batch with a thread not seen before (the first, mostly) looks for new ones.
        if (lut[hk] < 0).any() or (lut[fk] < 0).any():
            first: dict[int, int] = {}  # a new key's first event, spans and flows together
            for ks, rows in ((hk, h_rows), (fk, f_idx)):
                u, at = np.unique(ks, return_index=True)
                for k, r in zip(u.tolist(), rows[at].tolist()):
                    if lut[k] < 0 and r < first.get(k, 1 << 62):
                        first[k] = r
            for k in sorted(first, key=first.__getitem__):
                key = keys[k]
                if key not in thread_ids:  # two numbers of one key (scan.py's tokens): numbered once
                    thread_ids[key] = len(thread_ids)
            # (Keys of other events, GPU rows and metadata, stay -1: no span or flow reads them.)
            lut = np.fromiter(map(thread_ids.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))
        self.thread.append(lut[hk])
        if len(f_idx):
            f_val = zip(lut[fk].tolist(), fs_ns.tolist())
            # Later flows with the same id replace earlier ones, in event order, as before.
            flow_s, flow_f = self.flow_s, self.flow_f
            for start, fid, v in zip((ph[f_idx] == _PH_S).tolist(), b.ids(f_idx), f_val):
                (flow_s if start else flow_f)[fid] = v
        # --- args: sequence numbers of ops, correlations of launches ---
        seq = np.full(len(h_rows), -1, dtype=np.int64)
        op_j = np.flatnonzero(h_kind == OP)
        if len(op_j):
            seq[op_j] = b.arg("seq", h_rows[op_j], -1)
        self.seq.append(seq)
        launch_j = np.flatnonzero(h_kind == LAUNCH)
        corr = b.arg("correlation", h_rows[launch_j], None).tolist()
        setdefault = self.launch_of_corr.setdefault
        for c, j in zip(corr, launch_j.tolist()):
            if c >= 0:
                setdefault(c, n0 + j)
        self.n = n0 + len(h_rows)
        # --- GPU events ---
        g_idx = np.flatnonzero(ok & (ccat >= _GPU0))
        if len(g_idx):
            self._add_gpu(b, cand[g_idx], ccat[g_idx] - _GPU0, s[g_idx], d[g_idx])
        # --- thread names ---
        for e in b.events(np.flatnonzero(ph == _PH_M)):
            if e.name == "thread_name" and e.args is not None and isinstance(e.args.name, str):
                self.thread_names[(e.pid, e.tid)] = e.args.name.strip()
            elif e.name == "process_labels" and e.args is not None and isinstance(e.args.labels, str):
                self.labels[e.pid] = e.args.labels.strip()
        # `[memory]` events are instant events ("i"): only the events of a ph this pass does not
        # read (code 0) are handed on, not every event.
        self.memory.add(b.events(np.flatnonzero(ph == 0)))

    def _add_gpu(self, b: StructBatch | Any, rows: np.ndarray, kind: np.ndarray, start: np.ndarray,
                 dur: np.ndarray) -> None:
        """GPU events' rows, a column at a time. Fields the event lacks fall back as the linker
        reads them: the device to the pid, the stream to the tid (where they are ints), and a
        copy's kind is read from its name when its category does not say it."""
        pids = b.pids(rows)
        self.gpu_pids.update(pids)
        dev = b.arg("device", rows, -1)
        stream = b.arg("stream", rows, -1)
        for j in np.flatnonzero(dev < 0).tolist():
            dev[j] = _int_column([as_int(pids[j])], -1)[0]  # a pid past int64 reads as none too
        no_stream = np.flatnonzero(stream < 0)
        if len(no_stream):
            tids = b.tids(rows[no_stream])
            for j, tid in zip(no_stream.tolist(), tids):
                stream[j] = _int_column([as_int(tid)], -1)[0]
        names = b.names(rows)
        kind = kind.astype(np.int64)
        for j in np.flatnonzero(kind == MEMCPY_OTHER).tolist():
            kind[j] = copy_kind(names[j])
        self.gpu_name.extend(map(self._names.setdefault, names, names))
        parts = (kind, start, dur, b.arg("correlation", rows, None), dev, stream,
                 np.maximum(b.arg("bytes", rows, 0), 0))
        for col, part in zip(self._gpu, parts):
            col.append(part)

    def gpu_rows(self) -> GpuRows:
        """The GPU events' rows, in event order."""
        kind, start, dur, corr, device, stream, nbytes = (np.concatenate(c) if c else np.zeros(0, dtype=np.int64)
                                                         for c in self._gpu)
        return GpuRows(kind, start, dur, corr, device, stream, nbytes, self.gpu_name)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kind, thread, start, end, sequence number) of all spans."""
        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        return cat(self.kind), cat(self.thread), cat(self.start), cat(self.end), cat(self.seq)


# Kinds that sit on a device's rows in real traces but are not work of the device's own:
# annotation ranges drawn over the kernels (`gpu_user_annotation`, the GPU side of
# `record_function`), CUPTI's synchronization records (`cuda_sync`: time a stream or the host
# waited) and the profiler's own range marker. dlpt knows them and has nothing to count in them.
KNOWN_DEVICE_CATS = frozenset({"gpu_user_annotation", "cuda_sync", "cuda_profiler_range"})


def unknown_device_events(cols: Columns) -> dict[str, int]:
    """{category: count} of the complete events of kinds dlpt does not read that sit on a
    device's row, most first: what a trace of hardware dlpt does not know (MTIA's categories,
    a newer profiler's) holds instead of `kernel`, which would otherwise vanish silently.

    A row (pid) is a device's when Kineto's `process_labels` names it so (anything but "CPU";
    Kineto writes "GPU N"); without a label, when it holds GPU events dlpt reads, and else when
    it holds none of the host spans (Python, ops, runtime calls) and its pid is a device number
    (an int >= 0), as Kineto numbers device rows. Unknown kinds on host rows (a newer profiler's
    CPU-side categories, user annotations of other tools), on Kineto's string-named rows
    ("Spans", "Traces") and at pid -1 (its `overhead` events) are not the device's work and are
    passed over quietly."""
    host = {k[0] for k in cols.thread_ids}

    def device(pid: object) -> bool:
        label = cols.labels.get(pid)
        if label:
            return not label.upper().startswith("CPU")
        if pid in cols.gpu_pids:
            return True
        return pid not in host and isinstance(pid, int) and not isinstance(pid, bool) and pid >= 0

    out: Counter[str] = Counter()
    for (pid, cat), n in cols.unknown.items():
        if cat and cat not in KNOWN_DEVICE_CATS and device(pid):
            out[cat] += n
    return dict(out.most_common())
