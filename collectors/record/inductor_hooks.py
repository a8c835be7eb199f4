"""What dlpt installs in Inductor while recording provenance (provenance.py's `ProvenanceRecorder.start`).

* An import hook (`AfterImport`): importing Inductor costs a second or more, which a program
  that never compiles should not pay, so the patches wait for the program's own import of
  `torch._inductor.output_code` (and of Triton's codegen, which a CPU program never imports).
* A compile-cache mark (`marked_pass`): Inductor leaves `trace.*` config out of its cache keys,
  so a graph cached by an unrecorded run would be served without provenance. A post-grad custom
  pass that does nothing but add dlpt's mark to the key gives recorded runs cache entries of
  their own, compiled with provenance (cold the first time, warm after).
* Provenance for mix-order reduction kernels (`handle_mix_order_kernels`), which Inductor
  records none for.
* Each kernel's work per source line (`record_work_weights`), so that a fused kernel's time is
  shared by work done rather than evenly, and an extern kernel goes to the op it implements.

None of them changes what the program computes: the mark pass does nothing, and the codegen
patch adds comments and provenance entries only.
"""

from __future__ import annotations

import importlib.abc
import json
import operator
import sys
import threading
from typing import Any

from dlpt.collectors.record.fx_lines import kernel_fx

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

    # setattr: replacing a method on Inductor's classes is the hook itself (undone below); a
    # plain assignment would read to a type checker as a mistake.
    setattr(TritonScheduling, "codegen_comment", codegen_comment)  # noqa: B010
    setattr(TritonKernel, "call_kernel", call_kernel)  # noqa: B010

    def undo() -> None:
        setattr(TritonScheduling, "codegen_comment", comment)  # noqa: B010
        setattr(TritonKernel, "call_kernel", call)  # noqa: B010

    return undo


MARK = "dlpt-provenance/3"  # 2: mix-order reduction kernels carry provenance; 3: work weights
# Set while kernel lines are tagged with their FX nodes (fx_lines.py, `--pc-samples`): a graph
# compiled without the tags must not be served from the cache to a run that needs them.
FX_MARK = "+fx-lines"
marks = {"fx_lines": False}


def mark() -> str:
    """The cache mark of what this recording adds to generated code."""
    return MARK + (FX_MARK if marks["fx_lines"] else "")


def marked_pass(current: Any, before: Any = None) -> Any:
    """A post-grad custom pass that changes nothing but the compile-cache key.

    Inductor leaves `trace.*` config out of its FX-graph and AOTAutograd cache keys, so a graph
    cached by a run without provenance would be served to a recorded run: no comments, no map.
    A custom pass's `uuid()` is part of the key: with dlpt's mark, recorded runs get entries of
    their own, made with provenance (cold the first time, warm after). A user's own pass keeps
    running inside it; a plain callable already disables caching and is left alone (None).
    `before()` runs first on every call: a compile is under way, Inductor fully imported."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class Marked(CustomGraphPass):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __call__(self, graph: Any) -> None:
            if before is not None:
                before()
            if self.inner is not None:
                self.inner(graph)

        def uuid(self) -> Any:
            return (mark(), self.inner.uuid()) if self.inner is not None else mark()

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


# The reserved key under which the kernels' work per source stack trace rides in Inductor's
# kernel → stack traces map: that map is what the compiled graph (and its FX-graph cache entry)
# carries, so the weights come back on a cache hit too. No kernel is named like this.
WEIGHTS_KEY = "dlpt:work"
FX_KEY = "dlpt:fx"  # beside it: each kernel's FX node names → stack traces (fx_lines.kernel_fx)

# Ops that only make a new view of their input (or pick one of several outputs): no work of
# their own, whatever their tensors' sizes. Aliasing returns in the schema catch the rest.
_VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "expand_as", "permute", "slice", "select", "squeeze",
    "unsqueeze", "transpose", "t", "as_strided", "alias", "split", "split_with_sizes", "unbind", "narrow",
    "diagonal", "unfold", "view_as", "flatten", "unflatten", "movedim", "detach", "chunk", "view_as_real",
    "view_as_complex", "_reshape_alias", "numpy_T", "mT", "lift_fresh"})


def is_view_op(target: Any) -> bool:
    """Whether an FX node's target does no work: a view, reshape, expand, permute, slice,
    select... or `getitem` of a multi-output op."""
    if target is operator.getitem:
        return True
    name = getattr(target, "_opname", None) or str(getattr(target, "__name__", "")).split(".")[0]
    if name in _VIEW_OPS:
        return True
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.returns and not schema.is_mutable:
        alias = schema.returns[0].alias_info
        return alias is not None and not alias.is_write
    return False


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError, RuntimeError):
        hint = getattr(getattr(x, "node", None), "hint", None)  # a dynamic size: its example value
        return int(hint) if hint is not None else None


def tensor_bytes(val: Any) -> int | None:
    """Bytes of a node's value (a fake tensor, or a tuple of them); None where a size is unknown."""
    if isinstance(val, (list, tuple)):
        parts = [tensor_bytes(v) for v in val]
        return None if any(p is None for p in parts) else sum(p for p in parts if p)
    numel = getattr(val, "numel", None)
    if numel is None or not hasattr(val, "element_size"):
        return 0  # a scalar, a SymInt, None: no memory traffic
    n = _int(numel())
    return None if n is None else n * int(val.element_size())


def node_work(node: Any) -> int | None:
    """The work of one post-grad FX node: the bytes it would read and write on its own (its
    inputs' and outputs' sizes, from the fake values Inductor keeps in `meta["val"]`); 0 for
    views and non-calls; None where a size is unknown. Inside a fused kernel the intermediate
    values never reach memory, but each node's traffic as an op on its own is what scales with
    the work of its loop body: a heavy pointwise op over a big tensor outweighs a small one."""
    if node.op != "call_function" or is_view_op(node.target):
        return 0
    out = tensor_bytes(node.meta.get("val"))
    ins = [tensor_bytes(a.meta.get("val")) for a in node.all_input_nodes]
    if out is None or any(i is None for i in ins):
        return None
    return out + sum(i for i in ins if i)


def kernel_work(node_info: dict[str, list[str]], nodes: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Kernel NAME:HANDLE → [[stack trace text, work], ...] over the post-grad nodes Inductor
    recorded for it (for an extern kernel with an `origin_node`, that node alone: the op it
    implements). A kernel with a node of unknown size or not in the graph is left out."""
    out: dict[str, list[list[Any]]] = {}
    for key, names in node_info.items():
        per: dict[str, int] = {}
        for name in names:
            n = nodes.get(name)
            w = node_work(n) if n is not None else None
            if n is None or w is None:
                per = {}
                break
            st = n.meta.get("stack_trace")
            if st:
                per[st] = per.get(st, 0) + w
        if per:
            out[key] = [[st, w] for st, w in per.items()]
    return out


def record_work_weights() -> Any:
    """Put each kernel's work per stack trace into the map Inductor stores on the compiled graph.

    Inductor dumps its provenance maps right after generating a graph's code, still inside that
    graph's lowering (`V.graph`, whose `module` is the post-grad graph the kernels' nodes are
    named after), through `torch._inductor.debug.dump_inductor_provenance_info()`; the kernel →
    stack traces map is serialised right after it. Wrapping that call adds the weights under
    `WEIGHTS_KEY`. Returns the undo, or None where this torch has no such function (then every
    kernel is shared evenly, and the profile says so)."""
    try:
        import torch._inductor.debug as debug
        from torch._inductor.virtualized import V
    except ImportError:
        return None
    original = debug.__dict__.get("dump_inductor_provenance_info")
    if original is None:
        return None

    def dump_inductor_provenance_info(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        try:
            gm = getattr(V.graph, "module", None)
            graph = getattr(gm, "graph", None)
            if graph is not None:
                nodes = {n.name: n for n in graph.nodes}
                info = getattr(debug, "_inductor_triton_kernel_to_post_grad_node_info", {})
                work = kernel_work(info, nodes)
                if work:
                    debug._inductor_kernel_stack_trace[WEIGHTS_KEY] = [json.dumps(work)]
                if marks["fx_lines"]:
                    fx = kernel_fx(info, nodes)
                    if fx:
                        debug._inductor_kernel_stack_trace[FX_KEY] = [json.dumps(fx)]
        except Exception:  # noqa: BLE001 - weights are an extra; the compile must go on (even shares then)
            pass
        return out

    setattr(dump_inductor_provenance_info, "__wrapped__", original)  # noqa: B010 - functools' marker of a wrapper
    debug.dump_inductor_provenance_info = dump_inductor_provenance_info

    def undo() -> None:
        debug.dump_inductor_provenance_info = original

    return undo
