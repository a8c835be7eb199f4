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

import collections
import datetime as _dt
import itertools
import os
import socket
import sys
import threading
import time
import warnings
from typing import Any

from dlpt.cct import TreeBuilder
from dlpt.collectors.kineto import finish
from dlpt.collectors.kineto.link import BACKWARD_FRAME, BACKWARD_PREFIX, NO_LAUNCH, LinkResult, unattributed_frame
from dlpt.frames import Frame, FrameTable, is_library_file
from dlpt.metrics import KERNEL, MEMSET, copy_kind
from dlpt.profile import Profile
from dlpt.version import __version__

THREAD_MARK = "dlpt::thread#"
NO_GPU_NOTICE = "dlpt: no GPU seen; recording host op time (cpu_time) only"
MAX_SOURCE_BYTES = 4 << 20  # a generated or data file this large is not code a user reads
_DEVICE_KINDS = {"kernel": KERNEL, "gpu_memcpy": -1, "gpu_memset": MEMSET}
_LEAF_KIND = {KERNEL: "kernel", MEMSET: "memset"}

# The recorder of the running `dlpt record` / `dlpt.profile`, for `dlpt.step()`.
_ACTIVE: Recorder | None = None


def active() -> Recorder | None:
    return _ACTIVE


class Recorder:
    """Record a region of a program: `start()`, run it, `stop()` → `Profile`.

    `steps=(A, B)` records steps A..B-1 only (steps counted by optimizer steps or `dlpt.step()`);
    `window` restarts the profiler every that many steps, folding each window into the tree.
    """

    def __init__(self, command: str = "", name: str = "", steps: tuple[int, int] | None = None,
                 window: int | None = 20, quiet: bool = False, drop_files: tuple[str, ...] = ()) -> None:
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
        self.link_stats: collections.Counter[str] = collections.Counter()
        self.done = False
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
        self._drop = frozenset(os.path.abspath(f) for f in drop_files)
        self.started_at = time.time()

    # ----- lifecycle -----

    def start(self) -> None:
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            raise RuntimeError("dlpt is already recording in this process")
        _ACTIVE = self
        self._remember_paths()
        self._install_hooks()
        if not self.cuda and not self.quiet:
            print(NO_GPU_NOTICE, file=sys.stderr)
        if self.steps is None or self.steps[0] <= 0:
            self._begin()

    def stop(self) -> Profile:
        """End recording (idempotent on the hooks) and build the profile."""
        global _ACTIVE
        try:
            if self._prof is not None:
                self._end()
        finally:
            self._remove_hooks()
            if _ACTIVE is self:
                _ACTIVE = None
        return self._finish()

    def step(self, explicit: bool = False) -> None:
        """One training step finished: start, restart or end the profiler at step boundaries."""
        if explicit and not self.explicit_steps:
            self.explicit_steps = True
        elif not explicit and self.explicit_steps:
            return
        self.step_count += 1
        s = self.step_count
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
        if self._prof is not None and self.window and s - self._window_start >= self.window:
            self._end()
            self._begin()

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
            prof.start()
        self._prof = prof
        self._window_start = self.step_count
        self.windows += 1

    def _end(self) -> None:
        prof, self._prof = self._prof, None
        prof.stop()
        t0 = time.perf_counter()
        try:
            self._ingest(prof.profiler.kineto_results)
        finally:
            # Drop the window's events before the next one starts: memory stays bounded.
            prof.profiler.kineto_results = None
            self.post_seconds += time.perf_counter() - t0

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

    def _py(self, file: str, line: int, func: str) -> int:
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

    def _def(self, file: str, line: int, func: str) -> int:
        """A function at its `def` line: for ops that the profiler gives no line for."""
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
        from torch._C._profiler import _EventType

        T_OP, T_CALL, T_CCALL, T_KINETO = _EventType.TorchOp, _EventType.PyCall, _EventType.PyCCall, _EventType.Kineto
        b = self.builder
        child = b.child
        frames = self.frames
        out = self.out
        op_frames: dict[str, int] = {}
        op_node: dict[int, int] = {}  # op correlation id → node
        rt_node: dict[int, int] = {}  # runtime call correlation id → context node
        # Python calls made inside an op (a custom Function's forward, an optimizer step):
        # op node → [(start, end, context)], for runtime calls that torch files under the op.
        inner: dict[int, list[tuple[int, int, int]]] = {}
        rt_start: dict[int, int] = {}
        fwd: dict[tuple[int, int], int] = {}  # (thread, sequence number) → forward op node
        fwd_tids: dict[int, set[int]] = {}
        backward: list[tuple[Any, int, int, int]] = []
        bwd_frame = frames.intern(BACKWARD_FRAME)
        cpu_node, cpu_self = out.cpu_node, out.cpu_self

        roots = sorted(kr.experimental_event_tree(), key=lambda n: n.start_time_ns)
        py_tids = {r.start_tid for r in roots if r.tag == T_CALL}

        def walk(root: Any, ctx: int, tid: int, op_row: int = -1, placed: bool = False) -> None:
            """Fold one subtree into the tree beneath `ctx`. `placed`: the root is a backward op
            whose context is already decided."""
            # (node, context, def-frame source or None, index of the enclosing op's cpu row)
            stack: list[tuple[Any, int, Any, int]] = [(root, ctx, None, op_row)]
            first = root if placed else None
            pop, push = stack.pop, stack.append
            while stack:
                n, ctx, defsrc, op_row = pop()
                tag = n.tag
                if tag == T_OP:
                    name = _name(n)
                    ef = n.extra_fields
                    if defsrc is not None:
                        cs = defsrc.callsite
                        ctx = child(ctx, self._def(cs.file_name, cs.line_number, cs.function_name))
                    seq = ef.sequence_number
                    if seq >= 0 and n is not first and name.startswith(BACKWARD_PREFIX):
                        # Placed once the forward ops of every thread are known.
                        backward.append((n, ctx, tid, op_row))
                        continue
                    f = op_frames.get(name)
                    if f is None:
                        f = op_frames[name] = frames.intern(Frame("op", name))
                    node = child(ctx, f)
                    if seq >= 0:
                        # The last op to carry a sequence number is the one that made the node.
                        fwd[(tid, seq)] = node
                        fwd_tids.setdefault(seq, set()).add(tid)
                    op_node[n.correlation_id] = node
                    dur = n.duration_time_ns
                    if op_row >= 0:
                        cpu_self[op_row] -= dur
                    row = len(cpu_node)
                    cpu_node.append(node)
                    cpu_self.append(dur)
                    for c in reversed(n.children):
                        push((c, node, None, row))
                elif tag == T_CALL:
                    ef = n.extra_fields
                    if n.parent is not None:
                        c = ef.caller
                        f = self._py(c.file_name, c.line_number, c.function_name)
                        if f >= 0:
                            ctx = child(ctx, f)
                    if op_row >= 0:
                        inner.setdefault(cpu_node[op_row], []).append((n.start_time_ns, n.end_time_ns, ctx))
                    name = _name(n)
                    if name.startswith("nn.Module: "):
                        f = op_frames.get(name)
                        if f is None:
                            f = op_frames[name] = frames.intern(Frame("module", name[len("nn.Module: "):]))
                        ctx = child(ctx, f)
                        src = None
                    else:
                        src = ef
                    for c in reversed(n.children):
                        push((c, ctx, src, op_row))
                elif tag == T_CCALL:
                    c = n.extra_fields.caller
                    f = self._py(c.file_name, c.line_number, c.function_name)
                    if f >= 0:
                        ctx = child(ctx, f)
                    if op_row >= 0:
                        inner.setdefault(cpu_node[op_row], []).append((n.start_time_ns, n.end_time_ns, ctx))
                    for c in reversed(n.children):
                        push((c, ctx, None, op_row))
                else:
                    if tag == T_KINETO and n is not root:
                        # Only runtime calls nested in a context: a bare one says nothing.
                        corr = n.correlation_id
                        if corr not in rt_node:
                            rt_node[corr] = ctx
                            if ctx in inner:
                                rt_start[corr] = n.start_time_ns
                    for c in reversed(n.children):
                        push((c, ctx, defsrc, op_row))

        for r in roots:
            tid = r.start_tid
            if r.tag == T_OP and _name(r).startswith(THREAD_MARK):
                try:
                    key = int(_name(r)[len(THREAD_MARK):])
                except ValueError:
                    key = -1
                if key in self._threads:
                    base = self._tid_base[tid] = self._thread_base(key)
                    for c in reversed(r.children):
                        walk(c, base, tid)
                    continue
            if tid in py_tids:
                base = 0
            else:
                base = self._tid_base.get(tid, -1)
                if base < 0:
                    # A thread not started while recording (autograd's device threads, a
                    # thread from before): its work is still counted, under its thread node.
                    base = self._tid_base[tid] = child(0, frames.intern(Frame("thread", f"[thread {tid}]")))
            walk(r, base, tid)

        # Backward ops under the forward op that made their autograd node.
        fwd_tid_of: dict[int, int] | None = None
        for n, ctx, tid, op_row in backward:
            seq = n.extra_fields.sequence_number
            tids = fwd_tids.get(seq, ())
            fnode = -1
            if len(tids) == 1:
                fnode = fwd[(next(iter(tids)), seq)]
            elif tids:
                if fwd_tid_of is None:
                    # Several threads ran forward ops with this number: ask which one.
                    fwd_tid_of = {e.correlation_id(): e.fwd_thread_id() for e in kr.events()
                                  if e.sequence_nr() >= 0 and e.name().startswith(BACKWARD_PREFIX)}
                fnode = fwd.get((fwd_tid_of.get(n.correlation_id, -1), seq), -1)
            if fnode >= 0:
                ctx = child(fnode, bwd_frame)
            else:
                self.unlinked_backward += 1
            walk(n, ctx, tid, op_row, placed=True)

        # Device activities.
        no_launch = -1
        stats = self.link_stats
        leaf_cache: dict[tuple[int, str], int] = {}
        events = kr.events()
        has_type = bool(events) and hasattr(events[0], "activity_type")
        has_annot = bool(events) and hasattr(events[0], "is_user_annotation")
        for e in events:
            if e.device_type() == _CPU(self.torch):
                continue
            name = e.name()
            if has_type:
                at = e.activity_type()
                k = _DEVICE_KINDS.get(at)
            else:
                # torch before 2.12 has no activity_type(): the kind is in the name.
                at = "user_annotation" if has_annot and e.is_user_annotation() else ""
                k = None if at else (-1 if name.startswith("Memcpy") else MEMSET if name.startswith("Memset")
                                     else KERNEL)
            if k is None:
                stats["skipped:" + str(at)] += 1
                continue  # gpu_user_annotation and the like are not GPU time
            if k < 0:
                k = copy_kind(name)
            # The runtime call's own place in the tree is the most specific context (a kernel
            # launched by Python code inside an op, e.g. a custom Function's forward, lands on
            # that line); the launching op comes next; graph replays and Triton launches have
            # only the runtime call.
            corr = e.correlation_id()
            node = rt_node.get(corr, -1)
            if node >= 0:
                stats["runtime"] += 1
                t = rt_start.get(corr)
                if t is not None:
                    node = _innermost(inner[node], t, node)
            else:
                node = op_node.get(e.linked_correlation_id(), -1)
                if node >= 0:
                    stats["op"] += 1
            if node < 0:
                stats["unlinked"] += 1
                if no_launch < 0:
                    no_launch = child(0, frames.intern(unattributed_frame(NO_LAUNCH)))
                node = no_launch
            lk = (k, name)
            lf = leaf_cache.get(lk)
            if lf is None:
                lf = leaf_cache[lk] = frames.intern(Frame(_LEAF_KIND.get(k, "memcpy"), name))
            out.node.append(child(node, lf))
            out.kind.append(k)
            out.name.append(lf)
            out.device.append(int(e.device_index()))
            out.stream.append(int(e.device_resource_id()))
            out.start.append(int(e.start_ns()))
            out.duration.append(int(e.duration_ns()))
            out.nbytes.append(_nbytes(e))

    # ----- the profile -----

    def _finish(self) -> Profile:
        t0 = time.perf_counter()
        self.out.cpu_self[:] = [max(v, 0) for v in self.out.cpu_self]
        prof = finish(self.builder, self.frames, self.out, {})
        prof.sources.update(self._sources(prof))
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
            "windows": self.windows, "post_processing_s": round(self.post_seconds, 6),
            "unlinked_backward_ops": self.unlinked_backward, "gpu": self.cuda,
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


def _innermost(spans: list[tuple[int, int, int]], t: int, default: int) -> int:
    """The context of the innermost span containing time t (spans are in start order, nested
    or disjoint), else `default`. Looks back a bounded way: spans are many only in long ops."""
    import bisect

    k = bisect.bisect_right(spans, (t, 1 << 62, 1 << 62)) - 1
    for j in range(k, max(k - 256, -1), -1):
        s, e, ctx = spans[j]
        if s <= t < e:
            return ctx
    return default


def _name(n: Any) -> str:
    try:
        return n.name
    except UnicodeDecodeError:
        # Seen in torch 2.13: a node whose name is not valid UTF-8. Its work still counts.
        return "<undecodable name>"


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


def _nbytes(e: Any) -> int:
    try:
        v = int(e.nbytes())
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return 0
    return max(v, 0)


def _rank_world(torch: Any) -> tuple[int | None, int | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a broken process group must not lose the profile
        pass
    r, w = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return (int(r) if r and r.isdigit() else None, int(w) if w and w.isdigit() else None)
