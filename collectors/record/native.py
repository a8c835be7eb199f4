"""Building and loading the collector's native part, `collectors/native/collector.cpp`.

It is compiled against the running torch with `torch.utils.cpp_extension.load` on first use and
kept in torch's extensions folder, in a folder of its own per set of build inputs (`build`: the
sources, torch's version and folder, Python, the compiler, CUPTI, the flags), so that two
environments never rebuild over each other's build (the way Proton ships a small C++ core
behind a thin Python API). With a CUDA torch it links the CUPTI library torch itself uses and
records device activity; with a CPU-only torch it builds without CUPTI and records host op time
(`cpu_time`).

Python 3.11 and 3.12 read frames through CPython's internal frame struct without taking the
GIL (collector.cpp says why that is safe); other versions, or a build where those headers do
not compile, use the public frame API under the GIL.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass
from types import CodeType
from typing import Any, NamedTuple, Protocol, cast

import numpy as np

from dlpt.collectors.record.builds import build, build_error, build_error_line
from dlpt.errors import DlptError
from dlpt.metrics import DTOD, DTOH, HTOD, KERNEL, MEMCPY_OTHER, MEMSET

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "native", "collector.cpp")

# ----- the boundary: what the extension hands over, with names -----

# Node kinds of the collector's trie (trie.h); `load` checks them against the extension's.
N_ROOT, N_PY, N_OP, N_BACKWARD, N_THREAD, N_TID, N_UNATTR, N_PHASE = range(8)
NODE_KINDS = {"root": N_ROOT, "python": N_PY, "op": N_OP, "backward": N_BACKWARD, "thread": N_THREAD,
              "tid": N_TID, "unattributed": N_UNATTR, "phase": N_PHASE}
# The collector's raw phases (trie.h): the contexts of each hang from a node of its own.
# collectors/record/phases.py names them (warm-up is start-up or steady, whether steps came).
P_STARTUP, P_WARMUP, P_STEADY, P_COMPILE = range(4)
RAW_PHASES = {"start-up": P_STARTUP, "warm-up": P_WARMUP, "steady": P_STEADY, "compile": P_COMPILE}
# Activity kinds: the extension numbers them as dlpt.metrics does.
ACTIVITY_KINDS = {"kernel": KERNEL, "htod": HTOD, "dtoh": DTOH, "dtod": DTOD, "memcpy_other": MEMCPY_OTHER,
                  "memset": MEMSET}


class Leaf(NamedTuple):
    """The columns of one leaf row: a (node, activity name) aggregate of device activity."""

    node: int
    kind: int
    name: int  # index into the names the snapshots handed over
    activities: int  # how many the row aggregates
    total: int  # ns
    min: int
    max: int
    bytes: int
    device: int
    stream: int


LEAF_COLUMNS = len(Leaf._fields)


class Snapshot(NamedTuple):
    """`snapshot()`'s tuple with names: the trie's node columns (all nodes so far), the leaf rows
    (one row per `Leaf`, all so far), and the code objects and names from the indices asked for.

    The extension's tuple keeps this order; a new trailing item is one more field here."""

    parent: np.ndarray
    kind: np.ndarray
    a: np.ndarray  # python: code index; op/unattributed: name index; thread: key or thread id
    b: np.ndarray  # python: line
    cpu: np.ndarray  # exclusive host op time, ns
    leaves: np.ndarray  # (rows, LEAF_COLUMNS)
    codes: list[CodeType]
    names: list[str]

    @classmethod
    def decode(cls, raw: tuple[Any, ...]) -> Snapshot:
        """The one place the positional tuple is read: int64 columns from bytes, leaves as rows."""
        items = [np.frombuffer(x, dtype=np.int64) if isinstance(x, bytes) else x for x in raw[:len(cls._fields)]]
        snap = cls._make(items)
        return snap._replace(leaves=snap.leaves.reshape(-1, LEAF_COLUMNS))


# How the host sampler read the recording's main thread (HostSnapshot.main_read), as the
# profile's meta names it: without the GIL (host.h, peek.h), through either system call, or with it.
MAIN_READ = {0: "process_vm_readv", 1: "/proc/self/mem", -1: "gil"}


class HostSnapshot(NamedTuple):
    """`host_snapshot()`'s dict with names (collectors/native/host.h): host time and sync time per
    trie node, the sampler's run-length host intervals (steady clock), the GPU's merged busy
    intervals per device (CUPTI's clock), the recording window, the clocks' offsets, the threads
    that launched GPU work, collective calls, and the sampler's own figures."""

    host_node: np.ndarray
    host_ns: np.ndarray
    sync_node: np.ndarray
    sync_ns: np.ndarray
    iv_start: np.ndarray
    iv_end: np.ndarray
    iv_node: np.ndarray
    iv_tid: np.ndarray
    iv_sync: np.ndarray
    busy_device: np.ndarray
    busy_start: np.ndarray
    busy_end: np.ndarray
    ready_device: np.ndarray  # the GPU with work queued (a launch to its start), merged per device
    ready_start: np.ndarray
    ready_end: np.ndarray
    launch_tids: np.ndarray
    phase_t: np.ndarray  # each phase change (steady clock) ...
    phase_id: np.ndarray  # ... and the raw phase it started (P_STARTUP, ...)
    coll_node: np.ndarray
    coll_start: np.ndarray
    coll_end: np.ndarray
    coll_dropped: int
    collk_node: np.ndarray  # collective (NCCL) kernels: the launch's node, start and end (steady clock)
    collk_start: np.ndarray
    collk_end: np.ndarray
    collk_dropped: int
    window_start: int
    window_end: int  # 0 while recording
    now: int
    cupti_offset: int  # CUPTI's clock minus the steady clock
    realtime_offset: int  # the wall clock minus the steady clock
    samples: int  # the sampler's reads of the program's threads with the GIL
    sample_waits: int  # the sampler's wakes more than half a period after they were due (busy cores)
    peek_samples: int  # the main thread's samples read without the GIL (host.h, peek.h)
    sample_skips: int  # the main thread's ticks skipped: its frames changed under every read
    main_read: int  # how the main thread was read: 0 process_vm_readv, 1 /proc/self/mem, -1 with the GIL
    sample_period_ns: int

    @classmethod
    def decode(cls, raw: dict[str, Any]) -> HostSnapshot:
        """The one place the dict is read: int64 columns from bytes, numbers as ints."""
        values: dict[str, Any] = {f: np.frombuffer(raw[f], dtype=np.int64) if isinstance(raw[f], bytes)
                                  else int(raw[f]) for f in cls._fields}
        return cls(**values)


class Collector(Protocol):
    """The extension module's functions (collector.cpp's PYBIND11_MODULE)."""

    def start(self, device: bool, gil_frames: bool = False, host: bool = True, diag: str = "",
              sample_ns: int = 1000000, phase: int = -1) -> str: ...
    def set_phase(self, phase: int) -> None: ...
    def compile_phase(self, delta: int) -> None: ...
    def stop(self) -> None: ...
    def flush(self, forced: bool = True) -> None: ...
    def snapshot(self, codes_from: int = 0, names_from: int = 0) -> tuple[Any, ...]: ...
    def host_snapshot(self) -> dict[str, Any]: ...
    def ignore_this_thread(self) -> None: ...
    def context_here(self) -> int: ...
    def register_thread(self, where: int, key: int) -> None: ...
    def backward_begin(self, allow_off: bool) -> None: ...
    def backward_end(self) -> None: ...
    def memory_snapshot(self) -> dict[str, Any]: ...
    def pc_samples(self) -> dict[str, Any]: ...
    def memory_step(self, step: int) -> None: ...
    def capabilities(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, Any]: ...
    def constants(self) -> dict[str, Any]: ...
    def forget_callback(self) -> None: ...  # in a forked child (session.py)
    def hold_locks(self, seconds: float) -> None: ...  # tests only
    def has_global_callbacks(self) -> bool: ...  # tests only


def check_constants(mod: Collector) -> None:
    """The numbers both sides decode with must agree: a mismatch would misplace every row."""
    c = mod.constants()
    ours = {"node_kinds": NODE_KINDS, "activity_kinds": ACTIVITY_KINDS, "leaf_columns": LEAF_COLUMNS,
            "phases": RAW_PHASES}
    for key, want in ours.items():
        got = dict(c[key]) if isinstance(want, dict) else c[key]
        if got != want:
            raise DlptError(f"the native collector's {key} {got} differ from dlpt's {want}; please report this")


_loaded: dict[str, Any] = {}


@dataclass(frozen=True)
class Cupti:
    include: str
    library: str  # the shared library's full path


def _loaded_cupti() -> str | None:
    """The libcupti this process already mapped (torch's own, through Kineto), if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if "/libcupti.so" in path and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def find_cupti() -> Cupti | None:
    """CUPTI's headers and library: the library torch loaded if any (two CUPTI libraries in
    one process would fight over the callbacks), else NVIDIA's CUPTI wheel, else the toolkit."""
    roots: list[str] = []
    lib = _loaded_cupti()
    if lib:
        roots.append(os.path.dirname(os.path.dirname(lib)))
    for p in sys.path:
        roots += glob.glob(os.path.join(p, "nvidia", "cu*")) + glob.glob(os.path.join(p, "nvidia", "cuda_cupti"))
    for env in ("CUPTI_HOME", "CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            roots += [os.path.join(os.environ[env], "extras", "CUPTI"), os.environ[env]]
    roots += ["/usr/local/cuda/extras/CUPTI", "/usr/local/cuda"]
    for root in roots:
        inc = os.path.join(root, "include")
        if not os.path.isfile(os.path.join(inc, "cupti.h")):
            continue
        found = lib if lib and os.path.dirname(os.path.dirname(lib)) == root else None
        if found is None:
            libs = sorted(glob.glob(os.path.join(root, "lib*", "libcupti.so*")))
            found = libs[0] if libs else None
        if found:
            return Cupti(inc, found)
    return None


def _record_types(include: str) -> list[str]:
    """The newest activity record structs the headers declare (the library of the same CUDA
    fills those), as -D flags for collector.cpp."""
    with open(os.path.join(include, "cupti_activity.h"), errors="replace") as f:
        text = f.read()
    out = []
    for macro, base in (("DLPT_KERNEL_T", "CUpti_ActivityKernel"), ("DLPT_MEMCPY_T", "CUpti_ActivityMemcpy"),
                        ("DLPT_MEMCPY2_T", "CUpti_ActivityMemcpyPtoP"), ("DLPT_MEMSET_T", "CUpti_ActivityMemset")):
        versions = [int(v) for v in re.findall(rf"}}\s*{base}(\d+)\s*;", text)]
        if not versions:
            raise DlptError(f"CUPTI headers in {include} declare no {base} record")
        out.append(f"-D{macro}={base}{max(versions)}")
    # Graph-level records (CUDA 11.7+): sampled graph replays (device.h) need them.
    versions = [int(v or 0) for v in re.findall(r"}\s*CUpti_ActivityGraphTrace(\d*)\s*;", text)]
    if versions:
        out.append(f"-DDLPT_GRAPH_T=CUpti_ActivityGraphTrace{max(versions) or ''}")
    return out


def _internal_frames() -> bool:
    return (3, 11) <= sys.version_info[:2] <= (3, 12) and os.environ.get("DLPT_FRAMES", "") != "public"


def load(quiet: bool = False) -> Collector:
    """The built collector module (built once per environment and kept; later calls are free).

    Raises DlptError with what to install when it cannot be built: recording needs it."""
    if "mod" in _loaded:
        return cast(Collector, _loaded["mod"])
    import torch

    # The collector is one translation unit: collector.cpp and the headers it includes.
    sources = [SOURCE] + sorted(p for p in glob.glob(os.path.join(os.path.dirname(SOURCE), "*.[ch]*"))
                                if p != SOURCE)
    cflags = ["-O2"]
    ldflags: list[str] = []
    cupti = find_cupti() if torch.version.cuda else None
    if cupti is not None:
        cflags += ["-DDLPT_CUPTI", f"-I{cupti.include}", *_record_types(cupti.include)]
        ldflags += [cupti.library, f"-Wl,-rpath,{os.path.dirname(cupti.library)}"]
    variants = [["-DDLPT_INTERNAL_FRAMES"], []] if _internal_frames() else [[]]
    errors: list[BaseException] = []
    for i, extra in enumerate(variants):
        last = i == len(variants) - 1
        note = (f"the build that reads CPython's frames directly did not compile ({build_error_line(errors[-1])}), "
                "so this one uses the public frame API") if errors else ""
        try:
            # with_cuda: cupti.h includes the CUDA driver API's header, which CUDA_HOME has.
            # retry_failed: a variant that failed with these very inputs is not compiled again at
            # every recording (tens of seconds each); the last one is, so its error is today's.
            built = build(sources, cflags + extra, ldflags, with_cuda=cupti is not None, quiet=quiet,
                          retry_failed=last, note=note,
                          what="the native collector " + (f"(CUPTI {cupti.library})" if cupti else "(CPU only)"))
        except DlptError:
            raise
        except Exception as e:  # noqa: BLE001 - the next variant, then one line saying why
            errors.append(e)
            continue
        mod = cast(Collector, built.module)
        check_constants(mod)
        _loaded["mod"] = mod
        _loaded["cupti"] = cupti
        return mod
    raise DlptError(build_error(errors[-1]))


def cupti() -> Cupti | None:
    """The CUPTI the loaded collector links (None: a CPU build)."""
    return _loaded.get("cupti")
