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
        # Climb all nodes one level per pass: maximum depth passes, each a numpy operation.
        d = np.zeros(len(self), dtype=np.int64)
        anc = self.parent.copy()
        live = np.flatnonzero(anc >= 0)
        while len(live):
            d[live] += 1
            anc[live] = self.parent[anc[live]]
            live = live[anc[live] >= 0]
        return d

    @cached_property
    def end(self) -> np.ndarray:
        """`end[i]`: one past the last node of i's subtree."""
        n = len(self)
        size = np.ones(n, dtype=np.int64)
        depth = self.depth
        order = np.argsort(-depth, kind="stable")
        # Accumulate subtree sizes from the deepest level up, one level at a time.
        levels = np.split(order, np.flatnonzero(np.diff(depth[order])) + 1)
        for lv in levels:
            lv = lv[lv != 0]
            if len(lv):
                np.add.at(size, self.parent[lv], size[lv])
        return np.arange(n) + size

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
        n = len(self.parent)
        parent = np.asarray(self.parent, dtype=np.int64)
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            kids[self.parent[i]].append(i)
        order = []
        stack = [0]
        while stack:
            i = stack.pop()
            order.append(i)
            stack.extend(reversed(kids[i]))
        old = np.asarray(order, dtype=np.int64)
        new_of_old = np.empty(n, dtype=np.int64)
        new_of_old[old] = np.arange(n)
        new_parent = np.where(parent[old] >= 0, new_of_old[np.maximum(parent[old], 0)], -1)
        new_frame = np.asarray(self.frame, dtype=np.int64)[old]
        return new_parent, new_frame, new_of_old
