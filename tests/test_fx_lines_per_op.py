"""Each op of a fused chain is generated under its own FX node (collectors/record/fx_lines.py,
`per_op`), checked on a real CPU compile.

Inductor's C++ backend builds and interprets the same LoopBody as its Triton one, so the origin
each op carries from lowering to codegen can be watched here without a GPU: the test reads
`op_origin()` as each line of the C++ kernel is written (only Triton lines get the comment) and
follows that FX node's stack trace to a line of `_chain` below.
"""

from __future__ import annotations

import os
import re

import pytest
from conftest import copy_isa_probes

torch = pytest.importorskip("torch")

from dlpt.collectors.record import fx_lines  # noqa: E402


def _needs_inductor() -> None:
    """Inductor (seconds to import) is imported by the tests that compile, not as the suite
    collects this file."""
    pytest.importorskip("torch._inductor.loop_body")


def _chain(y):
    heavy = torch.sin(y) ** 7 * torch.cos(y * 1.3) ** 5 + torch.tanh(y).exp()  # HEAVY
    light = heavy + 1.0  # LIGHT
    return (light * 0.5).view(-1)  # RETURN


def _line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


def _model_line(node) -> int | None:
    """The line of this file an FX node's stack trace ends on (where it was traced from)."""
    hits = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    lines = [int(ln) for f, ln in hits if f == __file__]
    return lines[-1] if lines else None


def _patched_attrs():
    from torch._inductor import ir
    from torch._inductor.codegen.common import Kernel
    from torch._inductor.codegen.triton import TritonKernel
    from torch._inductor.loop_body import InterpreterShim, LightTracer
    from torch._inductor.utils import IndentedBuffer

    return [(c, a, c.__dict__.get(a)) for c, a in (
        (Kernel, "set_current_node"), (IndentedBuffer, "writeline"), (TritonKernel, "codegen_kernel"),
        (ir.Loops, "__post_init__"), (ir.ComputedBuffer, "get_store_function"),
        (LightTracer, "create_node"), (InterpreterShim, "run_node"))]


def _compile_tagged(x, owner, attr: str, observer):
    """`torch.compile(_chain)(x)` with the tagging installed and `owner.attr` replaced, while it
    compiles, by `observer(the hooked attribute)`; every attribute is restored after."""
    from torch._inductor import config

    undo = fx_lines.tag_kernel_lines()
    assert undo is not None
    hooked = getattr(owner, attr)
    try:
        setattr(owner, attr, observer(hooked))
        torch._dynamo.reset()
        with config.patch({"fx_graph_cache": False, "force_disable_caches": True}):
            return torch.compile(_chain)(x)
    finally:
        setattr(owner, attr, hooked)
        undo()
        torch._dynamo.reset()


def _compile_and_watch():
    """Compile `_chain` with the tagging installed; (each C++ kernel line, the FX node open when it
    was written), the post-grad FX nodes by name, eager and compiled outputs."""
    from torch._inductor.utils import IndentedBuffer
    from torch._inductor.virtualized import V

    before = _patched_attrs()
    seen, nodes = [], {}

    def observer(writeline):
        def watch(self, line):  # the observer only: Inductor's own path runs on underneath
            if isinstance(line, str) and line.strip():
                seen.append((line.strip(), fx_lines.op_origin()))
                graph = getattr(V.graph, "graph", None)
                if isinstance(graph, torch.fx.Graph):
                    nodes.update((n.name, n) for n in graph.nodes)
            writeline(self, line)
        return watch

    x = torch.randn(8, 33)
    got = _compile_tagged(x, IndentedBuffer, "writeline", observer)
    assert _patched_attrs() == before  # every attribute back, inherited ones deleted again
    return seen, nodes, _chain(x), got


@pytest.fixture(scope="module")
def watched(tmp_path_factory, inductor_isa_probed):
    _needs_inductor()
    from torch._inductor import cpu_vec_isa

    # The compile runs in a fresh cache folder (force_disable_caches), where Inductor would probe
    # the vector ISAs again (ten compiles): this process learns them first from a folder holding
    # the run's probes (conftest.inductor_isa_probed), as a process that compiled before has.
    # The compile's own fresh folder (force_disable_caches) is made inside it too, so that it goes
    # with the test's temporary folders rather than staying in /tmp/torchinductor_<user>.
    cache = copy_isa_probes(inductor_isa_probed, tmp_path_factory.mktemp("isa") / "inductor")
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    try:
        cpu_vec_isa.pick_vec_isa()
        return _compile_and_watch()
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def test_the_compile_is_unchanged(watched):
    _, _, want, got = watched
    torch.testing.assert_close(got, want)


def test_each_op_is_generated_under_the_fx_node_it_was_lowered_from(watched):
    seen, nodes, _, _ = watched
    heavy, light, ret = _line_of("HEAVY"), _line_of("LIGHT"), _line_of("RETURN")
    kernel = [(text, nodes[o]) for text, o in seen if o is not None and ("auto " in text or ".store(" in text)]
    assert kernel, seen
    assert all(n.op == "call_function" for _, n in kernel)

    def under(pattern):
        found = [n for text, n in kernel if re.search(pattern, text)]
        assert found, pattern
        return found

    # the transcendental ops of the chain: each under its own aten op, on the heavy line
    for fn in ("sin", "cos", "tanh", "exp"):
        for n in under(rf"(\.|std::){fn}\("):
            assert n.target == getattr(torch.ops.aten, fn).default, (fn, n.name)
            assert _model_line(n) == heavy
    # `light = heavy + 1.0`: its constant and its add, under that add node alone
    for n in under(r"\b1\.0\b") + under(r"\+ tmp\d+;$"):
        if _model_line(n) != heavy:  # the heavy chain's own add (sin·cos + exp) is the other `+`
            assert _model_line(n) == light and n.target == torch.ops.aten.add.Tensor
    assert {_model_line(n) for n in under(r"\b1\.0\b")} == {light}
    assert {_model_line(n) for n in under(r"\+ tmp\d+;$")} == {heavy, light}
    # the 0.5 scaling and the store of its result, under the returned line's mul
    for n in under(r"\b0\.5\b") + under(r"\.store\("):
        assert _model_line(n) == ret and n.target == torch.ops.aten.mul.Tensor
    # the view writes no op: its FX node is nobody's origin
    assert all(n.target not in (torch.ops.aten.view.default, torch.ops.aten.reshape.default) for _, n in kernel)
    # the chain's lines, by the FX nodes open when they were written: not one name for all
    assert {_model_line(n) for _, n in kernel} == {heavy, light, ret}
    assert len({n.name for _, n in kernel}) >= 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels need a GPU")
def test_a_triton_kernels_lines_carry_their_own_ops_fx_node():
    """On a GPU the same origins become the comments: each line of the fused kernel names the FX
    node of the op that wrote it, and the kernel still compiles and runs."""
    _needs_inductor()
    from torch._inductor.codegen.triton import TritonKernel

    sources, x = [], torch.randn(8, 33, device="cuda")

    def observer(codegen):  # the hook's (it strips tags a kernel cannot parse with)
        def keep(self, *args, **kwargs):
            sources.append(codegen(self, *args, **kwargs))
            return sources[-1]
        return keep

    got = _compile_tagged(x, TritonKernel, "codegen_kernel", observer)
    torch.testing.assert_close(got, _chain(x))
    tags = {text.split(fx_lines.TAG)[0].strip(): fx_lines.line_names(text)
            for src in sources for text in src.splitlines() if fx_lines.TAG in text}
    assert tags, sources
    by_op = {op: [names for text, names in tags.items() if op in text]
             for op in ("tl_math.sin(", "tl_math.cos(", "libdevice.tanh(", "tl_math.exp(", "tl.store(")}
    assert by_op["tl_math.sin("] == [["sin"]] and by_op["tl_math.cos("] == [["cos"]], tags
    assert by_op["tl.store("] and all(len(n) == 1 for n in by_op["tl.store("]), tags
    assert sum(len(n) == 1 for n in tags.values()) >= len(tags) - 2, tags  # lines of one op each
