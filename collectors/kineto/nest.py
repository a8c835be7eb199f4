"""Nesting the host spans of each thread by time: each span's parent, and its end clipped to the
parent's where float rounding let it overrun (link.py's first stage).

The rule is a stack walk over each thread's spans by start, longest first (`nest_loop`): pop the
spans that ended by this one's start, the top is its parent, clip its end to the parent's, push
it. That is a Python step per span, the largest item of reading a large trace. `nest` gets the
same answer with whole-array steps, from what the walk implies: with the clipped ends E, the
stack at span i (after popping) is the spans before it on its thread with E > start_i, so its
depth d_i is their number and its parent the last span before it with depth d_i - 1. Clipped ends
depend on parents and parents on clipped ends, so `nest` starts from the raw ends and repeats
until E is the chain minimum of the raw ends along the parents it gives (a fixed point, which
only the walk's answer is; the docstring of `_parents` says why). Rounding overruns are few and
a few nanoseconds long: one or two rounds. What does not settle goes to the walk.
"""

from __future__ import annotations

import numpy as np

I64 = np.int64
# Rounds of (parents, clipped ends) before the walk is asked instead.
_ROUNDS = 4


def nest(order: np.ndarray, thread: np.ndarray, start: np.ndarray,
         end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parent span of each span or -1, end clipped to the parent's), as `nest_loop` gives them.
    `order` sorts the spans by thread, start, longest first, then kind (link.py)."""
    n = len(end)
    if not n:
        return np.zeros(0, dtype=I64), end.astype(I64, copy=True)
    t, s, raw = thread[order], start[order], end[order]
    seg = np.flatnonzero(np.r_[True, t[1:] != t[:-1], True])  # each thread's run of positions
    zl = _zero_length_after(s, raw, t)
    e = raw
    for _ in range(_ROUNDS):
        found = _parents(s, e, t, seg, zl)
        if found is None:
            break
        par, by_depth = found
        clipped = _clip(raw, s, par, by_depth)
        if np.array_equal(clipped, e):
            has = par >= 0
            if not (e[par[has]] > s[has]).all():
                break  # a parent that does not contain its child: not the walk's answer
            parent = np.full(n, -1, dtype=I64)
            parent[order] = np.where(has, order[np.maximum(par, 0)], -1)
            end_c = np.empty(n, dtype=I64)
            end_c[order] = e
            return parent, end_c
        e = clipped
    return nest_loop(order, thread, start, end)


def _zero_length_after(s: np.ndarray, raw: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each position i, the zero-length spans at i or after it that start when i does (on its
    thread): they come last among the spans of that start, and they end by it though i comes
    first."""
    zl = np.r_[0, np.cumsum(raw == s)]  # zero-length spans before each position
    last = np.flatnonzero(np.r_[(s[1:] != s[:-1]) | (t[1:] != t[:-1]), True])  # of each start
    block_end = np.repeat(last + 1, np.diff(np.r_[0, last + 1]))
    return zl[block_end] - zl[:-1]


def _parents(s: np.ndarray, e: np.ndarray, t: np.ndarray, seg: np.ndarray,
             zl_after: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """(the parent position of each position for ends `e`, -1 for none; the positions of each
    depth, shallowest first). The depth is the number of earlier positions on the thread whose end
    is after the position's start; the parent, the last earlier position one level up. None where
    that finds no such parent.

    When `e` is the chain minimum of the raw ends along these parents and every parent's end is
    after its child's start, the depths count exactly the walk's stack (no end is before its
    start, and the zero-length ends are the raw ones, which `zl_after` takes out), and the last
    earlier position one level up is the top of that stack: the walk's parents and ends."""
    n = len(s)
    closed = np.empty(n, dtype=I64)  # positions on the thread that ended by each start
    for a, b in zip(seg[:-1].tolist(), seg[1:].tolist()):
        closed[a:b] = np.searchsorted(np.sort(e[a:b]), s[a:b], side="right")
    pos = np.arange(n, dtype=I64)
    first = np.repeat(seg[:-1], np.diff(seg))  # each position's thread's first
    depth = (pos - first) - (closed - zl_after)
    if (depth < 0).any():
        return None
    top = int(depth.max())
    # Positions by depth, each level in position order (a radix sort where depths are small).
    by_depth = np.argsort(depth.astype(np.int16) if top < 1 << 15 else depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(top + 2)).tolist()
    levels = [by_depth[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    par = np.full(n, -1, dtype=I64)
    for up, here in zip(levels[:-1], levels[1:]):
        k = np.searchsorted(up, here) - 1  # the last position one level up before each
        if len(k) and k[0] < 0:
            return None
        p = up[k]
        if not (t[p] == t[here]).all():
            return None
        par[here] = p
    return par, levels


def _clip(raw: np.ndarray, s: np.ndarray, par: np.ndarray, levels: list[np.ndarray]) -> np.ndarray:
    """Each end clipped to its parent's clipped end, a level at a time from the top, except where
    that parent ends by the child's start: such a parent is wrong (an overrun not yet clipped
    made it look open), and clipping to it would close the child before it began and mislead the
    next round's depths in turn."""
    e = raw.copy()
    for j in levels[1:]:
        pe = e[par[j]]
        clip = (pe > s[j]) & (pe < e[j])
        e[j[clip]] = pe[clip]
    return e


def nest_loop(order: np.ndarray, thread: np.ndarray, start: np.ndarray,
              end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`nest`'s answer by the stack walk, a Python step per span (lists inside: scalar steps,
    which numpy would make slower; arrays out, a fifth of the lists' memory)."""
    parent = [-1] * len(end)
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
    return np.asarray(parent, dtype=I64), np.asarray(end_l, dtype=I64)
