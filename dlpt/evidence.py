"""What the diagnosis judges (dlpt/findings.py): the steady state's time split into parts that
never overlap, each line's share of it, and what the program already does.

The split. Over the steady state (dlpt/phases.py; the whole profile when it has no phases) the
GPUs' time D is busy B plus idle I. Busy holds the collectives' waits W (a rank's NCCL kernel
spinning for a late rank: `comm_wait_time`) and pageable copies C (staged through the host), and
B − W − C is the GPU computing. Idle is start-up and unattributed U (no host line ran), Q while
work the host had launched waited to start (launch latency, a CUDA graph's nodes one after
another, a profiler's records: not the host's doing), plus what the host lines are blamed for; of that, A is what syncs cost: the idle while the host was
blocked in one, and, where the GPU ran dry during a sync, the idle after it until the host
launched again (`after_sync`); the rest is shared between the lines that ran during the gaps,
by their class:

- data loading (a line inside `torch/utils/data/`, or a `for … in loader:` line): L;
- launching short kernels (a line that launches, one by one and not replayed inside a CUDA
  graph, kernels whose op averages under 10 µs a kernel): K;
- the host's own Python (every other line: per-sample loops, preprocessing, logging): P;

each line's idle scaled by (blamed − A) / blamed, so that A + L + K + P is the blamed idle.
D = (B − W − C) + Q + W + C + A + L + K + P + U, so the verdicts, one per part, never add up to more
than the steady state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlpt.compile_time import compile_kind
from dlpt.frames import Frame, is_library
from dlpt.metrics import COL, HTOD, KERNEL
from dlpt.phases import STEADY, has_phases, select_phase
from dlpt.profile import Profile
from dlpt.transforms import def_line_mask, nearest_marked, propagate_down
from dlpt.waits import Waits, waits

SHORT_KERNEL_NS = 10_000  # "tiny" kernels: launching one costs about as much as running it
LOADER_FILE = "torch/utils/data/"
# `for batch in loader:`, `for i, (x, y) in enumerate(train_loader):`, `for b in DataLoader(...)`.
LOADER_LOOP = re.compile(r"^\s*(async\s+)?for\s.+\sin\s.*(loader|DataLoader)", re.IGNORECASE)
# Frames of a multi-process DataLoader's main side (its single-process iterator has none of them).
_WORKER_QUEUE = frozenset({"_try_get_data", "_get_data"})
_GRAPH_FILES = ("torch/cuda/graphs.py", "torch/_inductor/cudagraph_trees.py")
_GRAPH_FUNCS = frozenset({"replay", "run", "execute_node", "run_graph", "_run"})
_REPLAY_FILE = "torch/cuda/graphs.py"  # CUDAGraph.replay: cudagraph trees' replays call it too


def replay_frames(frames: list[Frame]) -> np.ndarray:
    """Frames of `CUDAGraph.replay`: the kernels beneath them ran inside a graph, launched by one
    call for the whole graph, so none of them is a launch of its own (cudagraph trees' input
    copies run in their `run`, outside it, and are)."""
    return np.fromiter((f.kind == "python" and f.function == "replay" and f.file.replace("\\", "/").endswith(_REPLAY_FILE)
                        for f in frames), dtype=bool, count=len(frames))


class Lines:
    """Each node's user line (the innermost non-library source frame on its path) and per-line
    sums of any per-node column."""

    def __init__(self, profile: Profile) -> None:
        cct = profile.cct
        frames = profile.frames
        # A frame on its `def` line is its caller's line's work (dlpt.transforms.def_line_mask).
        user = np.fromiter((f.has_source and not is_library(f) for f in frames), dtype=bool, count=len(frames))
        user &= ~def_line_mask(profile)
        owner_node = nearest_marked(cct, user[cct.frame])
        keys: dict[tuple[str, int], int] = {}
        self.line_of = np.full(len(cct), -1, dtype=np.int64)
        has = owner_node >= 0
        for fi, nodes in group(cct.frame[owner_node[has]], np.flatnonzero(has)):
            f = frames[fi]
            self.line_of[nodes] = keys.setdefault((f.file, f.line), len(keys))
        self.labels = [f"{file}:{line}" for file, line in keys]
        self.keys = list(keys)

    def sums(self, per_node: np.ndarray) -> np.ndarray:
        has = self.line_of >= 0
        return np.bincount(self.line_of[has], weights=per_node[has], minlength=len(self.labels))

    def top(self, per_line: np.ndarray, n: int = 3, at_least: float = 0.0) -> list[str]:
        order = np.argsort(-per_line, kind="stable")
        return [self.labels[i] for i in order[:n].tolist() if per_line[i] > at_least and per_line[i] > 0]


def group(values: np.ndarray, items: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, items having it) for each distinct value."""
    if not len(values):
        return []
    order = np.argsort(values, kind="stable")
    v, it = values[order], items[order]
    starts = np.r_[0, np.flatnonzero(np.diff(v)) + 1]
    ends = np.r_[starts[1:], len(v)]
    return [(int(v[s]), it[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]


def column(profile: Profile, metric: str) -> np.ndarray:
    return profile.cct.exclusive[:, COL[metric]]


@dataclass
class Traits:
    """What the program already does, so that no remedy asks for it again."""

    compiled: bool = False  # torch.compile'd code ran (Triton/Inductor kernels, compiled regions)
    graphed: bool = False  # CUDA graphs were replayed (torch.cuda.graphs, Inductor's cudagraph trees)
    # A recording that traced every kernel of every replay (`--cuda-graph-trace node`, the
    # default): CUPTI's records cost each graph launch 1-2 us per kernel on the host, idle the
    # program would not have.
    graphs_per_kernel: bool = False
    pinned: bool = False  # host-to-device copies from pinned memory
    loader_workers: int | None = None  # a DataLoader's num_workers, where known
    loader_pinned: bool | None = None  # its pin_memory, where known


def traits(whole: Profile) -> Traits:
    t = Traits()
    frames = whole.frames
    a = whole.activities
    used = np.zeros(len(frames), dtype=bool)
    used[a.name[a.kind == KERNEL]] = True
    for fid in np.flatnonzero(used).tolist():
        if frames[fid].name.startswith("triton_"):
            t.compiled = True
            break
    pinned = np.fromiter(("Pinned" in f.name for f in frames), dtype=bool, count=len(frames))
    t.pinned = bool(len(a) and (pinned[a.name] & (a.kind == HTOD)).any())
    workers = False
    graph_frames = np.zeros(len(frames), dtype=bool)
    for i, f in enumerate(frames):
        if f.kind == "op" and f.name.startswith(("Torch-Compiled Region", "CompiledFunction")):
            t.compiled = True
        if f.kind == "python":
            path = f.file.replace("\\", "/")
            # Replaying a graph: CUDAGraph.replay, or Inductor's cudagraph trees running a node
            # (other functions of those files run for eager programs too: is_current_stream_capturing).
            graph_frames[i] = path.endswith(_GRAPH_FILES) and f.function in _GRAPH_FUNCS
            if compile_kind(f) == "compiling":
                t.compiled = True
            if LOADER_FILE in path and f.function in _WORKER_QUEUE:
                workers = True
    if graph_frames.any():
        gpu = whole.cct.inclusive[:, COL["gpu_time"]]
        t.graphed = bool((gpu[graph_frames[whole.cct.frame]] > 0).any())
    collector = whole.meta.collector
    mode = collector.get("graph_trace") if isinstance(collector, dict) else None
    t.graphs_per_kernel = t.graphed and whole.collector == "record" and mode != "graph"
    # Not from a compile phase alone: capturing a CUDA graph by hand (torch.cuda.graph) is in that
    # phase too, and an eager program with one capture read "already compiled" (bench/workloads/truth.py).
    loaders = [x for x in whole.meta.dataloaders or [] if isinstance(x, dict)]
    if loaders:
        t.loader_workers = max(int(x.get("num_workers") or 0) for x in loaders)
        t.loader_pinned = all(bool(x.get("pin_memory")) for x in loaders)
    elif workers:
        t.loader_workers = -1  # worker processes, how many unknown
    return t


@dataclass
class Split:
    """The steady state's time in parts that never overlap (module docstring), ns summed over the
    GPUs; per-line idle of each class."""

    device: int = 0  # D
    busy: int = 0  # B
    comm_wait: int = 0  # W, inside B
    pageable: int = 0  # C, inside B
    queued: int = 0  # Q: idle with work queued (launch latency, a graph's nodes, a profiler's records)
    after_sync: int = 0  # A
    loader: float = 0.0  # L
    launch: float = 0.0  # K
    python: float = 0.0  # P
    unplaced: int = 0  # U
    lines_loader: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lines_launch: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lines_python: np.ndarray = field(default_factory=lambda: np.zeros(0))
    short_kernels: int = 0
    kernels: int = 0
    short_mean: float = 0.0
    lines_short: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # The launching lines' pace (the lines of K): kernels launched one by one from them, the GPU
    # time those kernels ran, and the host's time on those lines (every thread's).
    launch_kernels: int = 0
    launch_gpu: float = 0.0
    launch_host: float = 0.0

    @property
    def compute(self) -> int:
        return self.busy - self.comm_wait - self.pageable

    def share(self, part: float) -> float:
        return float(part) / self.device if self.device else 0.0


def loader_mask(profile: Profile, lines: Lines) -> np.ndarray:
    """Nodes inside the DataLoader's code or on a `for … in loader:` line."""
    cct, frames = profile.cct, profile.frames
    in_loader = np.fromiter((LOADER_FILE in f.file.replace("\\", "/") for f in frames), dtype=bool,
                            count=len(frames))
    mask = propagate_down(cct, in_loader[cct.frame])
    loop_line = np.fromiter((bool(LOADER_LOOP.match(profile.source_line(file, line)))
                             for file, line in lines.keys), dtype=bool, count=len(lines.keys))
    if len(loop_line):
        has = lines.line_of >= 0
        mask[has] |= loop_line[lines.line_of[has]]
    return mask


def split(profile: Profile, w: Waits, lines: Lines) -> Split:
    # What syncs cost the GPU: its idle while the host was blocked in one, and after it returned
    # until the host launched again (dlpt/idle.py, `after_sync`).
    s = Split(device=int(w.device_time or 0), busy=int(w.busy or 0),
              after_sync=int(w.idle_parts.get("sync", 0)) + int(w.after_sync))
    a = profile.activities
    assert a.count is not None  # Activities fills it in
    s.comm_wait = int(column(profile, "comm_wait_time").sum()) if s.device else 0
    s.comm_wait = min(s.comm_wait, s.busy)
    pageable = np.fromiter(("Pageable" in f.name for f in profile.frames), dtype=bool, count=len(profile.frames))
    if len(a):
        s.pageable = min(int(a.duration[(a.kind == HTOD) & pageable[a.name]].sum()), s.busy - s.comm_wait)
    # Kernels launched one by one, short ones by their row's mean (a recording's row aggregates
    # many), and their lines. Kernels replayed inside a CUDA graph are no launches of their own.
    replayed = propagate_down(profile.cct, replay_frames(profile.frames)[profile.cct.frame])
    k = (a.kind == KERNEL) & ~replayed[a.node]
    count = a.count[k]
    short = a.duration[k] < SHORT_KERNEL_NS * np.maximum(count, 1)
    s.kernels, s.short_kernels = int(count.sum()), int(count[short].sum())
    s.short_mean = float(a.duration[k][short].sum()) / max(s.short_kernels, 1)
    n = len(profile.cct)
    s.lines_short = lines.sums(np.bincount(a.node[k][short], weights=count[short], minlength=n))
    idle = column(profile, "gpu_idle_time").astype(np.float64)
    per_line = lines.sums(idle)
    in_loader = lines.sums(np.where(loader_mask(profile, lines), idle, 0.0))
    parts = w.idle_parts
    s.unplaced = int(parts.get("start-up", 0) + parts.get("unattributed", 0))
    s.queued = int(parts.get("queued", 0))
    blamed = max(float(w.idle or 0) - s.unplaced - s.queued, 0.0)
    s.after_sync = int(min(s.after_sync, blamed))
    scale = (blamed - s.after_sync) / blamed if blamed > 0 else 0.0
    s.lines_loader = in_loader * scale
    rest = (per_line - in_loader) * scale
    launching = s.lines_short > 0
    s.lines_launch = np.where(launching, rest, 0.0)
    s.lines_python = np.where(launching, 0.0, rest)
    s.loader, s.launch, s.python = (float(x.sum()) for x in (s.lines_loader, s.lines_launch, s.lines_python))
    # How fast those lines launched against how long their kernels ran: a host that takes longer
    # to launch a kernel than the kernel runs starves the GPU whatever the kernels' length
    # (nanoGPT's character model at batch 64: kernels of 8-40 us, launched at 10-20 us each).
    s.launch_kernels = int(lines.sums(np.bincount(a.node[k], weights=count, minlength=n))[launching].sum())
    s.launch_gpu = float(lines.sums(np.bincount(a.node[k], weights=a.duration[k], minlength=n))[launching].sum())
    s.launch_host = float(lines.sums(column(profile, "host_time").astype(np.float64))[launching].sum())
    return s


@dataclass
class Evidence:
    """One diagnosis's inputs: the steady state as a profile, the whole run, the figures."""

    steady: Profile
    whole: Profile
    w: Waits
    lines: Lines
    split: Split
    traits: Traits
    phased: bool  # the profile tells its phases apart: shares are of the steady state, else of the run
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def of(self) -> str:
        return "steady state" if self.phased else "run"


def evidence(profile: Profile) -> Evidence:
    phased = has_phases(profile)
    steady = select_phase(profile, STEADY) if phased else profile
    w = waits(steady)
    lines = Lines(steady)
    return Evidence(steady, profile, w, lines, split(steady, w, lines), traits(profile), phased)


__all__ = ["Evidence", "LOADER_FILE", "LOADER_LOOP", "Lines", "SHORT_KERNEL_NS", "Split", "Traits", "column",
           "evidence", "group", "loader_mask", "split", "traits"]
