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

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, NamedTuple, Protocol, cast

import numpy as np

from dlpt.collectors.record.buildlock import build_lock, try_build_lock
from dlpt.errors import DlptError, notice
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
    def memory_step(self, step: int) -> None: ...
    def capabilities(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, Any]: ...
    def constants(self) -> dict[str, Any]: ...


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
        note = (f"the build that reads CPython's frames directly did not compile ({_build_error_line(errors[-1])}), "
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
    raise DlptError(_build_error(errors[-1]))


# ----- builds: one folder per set of build inputs, so environments never evict each other -----

BUILDS_DIR = "dlpt-collector"  # under torch's extensions folder (TORCH_EXTENSIONS_DIR if set)
PREFIX = "dlpt_collector"
MANIFEST = "dlpt-build.json"  # a finished build's inputs; its mtime is the build's last use
FAILED = "dlpt-build-failed.txt"  # a failed build's error, for `retry_failed=False`
FAILED_RETRY_S = 86400.0  # then it is tried again: it may have been a full disk, since emptied
KEEP_PER_ENVIRONMENT = 3  # builds of older sources kept per environment (a checkout switched back)
# What a build depends on besides `build_inputs`' fields: a change to how builds are made here
# is a new build for everyone.
SCHEME = "2"
_LABELS = {"scheme": "dlpt's build scheme", "sources": "the collector's sources", "torch": "torch's version",
           "torch_include": "torch's location", "torch_lib": "torch's location", "python": "Python",
           "python_include": "Python's headers", "compiler": "the C++ compiler", "cuda_home": "CUDA_HOME",
           "cflags": "the compiler flags (CUPTI headers, frame reading)", "ldflags": "the CUPTI library"}


@dataclass(frozen=True)
class Built:
    module: Any
    folder: str
    built: bool  # compiled by this call (False: an existing build, reused)
    reason: str  # why it was compiled ("" when reused)


def builds_root() -> str:
    from torch.utils import cpp_extension

    return os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root(), BUILDS_DIR)


def build_inputs(sources: Sequence[str], cflags: Sequence[str], ldflags: Sequence[str],
                 with_cuda: bool) -> dict[str, str]:
    """Everything the compiled module depends on, as torch's builder will use it: the sources'
    contents, torch's version and the folder its headers and libraries come from, the Python
    ABI and headers, the compiler, CUDA_HOME (CUDA builds) and the flags (CUPTI's headers and
    library, the frame-reading variant). Two environments with the same torch and Python
    still differ here (torch's folder), so each gets a build of its own."""
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    digest = hashlib.sha256()
    for p in sources:
        with open(p, "rb") as f:
            digest.update(os.path.basename(p).encode() + b"\0" + f.read() + b"\0")
    # What torch's builder takes as torch's folder (_TORCH_PATH): the path as imported, links kept.
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    cxx = os.environ.get("CXX", "c++")
    return {
        "scheme": SCHEME,
        "sources": digest.hexdigest(),
        "torch": f"{torch.__version__} cuda={torch.version.cuda} hip={getattr(torch.version, 'hip', None)}",
        "torch_include": os.path.join(torch_dir, "include"),
        "torch_lib": os.path.join(torch_dir, "lib"),
        "python": f"{sys.version} {sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')} "
                  f"{sysconfig.get_config_var('EXT_SUFFIX')}",
        "python_include": sysconfig.get_path("include", scheme="posix_prefix") or "",
        "compiler": shutil.which(cxx) or cxx,
        "cuda_home": (getattr(cpp_extension, "CUDA_HOME", None) or "") if with_cuda else "",
        "cflags": " ".join(cflags),
        "ldflags": " ".join(ldflags),
    }


def build_name(inputs: dict[str, str], prefix: str = PREFIX) -> str:
    """The module's name and its folder's: one per set of inputs. torch's builder rebuilds a
    module whose name it saw with other inputs; with the inputs in the name it never does."""
    return f"{prefix}_{hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]}"


def build(sources: Sequence[str], cflags: Sequence[str], ldflags: Sequence[str], *, with_cuda: bool = False,
          prefix: str = PREFIX, what: str = "the native collector", takes: str = "10–60 s", quiet: bool = False,
          retry_failed: bool = True, note: str = "") -> Built:
    """The module compiled from `sources` (the first is the translation unit, the others the
    files it includes by name), built in a folder of its own inputs' (`build_name`) or reused
    from there. A build is said on stderr, once, with what and why; with `retry_failed` False
    a build that failed with these inputs within a day raises at once instead of failing again.
    Raises what torch's builder raises when the build fails."""
    from torch.utils import cpp_extension

    inputs = build_inputs(sources, cflags, ldflags, with_cuda)
    name = build_name(inputs, prefix)
    root = builds_root()
    folder = os.path.join(root, name)
    so = os.path.join(folder, f"{name}.so")
    with build_lock(folder, notice, quiet=quiet) as lock:
        if os.path.exists(so):
            changed = _out_of_date(folder)
            if changed:
                why = f"files it was built from changed since ({changed})"
            else:
                try:
                    module = _import(name, so)
                except ImportError as e:
                    # A damaged build (a disk that filled while it was linked): ninja sees nothing
                    # to do, so its outputs go and it is built again, said like any build.
                    for p in [so, *glob.glob(os.path.join(folder, "*.o"))]:
                        with contextlib.suppress(OSError):
                            os.remove(p)
                    why = f"its build does not load ({str(e)[:200]})"
                else:
                    manifest = os.path.join(folder, MANIFEST)
                    try:
                        os.utime(manifest)  # its last use, for the clean-up
                    except OSError:  # built by a process that stopped before writing it
                        with contextlib.suppress(OSError):
                            _write_json(manifest, {"inputs": inputs, "built": os.path.getmtime(so)})
                    return Built(module, folder, False, "")
        else:
            failed = _failed(folder)
            if failed and not retry_failed:
                raise RuntimeError(failed)
            why = f"its last build failed ({failed}); trying again" if failed else _why_new(root, prefix, name, inputs)
        if note:
            why += f"; {note}"
        _check_tools(cpp_extension)  # a build already made needs neither
        desc = (f"{what} for torch {inputs['torch'].split()[0]} at {os.path.dirname(inputs['torch_include'])}, "
                f"Python {sys.version.split()[0]}")
        # Said whatever `quiet` asks: the recording sits still for tens of seconds meanwhile.
        notice(f"building {desc}: {why} ({takes}, once for these build inputs, in {folder})")
        lock.building(desc)
        src = _copy_sources(folder, sources)
        # torch's builder skips building a name it already built in this process (a retry after
        # a failure, or a file changed since): forget it here, so that what was said happens.
        with contextlib.suppress(AttributeError, TypeError):
            cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(name, None)
        try:
            module = cpp_extension.load(name=name, sources=[src], extra_cflags=list(cflags),
                                        extra_ldflags=list(ldflags), with_cuda=with_cuda, build_directory=folder,
                                        verbose=False)
        except Exception as e:
            with contextlib.suppress(OSError), open(os.path.join(folder, FAILED), "w") as f:
                f.write(_build_error_line(e) + "\n")
            raise
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, FAILED))
        _write_json(os.path.join(folder, MANIFEST), {"inputs": inputs, "built": time.time()})
    _clean_up(root, prefix, name, inputs)
    return Built(module, folder, True, why)


def _import(name: str, so: str) -> Any:
    """A finished build's module, loaded as torch's builder loads it (without running ninja,
    which a finished build does not need)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, so)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {so}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _out_of_date(folder: str) -> str:
    """Why ninja would rebuild a finished build ("" when it would not): a file it was built from
    (a torch or CUPTI header) was replaced in place, at the same path. A dry run, so that such
    a rebuild is said before it starts, like any other."""
    import subprocess

    ninja = shutil.which("ninja")
    if ninja is None or not os.path.exists(os.path.join(folder, "build.ninja")):
        return ""  # nothing to check with: the build is what there is
    try:
        r = subprocess.run([ninja, "-n", "-d", "explain", "-C", folder], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    if r.returncode != 0 or "no work to do" in r.stdout:
        return ""
    lines = [ln.removeprefix("ninja explain: ") for ln in r.stderr.splitlines() if ln.startswith("ninja explain:")]
    why = lines[0] if lines else "ninja has work to do"
    newer = re.match(r"output \S+ older than most recent input (.+?)(?: \(\d+ vs \d+\))?$", why)
    return (f"{newer.group(1)} is newer than the build" if newer else why)[:300]


def _failed(folder: str) -> str:
    """The error of the last build in `folder` if it failed within FAILED_RETRY_S, else ""."""
    path = os.path.join(folder, FAILED)
    try:
        if time.time() - os.path.getmtime(path) > FAILED_RETRY_S:
            return ""
        with open(path) as f:
            return f.read().strip() or "failed"
    except OSError:
        return ""


def _copy_sources(folder: str, sources: Sequence[str]) -> str:
    """The sources copied into the build's folder; the copy of the first, to compile. The
    folder's name covers their contents, so a copy never changes: neither where dlpt is
    installed nor a checkout touching the files' times rebuilds anything."""
    out = os.path.join(folder, "src")
    os.makedirs(out, exist_ok=True)
    for p in sources:
        with open(p, "rb") as f:
            data = f.read()
        dest = os.path.join(out, os.path.basename(p))
        try:
            with open(dest, "rb") as f:
                if f.read() == data:
                    continue  # as it was: its time stays, so ninja sees nothing new
        except OSError:
            pass
        tmp = f"{dest}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    return os.path.join(out, os.path.basename(sources[0]))


def _write_json(path: str, value: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _manifests(root: str, prefix: str, name: str) -> list[tuple[str, float, dict[str, str]]]:
    """The other finished builds under `root`: (folder, last use, inputs)."""
    out = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for d in names:
        if d == name or not d.startswith(prefix + "_"):
            continue
        path = os.path.join(root, d, MANIFEST)
        try:
            with open(path) as f:
                inputs = json.load(f)["inputs"]
            used = os.path.getmtime(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(inputs, dict):
            out.append((os.path.join(root, d), used, inputs))
    return out


def _why_new(root: str, prefix: str, name: str, inputs: dict[str, str]) -> str:
    """Why there is no build for `inputs` yet, from the nearest other build: none at all (first
    use), the same environment with other sources, or another environment (and how it differs)."""
    nearest: tuple[int, float, list[str]] | None = None
    for _, used, other in _manifests(root, prefix, name):
        diff = [k for k in inputs if other.get(k) != inputs[k]]
        if nearest is None or (len(diff), -used) < (len(nearest[2]), -nearest[1]):
            nearest = (len(diff), used, diff)
    if nearest is None:
        return "first use"
    diff = nearest[2]
    if diff == ["sources"]:
        return "its sources changed"
    labels = list(dict.fromkeys(_LABELS.get(k, k) for k in diff if k != "sources"))
    return (f"a new environment: {', '.join(labels)} differ{'s' if len(labels) == 1 else ''} from the nearest "
            f"other build's{' (and its sources too)' if 'sources' in diff else ''}")


def _clean_up(root: str, prefix: str, name: str, inputs: dict[str, str]) -> None:
    """After a build: the environment's KEEP_PER_ENVIRONMENT most recently used builds stay
    (older sources go), builds of other environments stay (that is the point of a folder per
    environment) unless their torch folder is gone (a removed virtual environment). A build
    in use (its lock held) is never removed."""
    env = {k: v for k, v in inputs.items() if k != "sources"}
    same: list[tuple[float, str]] = []
    for folder, used, other in _manifests(root, prefix, name):
        if not os.path.isdir(other.get("torch_include", "")):
            _remove(folder)
        elif all(other.get(k) == v for k, v in env.items()):
            same.append((used, folder))
    for _, folder in sorted(same, reverse=True)[KEEP_PER_ENVIRONMENT - 1:]:
        _remove(folder)


def _remove(folder: str) -> None:
    with try_build_lock(folder) as held:
        if held:
            shutil.rmtree(folder, ignore_errors=True)


def _check_tools(cpp_extension: Any) -> None:
    """What the build needs, said before anything is built (torch's builder would print a page)."""
    cxx = os.environ.get("CXX", "c++")
    if not shutil.which(cxx):  # the compiler torch's builder calls
        raise DlptError(f"recording needs a C++ compiler to build its collector ({cxx} not found): install one "
                        "(Debian/Ubuntu: apt-get install g++; conda: conda install gxx_linux-64)")
    if not cpp_extension.is_ninja_available():
        raise DlptError("recording needs ninja to build its collector: pip install ninja (or dlpt[record])")


def _build_error_line(e: BaseException) -> str:
    """The compiler's error line out of torch's builder's page of output."""
    lines = [ln.strip() for ln in str(e).splitlines()]
    why = next((ln for ln in lines if "error" in ln.lower() and "Error building" not in ln), lines[0] if lines else "")
    return why[-200:] or type(e).__name__


def _build_error(e: BaseException) -> str:
    return f"could not build the native collector ({_build_error_line(e)}); please report this"


def cupti() -> Cupti | None:
    """The CUPTI the loaded collector links (None: a CPU build)."""
    return _loaded.get("cupti")
