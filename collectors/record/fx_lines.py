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

The resolution is the scheduler node, not the op: a chain of pointwise ops inlined into one
buffer is one node, and its lines carry every FX name of the chain (dlpt/compiled/sample_lines.py
splits those by work). What it costs: the tags make kernels of identical code but different FX
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
_state = threading.local()  # .names: the open node's FX names; .buffers: ids of its kernel's buffers


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
            if isinstance(line, str):
                line = tag_line(line, names)
            elif isinstance(line, DeferredLineBase) and isinstance(getattr(line, "line", None), str):
                line = line._new_line(tag_line(line.line, names))
        writeline(self, line)

    def codegen_kernel(self: Any, *args: Any, **kwargs: Any) -> Any:
        return checked(codegen(self, *args, **kwargs))

    # setattr: replacing Inductor's methods is the hook itself (undone below).
    setattr(Kernel, "set_current_node", set_current_node)  # noqa: B010
    setattr(IndentedBuffer, "writeline", tagged_writeline)  # noqa: B010
    setattr(TritonKernel, "codegen_kernel", codegen_kernel)  # noqa: B010

    def undo() -> None:
        setattr(Kernel, "set_current_node", set_node)  # noqa: B010
        setattr(IndentedBuffer, "writeline", writeline)  # noqa: B010
        setattr(TritonKernel, "codegen_kernel", codegen)  # noqa: B010

    return undo


_STRIP = re.compile(r"  " + re.escape(TAG) + r"[\w ,.]*$", re.M)


def checked(source: Any) -> Any:
    """A generated kernel's source, its tags taken out again if with them it is not valid Python:
    the map is an extra, the program's compile must never fail for it."""
    if not isinstance(source, str) or TAG not in source:
        return source
    try:
        ast.parse(source)
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
