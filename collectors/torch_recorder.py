"""The torch recorder behind `dlpt record` and `dlpt.profile`: runs torch.profiler with Python
stacks and turns its *live* result into a calling-context tree (DESIGN §2).

How a GPU activity finds its source line:
- the profiler's event tree (`kineto_results.experimental_event_tree()`) nests Python calls
  (`PyCall`, `PyCCall`) and torch ops (`TorchOp`) per thread; a Python call node's
  `extra_fields.caller` is the (file, line, function) of the line that made the call — the
  call-site line — so a path is the callers of the Python calls above an op;
- ops reached without a recorded Python call (`x + y`, `x[i]`: C slots, not calls) sit directly
  under the function's `PyCall`; they get a frame of that function at its `def` line, since the
  profiler records no line for them;
- a device event's `linked_correlation_id()` is the launching op's correlation id; failing that,
  its own `correlation_id()` is that of the runtime call (`cudaGraphLaunch`, Triton's
  `cuLaunchKernel`) in the tree, whose Python context is used;
- a backward op (`autograd::engine::evaluate_function: XBackward0`) carries the sequence number
  of the forward op that made its autograd node; its work goes under that op's path and a
  `[backward]` marker;
- threads started while recording get a `record_function` marker around their `run`, and are
  placed under the line that called `Thread.start` and the thread's target function, because
  torch records no Python frames for them.

Long runs are recorded in windows of steps: the profiler is stopped, its result folded into the
same tree and dropped, and started again, so memory stays bounded by a window.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import datetime as _dt
import gc
import itertools
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors import record_columns, record_native
from dlpt.collectors.kineto import finish
from dlpt.collectors.kineto.link import BACKWARD_FRAME, BACKWARD_PREFIX, NO_LAUNCH, LinkResult, unattributed_frame
from dlpt.collectors.record_trace import DeviceColumns, device_columns
from dlpt.frames import Frame, FrameTable, is_library_file
from dlpt.metrics import KERNEL, MEMSET, copy_kind
from dlpt.profile import Profile
from dlpt.ranks import rank_info
from dlpt.version import __version__

THREAD_MARK = "dlpt::thread#"
NO_GPU_NOTICE = "dlpt: no GPU seen; recording host op time (cpu_time) only"
MAX_SOURCE_BYTES = 4 << 20  # a generated or data file this large is not code a user reads
_DEVICE_KINDS = {"kernel": KERNEL, "gpu_memcpy": -1, "gpu_memset": MEMSET}
_LEAF_KIND = {KERNEL: "kernel", MEMSET: "memset"}


def _leaf_frame(kind: int, name: str) -> Frame:
    """The frame of a device activity of metric kind `kind` (every copy kind is a "memcpy")."""
    return Frame(_LEAF_KIND.get(kind, "memcpy"), name)


def _module_frame(name: str) -> Frame:
    """`nn.Module: Linear_0`, as torch names a module's call, is the module frame `Linear_0`."""
    return Frame("module", name[len("nn.Module: "):])

# Where device events come from: "events" (`kineto_results.events()` through pybind), or
# "trace" (Kineto's chrome trace, see `record_trace`). Measured on an H100 (docs/BENCHMARKS.md,
# Recording): the trace places every kernel on the same path but is slower — writing and decoding
# the whole window's JSON (every op too) took 2.2 s per 100k kernels against 1.5 s — so it is
# opt-in (DLPT_DEVICE_EVENTS=trace) and kept for comparison.
DEVICE_SOURCE = os.environ.get("DLPT_DEVICE_EVENTS", "events")

# The recorder of the running `dlpt record` / `dlpt.profile`, for `dlpt.step()`.
_ACTIVE: Recorder | None = None


def active() -> Recorder | None:
    return _ACTIVE


# torch's Python tracer keeps borrowed `const char*` pointers into each code object's
# `co_filename` and `co_name` and reads them only when the profiler stops. A code object run
# once and freed while recording — the module run by `dlpt record -m` (runpy drops it and its
# globals when the module ends), the body of every module imported meanwhile, exec'd strings —
# leaves them dangling: the file then reads as "site-packages", the function as "grad", or the
# bytes are not UTF-8 at all. Every such code reaches `exec` (import, runpy, eval and exec all
# go through it), which raises the "exec" audit event with the code object: holding it keeps
# its strings alive until the profile is built.
_KEPT: list[Any] | None = None
_AUDIT_HOOKED = False


def _keep_code(event: str, args: tuple[Any, ...]) -> None:
    if event == "exec":
        kept = _KEPT
        if kept is not None:
            kept.append(args[0])


def _keep_code_objects(on: bool) -> None:
    global _KEPT, _AUDIT_HOOKED
    if on:
        _KEPT = []
        if not _AUDIT_HOOKED:
            # An audit hook cannot be removed; outside a recording it returns at once.
            sys.addaudithook(_keep_code)
            _AUDIT_HOOKED = True
    else:
        _KEPT = None


class Recorder:
    """Record a region of a program: `start()`, run it, `stop()` → `Profile`.

    `steps=(A, B)` records steps A..B-1 only (steps counted by optimizer steps or `dlpt.step()`);
    `window` restarts the profiler every that many steps, folding each window into the tree;
    `window_seconds` / `window_bytes` bound a window in time and in memory growth too, also in
    programs with no steps at all (see `_arm_timer`). None or 0 turns a bound off.
    """

    def __init__(self, command: str = "", name: str = "", steps: tuple[int, int] | None = None,
                 window: int | None = 20, quiet: bool = False, drop_files: tuple[str, ...] = (),
                 window_seconds: float | None = 30.0, window_bytes: int | None = 2 << 30) -> None:
        import torch

        self.torch = torch
        self.command = command
        self.steps = steps
        self.window = window if window and window > 0 else None
        self.quiet = quiet
        self.frames = FrameTable()
        self.builder = TreeBuilder(self.frames.intern(Frame("root", name or command or "record")))
        self.out = LinkResult()
        self.cuda = bool(torch.cuda.is_available())
        self.step_count = 0
        self.explicit_steps = False  # once dlpt.step() is called, optimizer steps stop counting
        self.windows = 0
        self.skipped = 0
        self.unlinked_backward = 0
        self.post_seconds = 0.0
        # Where post-processing time goes (seconds): tree, walk, device, drop, finish.
        self.post_parts: collections.Counter[str] = collections.Counter()
        self.link_stats: collections.Counter[str] = collections.Counter()
        self.done = False
        self.window_seconds = window_seconds if window_seconds and window_seconds > 0 else None
        self.window_bytes = window_bytes if window_bytes and window_bytes > 0 else None
        self.bound_rotations = 0  # windows ended by the time or memory bound, not by steps
        self._rotating = False
        self._timer_on = False
        self._window_t0 = 0.0
        self._window_rss = 0
        self._last_step_t = 0.0
        self._prof: Any = None
        self._window_start = 0
        self._hook: Any = None
        self._orig_start: Any = None
        self._threads: dict[int, tuple[list[tuple[str, int, str]], tuple[str, int, str], str]] = {}
        self._thread_ids = itertools.count(1)
        self._tid_base: dict[int, int] = {}
        self._frame_cache: dict[tuple[str, int, str], int] = {}
        self._def_cache: dict[tuple[str, int, str], int] = {}
        self._file_cache: dict[str, str] = {}
        self._path_roots: list[str] = [os.path.dirname(os.path.abspath(f)) for f in drop_files]
        # Files whose frames are left out of paths: `dlpt record`'s console script, which sits
        # outside every library folder and would otherwise head each path as "source".
        # Also this file: its audit hook and thread wrapper run inside the program's calls.
        self._drop = frozenset(os.path.abspath(f) for f in (*drop_files, __file__))
        # The native reader of the profiler's result (None: the Python path). Built here, before
        # anything is recorded, so a first-use compile is not part of a window's fold.
        self._native = record_native.load()
        self.native_used = False
        # How the last window's events are freed (see `_release`): "background", "exit" (the
        # process ends right after: `dlpt record`), "now" (timed, for benchmarks).
        self.final_free = "background"
        self._stopping = False
        self.started_at = time.time()

    # ----- lifecycle -----

    def start(self) -> None:
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            raise RuntimeError("dlpt is already recording in this process")
        _ACTIVE = self
        _keep_code_objects(True)
        self._remember_paths()
        self._install_hooks()
        self._arm_timer()
        if not self.cuda and not self.quiet:
            print(NO_GPU_NOTICE, file=sys.stderr)
        if self.steps is None or self.steps[0] <= 0:
            self._begin()

    def stop(self) -> Profile:
        """End recording (idempotent on the hooks) and build the profile."""
        global _ACTIVE
        try:
            if self._prof is not None:
                self._stopping = True
                self._end()
        finally:
            self._stopping = False
            self._disarm_timer()
            self._remove_hooks()
            if _ACTIVE is self:
                _ACTIVE = None
                _keep_code_objects(False)  # every window is folded: the names were read
        return self._finish()

    def step(self, explicit: bool = False) -> None:
        """One training step finished: start, restart or end the profiler at step boundaries."""
        if explicit and not self.explicit_steps:
            self.explicit_steps = True
        elif not explicit and self.explicit_steps:
            return
        self.step_count += 1
        s = self.step_count
        self._last_step_t = time.monotonic()
        if self.done:
            return
        if self.steps is not None:
            a, b = self.steps
            if s >= b:
                if self._prof is not None:
                    self._end()
                self.done = True
                return
            if s == a and self._prof is None:
                self._begin()
                return
        if self._prof is not None and (
                (self.window and s - self._window_start >= self.window) or self._over_bound(self._last_step_t)):
            self._rotate()

    def _rotate(self) -> None:
        """Fold the window so far and start the next one."""
        if self._rotating:
            return
        self._rotating = True
        try:
            self._end()
            self._begin()
        finally:
            self._rotating = False

    # ----- the time and memory bound -----

    def _over_bound(self, now: float) -> bool:
        if self.window_seconds is not None and now - self._window_t0 >= self.window_seconds:
            return True
        return self.window_bytes is not None and _rss() - self._window_rss >= self.window_bytes

    def _arm_timer(self) -> None:
        """Bound each window in time and memory in programs that never step (no optimizer, no
        `dlpt.step()`): left alone, one such program grew to 23 GB of profiler events and the
        OOM killer took it and the recording with it.

        Rotating stops and restarts torch's profiler, which must happen on the main thread at a
        point where no op of ours is half-done; a Python signal handler runs exactly there (the
        main thread, between bytecodes). The tick is `ITIMER_VIRTUAL` (SIGVTALRM), which counts
        the process's own CPU time: a busy loop (the kind that piles up events) is ticked, an
        idle or blocked program is not, so no signal wakes its blocking calls for nothing; and
        SIGVTALRM, unlike SIGALRM (`signal.alarm`, timeouts), is all but unused by programs.
        A thread cannot do this: it cannot stop the profiler safely from outside the main thread,
        and its own Python calls would be recorded into the program's profile. The timer is set
        only where the program has no handler and no timer of its own for that signal, from the
        main thread; elsewhere windows are bounded at steps alone. At a step the same bounds are
        checked first, so a stepping program rotates at its step boundaries."""
        if self.window_seconds is None and self.window_bytes is None:
            return
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            return
        try:
            if signal.getsignal(signal.SIGVTALRM) != signal.SIG_DFL or signal.getitimer(signal.ITIMER_VIRTUAL)[0]:
                return
            tick = min(1.0, self.window_seconds / 4) if self.window_seconds else 1.0
            signal.signal(signal.SIGVTALRM, self._on_tick)
            signal.setitimer(signal.ITIMER_VIRTUAL, tick, tick)
            self._timer_on = True
        except (ValueError, OSError):
            pass

    def _disarm_timer(self) -> None:
        if not self._timer_on:
            return
        self._timer_on = False
        # The timer first: SIGVTALRM's default action ends the process.
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        if signal.getsignal(signal.SIGVTALRM) == self._on_tick:
            signal.signal(signal.SIGVTALRM, signal.SIG_DFL)

    def _on_tick(self, signum: int, frame: Any) -> None:
        if self._rotating or self._prof is None or self.done:
            return
        now = time.monotonic()
        # A program that steps rotates at its steps (a cleaner cut): the tick acts only when no
        # step came within the time bound, or when memory is over its bound regardless.
        if self.window_seconds is not None and now - self._last_step_t < self.window_seconds:
            if self.window_bytes is None or _rss() - self._window_rss < self.window_bytes:
                return
        if not self._over_bound(now):
            return
        try:
            self.bound_rotations += 1
            self._rotate()
        except Exception as e:  # noqa: BLE001 - raising here would raise inside the program
            self._disarm_timer()
            warnings.warn(f"dlpt: could not restart the profiler ({e!r}); windows now end at steps only",
                          RuntimeWarning, stacklevel=1)

    # ----- the profiler -----

    def _begin(self) -> None:
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        kw: dict[str, Any] = {}
        try:
            # All threads, not only the one that starts the profiler (torch >= 2.6 has it).
            kw["experimental_config"] = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        except (AttributeError, TypeError):
            pass
        try:
            prof = profile(activities=acts, with_stack=True, **kw)
        except TypeError:
            prof = profile(activities=acts, with_stack=True)
        with warnings.catch_warnings():
            # "Profiler clears events at the end of each cycle": that is what windows want.
            warnings.simplefilter("ignore", UserWarning)
            with _quiet_kineto():
                prof.start()
        self._prof = prof
        self._window_start = self.step_count
        self._window_t0 = self._last_step_t = time.monotonic()
        self._window_rss = _rss() if self.window_bytes is not None else 0
        self.windows += 1

    def _end(self) -> None:
        prof, self._prof = self._prof, None
        with _quiet_kineto():
            prof.stop()
        t0 = time.perf_counter()
        try:
            self._ingest(prof.profiler.kineto_results)
        finally:
            # Drop the window's events before the next one starts: memory stays bounded.
            t1 = time.perf_counter()
            self._release(prof.profiler.kineto_results, final=self._stopping)
            prof.profiler.kineto_results = None
            t2 = time.perf_counter()
            self.post_parts["drop"] += t2 - t1
            self.post_seconds += t2 - t0

    def _release(self, kr: Any, final: bool) -> None:
        """Hand the window's events to the native reader to free (torch's destructors took
        0.3-0.5 s per 100k GPU events on an H100): on a background thread while the program goes
        on, or, for the last window of a process about to exit (`final_free = "exit"`), not at
        all — the OS takes the memory back. Kineto's trace is freed here either way but in that
        last case. Without the native reader torch frees everything here, as before."""
        if self._native is None or kr is None:
            return
        mode = {"now": 0, "background": 1, "exit": 2}[self.final_free if final else "background"]
        try:
            got = self._native.release(kr, mode)
        except Exception:  # noqa: BLE001 - then torch frees it, as without the native reader
            return
        for k, v in got.items():
            self.post_parts["free_" + k[:-2]] += v

    def _install_hooks(self) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(lambda *a, **k: self.step())
        except ImportError:  # torch before 2.0
            self._hook = None
        rec = self
        orig = self._orig_start = threading.Thread.start
        record_function = self.torch.autograd.profiler.record_function

        def start(th: threading.Thread, *a: Any, **k: Any) -> Any:
            key = next(rec._thread_ids)
            f = sys._getframe(1)
            stack = []
            while f is not None:
                stack.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
                f = f.f_back
            stack.reverse()
            target = getattr(th, "_target", None) or th.run
            code = getattr(target, "__code__", None)
            where = (code.co_filename, code.co_firstlineno, getattr(target, "__qualname__", code.co_name)) \
                if code is not None else ("", 0, getattr(target, "__qualname__", repr(target)))
            rec._threads[key] = (stack, where, th.name)
            run = th.run

            def run_marked() -> None:
                # The marker heads the thread's ops in the tree, naming the thread they belong to.
                with record_function(f"{THREAD_MARK}{key}"):
                    run()

            th.run = run_marked  # type: ignore[method-assign]
            return orig(th, *a, **k)

        threading.Thread.start = start  # type: ignore[method-assign]

    def _remove_hooks(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._orig_start is not None:
            threading.Thread.start = self._orig_start  # type: ignore[method-assign]
            self._orig_start = None

    # ----- frames -----

    def _remember_paths(self) -> None:
        for p in [os.getcwd(), *sys.path]:
            p = os.path.abspath(p or os.getcwd())
            if p not in self._path_roots:
                self._path_roots.append(p)

    def _file(self, name: str) -> str:
        """The profiler strips the `sys.path` entry from file names (`torch/nn/modules/module.py`,
        `train.py`); find the file again so frames carry absolute paths."""
        r = self._file_cache.get(name)
        if r is None:
            r = name
            if name and not name.startswith("<") and not os.path.isabs(name):
                for root in self._path_roots:
                    cand = os.path.join(root, name)
                    if os.path.isfile(cand):
                        r = cand
                        break
            self._file_cache[name] = r
        return r

    def _py(self, file: str | None, line: int, func: str | None) -> int:
        """A call-site frame; -1 for a dropped file's. A file or function name torch read from
        freed memory (None: not UTF-8) names both `<undecodable>`."""
        if file is None or func is None:
            file = func = "<undecodable>"
        key = (file, line, func)
        f = self._frame_cache.get(key)
        if f is None:
            path = self._file(file)
            if path in self._drop:
                f = self._frame_cache[key] = -1
            else:
                f = self._frame_cache[key] = self.frames.intern(
                    Frame("python", f"{func} ({path}:{line})", path, line, func))
        return f

    def _def(self, file: str | None, line: int, func: str | None) -> int:
        """A function at its `def` line: for ops that the profiler gives no line for."""
        if file is None or func is None:
            file = func = "<undecodable>"
        key = (file, line, func)
        f = self._def_cache.get(key)
        if f is None:
            path = self._file(file)
            line = _def_line(path, line)
            f = self._def_cache[key] = self.frames.intern(
                Frame("python", f"{func} (def {path}:{line})", path, line, func))
        return f

    def _thread_base(self, key: int) -> int:
        stack, (tf, tl, tn), name = self._threads[key]
        node = 0
        b = self.builder
        for file, line, func in stack:
            f = self._py(file, line, func)
            if f >= 0:
                node = b.child(node, f)
        node = b.child(node, self.frames.intern(Frame("thread", f"[thread {name}]")))
        if tf:
            node = b.child(node, self._def(tf, tl, tn))
        return node

    # ----- folding one window into the tree -----

    def _ingest(self, kr: Any) -> None:
        # The Python path makes a pybind wrapper for every node it touches and drops it at once;
        # the cyclic GC would scan those young objects over and over (on a 300k-node tree,
        # reading `children` alone took 0.74 s with it on and 0.18 s with it off). Nothing made
        # here forms a cycle, so pausing it loses nothing.
        was = gc.isenabled()
        gc.disable()
        try:
            if self._native is not None and DEVICE_SOURCE != "trace" and self._native_fold(kr):
                return
            # No native reader: the same fold in Python, over the same columns read through
            # torch's pybind wrappers (slower).
            t0 = time.perf_counter()
            cols = record_columns.event_tree(kr)
            t1 = time.perf_counter()
            w = self._walk_columns(kr, cols)
            del cols
            t2 = time.perf_counter()
            self._device_events(kr, w)
            self.post_parts["tree"] += t1 - t0
            self.post_parts["walk"] += t2 - t1
            self.post_parts["device"] += time.perf_counter() - t2
        finally:
            if was:
                gc.enable()

    def _native_fold(self, kr: Any) -> bool:
        """Fold the window with the native reader (collectors/native/record_native.cpp) and merge
        its local tree; False where it cannot read this result (then the Python path folds it,
        and does from here on)."""
        t0 = time.perf_counter()
        try:
            F = self._native.fold(kr, BACKWARD_PREFIX, THREAD_MARK, list(self._threads), self.cuda)
        except Exception:  # noqa: BLE001 - a cast torch refuses: the Python path reads it instead
            F = None
        if F is None:
            self._native = None
            return False
        t1 = time.perf_counter()
        self._merge_native(F)
        self.post_parts["fold"] += t1 - t0
        self.post_parts["merge"] += time.perf_counter() - t1
        self.native_used = True
        return True

    def _merge_native(self, F: dict[str, Any]) -> None:
        """Merge the native fold's window-local tree into the profile's tree: one step per
        distinct local context (not per event), in the order the fold made them, so that nodes
        and frames are numbered as the Python fold numbers them. Frames resolve here, where the
        file paths are known: a local call site in a dropped file maps onto its parent."""
        R = record_native
        i64 = np.int64

        def col(k: str) -> np.ndarray:
            return np.frombuffer(F[k], dtype=i64)

        names = ["<undecodable name>" if v is None else v for v in F["names"]]
        strs = F["strs"]
        ftype, fa, fb, fc = (col(k).tolist() for k in ("ftype", "fa", "fb", "fc"))
        frames = self.frames
        child = self.builder.child
        bwd = frames.intern(BACKWARD_FRAME)
        # A leaf's activity kind: copies by their name's direction, as the Python path does.
        leaf_kind = {R.F_KERNEL: lambda name: KERNEL, R.F_MEMSET: lambda name: MEMSET, R.F_MEMCPY: copy_kind}

        def resolve(lf: int) -> int:
            t = ftype[lf]
            if t == R.F_SITE or t == R.F_DEF:
                return (self._py if t == R.F_SITE else self._def)(strs[fa[lf]], fb[lf], strs[fc[lf]])
            if t == R.F_OP:
                return frames.intern(Frame("op", names[fa[lf]]))
            if t == R.F_MODULE:
                return frames.intern(_module_frame(names[fa[lf]]))
            if t == R.F_BACKWARD:
                return bwd
            if t == R.F_UNATTR:
                return frames.intern(unattributed_frame(NO_LAUNCH))
            return frames.intern(_leaf_frame(leaf_kind[t](names[fa[lf]]), names[fa[lf]]))

        gframe = [-2] * len(ftype)  # -2: not resolved yet; -1: a dropped file's frame
        parent, frame = col("parent").tolist(), col("frame").tolist()
        g = [0] * len(parent)
        tid_base = self._tid_base
        for i in range(1, len(parent)):
            lf = frame[i]
            t = ftype[lf]
            if t == R.F_THREAD:
                node = tid_base[fb[lf]] = self._thread_base(fa[lf])
            elif t == R.F_TID:
                tid = fa[lf]
                node = tid_base.get(tid, -1)
                if node < 0:
                    node = tid_base[tid] = child(0, frames.intern(Frame("thread", f"[thread {tid}]")))
            else:
                f = gframe[lf]
                if f == -2:
                    f = gframe[lf] = resolve(lf)
                node = g[parent[i]]
                if f >= 0:
                    node = child(node, f)
            g[i] = node
        gnode = np.asarray(g, dtype=i64)
        out = self.out
        out.cpu_node += gnode[col("cpu_node")].tolist()
        out.cpu_self += col("cpu_self").tolist()
        act_frame = col("act_frame")
        if len(act_frame):
            kind_of = np.zeros(len(ftype), dtype=i64)
            for lf, t in enumerate(ftype):
                if t in leaf_kind:
                    kind_of[lf] = leaf_kind[t](names[fa[lf]])
            out.node += gnode[col("act_node")].tolist()
            out.kind += kind_of[act_frame].tolist()
            out.name += np.asarray(gframe, dtype=i64)[act_frame].tolist()
            out.device += col("device").tolist()
            out.stream += col("stream").tolist()
            out.start += col("start").tolist()
            out.duration += col("dur").tolist()
            out.nbytes += col("nbytes").tolist()
        stats = self.link_stats
        for at, v in F["skipped"].items():
            stats["skipped:" + at] += v
        for k, v in F["links"].items():
            stats[k] += v
        self.unlinked_backward += F["unlinked_backward"]

    def _walk_columns(self, kr: Any, T: dict[str, Any]) -> _Walked:
        """Fold the profiler's event tree, as preorder columns (from the native reader,
        collectors/native/record_native.cpp, or `record_columns.event_tree`), into the CCT. The
        children of node n are n+1, then each one's `end`, up to `end[n]`."""
        K_OP, K_CALL, K_CCALL, K_KIN = (record_native.K_OP, record_native.K_CALL, record_native.K_CCALL,
                                        record_native.K_KINETO)
        kind, end, start, stop, tids, corrs = T["kind"], T["end"], T["start"], T["stop"], T["tid"], T["corr"]
        name_ix, seqs, module = T["name"], T["seq"], T["module"]
        cfile, cline, cfunc = T["caller_file"], T["caller_line"], T["caller_func"]
        sfile, sline, sfunc = T["site_file"], T["site_line"], T["site_func"]
        # A name torch read from freed memory, or one that is not valid UTF-8 (None here), is
        # named `<undecodable…>`: the work is kept, the name lost.
        names = ["<undecodable name>" if v is None else v for v in T["names"]]
        strs = T["strs"]
        child = self.builder.child
        frames = self.frames
        py, def_frame = self._py, self._def
        out = self.out
        w = _Walked()
        op_node, rt_node, rt_row = w.op_node, w.rt_node, w.rt_row
        sp_start, sp_end, sp_ctx, sp_par = w.sp_start, w.sp_end, w.sp_ctx, w.sp_par
        op_lo, op_hi = w.op_lo, w.op_hi
        op_frames: dict[int, int] = {}  # name index → frame
        edge: dict[tuple[int, int], int] = {}
        # (context, file, line, function) of a call site, the strings by their index.
        site: dict[tuple[int, int, int, int], int] = {}
        fwd: dict[tuple[int, int], int] = {}
        fwd_tids: dict[int, set[int]] = {}
        backward: list[tuple[int, int, int, int, int]] = []
        bwd_frame = frames.intern(BACKWARD_FRAME)
        cpu_node, cpu_self = out.cpu_node, out.cpu_self
        link_ops = self.cuda

        def at_site(ctx: int, n: int) -> int:
            fi, line, fn = cfile[n], cline[n], cfunc[n]
            key = (ctx, fi, line, fn)
            node = site.get(key)
            if node is None:
                f = py(strs[fi], line, strs[fn])
                node = site[key] = child(ctx, f) if f >= 0 else ctx
            return node

        def walk(root: int, ctx: int, tid: int, op_row: int = -1, par: int = -1, placed: bool = False,
                 tree_root: int = -1) -> None:
            # An op's exit is a node of -1 whose context is the op's row.
            stack: list[tuple[int, int, Any, int, int]] = [(root, ctx, None, op_row, par)]
            first = root if placed else -1
            pop, push = stack.pop, stack.append
            while stack:
                n, ctx, src, row, par = pop()
                if n < 0:
                    op_hi[ctx] = len(sp_start)
                    continue
                t = kind[n]
                e = end[n]
                if t == K_OP:
                    ni = name_ix[n]
                    if src is not None:
                        d = src[1]
                        if d < 0:
                            c = src[0]
                            d = src[1] = child(ctx, def_frame(strs[sfile[c]], sline[c], strs[sfunc[c]]))
                        ctx = d
                    seq = seqs[n]
                    if seq >= 0 and n != first and names[ni].startswith(BACKWARD_PREFIX):
                        backward.append((n, ctx, tid, row, par))
                        continue
                    f = op_frames.get(ni)
                    if f is None:
                        f = op_frames[ni] = frames.intern(Frame("op", names[ni]))
                    key = (ctx, f)
                    node = edge.get(key)
                    if node is None:
                        node = edge[key] = child(ctx, f)
                    if seq >= 0:
                        fwd[(tid, seq)] = node
                        ts = fwd_tids.get(seq)
                        if ts is None:
                            fwd_tids[seq] = {tid}
                        elif tid not in ts:
                            ts.add(tid)
                    if link_ops:
                        op_node[corrs[n]] = node
                    s, en = start[n], stop[n]
                    dur = en - s
                    if row >= 0:
                        cpu_self[row] -= dur
                        sp_par.append(par)
                        par = len(sp_start)
                        sp_start.append(s)
                        sp_end.append(en)
                        sp_ctx.append(node)
                    r2 = len(cpu_node)
                    cpu_node.append(node)
                    cpu_self.append(dur)
                    if e > n + 1:
                        op_lo[r2] = len(sp_start)
                        push((-1, r2, None, -1, -1))
                        kids = []
                        c = n + 1
                        while c < e:
                            kids.append(c)
                            c = end[c]
                        for c in reversed(kids):
                            push((c, node, None, r2, par))
                    continue
                if t == K_CALL:
                    if n != tree_root:
                        ctx = at_site(ctx, n)
                    if module[n]:
                        ni = name_ix[n]  # "nn.Module: Linear_0"
                        f = op_frames.get(ni)
                        if f is None:
                            f = op_frames[ni] = frames.intern(_module_frame(names[ni]))
                        ctx = child(ctx, f)
                        src = None
                    else:
                        src = [n, -1]
                    if row >= 0:
                        sp_par.append(par)
                        par = len(sp_start)
                        sp_start.append(start[n])
                        sp_end.append(stop[n])
                        sp_ctx.append(ctx)
                elif t == K_CCALL:
                    ctx = at_site(ctx, n)
                    src = None
                    if row >= 0:
                        sp_par.append(par)
                        par = len(sp_start)
                        sp_start.append(start[n])
                        sp_end.append(stop[n])
                        sp_ctx.append(ctx)
                elif t == K_KIN and n != root:
                    corr = corrs[n]
                    if corr not in rt_node:
                        rt_node[corr] = ctx
                        if row >= 0:
                            rt_row[corr] = (row, start[n])
                        if row >= 0 and ctx == cpu_node[row]:
                            continue  # its children are only its own device events
                if e > n + 1:
                    kids = []
                    c = n + 1
                    while c < e:
                        kids.append(c)
                        c = end[c]
                    for c in reversed(kids):
                        push((c, ctx, src, row, par))

        roots = sorted(T["roots"], key=start.__getitem__)  # stable: roots in time order
        py_tids = {tids[r] for r in roots if kind[r] == K_CALL}
        for r in roots:
            tid = tids[r]
            if kind[r] == K_OP:
                name = names[name_ix[r]]
                if name.startswith(THREAD_MARK):
                    try:
                        key = int(name[len(THREAD_MARK):])
                    except ValueError:
                        key = -1
                    if key in self._threads:
                        base = self._tid_base[tid] = self._thread_base(key)
                        kids = []
                        c, e = r + 1, end[r]
                        while c < e:
                            kids.append(c)
                            c = end[c]
                        for c in kids:  # in time order, as the thread ran them
                            walk(c, base, tid)
                        continue
            if tid in py_tids:
                base = 0
            else:
                base = self._tid_base.get(tid, -1)
                if base < 0:
                    base = self._tid_base[tid] = child(0, frames.intern(Frame("thread", f"[thread {tid}]")))
            walk(r, base, tid, tree_root=r)

        fwd_tid_of: dict[int, int] | None = None
        for n, ctx, tid, op_row, par in backward:
            seq = seqs[n]
            tids_ = fwd_tids.get(seq, ())
            fnode = -1
            if len(tids_) == 1:
                fnode = fwd[(next(iter(tids_)), seq)]
            elif tids_:
                if fwd_tid_of is None:
                    fwd_tid_of = {e.correlation_id(): e.fwd_thread_id() for e in kr.events()
                                  if e.sequence_nr() >= 0 and e.name().startswith(BACKWARD_PREFIX)}
                fnode = fwd.get((fwd_tid_of.get(corrs[n], -1), seq), -1)
            if fnode >= 0:
                ctx = child(fnode, bwd_frame)
            else:
                self.unlinked_backward += 1
            walk(n, ctx, tid, op_row, par, placed=True)
        return w

    def _device_events(self, kr: Any, w: _Walked) -> None:
        """Device activities, each under the most specific context of its launch, from
        `kr.events()` (or, opted in, Kineto's chrome trace of the window: see DEVICE_SOURCE)."""
        if not self.cuda:
            return  # only CPU activity was asked of the profiler: no device events
        stats = self.link_stats
        cols = None
        if DEVICE_SOURCE == "trace":
            t0 = time.perf_counter()
            cols = device_columns(kr)
            self.post_parts["trace"] += time.perf_counter() - t0
        if cols is not None:
            for at, v in cols.skipped.items():
                stats["skipped:" + at] += v
            names = cols.name
            kinds = [_DEVICE_KINDS[c] for c in cols.cat]
            corrs = cols.corr
            linked: list[int] | None = cols.linked
            rest: Any = cols
        else:
            got = self._device_event_columns(kr)
            if got is None:
                return
            names, kinds, corrs, dev, KE = got
            linked = None
            rest = (dev, KE)
        if not names:
            return
        self._place_device(w, names, kinds, corrs, linked, rest)

    def _device_event_columns(self, kr: Any) -> Any:
        """The fallback: device events through pybind, sifted and read a column at a time
        through `map`, with no Python loop body per event."""
        stats = self.link_stats
        cpu = _CPU(self.torch)
        events = kr.events()
        if not events:
            return None
        KE = type(events[0])
        if hasattr(KE, "activity_type"):
            ats = list(map(KE.activity_type, events))
            host_of: dict[str, bool] = {}  # activity type → host side, asked once per type
            for i, at in enumerate(ats):
                if at not in host_of and at not in _DEVICE_KINDS:
                    host_of[at] = events[i].device_type() == cpu
            dev_types = {at for at, host in host_of.items() if not host}
            for at in dev_types:
                stats["skipped:" + str(at)] += ats.count(at)  # gpu_user_annotation is not GPU time
            dev = [e for e, at in zip(events, ats) if at in _DEVICE_KINDS]
            kinds = [_DEVICE_KINDS[at] for at in ats if at in _DEVICE_KINDS]
            names = list(map(KE.name, dev))
        else:
            # torch before 2.12 has no activity_type(): the kind is in the name.
            dev = [e for e, dt in zip(events, map(KE.device_type, events)) if dt != cpu]
            if dev and hasattr(KE, "is_user_annotation"):
                annot = list(map(KE.is_user_annotation, dev))
                if any(annot):
                    stats["skipped:user_annotation"] += sum(annot)
                    dev = [e for e, u in zip(dev, annot) if not u]
            names = list(map(KE.name, dev))
            kinds = [-1 if nm.startswith("Memcpy") else MEMSET if nm.startswith("Memset") else KERNEL for nm in names]
        del events
        return names, kinds, list(map(KE.correlation_id, dev)), dev, KE

    def _place_device(self, w: _Walked, names: list[str], kinds: list[int], corrs: list[int],
                      linked: list[int] | None, rest: Any) -> None:
        stats = self.link_stats
        # The runtime call's own place in the tree is the most specific context (a kernel
        # launched by Python code inside an op, e.g. a custom Function's forward, lands on that
        # line); the launching op comes next; graph replays and Triton launches have only the
        # runtime call.
        rt_node, rt_row, op_node = w.rt_node, w.rt_row, w.op_node
        child = self.builder.child
        frames = self.frames
        no_launch = -1
        n_rt = n_op = n_un = 0
        leaf_cache: dict[tuple[int, str], int] = {}
        edge: dict[tuple[int, int], int] = {}
        nodes: list[int] = []
        leaves: list[int] = []
        for i, corr in enumerate(corrs):
            name = names[i]
            k = kinds[i]
            if k < 0:
                k = kinds[i] = copy_kind(name)
            node = rt_node.get(corr, -1)
            if node >= 0:
                n_rt += 1
                rr = rt_row.get(corr)
                if rr is not None:
                    # Exact: the innermost call or op of that op instance that was open when the
                    # runtime call started (its own start, on the op's thread).
                    node = w.innermost(rr[0], rr[1], node)
            else:
                if linked is None:
                    dev, KE = rest
                    linked = list(map(KE.linked_correlation_id, dev))
                node = op_node.get(linked[i], -1)
                if node >= 0:
                    n_op += 1
                else:
                    n_un += 1
                    if no_launch < 0:
                        no_launch = child(0, frames.intern(unattributed_frame(NO_LAUNCH)))
                    node = no_launch
            lk = (k, name)
            lf = leaf_cache.get(lk)
            if lf is None:
                lf = leaf_cache[lk] = frames.intern(_leaf_frame(k, name))
            ek = (node, lf)
            leaf = edge.get(ek)
            if leaf is None:
                leaf = edge[ek] = child(node, lf)
            nodes.append(leaf)
            leaves.append(lf)
        out = self.out
        out.node += nodes
        out.kind += kinds
        out.name += leaves
        if isinstance(rest, DeviceColumns):
            out.device += rest.device
            out.stream += rest.stream
            out.start += rest.start
            out.duration += rest.dur
            out.nbytes += rest.nbytes
        else:
            dev, KE = rest
            out.device += map(int, map(KE.device_index, dev))
            out.stream += map(int, map(KE.device_resource_id, dev))
            out.start += map(int, map(KE.start_ns, dev))
            out.duration += map(int, map(KE.duration_ns, dev))
            out.nbytes += _copy_bytes(dev, kinds, KE)
        for key, v in (("runtime", n_rt), ("op", n_op), ("unlinked", n_un)):
            if v:
                stats[key] += v

    # ----- the profile -----

    def _finish(self) -> Profile:
        t0 = time.perf_counter()
        self.out.cpu_self[:] = [max(v, 0) for v in self.out.cpu_self]
        prof = finish(self.builder, self.frames, self.out, {})
        prof.sources.update(self._sources(prof))
        self.post_parts["finish"] += time.perf_counter() - t0
        self.post_seconds += time.perf_counter() - t0
        prof.meta = self._meta()
        return prof

    def _meta(self) -> dict[str, Any]:
        torch = self.torch
        meta: dict[str, Any] = {
            "source": "record", "dlpt_version": __version__, "command": self.command,
            "start_time": _dt.datetime.fromtimestamp(self.started_at, _dt.timezone.utc).isoformat(),
            "host": socket.gethostname(), "python_version": sys.version.split()[0],
            "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
            "steps": list(self.steps) if self.steps else None, "steps_seen": self.step_count,
            "windows": self.windows, "windows_by_bound": self.bound_rotations,
            "post_processing_s": round(self.post_seconds, 6),
            "post_processing_parts_s": {k: round(v, 6) for k, v in self.post_parts.items()},
            "unlinked_backward_ops": self.unlinked_backward, "gpu": self.cuda,
            "native_reader": self.native_used,  # collectors/native/ read the results (else pybind)
            "device_links": dict(self.link_stats),
        }
        if self.cuda:
            devs = []
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devs.append({"id": i, "name": p.name, "totalGlobalMem": p.total_memory,
                             "computeMajor": p.major, "computeMinor": p.minor,
                             "numSms": p.multi_processor_count})
            meta["devices"] = devs
        rank, world = _rank_world(torch)
        if rank is not None:
            meta["rank"] = rank
        if world is not None:
            meta["world_size"] = world
        meta.update(rank_info())  # rank, world_size, local_rank, host
        return meta

    def _sources(self, prof: Profile) -> dict[str, str]:
        """Snapshots of the user's files on the paths, so the profile shows code elsewhere."""
        out: dict[str, str] = {}
        for f in {fr.file for fr in prof.frames if fr.kind == "python" and fr.file}:
            if is_library_file(f) or not os.path.isfile(f):
                continue
            try:
                if os.path.getsize(f) > MAX_SOURCE_BYTES:
                    continue
                with open(f, encoding="utf-8", errors="replace") as fh:
                    out[f] = fh.read()
            except OSError:
                continue
        return out


class _Walked:
    """What the tree walk leaves for placing device events.

    Spans: the Python calls and ops inside each op, in walk (pre)order, as columns; `sp_par`
    is the enclosing span's index (or one before the op's range). An op row's descendants'
    spans are `op_lo[row]:op_hi[row]`, sorted by start (one thread, children in time order).
    """

    __slots__ = ("op_node", "rt_node", "rt_row", "sp_start", "sp_end", "sp_ctx", "sp_par", "op_lo", "op_hi")

    def __init__(self) -> None:
        self.op_node: dict[int, int] = {}  # op correlation id → node
        self.rt_node: dict[int, int] = {}  # runtime call correlation id → context node
        # runtime call correlation id → (cpu row of the op it is filed under, its tree node)
        self.rt_row: dict[int, tuple[int, Any]] = {}
        self.sp_start: list[int] = []
        self.sp_end: list[int] = []
        self.sp_ctx: list[int] = []
        self.sp_par: list[int] = []
        self.op_lo: dict[int, int] = {}
        self.op_hi: dict[int, int] = {}

    def innermost(self, row: int, t: int, default: int) -> int:
        """The context of the innermost call or op inside op `row` whose [start, end) holds
        t (a runtime call's start), else `default`: the last span starting at or before t, then
        up its enclosing spans until one is still open at t — exact, and as many steps as the
        nesting is deep."""
        lo = self.op_lo.get(row)
        if lo is None:
            return default
        hi = self.op_hi.get(row, lo)
        if hi <= lo:
            return default
        k = bisect.bisect_right(self.sp_start, t, lo, hi) - 1
        sp_end, sp_par = self.sp_end, self.sp_par
        while k >= lo:
            if t < sp_end[k]:
                return self.sp_ctx[k]
            k = sp_par[k]
        return default


_KINETO_NOISE = (b"USDT:", b"STAGE:")


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Keep libkineto's own log lines (`USDT:... profiler_start`, printed by the C++ library
    straight to file descriptor 2 on every start and stop) off the program's stderr, and pass
    through anything else written meanwhile. Only the profiler's start and stop run inside, so
    no line of the program's is held back for long."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            keep = [ln for ln in tmp.read().splitlines(keepends=True) if not ln.startswith(_KINETO_NOISE)]
            if keep:
                os.write(2, b"".join(keep))


def _def_line(path: str, line: int) -> int:
    """`co_firstlineno` is the first decorator's line; users look for the `def` below it."""
    import linecache

    for k in range(line, line + 20):
        text = linecache.getline(path, k).lstrip()
        if not text:
            return line
        if text.startswith(("def ", "async def ")):
            return k
        if not text.startswith(("@", "#")) and not text[0].isspace():
            # a decorator's arguments continue on this line; keep looking
            continue
    return line


_CPU_TYPE: Any = None


def _CPU(torch: Any) -> Any:
    global _CPU_TYPE
    if _CPU_TYPE is None:
        _CPU_TYPE = torch._C._autograd.DeviceType.CPU
    return _CPU_TYPE


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    """Resident bytes now (Linux); 0 where unknown, which leaves the memory bound off."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_BYTES = re.compile(r'"bytes":\s*(\d+)')


def _copy_bytes(dev: list[Any], kinds: list[int], KE: Any) -> list[int]:
    """Bytes of each copy and memset (kernels: 0). `nbytes()` is not filled for device activities
    in every torch, while CUPTI's own metadata (`"bytes": N`, as in exported traces) is; only the
    copies and memsets are asked, which are few next to kernels."""
    out = [0] * len(dev)
    has_nbytes = hasattr(KE, "nbytes")
    has_meta = hasattr(KE, "metadata_json")
    for i, k in enumerate(kinds):
        if k == KERNEL:
            continue
        e = dev[i]
        v = 0
        if has_nbytes:
            try:
                v = int(e.nbytes())
            except (RuntimeError, TypeError, ValueError):
                v = 0
        if v <= 0 and has_meta:
            try:
                m = _BYTES.search(e.metadata_json())
            except (RuntimeError, TypeError, ValueError):
                m = None
            v = int(m.group(1)) if m else 0
        out[i] = max(v, 0)
    return out


def _rank_world(torch: Any) -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a broken process group must not lose the profile
        pass
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return (int(r) if r and r.isdigit() else None, int(w) if w and w.isdigit() else None)
