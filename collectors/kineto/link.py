"""Linking a Kineto trace: every GPU activity to the host context that launched it.

The rules (docs/ARCHITECTURE.md, "`collectors/kineto/`: the Kineto importer"):
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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dlpt.cct import TreeBuilder, add_exact
from dlpt.collectors.assembly import ActivityColumns
from dlpt.collectors.kineto.columns import Columns, GpuRows
from dlpt.collectors.kineto.decode import ANNOT, OP, PY, Trace, as_int
from dlpt.collectors.kineto.memory import place_memory
from dlpt.collectors.kineto.nest import nest
from dlpt.collectors.kineto.paths import PathNodes, span_paths
from dlpt.collectors.kineto.waits import wait_metrics
from dlpt.collectors.kineto.walk import SpanWalk
from dlpt.frames import BACKWARD_FRAME, Frame, FrameTable, unattributed_frame
from dlpt.header import Header
from dlpt.metrics import ACTIVITY_KIND_INFO

I64 = np.int64
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "

NO_LAUNCH = "no launch record"


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


def link_columns(trace: Trace, cols: Columns, builder: TreeBuilder, frames: FrameTable, base: int,
                 out: ActivityColumns, meta: Header | None = None) -> None:
    """Place every GPU activity of a trace, its events sorted into `cols`, into `builder` beneath
    node `base`; `trace` gives only its metadata.

    The stages, each a step below: nest the host spans of each thread by time; give each op its
    self time; link backward ops to the forward ops that created them; then place every GPU
    activity under the node of its launch (nodes are made on demand, walking up the nesting and
    the backward links), and every op's self time under the op's own node. The last two stages
    make the tree, so their order (GPU activities first) fixes its numbering. Then, with `meta`
    to fill, host, sync and idle time (waits.py), whose nodes come after."""
    out.skipped += cols.skipped
    kind, thread, start, end, seq = cols.arrays()
    order = np.lexsort((kind, -end, start, thread)) if len(kind) else np.zeros(0, dtype=np.int64)
    parent, end_c = nest(order, thread, start, end)
    spans = _Spans(kind, thread, start, seq, cols.name, np.concatenate(cols.name_first) if cols.name_first
                   else np.zeros(0, dtype=I64), order, parent, end_c)
    cpu_self = _op_self_time(spans)
    fwd_of = _backward_links(spans, cols.flow_s, cols.flow_f)
    threads = _Threads(spans, cols.thread_ids, cols.thread_names)
    frames.intern(BACKWARD_FRAME)  # before any span's frame, whichever way nodes are made
    paths = span_paths(spans, fwd_of, threads)
    nodes: PathNodes | SpanWalk = (PathNodes(*paths, builder, frames, base) if paths is not None
                                   else SpanWalk(spans, fwd_of, threads, builder, frames, base))
    gpu = cols.gpu_rows()
    launch = launches_of(gpu, cols.launch_of_corr)
    _place_gpu_activities(gpu, launch, nodes, builder, frames, base, as_int(trace.baseTimeNanoseconds, 0), out)
    # Arrays, not lists: a list of half a million ints is five times the memory, at the peak.
    out.cpu_node = np.r_[np.asarray(out.cpu_node, dtype=np.int64), nodes.nodes(spans.ops)]
    out.cpu_self = np.r_[np.asarray(out.cpu_self, dtype=np.int64), cpu_self]
    if len(cols.memory):
        first = [int(start.min())] if len(start) else []
        first += [int(gpu.start.min())] if len(gpu) else []
        place_memory(cols.memory, cols.thread_ids, thread, start, order, spans.parent_l, spans.end_l, cols.name,
                     nodes.node,
                     builder, frames, base, min(first) if first else None, out)
    if meta is not None:
        wait_metrics(spans, end, nodes.nodes, gpu, builder, frames, base,
                     as_int(trace.baseTimeNanoseconds, 0), out, meta, launch if cols.launch_of_corr else None)


@dataclass
class _Spans:
    """The host spans of one trace once nested, as the later stages share them: numpy columns
    for the whole-array steps, and list copies, made when first asked for, for the per-span
    Python loops that remain (a trace whose links loop, memory events): indexing a list is
    several times faster than taking a numpy scalar, but a list of ints takes five times the
    memory, so whole-array stages never ask for them."""

    kind: np.ndarray
    thread: np.ndarray
    start: np.ndarray
    seq: np.ndarray  # sequence number of an op, -1 for none
    name: list[str]
    name_first: np.ndarray  # the first span with each span's name
    order: np.ndarray  # by thread, then start (nest.py)
    parent: np.ndarray
    end: np.ndarray  # clipped to the parent's end
    ops: np.ndarray = field(init=False)  # the op spans, in span order
    py_threads: set[int] = field(init=False)  # threads with Python frames in the trace

    @cached_property
    def name_group(self) -> tuple[np.ndarray, np.ndarray]:
        """(a span of each distinct name, the distinct name of each span): tests on names made
        once per name, not per span. Names are numbered by their first span (columns.py)."""
        n = len(self.name_first)
        firsts = np.flatnonzero(self.name_first == np.arange(n))
        number = np.empty(n, dtype=I64)
        number[firsts] = np.arange(len(firsts))
        return firsts, number[self.name_first]

    def names_where(self, test: Callable[[str], bool]) -> np.ndarray:
        """Which spans' names pass `test`, asked once per distinct name."""
        first, group = self.name_group
        name = self.name
        return np.asarray([test(name[i]) for i in first.tolist()], dtype=bool)[group]

    @cached_property
    def parent_l(self) -> list[int]:
        return self.parent.tolist()

    @cached_property
    def end_l(self) -> list[int]:
        return self.end.tolist()

    @cached_property
    def kind_l(self) -> list[int]:
        return self.kind.tolist()

    @cached_property
    def thread_l(self) -> list[int]:
        return self.thread.tolist()

    @cached_property
    def start_l(self) -> list[int]:
        return self.start.tolist()

    def __post_init__(self) -> None:
        self.ops = np.flatnonzero(self.kind == OP)
        self.py_threads = set(self.thread[self.kind == PY].tolist())


def _op_self_time(spans: _Spans) -> np.ndarray:
    """Self time of each op (`spans.ops`): its duration less that of the ops and annotations
    directly inside it, found by climbing from each through Python frames and launches to the
    nearest op or annotation (all at once, one level per step). An annotation is a child, as in
    torch's own tables (a `record_function` span): time under it is not the enclosing op's — a
    `CompiledFunction` keeps none of the `## Call CompiledFxGraph ##` span inside it, whose ops
    have their own — and the ops inside it are subtracted from nothing (it has no self time)."""
    kind, start, end, ops = spans.kind, spans.start, spans.end, spans.ops
    par = np.asarray(spans.parent, dtype=np.int64)
    child_time = np.zeros(len(kind), dtype=np.int64)
    both = np.flatnonzero((kind == OP) | (kind == ANNOT))  # ops and annotations, in span order
    inner = both[par[both] >= 0]
    q = par[inner]
    climb = np.flatnonzero((kind[q] != OP) & (kind[q] != ANNOT))
    while len(climb):
        q[climb] = par[q[climb]]
        climb = climb[q[climb] >= 0]
        climb = climb[(kind[q[climb]] != OP) & (kind[q[climb]] != ANNOT)]
    has_op = q >= 0
    has_op[has_op] = kind[q[has_op]] == OP
    add_exact(child_time, q[has_op], (end - start)[inner[has_op]])
    return np.maximum(end[ops] - start[ops] - child_time[ops], 0)


def _backward_roots(parent: np.ndarray, is_eval: Callable[[np.ndarray], np.ndarray], ops: np.ndarray) -> np.ndarray:
    """The `evaluate_function` op around each op (itself included), or the op itself where
    there is none; all at once, one level per step."""
    q = ops.copy()
    climb = np.flatnonzero(~is_eval(q))
    while len(climb):
        q[climb] = parent[q[climb]]
        climb = climb[q[climb] >= 0]
        climb = climb[~is_eval(q[climb])]
    return np.where(q >= 0, q, ops)


def _backward_links(spans: _Spans, flow_s: dict[object, tuple[int, int]],
                    flow_f: dict[object, tuple[int, int]]) -> dict[int, int]:
    """Backward node op → the forward op that created its autograd node: through `fwdbwd` flows
    first (each end is the first op at the flow's (thread, time)), then, for backward ops no flow
    links, through the sequence number, which the forward op on a Python thread carries too."""
    kind, thread, start, seq, order, ops = spans.kind, spans.thread, spans.start, spans.seq, spans.order, spans.ops
    n = len(kind)
    op_at = _first_ops_at(order[kind[order] == OP], thread, start,
                          list({*flow_s.values(), *flow_f.values()}))
    # Which spans are `evaluate_function` ops: a name test per distinct name.
    is_eval = ((kind == OP) & spans.names_where(lambda s: s.startswith(BACKWARD_PREFIX))).__getitem__

    pairs = []
    for fid, (tf, sf) in flow_f.items():
        src = flow_s.get(fid)
        if src is None:
            continue
        b = op_at.get((tf, sf))
        f = op_at.get(src)
        if b is not None and f is not None:
            pairs.append((b, f))
    fwd_of: dict[int, int] = {}
    if pairs:
        roots = _backward_roots(spans.parent, is_eval, np.fromiter((b for b, _ in pairs), dtype=np.int64,
                                                                  count=len(pairs)))
        for r, (_, f) in zip(roots.tolist(), pairs):
            fwd_of.setdefault(r, f)
    numbered = ops[seq[ops] >= 0]
    is_bwd = np.zeros(n, dtype=bool)
    is_bwd[numbered] = is_eval(numbered)
    # Masks through lookup arrays, not np.isin: its plain np.unique imports numpy.ma (9 ms).
    py_thread = np.zeros(n, dtype=bool)
    py_threads = spans.py_threads
    if py_threads and n:
        is_py = np.zeros(max(int(thread.max()), *py_threads) + 1, dtype=bool)
        is_py[list(py_threads)] = True
        py_thread = is_py[thread]
    todo = numbered[is_bwd[numbered]]
    if fwd_of:
        linked = np.zeros(n, dtype=bool)
        linked[list(fwd_of)] = True
        todo = todo[~linked[todo]]
    if not len(todo):
        return fwd_of
    cand = order[(kind[order] == OP) & (seq[order] >= 0) & ~is_bwd[order] & py_thread[order]]
    if not len(cand):
        return fwd_of
    # The op that created the node is the last to carry its number that started before the
    # backward op: not merely the last in the trace, since on a CPU run backward runs on the
    # Python thread too, and the node's own op inside `evaluate_function` carries the number.
    # Candidates by (number, start), stably (span order among equal starts: several threads' ops
    # interleave); each backward op finds the last one below (its number, its start) in one
    # search, over a key of both ranks (numbers and times as ranks fit 32 bits each).
    cand = cand[np.lexsort((start[cand], seq[cand]))]
    m = len(cand)
    _, seq_rank = np.unique(np.r_[seq[cand], seq[todo]], return_inverse=True)
    _, t_rank = np.unique(np.r_[start[cand], start[todo]], return_inverse=True)
    key = (seq_rank.astype(np.int64) << 32) | t_rank.astype(np.int64)
    k = np.searchsorted(key[:m], key[m:], side="left") - 1
    hit = k >= 0
    hit[hit] = seq[cand[k[hit]]] == seq[todo[hit]]
    fwd_of.update(zip(todo[hit].tolist(), cand[k[hit]].tolist()))
    return fwd_of


class _Threads:
    """Where the work of a thread without Python frames hangs (autograd's, threads started while
    profiling): the facts of the trace that say so, looked up by the tree stage."""

    def __init__(self, spans: _Spans, thread_ids: dict[tuple, int], thread_names: dict[tuple, str]) -> None:
        thread, start, order = spans.thread, spans.start, spans.order
        self.py_threads = spans.py_threads
        self._thread = spans.thread
        self._parent = spans.parent
        t_sorted = thread[order]
        firsts = (np.flatnonzero(np.r_[True, t_sorted[1:] != t_sorted[:-1]]) if len(order)
                  else np.zeros(0, dtype=np.int64))
        # Spans are sorted by thread, then start: the first of each thread starts it.
        self._first_start = dict(zip(t_sorted[firsts].tolist(), start[order[firsts]].tolist()))
        py = spans.kind == PY
        rb = np.flatnonzero(py & spans.names_where(lambda s: "run_backward" in s)).tolist()
        self._run_backward = sorted(zip(start[rb].tolist(), spans.end[rb].tolist(), rb))
        self._rb_starts = [r[0] for r in self._run_backward]
        ts = np.flatnonzero(py & spans.names_where(lambda s: s.startswith("threading.py(") and s.endswith("): start")))
        self._thread_starts = sorted(zip(start[ts].tolist(), ts.tolist()))
        self._ts_starts = [x[0] for x in self._thread_starts]
        self._key_of = {v: k for k, v in thread_ids.items()}
        self._names = thread_names

    def run_backward_around(self, t: int, s: int) -> int:
        """The `run_backward` span (on another thread) that was waiting when thread t's top-level
        span began at s, or -1: the autograd engine's work belongs to the call that waits for it."""
        last = bisect.bisect_right(self._rb_starts, s) - 1
        for k in range(last, max(last - 4, -1), -1):
            rs, re_, ri = self._run_backward[k]
            if rs <= s < re_ and self._thread[ri] != t:
                return ri
        return -1

    def started_under(self, t: int) -> int:
        """The span around the `Thread.start` call that most likely started thread t (the last
        one before its first event, on another thread), or -1."""
        k = bisect.bisect_right(self._ts_starts, self._first_start.get(t, 0)) - 1
        if k >= 0:
            si = self._thread_starts[k][1]
            ps = int(self._parent[si])
            if ps >= 0 and self._thread[si] != t:
                return ps
        return -1

    def frame(self, t: int) -> Frame:
        key = self._key_of.get(t, ("?", "?"))
        return Frame("thread", self._names.get(key) or f"thread {key[1]}")


def _place_gpu_activities(gpu: GpuRows, launch: np.ndarray, nodes: PathNodes | SpanWalk,
                          builder: TreeBuilder, frames: FrameTable, base: int, base_ns: int,
                          out: ActivityColumns) -> None:
    """One row per GPU activity, at a leaf of its kind and name under its launch's node (`launch`:
    the launch span of each row, -1 for none), or under `<unattributed: no launch record>` when
    no launch has its correlation.

    Nodes and frames are made as placing the rows one at a time in their order makes them: only
    the first row of each (launch's node, leaf) pair makes anything, so those rows alone are
    placed, in that order, and every other row takes its pair's node."""
    n = len(gpu)
    if not n:
        return
    ids = np.fromiter(map(id, gpu.name), dtype=I64, count=n)  # one str object per distinct name
    _, name_code = np.unique(ids, return_inverse=True)
    leaf_key = name_code.reshape(-1) * I64(int(gpu.kind.max()) + 1) + gpu.kind
    has = launch >= 0
    ctx_key = np.full(n, -1, dtype=I64)
    ctx_key[has] = nodes.keys(launch[has])
    pair = (ctx_key + 1) * I64(int(leaf_key.max()) + 1) + leaf_key
    _, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    leaf_cache: dict[tuple[int, str], int] = {}
    no_launch = None
    made = np.empty(len(first), dtype=I64)
    leaf_fid = np.empty(len(first), dtype=I64)
    names, kinds, launches = gpu.name, gpu.kind, launch.tolist()
    for u in np.argsort(first).tolist():
        r = int(first[u])
        li = launches[r]
        if li >= 0:
            ctx = nodes.node(li)
        else:
            if no_launch is None:
                no_launch = builder.child(base, frames.intern(unattributed_frame(NO_LAUNCH)))
            ctx = no_launch
        lk = (int(kinds[r]), names[r])
        lf = leaf_cache.get(lk)
        if lf is None:
            lf = leaf_cache[lk] = frames.intern(Frame(ACTIVITY_KIND_INFO[lk[0]].frame, lk[1]))
        made[u] = builder.child(ctx, lf)
        leaf_fid[u] = lf
    inverse = inverse.reshape(-1)
    out.node.extend(made[inverse].tolist())
    out.kind.extend(gpu.kind.tolist())
    out.name.extend(leaf_fid[inverse].tolist())
    out.device.extend(gpu.device.tolist())
    out.stream.extend(gpu.stream.tolist())
    out.start.extend([base_ns + s for s in gpu.start.tolist()])  # Python ints: a damaged base can't wrap
    out.duration.extend(gpu.dur.tolist())
    out.nbytes.extend(gpu.nbytes.tolist())


def launches_of(gpu: GpuRows, launch_of_corr: dict[int, int]) -> np.ndarray:
    """The launch span of each GPU row, through its correlation; -1 for none."""
    get = launch_of_corr.get
    return np.fromiter((get(c, -1) if c >= 0 else -1 for c in gpu.corr.tolist()), dtype=I64, count=len(gpu))
