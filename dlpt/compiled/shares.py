"""Integer shares that sum exactly: how a compiled kernel's time (its node's metrics and its
activity rows) is divided between the model lines it was generated from without losing or
inventing a nanosecond."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from dlpt.metrics import _KIND_BYTES_COL, _KIND_COUNT_COL, _KIND_TIME_COL, COL, PC_PARTS
from dlpt.profile import Activities


def split_int(values: np.ndarray, weights: list[int]) -> np.ndarray:
    """(len(weights), len(values)) integers, each column summing to its value exactly: floor of
    the proportional share, the remainder to the largest fractional parts (ties: first share).
    Python integers: ns totals times weights can pass 2**63."""
    w = [int(x) for x in weights]
    total = sum(w)
    out = np.zeros((len(w), len(values)), dtype=np.int64)
    for c, v in enumerate(int(x) for x in values):
        if v == 0:
            continue
        base = [v * x // total for x in w]
        rem = v - sum(base)
        order = sorted(range(len(w)), key=lambda j: (-(v * w[j] % total), j))
        for j in order[:rem]:
            base[j] += 1
        out[:, c] = base
    return out


# Metric families whose parts add up to their total on every node (dlpt.metrics): split column by
# column, each part's share may round the other way than the total's; `keep_families` mends it.
_FAMILIES = ((COL["pc_samples"], np.array([COL[m] for m in PC_PARTS])),)


def keep_families(split: np.ndarray, values: np.ndarray, weights: list[int]) -> np.ndarray:
    """`split` (split_int's shares of `values`) with each family's parts mended so that, in every
    share, they add up to the share's total again, every column still summing to its value:
    the parts' floors stay, and the units each part has left go one at a time to the shares that
    lack most, largest fractional part first."""
    w = [int(x) for x in weights]
    total = sum(w)
    for t, cols in _FAMILIES:
        if not int(values[t]):
            continue
        vals = [int(values[c]) for c in cols]
        floor = np.array([[v * x // total for v in vals] for x in w], dtype=np.int64)
        need = split[:, t] - floor.sum(axis=1)
        left = np.array(vals, dtype=np.int64) - floor.sum(axis=0)
        frac = sorted(((-(v * w[j] % total), j, k) for j in range(len(w)) for k, v in enumerate(vals)))
        for _, j, k in frac:  # proportional first: a share's own largest remainders
            if need[j] > 0 and left[k] > 0:
                floor[j, k] += 1
                need[j] -= 1
                left[k] -= 1
        for j in np.flatnonzero(need > 0).tolist():  # then whatever part still has units
            for k in np.flatnonzero(left > 0).tolist():
                n = min(int(need[j]), int(left[k]))
                floor[j, k] += n
                need[j] -= n
                left[k] -= n
        split[:, cols] = floor
    return split


def transport(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Integers x[r, j] >= 0 with row sums `rows` and column sums `cols` (equal totals): the
    north-west corner rule in closed form, so split activity rows agree with split node metrics."""
    r1 = np.cumsum(rows)
    c1 = np.cumsum(cols)
    r0, c0 = r1 - rows, c1 - cols
    return np.clip(np.minimum(r1[:, None], c1[None, :]) - np.maximum(r0[:, None], c0[None, :]), 0, None)


# Activity columns that add up (split between shares); the others (start, device...) are copied.
_ADDITIVE = ("duration", "bytes", "count")


def split_activities(a: Activities, first: np.ndarray, copies: dict[int, list[int]], shares: dict[int, np.ndarray],
                     weights: dict[int, list[int]], new_of_old: np.ndarray) -> Activities:
    """The activity rows of a tree whose nodes were copied to new places: a row of a node with
    one place moves to it (`first`, then `new_of_old`); the rows of a node with several
    (`copies`) are split between them, each additive column so that each copy's rows sum to its
    share of the node's metrics (`shares`, the node's `split_int` by `weights`), other columns
    repeated."""
    cols = {f.name: getattr(a, f.name) for f in fields(a)}
    if not len(a):
        return a
    split_rows = np.flatnonzero(np.isin(a.node, np.fromiter(copies, dtype=np.int64, count=len(copies))))
    keep = np.ones(len(a), dtype=bool)
    keep[split_rows] = False
    out = {k: [v[keep]] for k, v in cols.items()}
    out["node"] = [new_of_old[first[a.node[keep]]]]
    order = split_rows[np.lexsort((a.kind[split_rows], a.node[split_rows]))]
    groups = np.split(order, np.flatnonzero(np.diff(a.node[order] * 8 + a.kind[order])) + 1) if len(order) else []
    for g in groups:
        node = int(a.node[g[0]])
        kind = int(a.kind[g[0]])
        k = len(copies[node])
        parts: dict[str, np.ndarray] = {}
        for name in _ADDITIVE:
            if name not in cols:
                continue
            vals = cols[name][g].astype(np.int64)
            col = {"duration": _KIND_TIME_COL[kind], "count": _KIND_COUNT_COL[kind]}.get(name, _KIND_BYTES_COL.get(kind))
            target = shares[node][:, col] if col is not None else None
            if target is not None and int(target.sum()) == int(vals.sum()):
                parts[name] = transport(vals, target)  # (rows, shares)
            else:
                parts[name] = split_int(vals, weights[node]).T
        for name, v in cols.items():
            if name == "node":
                out[name].append(np.tile(new_of_old[np.asarray(copies[node], dtype=np.int64)], len(g)))
            elif name in parts:
                out[name].append(parts[name].ravel())
            else:
                out[name].append(np.repeat(v[g], k))
    merged = {k: np.concatenate(v).astype(cols[k].dtype, copy=False) for k, v in out.items()}
    return replace(a, **merged)
