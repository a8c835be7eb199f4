"""The tree node of each host span, made one span at a time (link.py's rule, docs/ARCHITECTURE.md
"Linking a trace"). paths.py finds them for all spans at once and makes the same nodes in the same
order; this walk remains for traces whose backward links loop (damaged), which it breaks where
it meets them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.kineto.decode import LAUNCH, PY
from dlpt.frames import BACKWARD_FRAME, Frame, FrameTable, python_frame

if TYPE_CHECKING:
    from dlpt.collectors.kineto.link import _Spans, _Threads

# A span's node before it is made. Node ids are never negative, so tests of a node against this
# value say only "made or not", exactly.
UNMADE = -1


class SpanWalk:
    """The tree node of each host span's context, made on demand: a span's node is its frame
    under its context's node, where the context is the forward op's node and `[backward]` for a
    linked backward op, else the parent span's, else (top-level) the profile's base for a Python
    thread, the waiting `run_backward` call, or a node for the thread. A launch adds no frame."""

    def __init__(self, spans: _Spans, fwd_of: dict[int, int], threads: _Threads, builder: TreeBuilder,
                 frames: FrameTable, base: int) -> None:
        # The spans' columns as attributes of their own: these methods run once or more per span,
        # and every `self.a.b` costs a lookup.
        self._kind_l, self._name, self._parent = spans.kind_l, spans.name, spans.parent_l
        self._thread_l, self._start_l = spans.thread_l, spans.start_l
        self._fwd_of = fwd_of
        self._threads = threads
        self._builder = builder
        self._frames = frames
        self._base = base
        self._bwd = frames.intern(BACKWARD_FRAME)
        n = len(self._kind_l)
        self._node_of = [UNMADE] * n
        # Spans whose node is being made: a backward link back into one of them is a loop.
        self._busy = [False] * n
        self._frame_cache: dict[tuple[int, str], int] = {}
        self._thread_node: dict[int, int] = {}

    def _frame(self, i: int) -> int | None:
        """Frame id of span i (memoised by kind and name), None for a launch (it adds no frame)."""
        k = self._kind_l[i]
        if k == LAUNCH:
            return None
        return self._frame_id(k, self._name[i])

    def _frame_id(self, k: int, name: str) -> int:
        """Frame id of a span of kind k (not a launch) named name, memoised."""
        key = (k, name)
        f = self._frame_cache.get(key)
        if f is None:
            fr = python_frame(name) if k == PY else Frame("op", name)
            f = self._frame_cache[key] = self._frames.intern(fr)
        return f

    def _thread_node_for(self, t: int) -> int:
        nd = self._thread_node.get(t)
        if nd is None:
            ps = self._threads.started_under(t)
            anchor = self.node(ps) if ps >= 0 else self._base
            nd = self._thread_node[t] = self._builder.child(anchor, self._frames.intern(self._threads.frame(t)))
        return nd

    def keys(self, idx: np.ndarray) -> np.ndarray:
        """A key of each span's node, equal for spans of one node: here the span itself (paths.py's
        `PathNodes` has the same)."""
        return idx

    def node(self, i: int) -> int:
        """The node of span i, made with its ancestors' as needed."""
        node_of = self._node_of
        nd = node_of[i]
        if nd != UNMADE:
            return nd
        # The common case without the general walk: climb the parents (no backward link, not
        # top-level) up to one that has a node, then make the nodes on the way back down. It
        # marks and unmarks `busy` and creates nodes in the same order as `_walk` would, so the
        # tree comes out numbered the same.
        fwd_of, parent, busy = self._fwd_of, self._parent, self._busy
        chain = []
        j = i
        while j not in fwd_of:
            p = parent[j]
            if p < 0:  # top-level: the walk finds its context
                nd = self._walk(j)
                break
            chain.append(j)
            busy[j] = True
            nd = node_of[p]
            if nd != UNMADE:
                break
            j = p
        else:  # a linked backward op: the walk follows its link
            nd = self._walk(j)
        # `_frame_id`, inlined for the frames already interned: this loop makes most of the nodes.
        child, kind_l, name, frame_cache = self._builder.child, self._kind_l, self._name, self._frame_cache
        for k in reversed(chain):
            if node_of[k] != UNMADE:  # made meanwhile, through a link of a damaged trace
                nd = node_of[k]
            else:
                kk = kind_l[k]
                if kk != LAUNCH:
                    fr = frame_cache.get((kk, name[k]))
                    nd = child(nd, self._frame_id(kk, name[k]) if fr is None else fr)
                node_of[k] = nd
            busy[k] = False
        return nd

    def nodes(self, idx: np.ndarray) -> np.ndarray:
        """The nodes of spans idx (any order, repeats allowed). Those not made yet are made in
        ascending span order, as calling `node` on each in that order would (on a span that
        has its node, `node` changes nothing); only they cost a Python call."""
        node_of = self._node_of
        have = np.asarray(node_of, dtype=np.int64)
        miss = idx[have[idx] == UNMADE]
        if len(miss):
            node = self.node
            miss = np.sort(miss)
            # Repeats dropped by hand: np.unique hashes, several times slower on sorted ints.
            for i in miss[np.r_[True, miss[1:] != miss[:-1]]].tolist():
                node(i)
            have = np.asarray(node_of, dtype=np.int64)
        return have[idx]

    def _walk(self, i: int) -> int:
        """`node` in general: an explicit stack over parents, backward links and thread anchors,
        so that deep nesting cannot overflow Python's."""
        node_of, busy, fwd_of, parent = self._node_of, self._busy, self._fwd_of, self._parent
        child, threads = self._builder.child, self._threads
        stack = [i]
        while stack:
            j = stack[-1]
            if node_of[j] != UNMADE:
                stack.pop()
                continue
            busy[j] = True
            f = fwd_of.get(j)  # None: j is not linked to a forward op
            if f is not None and busy[f] and node_of[f] == UNMADE:
                f = None  # a link that loops back on itself (damaged trace): ignore it
                del fwd_of[j]
            if f is not None:
                if node_of[f] == UNMADE:
                    stack.append(f)
                    continue
                ctx = child(node_of[f], self._bwd)
            else:
                p = parent[j]
                if p >= 0:
                    if node_of[p] == UNMADE:
                        stack.append(p)
                        continue
                    ctx = node_of[p]
                else:  # a top-level span
                    t = self._thread_l[j]
                    if t in threads.py_threads:
                        ctx = self._base
                    else:
                        rb = threads.run_backward_around(t, self._start_l[j])
                        if rb >= 0:
                            if node_of[rb] == UNMADE:
                                stack.append(rb)
                                continue
                            ctx = child(node_of[rb], self._bwd)
                        else:
                            ctx = self._thread_node_for(t)
            fr = self._frame(j)
            node_of[j] = ctx if fr is None else child(ctx, fr)
            busy[j] = False
            stack.pop()
        return node_of[i]
