"""The diagnosis: a few rules, each a threshold on the profile's figures with the remedy the field
knows for it (docs/ARCHITECTURE.md, "Why the GPU waits"). A rule reads only the Profile —
metrics, frames, activities, meta — so recorded and imported profiles are diagnosed alike, and
reports only when its figure crosses its threshold.

`findings(profile) -> list[Finding]`, in the order of `RULES`; `Finding.to_json()` is the
hotspots `summary.findings` item: `{"rule", "lines": ["file:line"], "figure", "remedy"}`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dlpt.frames import is_library, short_path
from dlpt.metrics import COL, HTOD, KERNEL
from dlpt.profile import Profile
from dlpt.ranks import MIRROR_MIN_SHARE, rank_nodes, straggler
from dlpt.transforms import nearest_marked, propagate_down
from dlpt.waits import Waits, rank_window, waits

# Thresholds, named so that the report and the tests speak of the same numbers.
SHORT_KERNEL_NS = 10_000  # "tiny" kernels: launching one costs about as much as running it
LAUNCH_BUSY_BELOW = 0.5  # the GPU busy less than half of its window ...
LAUNCH_HOST_SHARE = 0.5  # ... most of its idle blamed on host lines ...
LAUNCH_MIN_KERNELS = 100  # ... with at least this many kernels ...
LAUNCH_SHORT_SHARE = 0.5  # ... most of them short
SYNC_WALL_SHARE = 0.05  # the host blocked on the GPU at least 5% of the wall time
SYNC_LINE_SHARE = 0.01  # a line named for its sync: at least 1% of the wall time
PAGEABLE_WALL_SHARE = 0.02  # pageable host-to-device copies at least 2% of the wall time
LOADER_IDLE_SHARE = 0.10  # idle while the data loader fetches: at least 10% of the idle ...
LOADER_DEVICE_SHARE = 0.05  # ... and 5% of the devices' time
GPU_BUSY_ABOVE = 0.90
RANK_WAIT_SHARE = 0.05  # a rank sat in collectives, waiting for another, 5% of the time it ran in step with them
TOP_LINES = 3

_LOADER_FILE = "torch/utils/data/"
# `for batch in loader:`, `for i, (x, y) in enumerate(train_loader):`, `for b in DataLoader(...)`.
_LOADER_LOOP = re.compile(r"^\s*(async\s+)?for\s.+\sin\s.*(loader|DataLoader)", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    rule: str
    lines: list[str] = field(default_factory=list)  # "file:line", the costliest first
    figure: str = ""  # the profile's figure that crossed the threshold, in words
    remedy: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _t(ns: float) -> str:
    """A duration in the unit that reads best (the model does not import the viewers' units)."""
    ns = float(ns)
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


class _Lines:
    """Each node's user line (the innermost non-library source frame on its path) and per-line
    sums of any per-node column."""

    def __init__(self, profile: Profile) -> None:
        cct = profile.cct
        frames = profile.frames
        user = np.fromiter((f.has_source and not is_library(f) for f in frames), dtype=bool, count=len(frames))
        owner_node = nearest_marked(cct, user[cct.frame])
        keys: dict[tuple[str, int], int] = {}
        self.line_of = np.full(len(cct), -1, dtype=np.int64)
        has = owner_node >= 0
        for fi, nodes in _group(cct.frame[owner_node[has]], np.flatnonzero(has)):
            f = frames[fi]
            self.line_of[nodes] = keys.setdefault((f.file, f.line), len(keys))
        self.labels = [f"{file}:{line}" for file, line in keys]
        self.keys = list(keys)

    def sums(self, per_node: np.ndarray) -> np.ndarray:
        has = self.line_of >= 0
        return np.bincount(self.line_of[has], weights=per_node[has], minlength=len(self.labels))

    def top(self, per_line: np.ndarray, n: int = TOP_LINES, at_least: float = 0.0) -> list[str]:
        order = np.argsort(-per_line, kind="stable")
        return [self.labels[i] for i in order[:n].tolist() if per_line[i] > at_least and per_line[i] > 0]


def _group(values: np.ndarray, items: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, items having it) for each distinct value."""
    if not len(values):
        return []
    order = np.argsort(values, kind="stable")
    v, it = values[order], items[order]
    starts = np.r_[0, np.flatnonzero(np.diff(v)) + 1]
    ends = np.r_[starts[1:], len(v)]
    return [(int(v[s]), it[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]


def _col(profile: Profile, metric: str) -> np.ndarray:
    return profile.cct.exclusive[:, COL[metric]]


def launch_bound(profile: Profile, w: Waits, lines: _Lines) -> Finding | None:
    busy = w.busy_share
    if busy is None or busy >= LAUNCH_BUSY_BELOW or not w.idle:
        return None
    host_share = w.idle_parts.get("host", 0) / w.idle
    a = profile.activities
    assert a.count is not None  # Activities fills it in
    k = a.kind == KERNEL
    count = a.count[k]
    short = a.duration[k] < SHORT_KERNEL_NS * np.maximum(count, 1)  # a row's mean duration
    n_all, n_short = int(count.sum()), int(count[short].sum())
    if host_share < LAUNCH_HOST_SHARE or n_all < LAUNCH_MIN_KERNELS or n_short < LAUNCH_SHORT_SHARE * n_all:
        return None
    # The lines launching the short kernels, by the idle blamed on them.
    launches = np.zeros(len(profile.cct), dtype=np.int64)
    np.add.at(launches, a.node[k][short], count[short])
    per_line_kernels = lines.sums(launches.astype(np.float64))
    idle = lines.sums(_col(profile, "gpu_idle_time").astype(np.float64))
    top = lines.top(np.where(per_line_kernels > 0, idle, 0)) or lines.top(per_line_kernels)
    mean = float(a.duration[k][short].sum()) / max(n_short, 1)
    return Finding(
        "launch-bound", top,
        f"GPU busy {busy:.1%}, {host_share:.0%} of its idle time on host lines; "
        f"{n_short} of {n_all} kernels under {_t(SHORT_KERNEL_NS)} (mean {_t(mean)})",
        "the host launches kernels one Python line at a time: compile the model with torch.compile "
        "(mode=\"reduce-overhead\" adds CUDA graphs) or capture the step in a CUDA graph, so that "
        "fewer, larger kernels run without a launch each")


class _LoopLines:
    """Whether a node's path runs through a line inside a loop (`for`, `while`, a comprehension)
    of the program's stored source; True where no frame on it has its source stored."""

    _LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.spans: dict[str, list[tuple[int, int]] | None] = {}

    def _spans(self, file: str) -> list[tuple[int, int]] | None:
        if file not in self.spans:
            text = self.profile.sources.get(file)
            try:
                tree = ast.parse(text) if text is not None else None
            except (SyntaxError, ValueError):
                tree = None
            self.spans[file] = None if tree is None else [
                (n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, self._LOOPS)]
        return self.spans[file]

    def on_path(self, node: int) -> bool:
        known = False
        for n in self.profile.cct.path(node):
            f = self.profile.frame_of(n)
            if f.kind != "python" or not f.has_source:
                continue
            spans = self._spans(f.file)
            if spans is None:
                continue
            known = True
            if any(a <= f.line <= b for a, b in spans):
                return True
        return not known


def sync_in_loop(profile: Profile, w: Waits, lines: _Lines) -> Finding | None:
    wall = w.wall or w.device_time
    if not wall or w.sync_time < SYNC_WALL_SHARE * wall:
        return None
    share = w.busy_share
    if share is not None and share > GPU_BUSY_ABOVE:
        return None  # the GPU stays busy while the host waits: the wait costs nothing
    sync = _col(profile, "sync_time")
    if profile.collector == "record":
        # A recording's frames are at their current lines, so the blocking line, or a line that
        # called it, can be seen inside a loop's body in the stored source: a sync outside any
        # loop (a final .item(), a synchronize before timing) waits once, for work that had to
        # finish anyway. A frame whose source is not stored says nothing, and then it counts.
        loops = _LoopLines(profile)
        looped = np.zeros(len(sync), dtype=bool)
        for n in np.flatnonzero(sync).tolist():
            looped[n] = loops.on_path(n)
        sync = np.where(looped, sync, 0)
    per_line = lines.sums(sync.astype(np.float64))
    top = lines.top(per_line, at_least=SYNC_LINE_SHARE * wall)
    if not top:
        return None
    first = float(per_line.max())
    return Finding(
        "sync-in-loop", top,
        f"the host waited for the GPU {w.sync_time / wall:.1%} of the wall time ({_t(w.sync_time)}); "
        f"{short_path(top[0].rpartition(':')[0])}:{top[0].rpartition(':')[2]}: {_t(first)}",
        "each .item(), .cpu(), .tolist(), print(tensor) or torch.cuda.synchronize() in the step loop "
        "stops the host until the GPU is done: keep values on the GPU (accumulate into a tensor) "
        "and read them every N steps, outside the loop")


def pageable_copies(profile: Profile, w: Waits, lines: _Lines) -> Finding | None:
    wall = w.wall or w.device_time
    a = profile.activities
    if not wall or not len(a):
        return None
    pageable_name = np.fromiter(("Pageable" in f.name for f in profile.frames), dtype=bool, count=len(profile.frames))
    sel = (a.kind == HTOD) & pageable_name[a.name]
    total = int(a.duration[sel].sum())
    if total < PAGEABLE_WALL_SHARE * wall:
        return None
    per_node = np.zeros(len(profile.cct))
    np.add.at(per_node, a.node[sel], a.duration[sel].astype(np.float64))
    nbytes = int(a.bytes[sel].sum())
    return Finding(
        "pageable-copies", lines.top(lines.sums(per_node)),
        f"host-to-device copies from pageable memory {_t(total)} ({total / wall:.1%} of the wall time, "
        f"{nbytes / 2**20:.1f} MiB in {int(a.count[sel].sum()) if a.count is not None else int(sel.sum())} copies)",
        "copies from pageable memory are staged and block the host: pin the source "
        "(DataLoader(pin_memory=True) or tensor.pin_memory()) and copy with .to(device, non_blocking=True)")


def dataloader_wait(profile: Profile, w: Waits, lines: _Lines) -> Finding | None:
    if not w.idle or not w.device_time:
        return None
    cct, frames = profile.cct, profile.frames
    in_loader = np.fromiter((_LOADER_FILE in f.file.replace("\\", "/") for f in frames), dtype=bool,
                            count=len(frames))
    mask = propagate_down(cct, in_loader[cct.frame])
    loop_line = np.fromiter((bool(_LOADER_LOOP.match(profile.source_line(file, line)))
                             for file, line in lines.keys), dtype=bool, count=len(lines.keys))
    if len(loop_line):
        has = lines.line_of >= 0
        mask[has] |= loop_line[lines.line_of[has]]
    idle = _col(profile, "gpu_idle_time")
    waited = int(idle[mask].sum())
    if waited < LOADER_IDLE_SHARE * w.idle or waited < LOADER_DEVICE_SHARE * w.device_time:
        return None
    top = lines.top(lines.sums(np.where(mask, idle, 0).astype(np.float64)))
    return Finding(
        "dataloader-wait", top,
        f"GPU idle {_t(waited)} ({waited / w.idle:.0%} of its idle time) while the data loader fetched batches",
        "the GPU waits for the next batch: load it in worker processes while the GPU computes — "
        "DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2) — "
        "and move per-sample Python work into the dataset")


def gpu_bound(profile: Profile, w: Waits, lines: _Lines) -> Finding | None:
    busy = w.busy_share
    if busy is None or busy <= GPU_BUSY_ABOVE:
        return None
    return Finding(
        "gpu-bound", lines.top(lines.sums(_col(profile, "gpu_time").astype(np.float64))),
        f"GPU busy {busy:.1%} of its window",
        "the GPU is the bottleneck, so the kernels themselves matter: see the top kernels "
        "(dlpt report --view flat --by kernel) and their lines; mixed precision (bf16/AMP), fused "
        "or compiled kernels (torch.compile) and fewer, larger ops make them faster")


def _rank_span(profile: Profile, rank: int, node: int) -> tuple[int, str]:
    """What a merged rank's comm wait is a share of: the stretch from its first collective to its
    last (start-up, model loading and the end left out: the wait can only fall inside it), else
    its recording window, else its host time; and that stretch's name."""
    for m in profile.meta.get("ranks") or []:
        if isinstance(m, dict) and m.get("rank") == rank:
            if m.get("collective_span"):
                return int(m["collective_span"]), "the time between its first and last collective"
            wall = rank_window(m)[0]
            if wall:
                return int(wall), "its wall time"
    return int(profile.cct.inclusive[node, COL["host_time"]]), "its host time"


def explaining_verdict(gpu: dict[str, Any] | None, host: dict[str, Any] | None,
                       waited: int) -> dict[str, Any] | None:
    """Which straggler verdict (dlpt.ranks.straggler) explains a wait of `waited` ns. The GPU's,
    when its extra compute is at least half the wait: a rank whose GPU has more to do also
    spends more host time, blocked on its own GPU (a full launch queue, a sync), so its host
    verdict names where it waited rather than why. Else the host's: a rank slowed by its host (a
    data loader, logging, a sleep) computes no more on its GPU — a few ms of GPU excess there
    does not explain a second's wait. Else a GPU straggler anyway; None when neither is one."""
    if gpu is not None and gpu["straggler"] and gpu["excess"] >= MIRROR_MIN_SHARE * waited:
        return gpu
    if host is not None and host["straggler"]:
        return host
    return gpu if gpu is not None and gpu["straggler"] else None


def rank_wait(profile: Profile, w: Waits, lines: _Lines) -> Finding | None:
    """Ranks waiting in collectives for another: named with the straggler's line, from the GPU
    or the host verdict (`explaining_verdict` says which)."""
    nodes = rank_nodes(profile)
    if len(nodes) < 2:
        return None
    wait_col = profile.cct.inclusive[:, COL["comm_wait_time"]]
    per_rank = [(int(wait_col[node]), *_rank_span(profile, r, node), r) for r, node in nodes]
    waited, span, of_what, who = max(per_rank, key=lambda x: x[0] / x[1] if x[1] else 0.0)
    if not span or waited < RANK_WAIT_SHARE * span:
        return None
    verdict = explaining_verdict(straggler(profile, "gpu_time"), straggler(profile, "host_time"), waited)
    figure = (f"rank {who} waited {_t(waited)} in collectives for another rank ({waited / span:.0%} of "
              f"{of_what}; estimated from the ranks' start times)")
    if verdict is None:
        return Finding("rank-wait", [], figure + "; no rank computes more than the others",
                       "the ranks arrive at collectives apart without one computing more: look for work "
                       "on one rank only (logging, checkpoints, evaluation on rank 0) and uneven input sizes")
    top = []
    where = ""
    if verdict["line"]:
        ln = verdict["line"]
        top = [f"{ln['file']}:{ln['line']}"]
        where = f", most on {short_path(ln['file'])}:{ln['line']} (+{_t(ln['excess'])})"
    what = "GPU time" if verdict["metric"] == "gpu_time" else "host time"
    return Finding(
        "rank-wait", top,
        figure + f"; rank {verdict['rank']} spends {_t(verdict['excess'])} more {what} than the others{where}",
        f"every rank waits for the slowest at each collective: balance rank {verdict['rank']}'s work "
        "(equal batch and sequence lengths per rank), move work that one rank does alone (logging, "
        "evaluation, checkpoints, .item()) out of the step, and give slow data loading more workers")


RULES: tuple[tuple[str, Callable[[Profile, Waits, _Lines], Finding | None]], ...] = (
    ("launch-bound", launch_bound),
    ("sync-in-loop", sync_in_loop),
    ("pageable-copies", pageable_copies),
    ("dataloader-wait", dataloader_wait),
    ("gpu-bound", gpu_bound),
    ("rank-wait", rank_wait),
)


def findings(profile: Profile) -> list[Finding]:
    """The rules whose figure crosses its threshold, in the order of `RULES`."""
    w = waits(profile)
    lines = _Lines(profile)
    out = []
    for _, rule in RULES:
        f = rule(profile, w, lines)
        if f is not None:
            out.append(f)
    return out
