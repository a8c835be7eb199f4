"""A recording: the native collector switched on and off, steps, threads, backward calls, and
the snapshots that keep a crashed program's profile (docs/ARCHITECTURE.md).

`Recorder.start()` → the program runs → `Recorder.stop()` → `Profile`. Nothing is folded
inside the program: the collector aggregates as it goes, and a background thread writes the
tree so far into the profile file every few seconds, so a `kill -9` or a crash loses at most
the last interval.
"""

from __future__ import annotations

import _thread
import datetime as _dt
import itertools
import os
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from dlpt.collectors.record import native
from dlpt.collectors.record.pcsamples import ENV as PC_ENV
from dlpt.collectors.record.phases import P_STARTUP, P_STEADY, PhaseHooks
from dlpt.collectors.record.provenance import ProvenanceRecorder
from dlpt.collectors.record.rank_env import rank_info
from dlpt.collectors.record.trie_converter import TrieConverter
from dlpt.compiled.fused import attribute_compiled
from dlpt.errors import notice
from dlpt.header import Header
from dlpt.layout import OWN_ROOTS
from dlpt.phases import split_phases
from dlpt.profile import Profile
from dlpt.version import __version__

# The two host metrics by their names everywhere (report header, picker, README): host time
# (host_time, the sampler's wall time on each line) and host op time (cpu_time, inside ops).
NO_GPU_NOTICE = "no GPU seen; recording host time (host_time) and host op time (cpu_time) only"
SNAPSHOT_SECONDS = 5.0
# A snapshot is built in Python on a thread of its own, so it takes the GIL from a host-bound
# program while it runs: on gpt-fast `--compile` (H100, docs/BENCHMARKS.md) one built after the
# compile took 1.9-15 s of wall and the samples it overlapped ran at half speed. The wait after a
# snapshot is at least this many times its cost (the thread's CPU time), which keeps snapshots
# under 1/SNAPSHOT_DUTY (4%) of the program's time, whatever the profile's size.
SNAPSHOT_DUTY = 25.0

# The recorder of the running `dlpt record` / `dlpt.profile`, for `dlpt.step()`.
_ACTIVE: Recorder | None = None

def active() -> Recorder | None:
    return _ACTIVE


class Recorder:
    """Record a region of a program: `start()`, run it, `stop()` → `Profile`.

    `steps=(A, B)` records steps A..B-1 only (optimizer steps, or `dlpt.step()` calls once the
    program makes any): the collector is switched on at step A and fully off at step B.
    `snapshot_path`: where to write the profile so far every `snapshot_seconds`.
    `attribute`: place compiled code's kernels on their model lines in the final profile (off:
    the profile as recorded, and `self.provenance` to attribute it later).
    """

    def __init__(self, command: str = "", name: str = "", steps: tuple[int, int] | None = None,
                 quiet: bool = False, drop_files: tuple[str, ...] = (), snapshot_path: str | None = None,
                 snapshot_seconds: float = SNAPSHOT_SECONDS, attribute: bool = True) -> None:
        import torch

        self.torch = torch
        self.command = command
        self.steps = steps
        self.quiet = quiet
        self.cuda = bool(torch.cuda.is_available())
        # Built before the program runs: a first-use compile is not part of the program's time,
        # and a machine that cannot build it is told so before anything runs.
        self.mod = native.load(quiet)
        self.step_count = 0
        self.explicit_steps = False  # once dlpt.step() is called, optimizer steps stop counting
        self.done = False
        self.on = False
        self.device_error = ""
        self.post_seconds = 0.0
        self.snapshots = 0
        self.snapshot_pause_max = 0.0  # the longest snapshot build (wall: it shares the GIL with the program)
        self.snapshot_cpu = 0.0  # the snapshot thread's CPU seconds, builds and writes
        self.snapshot_wait_max = 0.0  # the longest wait between snapshots (SNAPSHOT_DUTY)
        self.snapshot_path = snapshot_path
        self.snapshot_seconds = snapshot_seconds
        self.started_at = time.time()
        self._thread_names: dict[int, str] = {}
        self._thread_keys = itertools.count(1)
        drop = {os.path.abspath(f) for f in drop_files}
        import runpy

        drop.add(os.path.splitext(os.path.abspath(runpy.__file__))[0])
        self.converter = TrieConverter(name or command or "record", frozenset(drop), OWN_ROOTS, os.getcwd(),
                                       self._thread_names)
        # Inductor's provenance of each generated kernel, so compiled code's kernels land on the
        # model lines they were generated from (on CPU, its C++ kernels become ops to see them).
        # With PC samples, also which FX nodes wrote each Triton kernel line (fx_lines.py).
        pcs = os.environ.get("DLPT_PC_SAMPLES", "0") not in ("", "0")
        self.provenance = ProvenanceRecorder(cwd=os.getcwd(), cpu_kernels=not self.cuda, fx_lines=pcs and self.cuda)
        self.attribute = attribute
        # Phases (collectors/record/phases.py): torch.compile's work is told apart as it happens,
        # and the first step ends the warm-up. DLPT_PHASES=0 records one tree, as before phases.
        self.phases = os.environ.get("DLPT_PHASES", "1") != "0"
        self.phase_hooks = PhaseHooks(self.mod) if self.phases else None
        self._steady = False
        self.loaders: dict[int, dict[str, Any]] = {}  # the DataLoaders the program iterated (_watch_loaders)
        self._hooks: list[Any] = []
        self._lock = threading.Lock()  # one snapshot or final build at a time
        self._stop_snap = threading.Event()
        self._snap_thread: int | None = None
        self.pid = os.getpid()  # the recording process's, set again at start

    # ----- lifecycle -----

    def in_forked_child(self) -> bool:
        """Whether this is a child the program forked while recording (a DataLoader worker, a
        fork pool's process): the collector is off there (collector.cpp, after_fork_in_child),
        and the recording, its threads and its profile are the parent's, so the child neither
        switches on, stops nor saves."""
        return os.getpid() != self.pid

    def start(self) -> None:
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            from dlpt.errors import DlptError

            raise DlptError("dlpt is already recording in this process")
        _ACTIVE = self
        self.pid = os.getpid()
        self.provenance.start()  # whatever --steps says: compiling happens before step A
        self._install_hooks()
        if not self.cuda and not self.quiet:
            notice(NO_GPU_NOTICE)
        if self.steps is None or self.steps[0] <= 0:
            self._switch_on()
        if self.snapshot_path is not None and self.snapshot_seconds > 0:
            # A bare thread: threading.Thread's start is wrapped to record the program's threads.
            self._snap_thread = _thread.start_new_thread(self._snapshot_loop, ())

    def stop(self) -> Profile:
        """End recording and build the profile."""
        global _ACTIVE
        try:
            self._stop_snap.set()
            self._switch_off()
        finally:
            self.provenance.stop()
            self._remove_hooks()
            if _ACTIVE is self:
                _ACTIVE = None
        with self._lock:
            t0 = time.perf_counter()
            prof = self._build(partial=False)
            if self.attribute and self.provenance:
                keep = os.environ.get("DLPT_RECORDED_OUT")
                if keep:
                    # Diagnostics for compiled code's attribution: the tree as recorded, with the
                    # provenance, so the pure transformation can be rerun and inspected anywhere.
                    from dlpt.store import save

                    save(replace(prof, meta=replace(prof.meta, provenance=self.provenance.to_dict())), keep, force=True)
                # The model's pure transformation, on the records as plain data.
                prof = attribute_compiled(prof, self.provenance.snapshot())
                prof.sources.update(self.converter.sources(prof))  # stack traces may name new files
            prof = self._split(prof)
            self.post_seconds = time.perf_counter() - t0
            prof.meta.post_processing_s = round(self.post_seconds, 6)
        return prof

    def step(self, explicit: bool = False) -> None:
        """One training step finished: switch the collector on at step A, off at step B."""
        if self.in_forked_child():
            return
        if explicit and not self.explicit_steps:
            self.explicit_steps = True
        elif not explicit and self.explicit_steps:
            return
        self.step_count += 1
        self.mod.memory_step(self.step_count)  # the step of the memory peak
        if self.on and self.phases and not self._steady:
            self.mod.set_phase(P_STEADY)  # the first step's end: the warm-up is over
            self._steady = True
        if self.done or self.steps is None:
            return
        a, b = self.steps
        if self.step_count >= b:
            self._switch_off()
            self.done = True
        elif self.step_count == a and not self.on:
            self._switch_on()

    def _switch_on(self) -> None:
        # Diagnostics for measuring the collector's parts (docs/BENCHMARKS.md): DLPT_FRAMES=gil
        # reads frames under the GIL; DLPT_DEVICE=0 leaves CUPTI off; DLPT_HOST=0 leaves the op
        # callback off (kernels then land on the Python line that launched them, no backward link).
        gil = os.environ.get("DLPT_FRAMES", "") == "gil"
        device = self.cuda and os.environ.get("DLPT_DEVICE", "1") != "0"
        host = os.environ.get("DLPT_HOST", "1") != "0"
        # DLPT_DIAG: noop (the op callback returns at once), nocallbacks, noactivities (CUPTI's halves);
        # the parts a CUDA-graph launch pays for (nocbids, nokinds, graphonly, nographcb), cbreturn, optime
        # (the op callback timed by part, said at stop), nowalk (no frame walk: every op at its thread's root): common.h.
        # DLPT_SAMPLE_US: the host sampler's period (host_time, GPU idle blame); 0 switches it off.
        try:
            sample_ns = int(float(os.environ.get("DLPT_SAMPLE_US", "1000")) * 1000)
        except ValueError:
            sample_ns = 1_000_000
        if self.cuda and self.step_count and self.torch.cuda.is_initialized():
            # A --steps window opens on an empty GPU queue: work launched before it would keep the
            # GPU busy unrecorded, and its first stretch would read as idle (start-up).
            try:
                self.torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a broken CUDA context: record what can be
                pass
        # start_time is the recording window's start in the wall clock (with --steps, the window's):
        # with the window's length it places the recording in time (dlpt/runs.py).
        self.started_at = time.time()
        # A --steps window opens at a step's end: it is steady state from its start.
        phase = -1 if not self.phases else P_STEADY if self.step_count else P_STARTUP
        self._steady = phase == P_STEADY
        self.device_error = self.mod.start(device, gil, host, os.environ.get("DLPT_DIAG", ""), sample_ns, phase)
        self.mod.memory_step(self.step_count)  # the peak's step counts from the program's steps
        self.on = True
        if self.device_error and not self.quiet:
            notice(f"no GPU activity will be recorded ({self.device_error}); recording host time and host op time only"
                   " — is another profiler (torch.profiler, Nsight) using CUPTI?")

    def _switch_off(self) -> None:
        if not self.on:
            return
        self.on = False
        if self.cuda:
            # The kernels launched so far must finish for CUPTI to hand over their records.
            try:
                self.torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - a broken CUDA context: keep what was recorded
                pass
        self.mod.stop()

    # ----- hooks into the program -----

    def _install_hooks(self) -> None:
        torch = self.torch
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hooks.append(register_optimizer_step_post_hook(lambda *a, **k: self.step()).remove)
        except ImportError:  # torch before 2.0
            pass
        mod, names, keys = self.mod, self._thread_names, self._thread_keys
        orig_start = threading.Thread.start

        def start(th: threading.Thread, *a: Any, **k: Any) -> Any:
            # The line that starts the thread heads its work; the thread's own frames follow.
            where = mod.context_here()
            key = next(keys)
            names[key] = th.name
            run = th.run

            def run_recorded() -> None:
                mod.register_thread(where, key)
                run()

            # setattr: this thread's run, wrapped to register it with the collector first.
            setattr(th, "run", run_recorded)  # noqa: B010
            return orig_start(th, *a, **k)

        if self.phase_hooks is not None:
            self.phase_hooks.install()
            self._hooks.append(self.phase_hooks.remove)
        self._watch_loaders()
        # setattr: Thread.start is replaced on purpose while recording (restored by the hook below).
        setattr(threading.Thread, "start", start)  # noqa: B010
        self._hooks.append(lambda: setattr(threading.Thread, "start", orig_start))

        # Around autograd's engine (backward() and autograd.grad()): backward ops whose forward op
        # is unknown go under this call (autograd's device threads have no Python frames of their
        # own), and with CUPTI on the call runs with RecordFunction off, its work placed through
        # autograd's current node (collectors/native/autograd.h says why) — unless torch.profiler
        # is running too, which needs RecordFunction for its own trace.
        ag = torch.autograd
        orig_run = getattr(ag, "_engine_run_backward", None)
        profiling = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", lambda: True)
        if orig_run is not None:
            def run_backward(*a: Any, **k: Any) -> Any:
                mod.backward_begin(not profiling())
                try:
                    return orig_run(*a, **k)
                finally:
                    mod.backward_end()

            ag._engine_run_backward = run_backward
            self._hooks.append(lambda: setattr(ag, "_engine_run_backward", orig_run))

    def _watch_loaders(self) -> None:
        """Each DataLoader the program iterates: its workers, pinning and prefetching, so that the
        diagnosis says what a loader that keeps the GPU waiting already does (dlpt/evidence.py)."""
        try:
            from torch.utils.data import DataLoader
        except ImportError:
            return
        orig = DataLoader.__dict__.get("__iter__")
        if orig is None:
            return
        seen = self.loaders

        def iter_watched(loader: Any) -> Any:
            key = id(loader)
            if key not in seen:
                seen[key] = {"num_workers": int(getattr(loader, "num_workers", 0) or 0),
                             "pin_memory": bool(getattr(loader, "pin_memory", False)),
                             "prefetch_factor": getattr(loader, "prefetch_factor", None),
                             "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
                             "batch_size": getattr(loader, "batch_size", None)}
            return orig(loader)

        setattr(DataLoader, "__iter__", iter_watched)  # noqa: B010 - restored by the hook below
        self._hooks.append(lambda: setattr(DataLoader, "__iter__", orig))

    def _remove_hooks(self) -> None:
        while self._hooks:
            self._hooks.pop()()

    # ----- the profile -----

    def _build(self, partial: bool) -> Profile:
        if self.on:
            self.mod.flush(not partial)
        host = native.HostSnapshot.decode(self.mod.host_snapshot())  # first: every node it names is then in the trie's snapshot
        memory = self.mod.memory_snapshot()  # likewise
        pc = self.mod.pc_samples() if os.environ.get(PC_ENV, "0") != "0" else None  # likewise
        snap = native.Snapshot.decode(self.mod.snapshot(len(self.converter.code_info), len(self.converter.names)))
        dump = os.environ.get("DLPT_HOST_DUMP")
        if dump and not partial:
            # Diagnostics for idle blame: the sampler's intervals and the GPU's busy intervals as
            # recorded, to rerun dlpt/idle.py on them anywhere.
            import numpy as np

            arrays: dict[str, Any] = {k: np.asarray(v) for k, v in host._asdict().items()}
            np.savez(dump, **arrays)
        meta = self._meta(partial)
        return self.converter.profile(snap, meta, host, memory, pc)

    @staticmethod
    def _split(prof: Profile) -> Profile:
        """The recorded tree's phase subtrees as one tree with its phase table (dlpt/phases.py)."""
        names = prof.meta.phase_names
        return split_phases(prof, names) if isinstance(names, dict) else prof

    def _snapshot_loop(self) -> None:
        from dlpt.store import save

        self.mod.ignore_this_thread()  # dlpt's own: no host time for the program from it
        wait = self.snapshot_seconds
        while not self._stop_snap.wait(wait):
            if not self._lock.acquire(blocking=False):
                continue
            try:
                if self._stop_snap.is_set():
                    return
                t0, c0 = time.perf_counter(), time.thread_time()
                prof = self._split(self._build(partial=True))
                self.snapshot_pause_max = max(self.snapshot_pause_max, time.perf_counter() - t0)
                assert self.snapshot_path is not None  # the snapshot thread runs only with one
                save(prof, self.snapshot_path, force=True)
                self.snapshots += 1
                cost = time.thread_time() - c0
                self.snapshot_cpu += cost
                wait = max(self.snapshot_seconds, SNAPSHOT_DUTY * cost)
                self.snapshot_wait_max = max(self.snapshot_wait_max, wait)
            except Exception as e:  # noqa: BLE001 - a failed snapshot must not end the program
                if not self.quiet:
                    notice(f"snapshot not written ({type(e).__name__}: {e})")
            finally:
                self._lock.release()

    def _meta(self, partial: bool) -> Header:
        torch = self.torch
        steps = list(self.steps) if self.steps else None
        meta = Header(
            source="record", dlpt_version=__version__, command=self.command,
            start_time=_dt.datetime.fromtimestamp(self.started_at, _dt.timezone.utc).isoformat(),
            host=socket.gethostname(), python_version=sys.version.split()[0],
            torch_version=torch.__version__, cuda_version=torch.version.cuda,
            steps=steps, steps_seen=self.step_count,
            gpu=self.cuda, collector={**self.mod.capabilities(), **self.mod.stats()},
            snapshots=self.snapshots, snapshot_pause_max_s=round(self.snapshot_pause_max, 6),
            snapshot_cpu_s=round(self.snapshot_cpu, 6), snapshot_wait_max_s=round(self.snapshot_wait_max, 3),
            # Recordings have always written these two keys, null when unknown (a CPU build's
            # CUDA, no --steps): kept so, the file's keys the same as before the typed header.
            extra={"cuda_version": None} if torch.version.cuda is None else {},
        )
        if steps is None:
            meta.extra["steps"] = None
        if self.loaders:
            meta.dataloaders = list(self.loaders.values())
        if partial:
            meta.partial = True
            meta.snapshot_time = _dt.datetime.now(_dt.timezone.utc).isoformat()
        if self.cuda:
            devs = []
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devs.append({"id": i, "name": p.name, "totalGlobalMem": p.total_memory,
                             "computeMajor": p.major, "computeMinor": p.minor,
                             "numSms": p.multi_processor_count})
            meta.devices = devs
        # rank, world_size, local_rank, host and run_id, in meta's keys (collectors/record/rank_env.py)
        return meta.updated(Header.from_dict(rank_info()))


def _after_fork_in_child() -> None:
    """In a child the program forked while recording: the recording is the parent's. Its hooks
    (threads, backward, DataLoaders, optimizer steps, torch.compile's phases) and the op callback
    are taken out, so the child's own work runs as it would without dlpt and reaches none of the
    collector's calls, and the child may start a recording of its own. Nothing here waits on a
    lock another thread may have held at the fork: the hooks are Python's, and torch's callback
    registry is changed only with the GIL held, as os.fork holds it."""
    global _ACTIVE
    rec = _ACTIVE
    if rec is None or not rec.in_forked_child():
        return
    _ACTIVE = None
    try:
        rec._remove_hooks()
        rec.mod.forget_callback()  # torch's RecordFunction machinery off for the child's ops
    except Exception:  # noqa: BLE001 - what cannot be undone here stays; the child records nothing anyway
        pass


os.register_at_fork(after_in_child=_after_fork_in_child)
