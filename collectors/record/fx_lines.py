"""Which FX nodes wrote each line of a generated Triton kernel: the codegen map that lets a fused
kernel's PC samples (`dlpt record --pc-samples`) go to the model lines of the ops whose
instructions were sampled, instead of following the kernel's work shares.

While Inductor generates a Triton kernel, it emits each scheduler node's loads, arithmetic and
stores inside `kernel.set_current_node(node)` (torch/_inductor/codegen/simd.py), through the
kernel's own line buffers (`loads`, `compute`, `stores`, …). The hook here keeps, while that
context is open, the post-grad FX node names of the node's `origins` (the names Inductor's
provenance map lists for the kernel), and every line written into one of that kernel's buffers
gets a trailing comment:

    tmp3 = tl_math.sin(tmp0)  # dlpt-fx: sin

A comment changes no instruction of a kernel, and the kernel's source file keeps it: the
cubin's line table leads a sampled instruction to its line, the comment to the FX nodes, and the
provenance map (FX node → stack trace, `kernel_fx`) to the model line. Lines written outside a
node's context (loop headers, the signature) get none; their samples keep the kernel's work
shares. A load shared by several nodes (Inductor emits it once) is tagged with the node that
first needed it, and so is index arithmetic, which Inductor emits when the first node asks.

The resolution is the op, where Inductor lets it be seen (`per_op` below): a chain of pointwise
ops inlined into one buffer is one scheduler node, whose origins are every FX node of the chain,
but each op of its loop body came from one FX node's lowering, and its lines carry that name
alone. Lines no single op wrote keep the node's names (dlpt/compiled/sample_lines.py splits
those by work). What it costs: the tags make kernels of identical code but different FX
names (the same layer repeated) differ, so Inductor no longer merges them into one kernel; a
`--pc-samples` recording compiles more kernels than a plain one (its compile cache entries are
its own anyway, below). Tagging lines by their node's position in the kernel instead of its FX
names would keep the merging; not done yet.

Only lines that stay valid with a comment appended are tagged: not a line already holding a
`#` (it may be inside a string), not one continued by a backslash, not one opening or closing a
triple-quoted string. Only `dlpt record --pc-samples` installs it, and it changes the compile
cache's key (inductor_hooks.mark), so an untagged cached graph is never served to it.
"""

from __future__ import annotations

import ast
import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

TAG = "# dlpt-fx:"
_TAGGED = re.compile(r"#\s*dlpt-fx:\s*(?P<names>[\w ,.]*)\s*$")
# .names: the open scheduler node's FX names; .buffers: ids of its kernel's buffers; .origin: the FX
# node whose inner_fn a LoopBody is tracing; .op: that of the loop-body op being generated
_state = threading.local()


def tag_line(line: str, names: list[str]) -> str:
    """`line` with the FX node names appended as a comment, where a comment can go."""
    body = line.rstrip()
    if not names or not body.strip() or "#" in body or body.endswith("\\") or '"""' in body or "'''" in body:
        return line
    return f"{body}  {TAG} {' '.join(names)}"


def line_names(text: str) -> list[str]:
    """The FX node names a line's tag gives (none where it has no tag)."""
    m = _TAGGED.search(text)
    return m.group("names").split() if m else []


def file_tags(path: str, lines: set[int] | None = None) -> dict[int, list[str]]:
    """{line: FX node names} of a generated kernel file (only `lines`, where given); empty where
    it cannot be read (a cache cleaned before the recording ended)."""
    out: dict[int, list[str]] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, text in enumerate(f, 1):
                if (lines is None or i in lines) and TAG[1:].strip() in text:
                    names = line_names(text)
                    if names:
                        out[i] = names
    except OSError:
        return {}
    return out


def node_names(node: Any) -> list[str]:
    """The post-grad FX node names a scheduler node was lowered from (its IR node's `origins`)."""
    ir = getattr(node, "node", None)
    origins = getattr(ir, "origins", None) or ()
    return sorted({o.name for o in origins if getattr(o, "op", "") == "call_function" and getattr(o, "name", None)})


def tag_kernel_lines() -> Any:
    """Install the tagging (see the module's docstring); returns the undo, or None where this
    torch has no such code path (then samples keep the work shares)."""
    try:
        from torch._inductor.codegen.common import Kernel
        from torch._inductor.codegen.triton import TritonKernel
        from torch._inductor.utils import DeferredLineBase, IndentedBuffer
    except ImportError:
        return None
    set_node, writeline = Kernel.__dict__.get("set_current_node"), IndentedBuffer.__dict__.get("writeline")
    codegen = TritonKernel.__dict__.get("codegen_kernel")
    if set_node is None or writeline is None or codegen is None:
        return None

    @contextlib.contextmanager
    def set_current_node(self: Any, node: Any) -> Iterator[None]:
        prior = getattr(_state, "names", None), getattr(_state, "buffers", None)
        if isinstance(self, TritonKernel):
            try:
                _state.names = node_names(node)
                _state.buffers = {id(v) for v in vars(self).values() if isinstance(v, IndentedBuffer)}
            except Exception:  # noqa: BLE001 - the map is an extra; codegen must go on untagged
                _state.names = None
        try:
            with set_node(self, node):
                yield
        finally:
            _state.names, _state.buffers = prior

    def tagged_writeline(self: Any, line: Any) -> None:
        names = getattr(_state, "names", None)
        if names and id(self) in (getattr(_state, "buffers", None) or ()):
            op = getattr(_state, "op", None)
            # the op's own FX node, where it is one of the node's (else Inductor's provenance map
            # may not list it for this kernel): the node's names otherwise
            if op in names:
                names = [op]
            if isinstance(line, str):
                line = tag_line(line, names)
            elif isinstance(line, DeferredLineBase) and isinstance(getattr(line, "line", None), str):
                line = line._new_line(tag_line(line.line, names))
        writeline(self, line)

    def codegen_kernel(self: Any, *args: Any, **kwargs: Any) -> Any:
        return checked(codegen(self, *args, **kwargs))

    # Replacing Inductor's methods is the hook itself (undone below).
    patched: list[tuple[Any, str, Any]] = []
    _patch(patched, Kernel, "set_current_node", set_current_node)
    _patch(patched, IndentedBuffer, "writeline", tagged_writeline)
    _patch(patched, TritonKernel, "codegen_kernel", codegen_kernel)
    try:
        per_op(patched)
    except Exception:  # noqa: BLE001 - a torch whose loop bodies differ: tags by scheduler node
        _unpatch(patched[3:])
        del patched[3:]

    def undo() -> None:  # a second call finds nothing left to restore
        _unpatch(patched)
        patched.clear()

    return undo


# -- per op ----------------------------------------------------------------------------------------

META = "dlpt_fx"  # the key of a loop body's FX node meta: the post-grad FX node that op came from
_MISSING = object()


def _patch(patched: list[tuple[Any, str, Any]], owner: Any, attr: str, new: Any) -> None:
    """Set `owner.attr`, remembering what its own `__dict__` held (or that it held none: an
    inherited attribute is deleted again, not copied onto the subclass)."""
    patched.append((owner, attr, owner.__dict__.get(attr, _MISSING)))
    setattr(owner, attr, new)


def _unpatch(patched: list[tuple[Any, str, Any]]) -> None:
    for owner, attr, prior in reversed(patched):
        if prior is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, prior)


class Origin:
    """An IR node's `inner_fn` (or a buffer's store function), called with its FX node as the
    origin of the ops it traces; a nested call (an inlined input's loader) has its own, and the
    outer one is back when it returns."""

    __slots__ = ("fn", "name")

    def __init__(self, fn: Any, name: str) -> None:
        self.fn, self.name = fn, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        prior = getattr(_state, "origin", None)
        _state.origin = self.name
        try:
            return self.fn(*args, **kwargs)
        finally:
            _state.origin = prior

    # Loops is a frozen dataclass compared and hashed by its fields: equal to the function it
    # wraps, the wrapper leaves those comparisons as they were.
    def __eq__(self, other: object) -> bool:
        return self.fn == (other.fn if isinstance(other, Origin) else other)

    def __hash__(self) -> int:
        return hash(self.fn)


def _lowering_node() -> str | None:
    """The post-grad FX node GraphLowering is lowering now (call_function only), or None."""
    from torch._inductor.virtualized import V

    n = getattr(V.graph, "current_node", None)
    name = getattr(n, "name", None)
    return name if getattr(n, "op", None) == "call_function" and isinstance(name, str) else None


def per_op(patched: list[tuple[Any, str, Any]]) -> None:
    """Stamp each op of a loop body with its FX node and open it while its lines are written.

    An `ir.Loops` (Pointwise, Reduction, Scan, Sort) is created while GraphLowering lowers one FX
    node; its `inner_fn` runs later, when the scheduler traces it into a LoopBody (an inlined
    input's loader is that input's own `inner_fn`). So: the inner_fn is wrapped when its Loops is
    made (`Origin`), each node the LoopBody's tracer creates is stamped with the origin then
    current, and when codegen interprets the body each node opens its stamp as `_state.op`.
    The store (and a reduction's combine), which a buffer's store function writes around the
    inner_fn, go to the buffer's Loops."""
    from torch._inductor import ir
    from torch._inductor.loop_body import InterpreterShim, LightTracer

    base_init, store_fn = ir.Loops.__post_init__, ir.ComputedBuffer.__dict__["get_store_function"]
    create_node, run_node = LightTracer.create_node, InterpreterShim.__dict__["run_node"]

    def post_init(self: Any) -> None:
        base_init(self)  # IRNode's: origins, traceback...
        try:
            name = _lowering_node()
            if name and not isinstance(self.inner_fn, Origin):  # a copy keeps its first origin
                object.__setattr__(self, "inner_fn", Origin(self.inner_fn, name))  # frozen dataclass
        except Exception:  # noqa: BLE001 - untagged, never a failed lowering
            pass

    def get_store_function(self: Any) -> Any:
        fn = store_fn(self)
        origin = getattr(self.data, "inner_fn", None)
        return Origin(fn, origin.name) if isinstance(origin, Origin) else fn

    def stamped_create_node(self: Any, *args: Any, **kwargs: Any) -> Any:
        node = create_node(self, *args, **kwargs)
        origin = getattr(_state, "origin", None)
        if origin:
            node.meta[META] = origin
        return node

    def shim_run_node(self: Any, n: Any) -> Any:
        prior = getattr(_state, "op", None)
        _state.op = getattr(n, "meta", {}).get(META)
        try:
            return run_node(self, n)
        finally:
            _state.op = prior

    _patch(patched, ir.Loops, "__post_init__", post_init)
    _patch(patched, ir.ComputedBuffer, "get_store_function", get_store_function)
    _patch(patched, LightTracer, "create_node", stamped_create_node)
    _patch(patched, InterpreterShim, "run_node", shim_run_node)


def op_origin() -> str | None:
    """The FX node of the loop-body op whose code is being generated now (None between ops)."""
    return getattr(_state, "op", None)


_STRIP = re.compile(r"  " + re.escape(TAG) + r"[\w ,.]*$", re.M)
# `codegen_kernel()` names the kernel `str(Placeholder.KERNEL_NAME)`, "Placeholder.KERNEL_NAME"
# (`def Placeholder.KERNEL_NAME(...)`), which Inductor replaces by the real name later on: never
# valid Python as returned, so it is parsed with the bare member name in its place.
_PLACEHOLDER = re.compile(r"\bPlaceholder\.([A-Z][A-Z_]*)\b")


def checked(source: Any) -> Any:
    """A generated kernel's source, its tags taken out again if with them it is not valid Python:
    the map is an extra, the program's compile must never fail for it."""
    if not isinstance(source, str) or TAG not in source:
        return source
    try:
        ast.parse(_PLACEHOLDER.sub(r"\1", source))
    except Exception:  # noqa: BLE001 - SyntaxError, or a RecursionError on a deep expression: untagged then
        return _STRIP.sub("", source)
    return source


def kernel_fx(node_info: dict[str, list[str]], nodes: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Kernel NAME:HANDLE → {post-grad FX node name: its stack trace text}, over the nodes
    Inductor's provenance map lists for it: how a tag's names reach model lines."""
    out: dict[str, dict[str, str]] = {}
    for key, names in node_info.items():
        per = {}
        for name in names:
            node = nodes.get(name)  # a torch.fx node: its own `meta` dict
            st = node.meta.get("stack_trace") if node is not None else None
            if st:
                per[name] = st
        if per:
            out[key] = per
    return out
