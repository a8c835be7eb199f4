"""The tree node of every host span, found for all spans at once (walk.py's `SpanWalk` makes
them one span at a time, a Python call each: on a 500k-event trace, a sixth of a read).

A span's node is its frame under its context's node, and its context is one other span's node
(its parent's; the forward op's, under `[backward]`; the waiting `run_backward` call's, under
`[backward]`; the span that started its thread, under a thread node) or the profile's base. Each
span thus depends on at most one other, and the dependencies form a forest unless a damaged
trace's links loop. Walking that forest a level at a time gives every span its *path*: a node of
a provisional tree, hash-consed on (parent path, frame), so that a path is a tree node.

The builder's nodes are still made in the order the one-at-a-time walk made them, because the
order of siblings is the tree's (`TreeBuilder.preorder`) and frame ids follow the order of
first use: asking for a span's node makes the missing nodes of its path, top-down, exactly as
the walk made the missing nodes on the way to it; asking for it again changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.kineto.decode import LAUNCH, PY
from dlpt.frames import BACKWARD_FRAME, Frame, FrameTable, python_frame

if TYPE_CHECKING:
    from dlpt.collectors.kineto.link import _Spans, _Threads

I64 = np.int64
# How a span's context comes from the span it depends on (`dep`).
_UNDER = 0  # the dependency's node: its parent span
_BWD = 1  # `[backward]` under the dependency's node: a forward op, a waiting `run_backward`
_THREAD = 2  # a thread node under the dependency's node, or under the base without one
_BASE = 3  # the base itself: a top-level span of a Python thread
# A frame code where there is none: a launch's (it adds no frame), and the thread node's of a
# span not placed under one (never read). Codes are never negative.
NO_FRAME = -1
# A span's path before its level of the dependency forest is reached: every span's is set by
# the end, or the trace is given up (its dependencies loop). Paths are never negative.
NO_PATH = -1
# A path's tree node before it is made. Node ids are never negative, so tests of a node against
# this value say only "made or not", exactly.
UNMADE = -1


class _HashCons:
    """Paths: path 0 is the base; every other is (parent path, frame code), made once."""

    def __init__(self, n_codes: int) -> None:
        self.parent: list[int] = [-1]
        self.code: list[int] = [-1]
        self._of: dict[int, int] = {}
        self._n_codes = n_codes

    def children(self, parents: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """The path of each (parent, code), made as needed: a Python step per distinct pair."""
        if not len(parents):
            return np.zeros(0, dtype=I64)
        keys = parents * I64(self._n_codes) + codes
        uniq, inv = np.unique(keys, return_inverse=True)
        of, par, code = self._of, self.parent, self.code
        out = []
        n = self._n_codes
        for k in uniq.tolist():
            p = of.get(k)
            if p is None:
                p = of[k] = len(par)
                par.append(k // n)
                code.append(k % n)
            out.append(p)
        return np.asarray(out, dtype=I64)[inv.reshape(-1)]


def span_paths(spans: _Spans, fwd_of: dict[int, int],
               threads: _Threads) -> tuple[np.ndarray, list[int], list[int], list[Frame]] | None:
    """(path of each span, parent of each path, frame code of each path, frame of each code), or
    None when the spans' dependencies loop (a damaged trace: the one-at-a-time walk breaks
    such loops where it meets them, in its own order)."""
    kind, name = spans.kind, spans.name
    n = len(kind)
    # Frame codes: one per distinct frame, through the distinct (kind, name) pairs.
    frames: list[Frame] = []
    code_of: dict[Frame, int] = {}

    def code(fr: Frame) -> int:
        c = code_of.get(fr)
        if c is None:
            c = code_of[fr] = len(frames)
            frames.append(fr)
        return c

    fcode = np.zeros(0, dtype=I64)
    if n:
        # Distinct pairs without a sort: their keys are dense (names) times the kinds (< 8).
        pair = spans.name_group[1] * I64(8) + kind
        some = np.zeros(len(spans.name_group[0]) * 8, dtype=I64)
        some[pair] = np.arange(n)  # a span of each pair present
        present = np.zeros(len(some), dtype=bool)
        present[pair] = True
        pcode = np.full(len(some), NO_FRAME, dtype=I64)
        for p, i in zip(np.flatnonzero(present).tolist(), some[present].tolist()):
            k, nm = p % 8, name[i]
            if k != LAUNCH:
                pcode[p] = code(python_frame(nm) if k == PY else Frame("op", nm))
        fcode = pcode[pair]
    bwd = code(BACKWARD_FRAME)

    # Each span's dependency and how its context comes from it.
    dep = np.array(spans.parent, dtype=I64)  # a copy: links and thread anchors go in
    how = np.zeros(n, dtype=np.int8)
    tcode = np.full(n, NO_FRAME, dtype=I64)
    if fwd_of:
        fj = np.fromiter(fwd_of.keys(), dtype=I64, count=len(fwd_of))
        dep[fj] = np.fromiter(fwd_of.values(), dtype=I64, count=len(fwd_of))
        how[fj] = _BWD
    linked = how == _BWD
    started: dict[int, int] = {}
    top = np.flatnonzero((dep < 0) & ~linked)
    py = threads.py_threads
    on_py = np.isin(spans.thread[top], np.fromiter(py, dtype=I64, count=len(py)))
    how[top[on_py]] = _BASE
    rest = top[~on_py]
    for j, t, s in zip(rest.tolist(), spans.thread[rest].tolist(), spans.start[rest].tolist()):
        rb = threads.run_backward_around(t, s)
        if rb >= 0:
            dep[j], how[j] = rb, _BWD
            continue
        ps = started.get(t)
        if ps is None:
            ps = started[t] = threads.started_under(t)
        dep[j], how[j], tcode[j] = ps, _THREAD, code(threads.frame(t))

    # The dependency forest, a level at a time: children of each span in a CSR layout.
    paths = _HashCons(len(frames))
    path_of = np.full(n, NO_PATH, dtype=I64)
    has_dep = np.flatnonzero(dep >= 0)
    by_dep = has_dep[np.argsort(dep[has_dep], kind="stable")]
    n_children = np.bincount(dep[has_dep], minlength=n)
    first_child = np.cumsum(n_children) - n_children
    level = np.flatnonzero(dep < 0)
    done = 0
    while len(level):
        done += len(level)
        h, d = how[level], dep[level]
        ctx = np.zeros(len(level), dtype=I64)
        under = h == _UNDER
        ctx[under] = path_of[d[under]]
        sel = np.flatnonzero(h == _BWD)
        ctx[sel] = paths.children(path_of[d[sel]], np.full(len(sel), bwd, dtype=I64))
        sel = np.flatnonzero(h == _THREAD)
        if len(sel):
            anchor = np.where(d[sel] >= 0, path_of[np.maximum(d[sel], 0)], 0)
            ctx[sel] = paths.children(anchor, tcode[level[sel]])
        fc = fcode[level]
        own = np.flatnonzero(fc != NO_FRAME)  # a launch adds no frame: its context's path is its own
        path_of[level] = ctx
        path_of[level[own]] = paths.children(ctx[own], fc[own])
        # The next level: the spans that depend on this one's.
        lo, cnt = first_child[level], n_children[level]
        total = int(cnt.sum())
        if not total:
            break
        first = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
        level = by_dep[first + np.arange(total)]
    if done != n:
        return None  # some spans depend, through others, on themselves
    return path_of, paths.parent, paths.code, frames


class PathNodes:
    """The node of each span through its path (`span_paths`): `node` and `nodes` as link.py's
    `SpanWalk` has them, each path's missing nodes made top-down when first asked for."""

    def __init__(self, path_of: np.ndarray, parent: list[int], code: list[int], frames: list[Frame],
                 builder: TreeBuilder, table: FrameTable, base: int) -> None:
        self._path_of = path_of
        self._parent = parent
        self._code = code
        self._frames = frames
        self._builder = builder
        self._table = table
        self._real = [UNMADE] * len(parent)
        self._real[0] = base
        self._fid: dict[int, int] = {}

    def _make(self, p: int) -> int:
        """The node of path p, made with its missing ancestors, top-down."""
        real, parent = self._real, self._parent
        chain = []
        while real[p] == UNMADE:
            chain.append(p)
            p = parent[p]
        nd = real[p]
        child, fid, code = self._builder.child, self._fid, self._code
        for q in reversed(chain):
            c = code[q]
            f = fid.get(c)
            if f is None:  # interned on first use, as the one-at-a-time walk does
                f = fid[c] = self._table.intern(self._frames[c])
            nd = real[q] = child(nd, f)
        return nd

    def keys(self, idx: np.ndarray) -> np.ndarray:
        """A key of each span's node, equal for spans of one node (their path), known before the
        node is made."""
        return self._path_of[idx]

    def node(self, i: int) -> int:
        p = int(self._path_of[i])
        nd = self._real[p]
        return nd if nd != UNMADE else self._make(p)

    def nodes(self, idx: np.ndarray) -> np.ndarray:
        """The nodes of spans idx (any order, repeats allowed); missing ones are made as asking
        for each span in ascending order would make them."""
        p = self._path_of[idx]
        real = np.asarray(self._real, dtype=I64)
        if (real[p] == UNMADE).any():
            s = np.sort(idx)
            ps = self._path_of[s]
            ps = ps[real[ps] == UNMADE]
            uniq, first = np.unique(ps, return_index=True)
            for q in uniq[np.argsort(first)].tolist():
                if self._real[q] == UNMADE:
                    self._make(q)
            real = np.asarray(self._real, dtype=I64)
        return real[p]
