"""The calling-context tree: struct-of-arrays in preorder, so a subtree is a contiguous slice
and inclusive metrics are one cumulative sum."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from dlpt.metrics import METRICS


class CCT:
    """Nodes `0..n-1` in preorder; node 0 is the root. `exclusive` is an (n, len(METRICS)) int64
    matrix. Instances are never mutated: transformations build new trees."""

    def __init__(self, parent: np.ndarray, frame: np.ndarray, exclusive: np.ndarray) -> None:
        self.parent = np.asarray(parent, dtype=np.int64)
        self.frame = np.asarray(frame, dtype=np.int64)
        self.exclusive = np.asarray(exclusive, dtype=np.int64)
        n = len(self.parent)
        if n == 0 or self.parent[0] != -1:
            raise ValueError("a CCT needs a root at index 0")
        if self.exclusive.shape != (n, len(METRICS)):
            raise ValueError("exclusive metrics do not match the nodes")

    def __len__(self) -> int:
        return len(self.parent)

    @cached_property
    def depth(self) -> np.ndarray:
        return tree_depth(self.parent)

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """Node ids grouped by depth, the root's level first: the order in which a value passed
        down the tree (an ancestor's to its descendants) is computed one numpy step per level."""
        return _levels(self.depth)

    @cached_property
    def end(self) -> np.ndarray:
        """`end[i]`: one past the last node of i's subtree."""
        return np.arange(len(self)) + subtree_sizes(self.parent, self.depth)

    @cached_property
    def inclusive(self) -> np.ndarray:
        c = np.zeros((len(self) + 1, self.exclusive.shape[1]), dtype=np.int64)
        np.cumsum(self.exclusive, axis=0, out=c[1:])
        return c[self.end] - c[:-1]

    @cached_property
    def _child_index(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(self.parent[1:], kind="stable") + 1
        starts = np.searchsorted(self.parent[order], np.arange(len(self) + 1))
        return order, starts

    def children(self, i: int) -> np.ndarray:
        order, starts = self._child_index
        return order[starts[i]:starts[i + 1]]

    def path(self, i: int) -> list[int]:
        """Node ids from the root's child down to i."""
        out = []
        while i > 0:
            out.append(i)
            i = int(self.parent[i])
        return out[::-1]

    def total(self, metric_col: int) -> int:
        return int(self.exclusive[:, metric_col].sum())


def tree_depth(parent: np.ndarray) -> np.ndarray:
    """Depth of every node (root 0) for any numbering: all nodes climb one level per pass, so
    the cost is (maximum depth) numpy operations."""
    d = np.zeros(len(parent), dtype=np.int64)
    anc = np.asarray(parent, dtype=np.int64).copy()
    live = np.flatnonzero(anc >= 0)
    while len(live):
        d[live] += 1
        anc[live] = parent[anc[live]]
        live = live[anc[live] >= 0]
    return d


def _levels(depth: np.ndarray) -> list[np.ndarray]:
    """Node ids grouped by depth, shallowest first."""
    order = np.argsort(depth, kind="stable")
    cuts = np.flatnonzero(np.diff(depth[order])) + 1
    return np.split(order, cuts)


def subtree_sizes(parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    n = len(parent)
    size = np.ones(n, dtype=np.int64)
    for lv in reversed(_levels(depth)[1:]):
        size += np.bincount(parent[lv], weights=size[lv], minlength=n).astype(np.int64)
    return size


def preorder_ids(parent: np.ndarray) -> np.ndarray:
    """The preorder position of every node of a tree given in any numbering (root 0), siblings
    in the order of their ids. Level by level in numpy: a node's position is its parent's plus
    one plus the sizes of the siblings before it."""
    parent = np.asarray(parent, dtype=np.int64)
    n = len(parent)
    depth = tree_depth(parent)
    size = subtree_sizes(parent, depth)
    pre = np.zeros(n, dtype=np.int64)
    for lv in _levels(depth)[1:]:
        lv = lv[np.lexsort((lv, parent[lv]))]
        par = parent[lv]
        sz = size[lv]
        before = np.cumsum(sz) - sz
        first = np.r_[0, np.flatnonzero(np.diff(par)) + 1]
        group_start = np.repeat(before[first], np.diff(np.r_[first, len(lv)]))
        pre[lv] = pre[par] + 1 + before - group_start
    return pre


def renumber(parent: np.ndarray, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parent, frame, new_of_old) of the same tree in preorder."""
    parent = np.asarray(parent, dtype=np.int64)
    new_of_old = preorder_ids(parent)
    n = len(parent)
    new_parent = np.empty(n, dtype=np.int64)
    new_frame = np.empty(n, dtype=np.int64)
    new_parent[new_of_old] = np.where(parent >= 0, new_of_old[np.maximum(parent, 0)], -1)
    new_frame[new_of_old] = frame
    return new_parent, new_frame, new_of_old


def sum_rows(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """`out[index[k]] += values[k]` for an (m, c) int64 matrix, a bincount per column (np.add.at
    is an order of magnitude slower). Float weights are exact below 2**53 ns (104 days)."""
    out = np.zeros((n, values.shape[1]), dtype=np.int64)
    for c in range(values.shape[1]):
        col = values[:, c]
        if col.any():
            out[:, c] = np.bincount(index, weights=col, minlength=n).astype(np.int64)
    return out


def add_exact(out: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """`np.add.at(out, index, values)` for int64: a bincount (several times faster) where float
    weights are exact, that is where all the values together stay under 2**52."""
    if not len(values):
        return
    if float(np.abs(values).sum(dtype=np.float64)) < 2.0**52:
        out += np.bincount(index, weights=values, minlength=len(out)).astype(np.int64)
    else:
        np.add.at(out, index, values)


def distinct(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` of an int array, by sorting: a plain `np.unique` imports `numpy.ma` on its
    first call (to ask whether `a` is masked), 15 ms of a read's start-up."""
    s = np.sort(a)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


class TreeBuilder:
    """Grows a tree one (parent, frame) edge at a time through a cache, then renumbers it in
    preorder. Collectors memoise the node of each context, so a path is never walked twice."""

    def __init__(self, root_frame: int) -> None:
        self.parent: list[int] = [-1]
        self.frame: list[int] = [root_frame]
        self._edges: dict[tuple[int, int], int] = {}

    def child(self, parent: int, frame: int) -> int:
        key = (parent, frame)
        n = self._edges.get(key)
        if n is None:
            n = self._edges[key] = len(self.parent)
            self.parent.append(parent)
            self.frame.append(frame)
        return n

    def path(self, frames: tuple[int, ...] | list[int], start: int = 0) -> int:
        node = start
        for f in frames:
            node = self.child(node, f)
        return node

    def __len__(self) -> int:
        return len(self.parent)

    def preorder(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(parent, frame, new_id_of_old_id) with nodes renumbered in preorder; siblings keep
        their creation order."""
        return renumber(np.asarray(self.parent, dtype=np.int64), np.asarray(self.frame, dtype=np.int64))
