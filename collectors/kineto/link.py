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
    cpu_node: list[int] = field(default_factory=list)
    cpu_self: list[int] = field(default_factory=list)
    skipped: int = 0


def link_trace(trace: Trace, builder: TreeBuilder, frames: FrameTable, base: int,
               out: LinkResult) -> None:
    """Place every GPU activity of `trace` into `builder` beneath node `base`."""
    base_ns = _int(trace.baseTimeNanoseconds, 0)
    # --- one pass over the events, sorting them into host spans, GPU events and flows ---
    h_kind: list[int] = []
    h_name: list[str] = []
    h_thread: list[int] = []
    h_start: list[int] = []
    h_end: list[int] = []
    h_seq: list[int] = []
    launch_of_corr: dict[int, int] = {}
    gpu: list[tuple] = []
    flow_s: dict[object, tuple[int, int]] = {}
    flow_f: dict[object, tuple[int, int]] = {}
    thread_ids: dict[tuple, int] = {}
    thread_names: dict[tuple, str] = {}
    skipped = 0
    for e in trace.traceEvents:
        ph = e.ph
        if ph == "X":
            cat = e.cat
            hk = HOST_CATS.get(cat)
            if hk is not None:
                s = _ns(e.ts)
                d = _ns(e.dur) if e.dur is not None else 0
                if s is None or d is None or d < 0 or not isinstance(e.name, str):
                    skipped += 1
                    continue
                key = (e.pid, e.tid)
                try:
                    t = thread_ids.get(key)
                    if t is None:
                        t = thread_ids[key] = len(thread_ids)
                except TypeError:  # unhashable pid/tid
                    skipped += 1
                    continue
                i = len(h_kind)
                h_kind.append(hk)
                h_name.append(e.name)
                h_thread.append(t)
                h_start.append(s)
                h_end.append(s + d)
                a = e.args
                h_seq.append(_int(a.seq) if a is not None and hk == OP else -1)
                if hk == LAUNCH and a is not None:
                    c = _int(a.correlation)
                    if c >= 0:
                        launch_of_corr.setdefault(c, i)
                continue
            gk = GPU_CATS.get(cat)
            if gk is not None:
                s = _ns(e.ts)
                d = _ns(e.dur) if e.dur is not None else 0
                if s is None or d is None or d < 0 or not isinstance(e.name, str):
                    skipped += 1
                    continue
                a = e.args
                if a is not None:
                    corr, dev, stream, nb = _int(a.correlation), _int(a.device), _int(a.stream), _int(a.bytes, 0)
                else:
                    corr, dev, stream, nb = -1, -1, -1, 0
                if dev < 0:
                    dev = _int(e.pid)
                if stream < 0:
                    stream = _int(e.tid)
                if gk == MEMCPY_OTHER:
                    gk = copy_kind(e.name)
                gpu.append((gk, e.name, s, d, corr, dev, stream, max(nb, 0)))
            continue
        if (ph == "s" or ph == "f") and e.cat == "fwdbwd":
            s = _ns(e.ts)
            try:
                t = thread_ids.get((e.pid, e.tid))
            except TypeError:  # unhashable pid/tid: a flow with no thread links nothing
                continue
            if s is None:
                continue
            if t is None:
                t = thread_ids[(e.pid, e.tid)] = len(thread_ids)
            (flow_s if ph == "s" else flow_f)[e.id if not isinstance(e.id, (list, dict)) else None] = (t, s)
        elif ph == "M" and e.name == "thread_name" and e.args is not None and isinstance(e.args.name, str):
            thread_names[(e.pid, e.tid)] = e.args.name.strip()
    out.skipped += skipped

    n = len(h_kind)
    kind = np.asarray(h_kind, dtype=np.int64)
    thread = np.asarray(h_thread, dtype=np.int64)
    start = np.asarray(h_start, dtype=np.int64)
    end = np.asarray(h_end, dtype=np.int64)
    order = np.lexsort((kind, -end, start, thread)) if n else np.zeros(0, dtype=np.int64)

    # --- nesting by time on each thread ---
    parent = [-1] * n
    end_l = end.tolist()
    child_time = [0] * n  # time of direct child ops, for op self time
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
    for i in range(n):
        p = parent[i]
        if p >= 0 and h_kind[i] == OP:
            # Self time of an op: its duration less that of the ops directly inside it.
            q = p
            while q >= 0 and h_kind[q] != OP and h_kind[q] != ANNOT:
                q = parent[q]
            if q >= 0 and h_kind[q] == OP:
                child_time[q] += end_l[i] - h_start[i]

    # --- threads without Python frames: where their work hangs ---
    py_threads = set(thread[kind == PY].tolist()) if n else set()
    first_start: dict[int, int] = {}
    for i in order.tolist():
        first_start.setdefault(h_thread[i], h_start[i])
    run_backward = sorted((h_start[i], end_l[i], i) for i in range(n)
                          if h_kind[i] == PY and "run_backward" in h_name[i])
    rb_starts = [r[0] for r in run_backward]
    thread_starts = sorted((h_start[i], i) for i in range(n)
                           if h_kind[i] == PY and h_name[i].startswith("threading.py(")
                           and h_name[i].endswith("): start"))
    ts_starts = [x[0] for x in thread_starts]
    thread_key_of = {v: k for k, v in thread_ids.items()}

    # --- backward links: backward node op → forward op ---
    op_at: dict[tuple[int, int], int] = {}
    for i in order.tolist():
        if h_kind[i] == OP:
            op_at.setdefault((h_thread[i], h_start[i]), i)
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
    seq_fwd: dict[int, int] = {}
    for i in order.tolist():
        if h_kind[i] == OP and h_seq[i] >= 0 and not h_name[i].startswith(BACKWARD_PREFIX) \
                and h_thread[i] in py_threads:
            seq_fwd[h_seq[i]] = i  # the last op to carry the number created the node
    for i in range(n):
        if h_kind[i] == OP and h_seq[i] >= 0 and h_name[i].startswith(BACKWARD_PREFIX) and i not in fwd_of:
            f = seq_fwd.get(h_seq[i])
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

    def resolve(i: int) -> int:
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
    for i in range(n):
        if h_kind[i] == OP:
            self_t = end_l[i] - h_start[i] - child_time[i]
            out.cpu_node.append(resolve(i))
            out.cpu_self.append(max(self_t, 0))
