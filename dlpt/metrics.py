"""The metrics every CCT node carries, as integer columns (nanoseconds, bytes, counts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dlpt.profile import Profile

METRICS = (
    "gpu_time", "kernel_time", "htod_time", "dtoh_time", "dtod_time", "memcpy_other_time",
    "memset_time", "htod_bytes", "dtoh_bytes", "dtod_bytes", "kernel_count", "copy_count",
    "memset_count", "cpu_time",
)
COL = {m: i for i, m in enumerate(METRICS)}
TIME_METRICS = frozenset(m for m in METRICS if m.endswith("_time"))
BYTE_METRICS = frozenset(m for m in METRICS if m.endswith("_bytes"))

# Activity kinds, as stored in the profile. Copy direction comes from the name Kineto gives.
KERNEL, HTOD, DTOH, DTOD, MEMCPY_OTHER, MEMSET = range(6)
ACTIVITY_KIND_NAMES = ("kernel", "memcpy_htod", "memcpy_dtoh", "memcpy_dtod", "memcpy_other", "memset")
_KIND_TIME_COL = np.array([COL["kernel_time"], COL["htod_time"], COL["dtoh_time"], COL["dtod_time"],
                           COL["memcpy_other_time"], COL["memset_time"]])
_KIND_BYTES_COL = {HTOD: COL["htod_bytes"], DTOH: COL["dtoh_bytes"], DTOD: COL["dtod_bytes"]}
_KIND_COUNT_COL = np.array([COL["kernel_count"]] + [COL["copy_count"]] * 4 + [COL["memset_count"]])


def copy_kind(name: str) -> int:
    """`Memcpy HtoD (Pageable -> Device)` → HTOD, and so on; anything else is MEMCPY_OTHER."""
    if "HtoD" in name:
        return HTOD
    if "DtoH" in name:
        return DTOH
    if "DtoD" in name:
        return DTOD
    return MEMCPY_OTHER


def metric_unit(metric: str) -> str:
    """The unit of a metric's integer values: `ns`, `bytes` or `count`."""
    return "ns" if metric in TIME_METRICS else "bytes" if metric in BYTE_METRICS else "count"


def metric_column(name: str) -> int:
    from dlpt.errors import DlptError

    try:
        return COL[name]
    except KeyError:
        raise DlptError(f"unknown metric {name!r}; choose one of: {', '.join(METRICS)}") from None


def default_metric(*profiles: Profile) -> str:
    """The metric every view ranks by when the user names none: `gpu_time` when any of the
    profiles has GPU activity; else `cpu_time` (host ops' self time) when any has host op time,
    as a recording on a machine without a GPU has; else `gpu_time`. Reports, exports, the TUI,
    diffs and GraphFrames all start from this one rule, so they agree on what a profile shows."""
    gpu = cpu = 0
    for p in profiles:
        exc = p.cct.exclusive
        gpu += int(exc[:, COL["gpu_time"]].sum())
        cpu += int(exc[:, COL["cpu_time"]].sum())
    return "cpu_time" if gpu == 0 and cpu > 0 else "gpu_time"


def exclusive_matrix(n_nodes: int, node: np.ndarray, kind: np.ndarray, dur: np.ndarray,
                     nbytes: np.ndarray, cpu_node: np.ndarray, cpu_self: np.ndarray,
                     count: np.ndarray | None = None) -> np.ndarray:
    """Exclusive metrics of every node from activity rows (each standing for `count`
    activities; one if None), in one pass of bincounts."""
    out = np.zeros((n_nodes, len(METRICS)), dtype=np.int64)
    if len(node):
        for k in range(6):
            sel = kind == k
            if not sel.any():
                continue
            nk = node[sel]
            out[:, _KIND_TIME_COL[k]] += np.bincount(nk, weights=dur[sel], minlength=n_nodes).astype(np.int64)
            w = None if count is None else count[sel]
            out[:, _KIND_COUNT_COL[k]] += np.bincount(nk, weights=w, minlength=n_nodes).astype(np.int64)
            if k in _KIND_BYTES_COL:
                out[:, _KIND_BYTES_COL[k]] += np.bincount(nk, weights=nbytes[sel], minlength=n_nodes).astype(np.int64)
        out[:, COL["gpu_time"]] = out[:, _KIND_TIME_COL].sum(axis=1)
    if len(cpu_node):
        out[:, COL["cpu_time"]] = np.bincount(cpu_node, weights=cpu_self, minlength=n_nodes).astype(np.int64)
    return out
