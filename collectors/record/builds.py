"""Builds of the collector's native part (collectors/record/native.py loads it): one folder per
set of build inputs — the sources, torch's version and folder, Python, the compiler, CUDA_HOME,
CUPTI, the flags — under torch's extensions folder, so that two environments with the same
torch never rebuild over each other's build; every build said once with why; the build lock
(buildlock.py) names whom a wait waits for; old builds cleaned per environment."""

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
from typing import Any

from dlpt.collectors.record.buildlock import build_lock, try_build_lock
from dlpt.errors import DlptError, notice

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


# Finding a finished build must not import torch.utils.cpp_extension: that import (setuptools
# with it) took 0.15-0.18 s of every `dlpt record` and of every rank's start on this machine,
# more than loading the build itself. It is imported where a build is made. The two values the
# build's place depends on are read here as torch's builder reads them.
def _default_build_root() -> str:
    """cpp_extension.get_default_build_root()'s folder."""
    try:
        from torch import _appdirs

        return os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions"))
    except (ImportError, AttributeError):  # a torch that keeps it elsewhere: ask the builder
        from torch.utils import cpp_extension

        return cpp_extension.get_default_build_root()


def _cuda_home() -> str:
    """The CUDA_HOME torch's builder finds on Linux (cpp_extension.CUDA_HOME: none for a torch
    built without CUDA; else _find_cuda_home: the environment's CUDA_HOME or CUDA_PATH, else the
    folder above nvcc's, else /usr/local/cuda where it exists); "" for none."""
    import torch

    if not (torch.cuda._is_compiled() and torch.version.cuda):
        return ""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
        if nvcc is None and not os.path.exists(home):
            home = ""
    return home


def builds_root() -> str:
    return os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR") or _default_build_root(), BUILDS_DIR)


def build_inputs(sources: Sequence[str], cflags: Sequence[str], ldflags: Sequence[str],
                 with_cuda: bool) -> dict[str, str]:
    """Everything the compiled module depends on, as torch's builder will use it: the sources'
    contents, torch's version and the folder its headers and libraries come from, the Python
    ABI and headers, the compiler, CUDA_HOME (CUDA builds) and the flags (CUPTI's headers and
    library, the frame-reading variant). Two environments with the same torch and Python
    still differ here (torch's folder), so each gets a build of its own."""
    import sysconfig

    import torch

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
        "cuda_home": _cuda_home() if with_cuda else "",
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
        from torch.utils import cpp_extension

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
                f.write(build_error_line(e) + "\n")
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


def build_error_line(e: BaseException) -> str:
    """The compiler's error line out of torch's builder's page of output."""
    lines = [ln.strip() for ln in str(e).splitlines()]
    why = next((ln for ln in lines if "error" in ln.lower() and "Error building" not in ln), lines[0] if lines else "")
    return why[-200:] or type(e).__name__


def build_error(e: BaseException) -> str:
    return f"could not build the native collector ({build_error_line(e)}); please report this"
