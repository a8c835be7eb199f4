"""The recorder's native fast path: `native/record_native.cpp`, JIT-built against the running
torch with `torch.utils.cpp_extension.load` (cached in torch's extensions folder, so only the
first recording on a machine compiles it), folds a stopped profiler's result into a
window-local tree that the recorder merges into the profile (`Recorder._merge_native`).

Anything that keeps it from working — no compiler or ninja, a torch whose profiler structs the
source does not match, `DLPT_NATIVE=0` — leaves `load()` returning None, and the recorder uses
its Python path over torch's pybind wrappers, which gives the same profile, only slower. A
failed build says so once, in one `dlpt:` line on stderr.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
from typing import Any

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "record_native.cpp")

# Node kinds in `event_tree()`'s `kind` column (as the .cpp numbers them).
K_OP, K_CALL, K_CCALL, K_KINETO, K_OTHER = range(5)

# Local frame types of `fold()`'s tree (as the .cpp numbers them); the columns fa/fb/fc hold:
# SITE, DEF: file, line, function (file and function index `strs`); OP, MODULE: name index;
# THREAD: thread key, tid; TID: tid; KERNEL, MEMCPY, MEMSET: name index.
(F_ROOT, F_SITE, F_DEF, F_OP, F_MODULE, F_BACKWARD, F_THREAD, F_TID, F_UNATTR,
 F_KERNEL, F_MEMCPY, F_MEMSET) = range(12)

_loaded: dict[str, Any] = {}


def enabled() -> bool:
    return os.environ.get("DLPT_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def load(quiet: bool = False) -> Any:
    """The built extension module, or None (built once per process; later calls are free)."""
    if not enabled():
        return None
    if "mod" in _loaded:
        return _loaded["mod"]
    mod = None
    try:
        import torch
        from torch.utils import cpp_extension

        with open(SOURCE, "rb") as f:
            src = f.read()
        # One build per source, torch and Python: another torch's headers make another module.
        # USE_KINETO as torch itself is built: it declares `ProfilerResult::traceActivities()`,
        # where copies' byte counts are (the reader checks at compile time that it exists).
        cflags = ["-O2", "-DUSE_KINETO"]
        tag = hashlib.sha256(b"\0".join([src, torch.__version__.encode(), sys.version.encode(),
                                          " ".join(cflags).encode()])).hexdigest()[:12]
        # The profiler headers include Kineto's `ActivityType.h` by its bare name.
        kineto = [os.path.join(p, "kineto") for p in cpp_extension.include_paths()
                  if os.path.isdir(os.path.join(p, "kineto"))]
        name = f"dlpt_record_native_{tag}"
        if not quiet and not _built(cpp_extension, name):
            # The first recording with this torch compiles for ~10-20 s: say why it pauses.
            print("dlpt: building the native profile reader (once per torch version)…", file=sys.stderr, flush=True)
        mod = cpp_extension.load(name=name, sources=[SOURCE], extra_include_paths=kineto,
                                 extra_cflags=cflags, verbose=False)
        # Windows freed on background threads are waited for before the process exits.
        atexit.register(mod.join_released)
    except Exception as e:  # noqa: BLE001 - any failure means the Python path, never a lost recording
        mod = None
        if not quiet:
            # A build error's message is the whole compiler log: its first `error` line says why.
            lines = [ln.strip() for ln in str(e).splitlines()]
            why = next((ln for ln in lines if "error" in ln.lower() and "Error building" not in ln), lines[0] if lines else "")
            why = why[-200:] or type(e).__name__
            print(f"dlpt: native fast path unavailable, using the Python path ({type(e).__name__}: {why})",
                  file=sys.stderr, flush=True)
    _loaded["mod"] = mod
    return mod


def _built(cpp_extension: Any, name: str) -> bool:
    try:
        d = cpp_extension._get_build_directory(name, False)
    except Exception:  # noqa: BLE001 - a private helper of torch's: if it moved, just say nothing
        return True
    return os.path.exists(os.path.join(d, f"{name}.so"))
