"""The diagnosis: a few rules, each a threshold on the steady state's figures with the remedy the
field knows for it (docs/ARCHITECTURE.md, "Why the GPU waits"). A rule reads only the Profile —
metrics, frames, activities, meta — so recorded and imported profiles are diagnosed alike, and
reports only when its figure crosses its threshold.

Judged on the steady state (dlpt/phases.py): start-up and compiling are one-off work that says
nothing about the loop the program exists for; compiling has a verdict of its own. Each finding
says which share of the steady state it explains (`share`, of `of`): the rules read the parts of
one split of its time (dlpt/evidence.py), so their shares never add up to more than all of it.
No remedy asks for what the program already does (compiled, graphed, pinned, loader workers).

`findings(profile) -> list[Finding]`, in the order of `RULES`; `Finding.to_json()` is the
hotspots `summary.findings` item: `{"rule", "lines": ["file:line"], "figure", "remedy", "share", "of"}`.
A command computes them once, on the profile it opened (`dlpt.scope.Scope.apply` keeps them in
meta as `diagnosis`), since the views it then shows may hold one phase or none of the table.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import numpy as np

from dlpt.evidence import SHORT_KERNEL_NS, Evidence, column, evidence
from dlpt.finding import Finding
from dlpt.frames import is_library, short_path
from dlpt.metrics import COL, HTOD, fmt_time
from dlpt.phases import COMPILE, STEADY
from dlpt.profile import Profile
from dlpt.ranks import MIRROR_MIN_SHARE, rank_nodes, straggler
from dlpt.stalls import kernel_stalls
from dlpt.transforms import hide_library
from dlpt.views import flat
from dlpt.waits import rank_window

# Thresholds, named so that the report and the tests speak of the same numbers. Shares are of
# the steady state's GPU time (dlpt/evidence.py's D), unless said otherwise.
# The GPU running or with work queued this much of the time: it is the constraint (what is left
# is said by the other rules, which share out the rest).
GPU_BUSY_ABOVE = 0.70
LAUNCH_SHARE = 0.20  # at least this much idle on lines that launch short kernels ...
LAUNCH_MIN_KERNELS = 100  # ... with at least this many kernels ...
LAUNCH_SHORT_SHARE = 0.5  # ... most of them short, or the host slower to launch one than it runs
HOST_SHARE = 0.20  # idle on the host's own Python lines (none of them launching short kernels)
SYNC_SHARE = 0.05  # idle in the gaps that followed syncs
SYNC_LINE_SHARE = 0.01  # a line named for its sync: at least 1% of the wall time
PAGEABLE_WALL_SHARE = 0.02  # pageable host-to-device copies at least 2% of the wall time
LOADER_IDLE_SHARE = 0.10  # idle while the data loader fetches: at least 10% of the idle ...
LOADER_DEVICE_SHARE = 0.05  # ... and 5% of the devices' time
COMPILE_RUN_SHARE = 0.20  # compiling took at least this share of the run's wall
RECOMPILE_AFTER = 0.10  # a compile after this share of the steady state has run is a recompile
RANK_WAIT_SHARE = 0.05  # a rank sat in collectives, waiting for another, 5% of the time it ran in step with them
TOP_LINES = 3
# Between rank-wait's two halves, who waited and why: the report's header tells the second half
# as its straggler line, so that both say the same (viewers/report.py).
RANK_WHY = " — "

# Ops that make the host wait for the GPU, and what a user calls them.
_SYNC_OPS = (
    (("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"), ".item() (or a Python bool/int/float of a tensor)"),
    (("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2", "aten::unique_consecutive",
      "aten::repeat_interleave", "aten::bincount", "aten::histc"),
     "an op whose output size depends on the data (nonzero, boolean-mask indexing, unique, masked_select)"),
    (("aten::to", "aten::_to_copy", "aten::copy_", "aten::tolist"), ".cpu(), .tolist(), .numpy() or a copy to the host"),
)


def _of(e: Evidence, part: float) -> str:
    return f"{e.split.share(part):.0%} of the {e.of}'s GPU time"


def gpu_bound(e: Evidence) -> Finding | None:
    s = e.split
    # Busy and queued decide: the host kept the GPU fed (copies and collectives' waits keep it
    # from other work too). The share explained is its computing and queue, the rest being
    # pageable-copies' and rank-wait's.
    share = s.share(s.compute + s.queued)
    if not s.device or s.share(s.busy + s.queued) <= GPU_BUSY_ABOVE:
        return None
    lines = e.lines.top(e.lines.sums(column(e.steady, "gpu_time").astype(np.float64)))
    done = []
    if e.traits.compiled:
        done.append("compiled")
    if e.traits.graphed:
        done.append("CUDA-graphed")
    already = f" (the program is already {' and '.join(done)})" if done else ""
    tools = ("fewer, larger ops" if e.traits.compiled else "fused or compiled kernels (torch.compile) and fewer, larger ops")
    apart = (" (its waits in collectives and pageable copies left out)"
             if s.share(s.comm_wait + s.pageable) >= 0.01 else "")
    queue = (f", {s.share(s.queued):.1%} of it between kernels already launched (launch latency, a graph's "
             "nodes, a profiler's own records)") if s.share(s.queued) >= 0.01 else ""
    return Finding(
        "gpu-bound", lines, f"GPU busy {share:.1%} of the {e.of}{apart}{queue}{already}",
        "the GPU is the bottleneck, so the kernels themselves matter: see the top kernels "
        f"(dlpt report --view flat --by kernel) and their lines; mixed precision (bf16/AMP), {tools} "
        "make them faster", share, e.of)


def launch_bound(e: Evidence) -> Finding | None:
    s = e.split
    if not s.device or s.share(s.launch) < LAUNCH_SHARE:
        return None
    if s.kernels < LAUNCH_MIN_KERNELS:
        return None
    # Short kernels are the textbook case: launching one costs about as much as running it. Longer
    # kernels starve the GPU too where the host takes longer to launch each than it runs, which
    # the launching lines' own figures tell (nanoGPT's character model at batch 64: 43% of its
    # kernels short, yet 14 us of GPU time per kernel against 48 us of host time per launch). The
    # pace alone must leave the GPU idle at least LAUNCH_SHARE of the time (1 - GPU/host per
    # launch): where host and kernels run about even (imagenet's resnet50 under recording, 45 us
    # against 40 us), the idle is bursts, not the pace, and launch-bound would be a weak claim.
    per_kernel = s.launch_gpu / s.launch_kernels if s.launch_kernels else 0.0
    per_launch = s.launch_host / s.launch_kernels if s.launch_kernels else 0.0
    mostly_short = s.short_kernels >= LAUNCH_SHORT_SHARE * s.kernels
    paced = per_launch > 0 and per_kernel <= (1.0 - LAUNCH_SHARE) * per_launch
    if not mostly_short and not paced:
        return None
    top = e.lines.top(s.lines_launch) or e.lines.top(s.lines_short)
    figure = (f"GPU idle {_of(e, s.launch)} between launches; {s.short_kernels} of {s.kernels} kernels under "
              f"{fmt_time(SHORT_KERNEL_NS)} (mean {fmt_time(s.short_mean)})")
    if not mostly_short:
        figure += (f"; the launching lines' {s.launch_kernels} kernels ran {fmt_time(per_kernel)} each on the GPU "
                   f"against {fmt_time(per_launch)} of host time per launch")
    if e.traits.graphed:
        remedy = ("the program already replays CUDA graphs: these launches run outside them, one Python line at "
                  "a time — bring that code into the compiled or captured region (look for graph breaks: "
                  "TORCH_LOGS=graph_breaks) or batch its small ops")
    elif e.traits.compiled:
        remedy = ("the program is already compiled, yet the host still launches kernels one at a time, each "
                  "costing more than it runs: mode=\"reduce-overhead\" replays the compiled code as CUDA graphs, "
                  "and code left eager around the compiled regions (graph breaks: TORCH_LOGS=graph_breaks) "
                  "launches op by op")
    else:
        remedy = ("the host launches kernels one Python line at a time: compile the model with torch.compile "
                  "(mode=\"reduce-overhead\" adds CUDA graphs) or capture the step in a CUDA graph, so that "
                  "fewer, larger kernels run without a launch each")
    return Finding("launch-bound", top, figure, _recorder_note(e, remedy), s.share(s.launch), e.of)


def _recorder_note(e: Evidence, remedy: str) -> str:
    """Idle between launches in a CUDA-graphed program recorded with every replayed kernel traced
    is partly the recorder's own: CUPTI's per-kernel records cost each graph launch 1-2 us per
    kernel node on the host (docs/BENCHMARKS.md, graph_replay: a replay's launch call 0.14-0.26
    ms against 0.006-0.013 ms; gpt-fast --compile judged gpu-bound when recorded per graph)."""
    if not e.traits.graphs_per_kernel:
        return remedy
    return ("this recording traced every kernel of every CUDA-graph replay, which costs each graph launch "
            "1-2 us per kernel on the host: idle the program does not have. Record it again with `dlpt record "
            f"--cuda-graph-trace graph` before acting on this; if it stays: {remedy}")


def host_bound(e: Evidence) -> Finding | None:
    s = e.split
    if not s.device or s.share(s.python) < HOST_SHARE:
        return None
    top = e.lines.top(s.lines_python)
    if not top:
        return None
    return Finding(
        "host-bound", top,
        f"GPU idle {_of(e, s.python)} while the host ran its own Python between launches",
        _recorder_note(e, "the host's own work between launches (per-sample loops, preprocessing, logging, Python "
                       "bookkeeping) keeps the GPU waiting: vectorize per-sample loops into tensor ops, move "
                       "preprocessing into the DataLoader's workers, log every N steps"), s.share(s.python), e.of)


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


def _sync_kind(profile: Profile, nodes: np.ndarray, weights: np.ndarray) -> tuple[str, str]:
    """What made the host wait, in the user's words, and where in library code it happened:
    (what, `lib.py:12 fn, called from` prefix or '')."""
    by_what: dict[str, float] = {}
    lib: dict[str, float] = {}
    for n, v in zip(nodes.tolist(), weights.tolist()):
        path = profile.call_path(n)
        what = "torch.cuda.synchronize() or an event's synchronize"
        for f in reversed(path):
            if f.kind == "op":
                what = next((w for names, w in _SYNC_OPS if f.name in names), f"the op {f.name}")
                break
        by_what[what] = by_what.get(what, 0.0) + v
        # The innermost library frame below the innermost user line: library code that syncs.
        user = max((i for i, f in enumerate(path) if f.has_source and not is_library(f)), default=-1)
        inner = [f for f in path[user + 1:] if f.kind == "python" and f.has_source and is_library(f)
                 and "/torch/_tensor.py" not in f.file and "/torch/cuda/__init__.py" not in f.file]
        if inner:
            f = inner[-1]
            key = f"{short_path(f.file)}:{f.line} {f.function}"
            lib[key] = lib.get(key, 0.0) + v
    what = max(by_what, key=lambda k: by_what[k])
    where = max(lib, key=lambda k: lib[k]) if lib and max(lib.values()) >= 0.5 * sum(weights.tolist()) else ""
    return what, where


def sync_in_loop(e: Evidence) -> Finding | None:
    s, w = e.split, e.w
    wall = w.wall or w.device_time
    if not wall:
        return None
    if s.device:
        if s.share(s.after_sync) < SYNC_SHARE:
            return None
    elif w.sync_time < SYNC_SHARE * wall:
        return None  # no GPU figures (an older profile): the host's wait alone, against the wall
    profile = e.steady
    sync = column(profile, "sync_time")
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
    per_line = e.lines.sums(sync.astype(np.float64))
    top = e.lines.top(per_line, at_least=SYNC_LINE_SHARE * wall)
    if not top:
        return None
    first = float(per_line.max())
    nz = np.flatnonzero(sync)
    what, where = _sync_kind(profile, nz, sync[nz].astype(np.float64))
    place = f"{short_path(top[0].rpartition(':')[0])}:{top[0].rpartition(':')[2]}"
    figure = (f"the host waited for the GPU {w.sync_time / wall:.1%} of the wall time ({fmt_time(w.sync_time)}); "
              f"{place}: {fmt_time(first)}")
    if s.device:
        figure = f"GPU idle {_of(e, s.after_sync)} after syncs: " + figure
    if where:
        remedy = (f"the wait happens inside library code ({where}, called from {place}) through {what}: "
                  "nothing to remove from your line itself — call that code less often, outside the step, "
                  "or use its asynchronous form where it has one")
    else:
        remedy = (f"{what} in the step loop stops the host until the GPU is done, and the GPU then idles "
                  "while the host catches up: keep values on the GPU (accumulate into a tensor) and read "
                  "them every N steps, outside the loop")
    return Finding("sync-in-loop", top, figure, remedy, s.share(s.after_sync) if s.device else None, e.of)


def pageable_copies(e: Evidence) -> Finding | None:
    w, profile = e.w, e.steady
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
    count = int(a.count[sel].sum()) if a.count is not None else int(sel.sum())
    share = e.split.share(e.split.pageable) if e.split.device else None
    return Finding(
        "pageable-copies", e.lines.top(e.lines.sums(per_node)),
        f"host-to-device copies from pageable memory {fmt_time(total)} ({total / wall:.1%} of the wall time, "
        f"{nbytes / 2**20:.1f} MiB in {count} cop{'y' if count == 1 else 'ies'})",
        "copies from pageable memory are staged and block the host: pin the source "
        "(DataLoader(pin_memory=True) or tensor.pin_memory()) and copy with .to(device, non_blocking=True)",
        share, e.of)


def dataloader_wait(e: Evidence) -> Finding | None:
    s, w = e.split, e.w
    if not w.idle or not s.device:
        return None
    raw = float(s.lines_loader.sum())
    if s.share(s.loader) < LOADER_DEVICE_SHARE or s.loader < LOADER_IDLE_SHARE * w.idle:
        return None
    top = e.lines.top(s.lines_loader)
    figure = f"GPU idle {fmt_time(raw)} ({_of(e, s.loader)}) while the data loader fetched batches"
    t = e.traits
    pin = "" if t.pinned or t.loader_pinned else ", pin_memory=True"
    if t.loader_workers is not None and t.loader_workers != 0:
        n = (f"its {t.loader_workers} worker process{'es' if t.loader_workers > 1 else ''}" if t.loader_workers > 0
             else "its worker processes")
        figure += f", waiting on {n}"
        remedy = (f"{n} {'do' if t.loader_workers != 1 else 'does'} not make batches as fast as the GPU uses "
                  "them: raise num_workers (one per free "
                  f"core), keep them alive between epochs (persistent_workers=True{pin}), prefetch more "
                  "(prefetch_factor), and make each sample cheaper to load and decode")
    else:
        if t.loader_workers == 0:
            figure += " in the main process (num_workers=0)"
        remedy = ("the GPU waits for the next batch: load it in worker processes while the GPU computes — "
                  f"DataLoader(num_workers=N{pin}, persistent_workers=True, prefetch_factor=2) — "
                  "and move per-sample Python work into the dataset")
    return Finding("dataloader-wait", top, figure, remedy, s.share(s.loader), e.of)


def compile_time(e: Evidence) -> Finding | None:
    """torch.compile's one-off work, against the run's wall: worth a verdict when it is a large
    part of the run, or when the program compiled again after its steady state began."""
    metas = e.whole.meta.per_rank()
    compiling = max((int(((m.phases or {}).get(COMPILE) or {}).get("wall", 0)) for m in metas), default=0)
    run = max((rank_window(m)[0] or 0 for m in metas), default=0)
    if not compiling or not run:
        return None
    # A compile inside the loop: after a tenth of the steady state has run (a compile's first
    # calls come in a cluster — the graph, its CUDA-graph warm-up and recording — with moments of
    # steady state between them; those are not recompiles).
    spans = [s for s in e.whole.meta.phase_spans or [] if isinstance(s, list) and len(s) == 3]
    steady_total = sum(s[1] - s[0] for s in spans if s[2] == STEADY)
    again, ran = [], 0
    for s in spans:
        if s[2] == STEADY:
            ran += s[1] - s[0]
        elif s[2] == COMPILE and steady_total and ran > RECOMPILE_AFTER * steady_total:
            again.append(s)
    share = compiling / run
    if share < COMPILE_RUN_SHARE and not again:
        return None
    figure = f"compiling took {fmt_time(compiling)} of the run's {fmt_time(run)} ({share:.0%})"
    if again:
        figure += (f"; it compiled {len(again)} more time{'s' if len(again) > 1 else ''} after the steady state "
                   f"began ({fmt_time(sum(s[1] - s[0] for s in again))})")
    remedy = ("compiling is one-off work: Inductor caches its results (keep TORCHINDUCTOR_CACHE_DIR between "
              "runs; the FX-graph and AOTAutograd caches are on by default), max-autotune only pays in long "
              "runs, and a benchmark should time the steps after it")
    if again:
        remedy += ("; recompiles in the loop come from changing shapes or guards: TORCH_LOGS=recompiles says "
                   "why, torch._dynamo.mark_dynamic or padding to a few shapes stops them")
    return Finding("compile", [], figure, remedy, share, "run")


def _rank_span(profile: Profile, rank: int, node: int) -> tuple[int, str]:
    """What a merged rank's comm wait is a share of: the stretch from its first collective to its
    last (start-up, model loading and the end left out: the wait can only fall inside it), else
    its recording window, else its host time; and that stretch's name. In a phase (dlpt/phases.py)
    its window there."""
    for m in profile.meta.ranks or []:
        if m.rank == rank:
            win = m.window
            if isinstance(win, dict) and "wall" in win and win["wall"]:
                return int(win["wall"]), f"its {profile.meta.phase or 'phase'} time"
            if m.collective_span:
                return int(m.collective_span), "the time between its first and last collective"
            wall = rank_window(m)[0]
            if wall:
                return int(wall), "its wall time"
    return int(profile.cct.inclusive[node, COL["host_time"]]), "its host time"


# How much longer than every other rank the rank that waited most must have waited to count as
# the one kept waiting (rank_story).
WAITER_MARGIN = 1.5


def explaining_verdict(gpu: dict[str, Any] | None, host: dict[str, Any] | None, waited: int,
                       ops: dict[str, Any] | None = None, waiter: int | None = None) -> dict[str, Any] | None:
    """Which straggler verdict (dlpt.ranks.straggler) explains a wait of `waited` ns by rank
    `waiter`: the first of GPU time, host time and host ops' time (`ops`, cpu_time) whose extra
    compute is at least half the wait, else the first straggler of host time, host ops' time
    and GPU time; None when none is one.

    Why this order. A rank whose GPU has more to do also spends more host time, blocked on its
    own GPU (a full launch queue, a sync), so its host verdict names where it waited rather than
    why: the GPU's comes first. A rank slowed by its host (a data loader, logging, a sleep)
    computes no more on its GPU — a few ms of GPU excess there does not explain a second's wait:
    then the host's. The host time of a rank that waited can hold what the wait estimate misses
    (gloo's allreduce returns at once and the rank blocks in DDP's finalize, inside backward; on
    a loaded machine that read as compute, and the waiter's host time matched the straggler's),
    while its ops' own time does not: the ops' verdict explains the wait where host time cannot.
    A verdict that names the rank that waited never explains its wait: a rank kept waiting is not
    the slow one."""
    def names_another(v: dict[str, Any] | None) -> bool:
        return v is not None and bool(v["straggler"]) and (waiter is None or v["rank"] != waiter)

    for v in (gpu, host, ops):
        if names_another(v) and v is not None and v["excess"] >= MIRROR_MIN_SHARE * waited:
            return v
    for v in (host, ops, gpu):
        if names_another(v):
            return v
    return None


def rank_story(profile: Profile) -> tuple[int, int, str, int, dict[str, Any] | None] | None:
    """The one story of several ranks: which rank waited most in collectives for another (as a
    share of its span), and the straggler verdict that explains the wait. (waited, span, what the
    span is, rank, verdict); None for one rank. The header's straggler line and `rank-wait` both
    tell it (viewers/report.py)."""
    nodes = rank_nodes(profile)
    if len(nodes) < 2:
        return None
    wait_col = profile.cct.inclusive[:, COL["comm_wait_time"]]
    per_rank = [(int(wait_col[node]), *_rank_span(profile, r, node), r) for r, node in nodes]
    per_rank.sort(key=lambda x: x[0] / x[1] if x[1] else 0.0)
    waited, span, of_what, who = per_rank[-1]
    # The rank that waited most is the one kept waiting only when it waited clearly longer than
    # every other rank: where the ranks took turns (a loaded host stalling each in turn: 29 and
    # 31 ms of wait over five steps on two ranks), no rank is excluded from being the straggler.
    clear = waited > WAITER_MARGIN * max(x[0] for x in per_rank[:-1])
    fv = flat(profile, "line")  # the three verdicts' straggler lines, from one flat view
    gpu, host, ops = (straggler(profile, m, fv) for m in ("gpu_time", "host_time", "cpu_time"))
    verdict = explaining_verdict(gpu, host, waited, ops, who if clear else None)
    return waited, span, of_what, who, verdict


def rank_wait(e: Evidence) -> Finding | None:
    """Ranks waiting in collectives for another: named with the straggler's line, from the GPU
    or the host verdict (`explaining_verdict` says which)."""
    if len(rank_nodes(e.steady)) < 2:
        return None
    # The straggler's line is the user's: its flat view by line with library frames hidden.
    story = rank_story(hide_library(e.steady))
    if story is None:
        return None
    waited, span, of_what, who, verdict = story
    if not span or waited < RANK_WAIT_SHARE * span:
        return None
    own = min(waited / span, 1.0)
    figure = (f"rank {who} waited {fmt_time(waited)} in collectives for another rank ({own:.0%} of "
              f"{of_what}, estimated from the ranks' start times)")
    # The verdict's share is of the steady state's GPU time over every rank, as the others' are:
    # the comm wait W is its own part of the split (dlpt/evidence.py), so rank-wait, host-bound
    # (the straggler's own Python) and sync-in-loop never add up past 100% (2 H100s: 89% + 44%
    # + 9% when rank 0's own share was used, docs/BENCHMARKS.md).
    share = e.split.share(e.split.comm_wait) if e.split.device and e.split.comm_wait else own
    if verdict is None:
        return Finding("rank-wait", [], figure + RANK_WHY + "no rank computes more than the others",
                       "the ranks arrive at collectives apart without one computing more: look for work "
                       "on one rank only (logging, checkpoints, evaluation on rank 0) and uneven input sizes",
                       share, e.of)
    top = []
    where = ""
    if verdict["line"]:
        ln = verdict["line"]
        top = [f"{ln['file']}:{ln['line']}"]
        where = f", most on {short_path(ln['file'])}:{ln['line']} (+{fmt_time(ln['excess'])})"
    what = {"gpu_time": "GPU time", "cpu_time": "host op time"}.get(verdict["metric"], "host time")
    return Finding(
        "rank-wait", top,
        figure + RANK_WHY + f"rank {verdict['rank']} spends {fmt_time(verdict['excess'])} more {what} than the others{where}",
        f"every rank waits for the slowest at each collective: balance rank {verdict['rank']}'s work "
        "(equal batch and sequence lengths per rank), move work that one rank does alone (logging, "
        "evaluation, checkpoints, .item()) out of the step, and give slow data loading more workers",
        share, e.of)


RULES: tuple[tuple[str, Callable[[Evidence], Finding | None]], ...] = (
    ("launch-bound", launch_bound),
    ("host-bound", host_bound),
    ("sync-in-loop", sync_in_loop),
    ("pageable-copies", pageable_copies),
    ("dataloader-wait", dataloader_wait),
    ("gpu-bound", gpu_bound),
    ("rank-wait", rank_wait),
    ("compile", compile_time),
    ("kernel-stalls", kernel_stalls),
)


def findings(profile: Profile) -> list[Finding]:
    """The rules whose figure crosses its threshold, the largest share of the steady state first
    (the run's compile verdict last); those a command already judged (`meta.diagnosis`,
    dlpt.scope) as they were."""
    kept = profile.meta.diagnosis
    if isinstance(kept, list):
        return [Finding(**d) for d in kept if isinstance(d, dict)]
    e = evidence(profile)
    out = []
    for _, rule in RULES:
        f = rule(e)
        if f is not None:
            out.append(f)
    return sorted(out, key=lambda f: (f.of != e.of, -(f.share or 0.0)))


__all__ = ["Finding", "RANK_WHY", "RULES", "explaining_verdict", "findings", "rank_story"]
