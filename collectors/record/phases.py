"""The recorder's phases (dlpt/phases.py says what phases are): what tells the collector which
phase the program is in, and the phase figures of a recording.

The collector interns every context under its current phase's node (collectors/native/trie.h),
so the phase is known where work happens, at no cost per op. Its raw phases:

* start-up — from the start of recording to the program's first GPU work (the first launch or
  copy: CUPTI's callback switches it); before any GPU work, to the end of the first step or of the
  first compile (GPU work that starts after such a compile's end but before any step begins the
  warm-up still), or for the whole run where there is none of these;
* warm-up — from the first GPU work to the end of the first step (an optimizer's `step()` or
  `dlpt.step()`) or of the first compile, whichever comes first: the first step's one-off work
  (lazy initialisation, cuDNN's and cuBLAS's choices, the allocator's growth, the eager code
  that runs before a compiled function's first call). A program with neither never ends it:
  then it is the steady state (an eager decode or inference loop);
* steady — after that;
* compile — while torch.compile compiles (Dynamo's compile callbacks: tracing, AOTAutograd,
  Inductor, a lazy backward's compile, a CUDA graph's recording), autotunes (a Triton kernel's
  first run benchmarking its configs) or warms up and captures a CUDA graph; it nests and
  interrupts the others.

`phase_names` maps them onto start-up, compile and steady for `dlpt.phases.split_phases`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.record.inductor_hooks import AfterImport
from dlpt.collectors.record.native import P_COMPILE, P_STARTUP, P_STEADY, P_WARMUP, RAW_PHASES, Collector
from dlpt.frames import FrameTable
from dlpt.header import GpuIdle
from dlpt.idle import blame_phases, idle_column, merged_meta
from dlpt.phases import COMPILE, STARTUP, STEADY, phase_frame

RAW_NAMES = {v: k for k, v in RAW_PHASES.items()}
MAX_SPANS = 5000  # stretches kept in meta: a run that recompiles every step would list thousands


def phase_names(steps_seen: int, raw_seen: set[int]) -> dict[str, str]:
    """Each raw phase's name in the profile. Warm-up is start-up once a step or a compile ended
    it, else the steady state (an eager loop without steps: decode, inference); a run that never
    left start-up (no GPU work, no step) was all steady state."""
    warm = STARTUP if steps_seen or P_COMPILE in raw_seen else STEADY
    only_startup = not raw_seen - {P_STARTUP, P_COMPILE}
    return {RAW_NAMES[P_STARTUP]: STEADY if only_startup else STARTUP, RAW_NAMES[P_WARMUP]: warm,
            RAW_NAMES[P_STEADY]: STEADY, RAW_NAMES[P_COMPILE]: COMPILE}


def raw_spans(phase_t: np.ndarray, phase_id: np.ndarray, start: int, end: int) -> list[tuple[int, int, int]]:
    """The window [start, end) as (start, end, raw phase) stretches, from the collector's log of
    changes (each change's time and the phase it started)."""
    out: list[tuple[int, int, int]] = []
    t = [int(x) for x in phase_t.tolist()]
    p = [int(x) for x in phase_id.tolist()]
    for i, (t0, ph) in enumerate(zip(t, p)):
        t1 = t[i + 1] if i + 1 < len(t) else end
        s, e = max(t0, start), min(t1, end)
        if i == 0:
            s = start  # the first phase holds the window from its start
        if e > s:
            out.append((s, e, ph))
    return out


def spans_by(spans: list[tuple[int, int, Any]]) -> dict[Any, tuple[np.ndarray, np.ndarray]]:
    """{phase: (starts, ends)} of sorted stretches."""
    out: dict[Any, tuple[list[int], list[int]]] = {}
    for s, e, p in spans:
        a, b = out.setdefault(p, ([], []))
        a.append(s)
        b.append(e)
    return {p: (np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)) for p, (a, b) in out.items()}


def named_spans(spans: list[tuple[int, int, int]], names: dict[str, str]) -> list[list[Any]]:
    """`meta.phase_spans`: the stretches by their names, neighbours of one name joined."""
    out: list[list[Any]] = []
    for s, e, raw in spans:
        name = names[RAW_NAMES[raw]]
        if out and out[-1][2] == name and out[-1][1] == s:
            out[-1][1] = e
        else:
            out.append([s, e, name])
    return out[:MAX_SPANS]


def phase_walls(spans: list[tuple[int, int, int]], names: dict[str, str]) -> dict[str, Any]:
    """`meta.phases` before idle: each phase's wall (time in it) and window (its first start,
    its last end)."""
    out: dict[str, Any] = {}
    for s, e, raw in spans:
        ph = out.setdefault(names[RAW_NAMES[raw]], {"wall": 0, "window": {"start": s, "end": e}})
        ph["wall"] += e - s
        ph["window"]["end"] = e
    return out


def phase_node(builder: TreeBuilder, frames: FrameTable, raw: int) -> int:
    """The node heading raw phase `raw`'s subtree (the collector's N_PHASE node, converted)."""
    return builder.child(0, frames.intern(phase_frame(RAW_NAMES.get(raw, str(raw)))))


class Rehome:
    """Nodes moved under another raw phase's node: the same path beneath it. A host interval's
    node is its phase's when it was sampled; one sampled as the phase changed names the last
    phase's node, and its piece after the change belongs to the new phase."""

    def __init__(self, builder: TreeBuilder, frames: FrameTable) -> None:
        self.builder = builder
        self.frames = frames
        self.memo: dict[tuple[int, int], int] = {}

    def __call__(self, nodes: np.ndarray, raw: int) -> np.ndarray:
        target = phase_node(self.builder, self.frames, raw)
        parent, frame = self.builder.parent, self.builder.frame
        out = nodes.copy()
        for i, n in enumerate(nodes.tolist()):
            got = self.memo.get((n, target))
            if got is None:
                path = []
                m = n
                while m > 0 and parent[m] > 0:
                    path.append(frame[m])
                    m = parent[m]
                # m: the node under the root heading n's path (its phase node, or n's own top)
                moved = m != target and m > 0 and self.frames[frame[m]].kind == "phase"
                got = self.memo[(n, target)] = self.builder.path(path[::-1], target) if moved else n
            out[i] = got
        return out


def phase_idle(builder: TreeBuilder, frames: FrameTable, windows: dict[int, tuple[int, int]],
               busy: dict[int, tuple[np.ndarray, np.ndarray]], spans: list[tuple[int, int, int]],
               names: dict[str, str], host: tuple[np.ndarray, ...], phases_meta: dict[str, Any],
               rehome: Rehome | None = None, ready: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
               ) -> tuple[tuple[np.ndarray, np.ndarray], GpuIdle]:
    """GPU idle blamed phase by phase (`dlpt.idle.blame_phases`), in one clock: `spans` the raw
    phases' stretches, `host` the host intervals (start, end, node, thread, in-sync) on `builder`'s
    nodes; `ready` when each GPU had work queued. Returns the `gpu_idle_time` column (start-up and unattributed rows under each phase's
    node) and the run's `meta.gpu_idle`; each phase's figures go into `phases_meta[name]`."""
    rehome = rehome or Rehome(builder, frames)
    hs, he, hn, ht, hy = host
    results, bad = blame_phases(len(builder), windows, busy, spans_by(spans), hs, he, hn, ht, hy, rehome, ready)
    cols_n, cols_v = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for raw, res in results.items():
        nodes, values = idle_column(res, builder, frames, phase_node(builder, frames, raw))
        cols_n.append(nodes)
        cols_v.append(values)
    for name, ph in phases_meta.items():
        mine = [res for raw, res in results.items() if names[RAW_NAMES[raw]] == name]
        if mine:
            ph["gpu_idle"] = merged_meta(mine, {})
    return (np.concatenate(cols_n), np.concatenate(cols_v)), merged_meta(list(results.values()), bad)


class PhaseHooks:
    """Tells the collector when torch.compile's one-off work starts and ends. Each hook waits for
    the program's own import of the module it patches (importing Inductor costs a second, which a
    program that never compiles should not pay) and is undone by `remove()`."""

    def __init__(self, mod: Collector) -> None:
        self.mod = mod
        self._undo: list[Callable[[], None]] = []
        self._finders: list[AfterImport] = []

    def install(self) -> None:
        self._when("torch._dynamo.callback", self._dynamo)
        self._when("torch._inductor.cudagraph_trees", self._cudagraph_trees)
        self._when("torch._inductor.runtime.triton_heuristics", self._autotuning)
        self._when("torch.cuda.graphs", self._graph_capture)

    def remove(self) -> None:
        for f in self._finders:
            if f in sys.meta_path:
                sys.meta_path.remove(f)
        while self._undo:
            self._undo.pop()()

    def _when(self, module: str, then: Callable[[Any], None]) -> None:
        if module in sys.modules:
            then(sys.modules[module])
            return
        finder = AfterImport(module, lambda: then(sys.modules[module]))
        sys.meta_path.insert(0, finder)
        self._finders.append(finder)

    def _bracket(self, owner: Any, name: str, when: Callable[..., bool] | None = None) -> None:
        """`owner.name` runs inside the compile phase (where `when(self, *args)` says so)."""
        orig = owner.__dict__.get(name)
        if orig is None:
            return
        mod = self.mod

        @functools.wraps(orig)
        def inside(*args: Any, **kwargs: Any) -> Any:
            if when is not None and not when(*args):
                return orig(*args, **kwargs)
            mod.compile_phase(1)
            try:
                return orig(*args, **kwargs)
            finally:
                mod.compile_phase(-1)

        setattr(owner, name, inside)
        self._undo.append(lambda: setattr(owner, name, orig))

    def _dynamo(self, m: Any) -> None:
        handler = getattr(m, "callback_handler", None)
        if handler is None or not hasattr(handler, "register_start_callback"):
            return
        mod = self.mod
        # Dynamo runs these around each frame's compile (AOTAutograd and Inductor inside), a lazy
        # backward's compile, and cudagraph trees' recording of a graph; nested installs call once.
        start = handler.register_start_callback(lambda *_: mod.compile_phase(1))
        end = handler.register_end_callback(lambda *_: mod.compile_phase(-1))

        def undo() -> None:
            handler.remove_start_callback(start)
            handler.remove_end_callback(end)

        self._undo.append(undo)

    def _cudagraph_trees(self, m: Any) -> None:
        manager = getattr(m, "CUDAGraphTreeManager", None)
        if manager is not None:
            # A function's first (eager) run before its graph is recorded: warm-up, once.
            self._bracket(manager, "run_eager", lambda self_, _inputs, fid, *a: fid not in self_.warmed_up_functions)

    def _autotuning(self, m: Any) -> None:
        tuner = getattr(m, "CachingAutotuner", None)
        if tuner is not None:
            self._bracket(tuner, "benchmark_all_configs")
            self._bracket(tuner, "coordinate_descent_tuning")

    def _graph_capture(self, m: Any) -> None:
        graph = getattr(m, "CUDAGraph", None)
        if graph is None:
            return
        mod = self.mod
        begin, end = graph.__dict__.get("capture_begin"), graph.__dict__.get("capture_end")
        if begin is None or end is None:
            return

        @functools.wraps(begin)
        def capture_begin(*args: Any, **kwargs: Any) -> Any:
            mod.compile_phase(1)
            try:
                return begin(*args, **kwargs)
            except BaseException:
                mod.compile_phase(-1)
                raise

        @functools.wraps(end)
        def capture_end(*args: Any, **kwargs: Any) -> Any:
            try:
                return end(*args, **kwargs)
            finally:
                mod.compile_phase(-1)

        graph.capture_begin, graph.capture_end = capture_begin, capture_end

        def undo() -> None:
            graph.capture_begin, graph.capture_end = begin, end

        self._undo.append(undo)


__all__ = ["P_COMPILE", "P_STARTUP", "P_STEADY", "P_WARMUP", "PhaseHooks", "RAW_NAMES", "Rehome", "named_spans",
           "phase_idle", "phase_names", "phase_node", "phase_walls", "raw_spans", "spans_by"]
