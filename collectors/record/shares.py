"""Integer shares that sum exactly: how a compiled kernel's time is divided between the model
lines it was generated from without losing or inventing a nanosecond."""

from __future__ import annotations

import numpy as np


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


def transport(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Integers x[r, j] >= 0 with row sums `rows` and column sums `cols` (equal totals): the
    north-west corner rule in closed form, so split activity rows agree with split node metrics."""
    r1 = np.cumsum(rows)
    c1 = np.cumsum(cols)
    r0, c0 = r1 - rows, c1 - cols
    return np.clip(np.minimum(r1[:, None], c1[None, :]) - np.maximum(r0[:, None], c0[None, :]), 0, None)
