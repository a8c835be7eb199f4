"""Linking a Kineto trace: every GPU activity to the host context that launched it.

The rules (DESIGN §2):
- a GPU event's launch is the `cuda_runtime`/`cuda_driver` event with the same `correlation`;
- host spans nest by time on their `(pid, tid)`: Python functions, ops and annotations
  around the launch form its context;
- a backward op is linked to the forward op that created its autograd node, through the
  `fwdbwd` flow (start at the forward op, end at the backward node's op) or, failing that,
  its `Sequence number`; its work is placed under the forward op's context and a
  `[backward]` marker;
- threads with no Python frames (autograd's, threads started while profiling) hang under the
  Python context that drove them where the trace shows it (the `run_backward` call, the line
  that called `Thread.start`), else under a thread node;
- what cannot be linked goes under `<unattributed: REASON>`, so GPU time is conserved.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.kineto.decode import Trace
from dlpt.frames import Frame, FrameTable, python_frame
from dlpt.metrics import DTOD, DTOH, HTOD, KERNEL, MEMCPY_OTHER, MEMSET, copy_kind

# Host span kinds, in the order that breaks ties of equal start and end: the outer one first.
PY, ANNOT, OP, LAUNCH = 0, 1, 2, 3
HOST_CATS = {
    "python_function": PY, "user_annotation": ANNOT, "cpu_op": OP, "Operator": OP,
    "cuda_runtime": LAUNCH, "cuda_driver": LAUNCH, "Runtime": LAUNCH,
}
GPU_CATS = {
    "kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY_OTHER, "Memcpy": MEMCPY_OTHER,
    "gpu_memset": MEMSET, "Memset": MEMSET,
}
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "

BACKWARD_FRAME = Frame("backward", "[backward]")
NO_LAUNCH = "no launch record"


def unattributed_frame(reason: str) -> Frame:
    return Frame("unattributed", f"<unattributed: {reason}>")


def _ns(x: object) -> int | None:
    """Microseconds (as Kineto writes them, with ns decimals) to integer nanoseconds."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return None
    return round(x * 1000)


def _int(x: object, default: int = -1) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else default


@dataclass
class LinkResult:
    """What one trace file contributes: activity columns (node ids are the builder's)."""

    node: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    name: list[int] = field(default_factory=list)
    device: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    duration: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)  # activities per row; empty: one each
    cpu_node: list[int] = field(default_factory=list)
    cpu_self: list[int] = field(default_factory=list)
    skipped: int = 0


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


def _ns_column(values: list) -> tuple[np.ndarray, np.ndarray]:
    """(nanoseconds, valid) of microsecond values, as `_ns` gives them one at a time, plus the
    int64 range check. A column of floats (what Kineto writes) goes through numpy: `rint` rounds
    half to even as `round` does, and float products are the same IEEE operation in both."""
    kinds = set(map(type, values))
    n = len(values)
    if kinds <= {float, int}:
        x = np.asarray(values, dtype=np.float64) * 1000.0
        # Ints (an event with no `dur` has 0) are exact in float64 while the product stays
        # under 2**53; past that only Python's integers give the same answer.
        if int not in kinds or not len(x) or np.abs(x).max() < 2.0**53:
            ok = np.abs(x) < _NS_LIMIT  # false for nan and inf too
            return np.where(ok, np.rint(x), 0).astype(np.int64), ok
    ns = [_ns(v) for v in values]  # ints keep exact integer arithmetic; None and damage fail
    ok = np.fromiter((v is not None and -_NS_LIMIT < v < _NS_LIMIT for v in ns), dtype=bool, count=n)
    return np.fromiter((v if k else 0 for v, k in zip(ns, ok.tolist())), dtype=np.int64, count=n), ok


class _Columns:
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
        self.gpu: list[tuple] = []
        self.flow_s: dict[object, tuple[int, int]] = {}
        self.flow_f: dict[object, tuple[int, int]] = {}
        self.thread_ids: dict[tuple, int] = {}
        self.thread_names: dict[tuple, str] = {}
        self.skipped = 0
        self._names: dict[str, str] = {}  # one str object per distinct name

    def add(self, events: list) -> None:
        n_ev = len(events)
        ph = np.fromiter(map(_PH_CODE.get, [e.ph for e in events], repeat(0)), dtype=np.int8, count=n_ev)
        cat = np.fromiter(map(_CAT_CODE.get, [e.cat for e in events], repeat(0)), dtype=np.int8, count=n_ev)
        # --- spans and GPU events: validate times together ---
        cand = np.flatnonzero((ph == _PH_X) & (cat > 0) & (cat < _FWDBWD))
        sub = [events[i] for i in cand.tolist()]
        s, ok_s = _ns_column([e.ts for e in sub])
        d, ok_d = _ns_column([e.dur for e in sub])
        ok = ok_s & ok_d & (d >= 0)
        self.skipped += len(sub) - int(ok.sum())
        ccat = cat[cand]
        h_idx = np.flatnonzero(ok & (ccat <= LAUNCH + 1))
        hsub = [sub[i] for i in h_idx.tolist()]
        h_kind = ccat[h_idx].astype(np.int64) - 1
        names = [e.name for e in hsub]
        self.name.extend(map(self._names.setdefault, names, names))
        h_start = s[h_idx]
        self.kind.append(h_kind)
        self.start.append(h_start)
        self.end.append(h_start + d[h_idx])
        # --- flows ---
        f_idx = np.flatnonzero(((ph == _PH_S) | (ph == _PH_F)) & (cat == _FWDBWD))
        fsub = [events[i] for i in f_idx.tolist()]
        fs_ns, f_ok = _ns_column([e.ts for e in fsub])
        keep = np.flatnonzero(f_ok)
        fsub = [fsub[i] for i in keep.tolist()]
        f_idx, fs_ns = f_idx[keep], fs_ns[keep]
        # --- thread ids: (pid, tid) keys numbered by first appearance, spans and flows together ---
        h_keys = list(map(_KEY, hsub))
        f_keys = list(map(_KEY, fsub))
        thread_ids = self.thread_ids
        new = [k for k in dict.fromkeys(h_keys + f_keys) if k not in thread_ids]
        if new:
            # Position of each key's first event: filled from the back, so the first one stays.
            first = dict(zip(reversed(f_keys), reversed(f_idx.tolist())))
            first_h = dict(zip(reversed(h_keys), reversed(cand[h_idx].tolist())))
            for k in sorted(new, key=lambda k: min(first.get(k, 1 << 62), first_h.get(k, 1 << 62))):
                thread_ids[k] = len(thread_ids)
        self.thread.append(np.fromiter(map(thread_ids.__getitem__, h_keys), dtype=np.int64, count=len(h_keys)))
        if fsub:
            f_thread = map(thread_ids.__getitem__, f_keys)
            f_val = zip(f_thread, fs_ns.tolist())
            # Later flows with the same id replace earlier ones, in event order, as before.
            for e, v in zip(fsub, f_val):
                (self.flow_s if e.ph == "s" else self.flow_f)[e.id] = v
        # --- args: sequence numbers of ops, correlations of launches ---
        n0 = self.n
        seq = np.full(len(hsub), -1, dtype=np.int64)
        op_j = np.flatnonzero(h_kind == OP)
        if len(op_j):
            args = [hsub[j].args for j in op_j.tolist()]
            seq[op_j] = [-1 if a is None else a.seq for a in args]
        self.seq.append(seq)
        launch_of_corr = self.launch_of_corr
        for j in np.flatnonzero(h_kind == LAUNCH).tolist():
            a = hsub[j].args
            if a is not None and a.correlation >= 0:
                launch_of_corr.setdefault(a.correlation, n0 + j)
        self.n = n0 + len(hsub)
        # --- GPU events ---
        gpu = self.gpu
        g_idx = np.flatnonzero(ok & (ccat >= _GPU0)).tolist()
        for j, gk, gs, gd in zip(g_idx, (ccat[g_idx] - _GPU0).tolist(), s[g_idx].tolist(), d[g_idx].tolist()):
            e = sub[j]
            a = e.args
            if a is not None:
                corr, dev, stream, nb = a.correlation, a.device, a.stream, a.bytes
            else:
                corr, dev, stream, nb = -1, -1, -1, 0
            if dev < 0:
                dev = _int(e.pid)
            if stream < 0:
                stream = _int(e.tid)
            if gk == MEMCPY_OTHER:
                gk = copy_kind(e.name)
            gpu.append((gk, e.name, gs, gd, corr, dev, stream, max(nb, 0)))
        # --- thread names ---
        for i in np.flatnonzero(ph == _PH_M).tolist():
            e = events[i]
            if e.name == "thread_name" and e.args is not None and isinstance(e.args.name, str):
                self.thread_names[(e.pid, e.tid)] = e.args.name.strip()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kind, thread, start, end, sequence number) of all spans."""
        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

        return cat(self.kind), cat(self.thread), cat(self.start), cat(self.end), cat(self.seq)


def _first_ops_at(ops_sorted: np.ndarray, thread: np.ndarray, start: np.ndarray,
                  keys: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """For each (thread, start) in `keys`, the first op in `ops_sorted` (spans sorted by thread,
    then start) that has it. Only the keys that flows ask for are looked up, all at once: a dict of
    every op's key would cost a Python step per op."""
    if not keys or not len(ops_sorted):
        return {}
    kt = np.fromiter((k[0] for k in keys), dtype=np.int64, count=len(keys))
    ks = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
    ot, os_ = thread[ops_sorted], start[ops_sorted]
    # One sortable int64 per (thread, start): the thread above the rank of the start.
    _, rank = np.unique(np.concatenate([os_, ks]), return_inverse=True)
    shift = np.int64(int(rank.max()) + 1)
    okey = ot * shift + rank[: len(os_)]
    qkey = kt * shift + rank[len(os_):]
    pos = np.searchsorted(okey, qkey, side="left")
    hit = pos < len(okey)
    hit[hit] = okey[pos[hit]] == qkey[hit]
    return dict(zip([keys[j] for j in np.flatnonzero(hit).tolist()], ops_sorted[pos[hit]].tolist()))


def link_trace(trace: Trace, builder: TreeBuilder, frames: FrameTable, base: int,
               out: LinkResult) -> None:
    """Place every GPU activity of `trace` into `builder` beneath node `base`."""
    cols = _Columns()
    cols.add(trace.traceEvents)
    link_columns(trace, cols, builder, frames, base, out)


def link_columns(trace: Trace, cols: _Columns, builder: TreeBuilder, frames: FrameTable, base: int,
                 out: LinkResult) -> None:
    """`link_trace` for events already sorted into columns; `trace` gives only its metadata."""
    base_ns = _int(trace.baseTimeNanoseconds, 0)
    kind, thread, start, end, seq = cols.arrays()
    h_name, launch_of_corr, gpu = cols.name, cols.launch_of_corr, cols.gpu
    flow_s, flow_f, thread_ids, thread_names = cols.flow_s, cols.flow_f, cols.thread_ids, cols.thread_names
    out.skipped += cols.skipped
    h_kind = kind.tolist()
    h_thread = thread.tolist()
    h_start = start.tolist()

    n = len(h_kind)
    order = np.lexsort((kind, -end, start, thread)) if n else np.zeros(0, dtype=np.int64)

    # --- nesting by time on each thread ---
    parent = [-1] * n
    end_l = end.tolist()
    cur_t = -1
    stack: list[int] = []
    for i, t, s in zip(order.tolist(), thread[order].tolist(), start[order].tolist()):
        if t != cur_t:
            cur_t = t
            stack = []
        while stack and end_l[stack[-1]] <= s:
            stack.pop()
        if stack:
            p = stack[-1]
            parent[i] = p
            if end_l[i] > end_l[p]:  # float rounding let the child overrun its parent
                end_l[i] = end_l[p]
        stack.append(i)
    par = np.asarray(parent, dtype=np.int64)
    end = np.asarray(end_l, dtype=np.int64)
    ops = np.flatnonzero(kind == OP)
    # Self time of an op: its duration less that of the ops directly inside it, found by
    # climbing from each op through Python frames and launches to the nearest op or annotation
    # (all ops at once, one level per step).
    child_time = np.zeros(n, dtype=np.int64)
    inner = ops[par[ops] >= 0]
    q = par[inner]
    climb = np.flatnonzero((kind[q] != OP) & (kind[q] != ANNOT))
    while len(climb):
        q[climb] = par[q[climb]]
        climb = climb[q[climb] >= 0]
        climb = climb[(kind[q[climb]] != OP) & (kind[q[climb]] != ANNOT)]
    has_op = q >= 0
    has_op[has_op] = kind[q[has_op]] == OP
    np.add.at(child_time, q[has_op], (end - start)[inner[has_op]])

    # --- threads without Python frames: where their work hangs ---
    py_threads = set(thread[kind == PY].tolist()) if n else set()
    t_sorted = thread[order]
    firsts = np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]]) if n else np.zeros(0, dtype=np.int64)
    # Spans are sorted by thread, then start: the first of each thread starts it.
    first_start = dict(zip(t_sorted[firsts].tolist(), start[order[firsts]].tolist()))
    py_spans = np.flatnonzero(kind == PY).tolist()
    run_backward = sorted((h_start[i], end_l[i], i) for i in py_spans if "run_backward" in h_name[i])
    rb_starts = [r[0] for r in run_backward]
    thread_starts = sorted((h_start[i], i) for i in py_spans
                           if h_name[i].startswith("threading.py(") and h_name[i].endswith("): start"))
    ts_starts = [x[0] for x in thread_starts]
    thread_key_of = {v: k for k, v in thread_ids.items()}

    # --- backward links: backward node op → forward op ---
    op_at = _first_ops_at(order[kind[order] == OP], thread, start,
                          list({*flow_s.values(), *flow_f.values()}))
    fwd_of: dict[int, int] = {}

    def backward_root(i: int) -> int:
        """The `evaluate_function` op around op i, or i itself."""
        j = i
        while j >= 0:
            if h_kind[j] == OP and h_name[j].startswith(BACKWARD_PREFIX):
                return j
            j = parent[j]
        return i

    for fid, (tf, sf) in flow_f.items():
        src = flow_s.get(fid)
        if src is None:
            continue
        b = op_at.get((tf, sf))
        f = op_at.get(src)
        if b is not None and f is not None:
            fwd_of.setdefault(backward_root(b), f)
    numbered = ops[seq[ops] >= 0]
    is_bwd = np.zeros(n, dtype=bool)
    is_bwd[numbered] = [h_name[i].startswith(BACKWARD_PREFIX) for i in numbered.tolist()]
    py_thread = np.zeros(n, dtype=bool)
    if py_threads:
        py_thread = np.isin(thread, np.fromiter(py_threads, dtype=np.int64, count=len(py_threads)))
    fwd_cand = order[(kind[order] == OP) & (seq[order] >= 0) & ~is_bwd[order] & py_thread[order]]
    # In span order, the last op to carry the number created the node (dict keeps the last).
    seq_fwd = dict(zip(seq[fwd_cand].tolist(), fwd_cand.tolist()))
    for i in numbered[is_bwd[numbered]].tolist():
        if i not in fwd_of:
            f = seq_fwd.get(int(seq[i]))
            if f is not None:
                fwd_of[i] = f

    # --- frames and nodes, memoised per span ---
    frame_cache: dict[tuple[int, str], int] = {}

    def frame_of(i: int) -> int:
        k = h_kind[i]
        if k == LAUNCH:
            return -1
        key = (k, h_name[i])
        f = frame_cache.get(key)
        if f is None:
            fr = python_frame(h_name[i]) if k == PY else Frame("op", h_name[i])
            f = frame_cache[key] = frames.intern(fr)
        return f

    bwd = frames.intern(BACKWARD_FRAME)
    node_of = [-1] * n
    busy = [False] * n
    thread_node: dict[int, int] = {}

    def thread_base(i: int) -> tuple[int, bool]:
        """Where a top-level span of a thread without Python frames goes: (span or node, is_span)."""
        t, s = h_thread[i], h_start[i]
        if t in py_threads:
            return base, False
        # The autograd engine's work belongs to the `run_backward` call that waits for it.
        last = bisect.bisect_right(rb_starts, s) - 1
        for k in range(last, max(last - 4, -1), -1):
            rs, re_, ri = run_backward[k]
            if rs <= s < re_ and h_thread[ri] != t:
                return ri, True
        return -1, False

    def thread_frame(t: int) -> int:
        key = thread_key_of.get(t, ("?", "?"))
        label = thread_names.get(key) or f"thread {key[1]}"
        return frames.intern(Frame("thread", label))

    def thread_node_for(t: int) -> int:
        nd = thread_node.get(t)
        if nd is None:
            anchor = base
            # The thread was most likely started by the last Thread.start before its first event.
            k = bisect.bisect_right(ts_starts, first_start.get(t, 0)) - 1
            if k >= 0:
                si = thread_starts[k][1]
                ps = parent[si]
                if ps >= 0 and h_thread[si] != t:
                    anchor = resolve(ps)
            nd = thread_node[t] = builder.child(anchor, thread_frame(t))
        return nd

    child = builder.child

    def resolve(i: int) -> int:
        nd = node_of[i]
        if nd >= 0:
            return nd
        # The common case without the general walk: climb the parents (no backward link, not
        # top-level) up to one that has a node, then make the nodes on the way back down. It
        # marks and unmarks `busy` and creates nodes in the same order as `resolve_walk` would,
        # so the tree comes out numbered the same.
        chain = []
        j = i
        while j not in fwd_of:
            p = parent[j]
            if p < 0:
                break
            chain.append(j)
            busy[j] = True
            nd = node_of[p]
            if nd >= 0:
                j = -1
                break
            j = p
        if j >= 0:
            nd = resolve_walk(j)
        for k in reversed(chain):
            if node_of[k] >= 0:  # made meanwhile, through a link of a damaged trace
                nd = node_of[k]
            else:
                fr = frame_of(k)
                if fr >= 0:
                    nd = child(nd, fr)
                node_of[k] = nd
            busy[k] = False
        return nd

    def resolve_walk(i: int) -> int:
        stack = [i]
        while stack:
            j = stack[-1]
            if node_of[j] >= 0:
                stack.pop()
                continue
            busy[j] = True
            f = fwd_of.get(j, -1)
            if f >= 0 and busy[f] and node_of[f] < 0:
                f = -1  # a link that loops back on itself (damaged trace): ignore it
                del fwd_of[j]
            if f >= 0:
                if node_of[f] < 0:
                    stack.append(f)
                    continue
                ctx = builder.child(node_of[f], bwd)
            else:
                p = parent[j]
                if p >= 0:
                    if node_of[p] < 0:
                        stack.append(p)
                        continue
                    ctx = node_of[p]
                else:
                    anchor, is_span = thread_base(j)
                    if is_span:
                        if node_of[anchor] < 0:
                            stack.append(anchor)
                            continue
                        ctx = builder.child(node_of[anchor], bwd)
                    elif anchor >= 0:
                        ctx = anchor
                    else:
                        ctx = thread_node_for(h_thread[j])
            fr = frame_of(j)
            node_of[j] = builder.child(ctx, fr) if fr >= 0 else ctx
            busy[j] = False
            stack.pop()
        return node_of[i]

    # --- GPU activities ---
    leaf_cache: dict[tuple[int, str], int] = {}
    leaf_kind = {KERNEL: "kernel", HTOD: "memcpy", DTOH: "memcpy", DTOD: "memcpy",
                 MEMCPY_OTHER: "memcpy", MEMSET: "memset"}
    no_launch = None
    for gk, name, s, d, corr, dev, stream, nb in gpu:
        li = launch_of_corr.get(corr, -1) if corr >= 0 else -1
        if li >= 0:
            ctx = resolve(li)
        else:
            if no_launch is None:
                no_launch = builder.child(base, frames.intern(unattributed_frame(NO_LAUNCH)))
            ctx = no_launch
        lk = (gk, name)
        lf = leaf_cache.get(lk)
        if lf is None:
            lf = leaf_cache[lk] = frames.intern(Frame(leaf_kind[gk], name))
        out.node.append(builder.child(ctx, lf))
        out.kind.append(gk)
        out.name.append(lf)
        out.device.append(dev)
        out.stream.append(stream)
        out.start.append(base_ns + s)
        out.duration.append(d)
        out.nbytes.append(nb)

    # --- host op self time ---
    out.cpu_node.extend(map(resolve, ops.tolist()))
    out.cpu_self.extend(np.maximum(end[ops] - start[ops] - child_time[ops], 0).tolist())
