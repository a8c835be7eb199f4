"""The metrics every CCT node carries, as integer columns (nanoseconds, bytes, counts)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# The stored columns of every profile written so far, in their column order. A metric added to
# REGISTRY (below) and nowhere else gets the next column: METRICS is this order, then the
# registry's new names; the store writes the names beside the columns and reads them by name.
_COLUMNS = (
    "gpu_time", "kernel_time", "comm_time", "htod_time", "dtoh_time", "dtod_time", "memcpy_other_time",
    "memset_time", "htod_bytes", "dtoh_bytes", "dtod_bytes", "kernel_count", "copy_count",
    "memset_count", "cpu_time",
    # Why the GPU waits (docs/ARCHITECTURE.md, the section of that name): wall-clock time the
    # host spent with the node as its innermost line; GPU idle time blamed on the host lines that
    # ran during each gap; host time blocked waiting for the GPU.
    "host_time", "gpu_idle_time", "sync_time",
    # Time a rank's collectives spent waiting for the last rank to arrive: an estimate from the
    # ranks' start times of each call, made when all ranks' profiles are read together.
    "comm_wait_time",
    # GPU memory from the caching allocator's events: bytes and number of allocations, and the
    # bytes still live at the device's peak (summed over devices).
    "alloc_bytes", "alloc_count", "peak_bytes",
)


class Metric(NamedTuple):
    """What a metric is, said once: every view, export and the HTML page read it from here."""

    name: str
    unit: str  # of its integer values: "ns", "bytes" or "count"; all are additive over nodes
    about: str  # one line: what it counts (the TUI's picker and help, the HTML page's picker)
    cycled: bool  # offered by the TUI's `s` key (in REGISTRY's order); the rest only by the picker


# One record per metric, in the order the TUI cycles and the pickers list them.
REGISTRY = (
    Metric("gpu_time", "ns", "kernels + copies + memsets", True),
    Metric("kernel_time", "ns", "kernels", True),
    Metric("htod_time", "ns", "host→device copies", True),
    Metric("dtoh_time", "ns", "device→host copies", True),
    Metric("dtod_time", "ns", "device→device copies", True),
    Metric("memset_time", "ns", "memsets", True),
    Metric("gpu_idle_time", "ns", "GPU idle, blamed on the host", True),
    Metric("sync_time", "ns", "host waiting for the GPU", True),
    Metric("host_time", "ns", "host wall time on the line", True),
    Metric("cpu_time", "ns", "host ops' own time", True),
    Metric("peak_bytes", "bytes", "live at the memory peak", True),
    Metric("alloc_bytes", "bytes", "GPU memory allocated", True),
    Metric("kernel_count", "count", "kernel launches", True),
    Metric("copy_count", "count", "copies", True),
    Metric("comm_time", "ns", "collectives", False),
    Metric("comm_wait_time", "ns", "waiting for the last rank", False),
    Metric("memcpy_other_time", "ns", "other copies", False),
    Metric("htod_bytes", "bytes", "bytes copied host→device", False),
    Metric("dtoh_bytes", "bytes", "bytes copied device→host", False),
    Metric("dtod_bytes", "bytes", "bytes copied device→device", False),
    Metric("memset_count", "count", "memsets", False),
    Metric("alloc_count", "count", "GPU allocations", False),
    # GPU PC samples (`dlpt record --pc-samples`): every sample of a warp's program counter, and
    # each by why the warp was not issuing then (PC_STALLS below; `pc_issued`: it was). They add
    # up: pc_samples = pc_issued + the stall_* columns, per node.
    Metric("pc_samples", "count", "GPU PC samples", False),
    Metric("pc_issued", "count", "issuing, not stalled", False),
    Metric("stall_long_scoreboard", "count", "stalled, global memory", False),
    Metric("stall_lg_throttle", "count", "stalled, memory queue full", False),
    Metric("stall_short_scoreboard", "count", "stalled, shared memory", False),
    Metric("stall_mio_throttle", "count", "stalled, MIO queue full", False),
    Metric("stall_math_pipe", "count", "stalled, math pipe busy", False),
    Metric("stall_wait", "count", "stalled, fixed latency", False),
    Metric("stall_barrier", "count", "stalled at a barrier", False),
    Metric("stall_branch", "count", "stalled on a branch", False),
    Metric("stall_no_instruction", "count", "stalled, no instruction", False),
    Metric("stall_not_selected", "count", "ready, not selected", False),
    Metric("stall_other", "count", "stalled, other reasons", False),
)
METRIC = {m.name: m for m in REGISTRY}
assert set(_COLUMNS) <= set(METRIC), "every stored column has one record"
METRICS = _COLUMNS + tuple(m.name for m in REGISTRY if m.name not in _COLUMNS)
COL = {m: i for i, m in enumerate(METRICS)}
# The columns of schema-1 profiles, which predate comm_time: the store maps them by name.
METRICS_V1 = ("gpu_time", "kernel_time", "htod_time", "dtoh_time", "dtod_time", "memcpy_other_time", "memset_time",
              "htod_bytes", "dtoh_bytes", "dtod_bytes", "kernel_count", "copy_count", "memset_count", "cpu_time")
# The PC-sample family: the total, then its parts (which add up to it).
PC_PARTS = tuple(m.name for m in REGISTRY if m.name == "pc_issued" or m.name.startswith("stall_"))
PC_METRICS = ("pc_samples", *PC_PARTS)
TIME_METRICS = frozenset(m.name for m in REGISTRY if m.unit == "ns")
BYTE_METRICS = frozenset(m.name for m in REGISTRY if m.unit == "bytes")

# Activity kinds, as stored in the profile. Copy direction comes from the name Kineto gives.
KERNEL, HTOD, DTOH, DTOD, MEMCPY_OTHER, MEMSET = range(6)


class ActivityKind(NamedTuple):
    stored: str  # its name in the .dlpt file's activity_kinds table
    frame: str  # the kind of its leaf frame (dlpt.frames.ACTIVITY_KINDS): every copy is a `memcpy`
    label: str  # how totals name it: the report's and the TUI's GPU time split, the detail pane
    short: str  # a table column's header, the kind of a row in the detail pane's activity list
    time: str  # the metric its time counts in
    counted_in: str  # the metric that counts its activities
    split: str  # its key in the hotspots schema's `memcpy_time` split ("" for kernels and memsets)


# The one place an activity kind gets its names, indexed by the numbers above.
ACTIVITY_KIND_INFO = (
    ActivityKind("kernel", "kernel", "kernels", "kernel", "kernel_time", "kernel_count", ""),
    ActivityKind("memcpy_htod", "memcpy", "HtoD", "HtoD", "htod_time", "copy_count", "HtoD"),
    ActivityKind("memcpy_dtoh", "memcpy", "DtoH", "DtoH", "dtoh_time", "copy_count", "DtoH"),
    ActivityKind("memcpy_dtod", "memcpy", "DtoD", "DtoD", "dtod_time", "copy_count", "DtoD"),
    ActivityKind("memcpy_other", "memcpy", "other copies", "memcpy", "memcpy_other_time", "copy_count", "other"),
    ActivityKind("memset", "memset", "memset", "memset", "memset_time", "memset_count", ""),
)
# The copies, in the order the hotspots schema's `memcpy_time` split lists them.
COPY_KINDS = tuple(k for k in ACTIVITY_KIND_INFO if k.split)
# The metrics that count activities (kernels, copies, memsets): a row's `count` is their sum.
COUNT_METRICS = tuple(dict.fromkeys(k.counted_in for k in ACTIVITY_KIND_INFO))
ACTIVITY_KIND_NAMES = tuple(k.stored for k in ACTIVITY_KIND_INFO)
# The order a split of GPU time is told in: kernels, copies by direction, memsets, other copies.
KIND_BREAKDOWN = tuple(ACTIVITY_KIND_INFO[k] for k in (KERNEL, HTOD, DTOH, DTOD, MEMSET, MEMCPY_OTHER))
_KIND_TIME_COL = np.array([COL[k.time] for k in ACTIVITY_KIND_INFO])
_KIND_BYTES_COL = {HTOD: COL["htod_bytes"], DTOH: COL["dtoh_bytes"], DTOD: COL["dtod_bytes"]}
_KIND_COUNT_COL = np.array([COL[k.counted_in] for k in ACTIVITY_KIND_INFO])


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
    """The unit of a metric's integer values: `ns`, `bytes` or `count` (its REGISTRY record)."""
    return METRIC[metric].unit if metric in METRIC else "count"


def fmt_bytes(n: float) -> str:
    """A byte count for people, in binary units (1 KiB = 1024 B, as `ls -h`, memray and the
    CUDA tools count): `512 B`, `1.5 KiB`, `64 KiB`, `1.0 MiB`. Two or three significant digits
    are what tell sizes apart; more is noise."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.0f} {unit}" if abs(n) >= 10 else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_time(ns: float) -> str:
    """A duration for people, in the unit that reads best: `812 ns`, `3.4 us`, `12.35 ms`,
    `1.20 s` (every view, export and the diagnosis: one way to write a time)."""
    ns = float(ns)
    a = abs(ns)
    if a == 0:
        return "0"
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.1f} us"
    if a < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_metric(metric: str, v: float) -> str:
    """A metric's value in its unit: a time, bytes, or a count."""
    if metric in TIME_METRICS:
        return fmt_time(v)
    if metric in BYTE_METRICS:
        return fmt_bytes(v)
    return f"{int(v):,}"


# Collective communication, by name. Kernels: NCCL's (ncclDevKernel_*, ncclKernel_*) and RCCL's,
# the libraries whose collectives run as GPU kernels under torch.distributed. Host ops: the
# c10d dispatcher ops (c10d::allreduce_, ...) and the spans the process-group backends open
# around each collective (nccl:all_reduce, gloo:all_reduce, ...), where a rank waits for the
# others on the host (gloo on CPU: the whole collective).
_COLLECTIVE_PREFIXES = ("nccl", "rccl", "gloo:", "c10d::", "mpi:", "ucc:")


def is_collective(name: str) -> bool:
    """Is this kernel or op a collective (all-reduce, all-gather, ...)? A collective kernel's
    time is `comm_time`; a collective op's host time is the host side of communication."""
    return name.lstrip("_").lower().startswith(_COLLECTIVE_PREFIXES)


def collective_mask(frames: list, name: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Which activities (frame ids `name`, kinds `kind`) are collective kernels; one test per
    frame, not per activity."""
    per_frame = np.fromiter((is_collective(f.name) for f in frames), dtype=bool, count=len(frames))
    if not len(name):
        return np.zeros(0, dtype=bool)
    return (np.asarray(kind) == KERNEL) & per_frame[np.asarray(name)]


def metric_column(name: str) -> int:
    from dlpt.errors import DlptError

    try:
        return COL[name]
    except KeyError:
        raise DlptError(f"unknown metric {name!r}; choose one of: {', '.join(METRICS)}") from None


def exclusive_matrix(n_nodes: int, node: np.ndarray, kind: np.ndarray, dur: np.ndarray,
                     nbytes: np.ndarray, cpu_node: np.ndarray, cpu_self: np.ndarray,
                     count: np.ndarray | None = None, collective: np.ndarray | None = None) -> np.ndarray:
    """Exclusive metrics of every node from activity rows (each standing for `count`
    activities; one if None), in one pass of bincounts. `collective` marks the rows that are
    collective kernels (`collective_mask`): their time is counted in kernel_time and gpu_time
    like any kernel's, and in comm_time too."""
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
        if collective is not None and collective.any():
            out[:, COL["comm_time"]] = comm_column(n_nodes, node, dur, collective)
    if len(cpu_node):
        out[:, COL["cpu_time"]] = np.bincount(cpu_node, weights=cpu_self, minlength=n_nodes).astype(np.int64)
    return out


def comm_column(n_nodes: int, node: np.ndarray, dur: np.ndarray, collective: np.ndarray) -> np.ndarray:
    """comm_time of every node: the duration of its collective kernels."""
    return np.bincount(node[collective], weights=dur[collective], minlength=n_nodes).astype(np.int64)
