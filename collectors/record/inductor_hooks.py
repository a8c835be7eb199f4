"""What dlpt installs in Inductor while recording provenance (provenance.py's `Provenance.start`).

* An import hook (`AfterImport`): importing Inductor costs a second or more, which a program
  that never compiles should not pay, so the patches wait for the program's own import of
  `torch._inductor.output_code` (and of Triton's codegen, which a CPU program never imports).
* A compile-cache mark (`marked_pass`): Inductor leaves `trace.*` config out of its cache keys,
  so a graph cached by an unrecorded run would be served without provenance. A post-grad custom
  pass that does nothing but add dlpt's mark to the key gives recorded runs cache entries of
  their own, compiled with provenance (cold the first time, warm after).
* Provenance for mix-order reduction kernels (`handle_mix_order_kernels`), which Inductor
  records none for.

None of them changes what the program computes: the mark pass does nothing, and the codegen
patch adds comments and provenance entries only.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any

OUTPUT_CODE = "torch._inductor.output_code"
TRITON_CODEGEN = "torch._inductor.codegen.triton"


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then()` right after module `name` has been executed by its first import."""

    def __init__(self, name: str, then: Any) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            # Another recording's hook (dlpt.profile inside dlpt record) would ask this one back.
            if isinstance(finder, AfterImport) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, then: Any) -> None:
        self.inner = inner
        self.then = then

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.then()


def handle_mix_order_kernels() -> Any:
    """Give Inductor's mix-order reduction kernels the provenance every other kernel gets.

    Layer-norm and RMS-norm backward fuse their row and column reductions into one "mix order
    reduction" kernel (`triton.mix_order_reduction`, on by default on GPUs): 10-17% of nanoGPT's
    compiled GPU time. Inductor writes its `Topologically Sorted Source Nodes` comment but calls
    `codegen_comment(node_schedule, None)`, so no provenance is recorded and no handle written for
    it. Here the schedule of such a call is kept until the kernel's `call_kernel(name)`, which
    then records it and writes the handle, as `codegen_comment` does for the other kernels.
    Comments and the provenance map only: the kernel and its call are unchanged. Returns the
    undo, or None where this torch has no such code path."""
    try:
        from torch._inductor.codegen.triton import TritonKernel, TritonScheduling
        from torch._inductor.debug import set_kernel_post_grad_provenance_tracing
        from torch._inductor.virtualized import V
    except ImportError:
        return None
    comment, call = TritonScheduling.__dict__.get("codegen_comment"), TritonKernel.__dict__.get("call_kernel")
    if comment is None or call is None:
        return None
    pending = threading.local()

    def codegen_comment(self: Any, node_schedule: Any, kernel_name: Any = None) -> Any:
        pending.schedule = node_schedule if kernel_name is None else None
        return comment(self, node_schedule, kernel_name)

    def call_kernel(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        schedule, pending.schedule = getattr(pending, "schedule", None), None
        if schedule is not None:
            try:
                handle = set_kernel_post_grad_provenance_tracing(schedule, name)
                V.graph.wrapper_code.write_provenance_debug_handle(name, handle)
            except Exception:  # noqa: BLE001 - provenance is an extra; the kernel call must still be written
                pass
        return call(self, name, *args, **kwargs)

    TritonScheduling.codegen_comment = codegen_comment  # type: ignore[method-assign]
    TritonKernel.call_kernel = call_kernel  # type: ignore[method-assign]

    def undo() -> None:
        TritonScheduling.codegen_comment = comment  # type: ignore[method-assign]
        TritonKernel.call_kernel = call  # type: ignore[method-assign]

    return undo


MARK = "dlpt-provenance/2"  # 2: mix-order reduction kernels carry provenance


def marked_pass(current: Any) -> Any:
    """A post-grad custom pass that changes nothing but the compile-cache key.

    Inductor leaves `trace.*` config out of its FX-graph and AOTAutograd cache keys, so a graph
    cached by a run without provenance would be served to a recorded run: no comments, no map.
    A custom pass's `uuid()` is part of the key: with dlpt's mark, recorded runs get entries of
    their own, made with provenance (cold the first time, warm after). A user's own pass keeps
    running inside it; a plain callable already disables caching and is left alone (None)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Marked(CustomGraphPass):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __call__(self, graph: Any) -> None:
            if self.inner is not None:
                self.inner(graph)

        def uuid(self) -> Any:
            return (MARK, self.inner.uuid()) if self.inner is not None else MARK

    if current is None or isinstance(current, CustomGraphPass):
        return Marked(current)
    return None


def module_file(graph: Any) -> str:
    """The generated module's path: the file its `call` function's frames will show."""
    fn = getattr(graph, "current_callable", None)
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_filename:
        return str(code.co_filename)
    key = getattr(graph, "cache_key", None)
    if key:
        from torch._inductor.codecache import get_path

        return str(get_path(key, "py")[2])
    return ""
