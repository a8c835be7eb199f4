"""A fused kernel's PC samples split by the generated lines they hit (the codegen map), on CPU.

Three parts, each checked by hand: the tags `dlpt record --pc-samples` puts on Inductor's Triton
kernel lines (collectors/record/fx_lines.py, driven through a real `TritonKernel`'s own line
buffers and CSE, and undone after); the provenance records carrying each kernel's FX node →
trace map through the compiled graph's JSON and a profile's meta; and the model's split
(dlpt/compiled/sample_lines.py in fused.py) on a profile built by hand, whose expected figures
are worked out in the test from the samples placed on each line.
"""

from __future__ import annotations

import json
from dataclasses import fields

import numpy as np
import pytest

from dlpt.cct import CCT, TreeBuilder
from dlpt.collectors.record.fx_lines import META, TAG, file_tags, kernel_fx, line_names, tag_kernel_lines, tag_line
from dlpt.collectors.record.inductor_hooks import FX_KEY
from dlpt.collectors.record.provenance import compiled_module
from dlpt.compiled.fused import attribute_compiled
from dlpt.compiled.provenance import CompiledModule, KernelProvenance, Provenance, SourceFrame
from dlpt.frames import FUSED_PREFIX, Frame, FrameTable, source_frame
from dlpt.metrics import COL, KERNEL, exclusive_matrix
from dlpt.profile import Activities, Profile

GEN = "/tmp/torchinductor_u/ab/cabc.py"  # the generated wrapper module
KFILE = "/tmp/torchinductor_u/xy/cxyk.py"  # the Triton kernel's own source file
MODEL = "/home/u/model.py"


# -- the tags -----------------------------------------------------------------------------------

def test_a_tag_goes_only_where_a_comment_cannot_change_the_line():
    assert tag_line("    tmp2 = tmp0 * tmp1", ["mul", "mul_1"]) == f"    tmp2 = tmp0 * tmp1  {TAG} mul mul_1"
    assert line_names(tag_line("tmp2 = tmp0 * tmp1", ["mul"])) == ["mul"]
    for line in ("x = '#'  # theirs", "a = b + \\", 's = """', "t = '''x'''", "", "   "):
        assert tag_line(line, ["mul"]) == line, line
    assert tag_line("tmp0 = x", []) == "tmp0 = x"
    assert line_names("tmp0 = x") == []


def test_a_kernel_the_tags_would_break_is_compiled_without_them():
    from dlpt.collectors.record.fx_lines import checked

    good = f"def k():\n    tmp0 = x  {TAG} sin\n    return tmp0\n"
    assert checked(good) == good
    # a tag inside a string that spans lines (a case tag_line cannot see from one line) breaks
    # nothing here, but one that lands after a line's continuation would: both come out whole
    bad = f"def k():\n    tmp0 = x + \\  {TAG} sin\n        1\n    return tmp0  {TAG} add\n"
    assert checked(bad) == "def k():\n    tmp0 = x + \\\n        1\n    return tmp0\n"
    assert checked(None) is None and checked("plain = 1\n") == "plain = 1\n"
    # TritonKernel.codegen_kernel() names the kernel by Inductor's placeholder, replaced by the
    # real name later: no Python as it stands, but not the tags' doing (they stay)
    named = f"def Placeholder.KERNEL_NAME(x):\n    tmp0 = x  {TAG} sin\n    return tmp0\n"
    assert checked(named) == named
    assert checked(named.replace("return tmp0", "return tmp0 +")) == named.replace(f"  {TAG} sin", "").replace(
        "return tmp0", "return tmp0 +")


def test_file_tags_reads_the_lines_asked_for(tmp_path):
    f = tmp_path / "k.py"
    f.write_text("import triton\n"  # 1
                 f"tmp0 = tl.load(in_ptr0 + x0)  {TAG} sin\n"  # 2
                 "tmp1 = tmp0\n"  # 3
                 f"tl.store(out_ptr0 + x0, tmp1)  {TAG} mul_1 add\n")  # 4
    assert file_tags(str(f)) == {2: ["sin"], 4: ["mul_1", "add"]}
    assert file_tags(str(f), {3, 4}) == {4: ["mul_1", "add"]}
    assert file_tags(str(tmp_path / "gone.py")) == {}


class _Bounds:
    def get_bounds(self) -> dict:
        return {}


class _Body:
    def bounds(self) -> _Bounds:
        return _Bounds()


class _Node:
    """A scheduler node as `set_current_node` reads it: its IR node's FX origins, its body."""

    def __init__(self, origins: list) -> None:
        self.node = type("IR", (), {"origins": origins})()
        self._body = _Body()

    def codegen_originating_info(self, buffer: object, only_once: bool = True) -> None:
        """Inductor writes origin comments only with `config.comment_origin` (off): nothing."""


def test_the_hook_tags_a_triton_kernels_own_lines_and_is_undone():
    torch = pytest.importorskip("torch")
    sympy = pytest.importorskip("sympy")
    from torch._inductor import ir
    from torch._inductor.codegen.common import DeferredLine, Kernel
    from torch._inductor.codegen.simd_kernel_features import SIMDKernelFeatures
    from torch._inductor.codegen.triton import TritonKernel
    from torch._inductor.graph import GraphLowering
    from torch._inductor.loop_body import InterpreterShim, LightTracer
    from torch._inductor.utils import IndentedBuffer
    from torch._inductor.virtualized import V

    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]  # sin, add
    placeholder = [n for n in gm.graph.nodes if n.op == "placeholder"]
    hooked = ((Kernel, "set_current_node"), (IndentedBuffer, "writeline"), (TritonKernel, "codegen_kernel"),
              (ir.Loops, "__post_init__"), (ir.ComputedBuffer, "get_store_function"),
              (LightTracer, "create_node"), (InterpreterShim, "run_node"))
    before = [c.__dict__.get(a) for c, a in hooked]
    undo = tag_kernel_lines()
    assert undo is not None
    try:
        with V.set_graph_handler(GraphLowering(gm)):
            k = TritonKernel({"x": sympy.Integer(16)}, features=SIMDKernelFeatures([], sympy.Integer(16)))
            other = IndentedBuffer()
            k.compute.writeline("xoffset = tl.program_id(0)")  # outside any node's context
            with V.set_kernel_handler(k), k.set_current_node(_Node([calls[0], *placeholder])):
                v = k.cse.generate(k.compute, "tl_math.sin(tmp0)", dtype=torch.float32, shape=("XBLOCK",))  # Inductor's own path
                other.writeline("buf0 = empty()")  # not the kernel's buffer: never tagged
            with k.set_current_node(_Node([calls[1]])):
                k.stores.writeline(DeferredLine("buf1", f"tl.store(out_ptr0 + x0, {v} + 1)"))
            k.compute.writeline("tmp9 = tmp0")  # the context closed again
            # A loop body's ops, interpreted by Inductor's own InterpreterShim: each op's lines
            # take its stamp where it is one of the node's FX names, else the node's names.
            body = torch.fx.Graph()
            for stamp, text in ((calls[0].name, "tmp1 = tl_math.sin(tmp0)"), ("cos_9", "tmp2 = tmp1"),
                                (None, "tmp3 = tmp2")):
                op = body.call_function(k.compute.writeline, (text,))
                if stamp:
                    op.meta[META] = stamp
            body.output(None)
            with k.set_current_node(_Node(calls)):
                InterpreterShim(body, {}).run()
                k.compute.writeline("tmp4 = tmp3")  # after the ops, in the node: the node's names
            compute = k.compute.getvalue().splitlines()
            stores = k.stores.getvalue().splitlines()
    finally:
        undo()
    assert [c.__dict__.get(a) for c, a in hooked] == before
    assert "create_node" not in LightTracer.__dict__ and "__post_init__" not in ir.Loops.__dict__
    assert compute[0].strip() == "xoffset = tl.program_id(0)"
    assert line_names(compute[1]) == [calls[0].name] and "tl_math.sin(tmp0)" in compute[1]
    assert line_names(compute[2]) == []
    both = sorted(n.name for n in calls)
    assert [line_names(c) for c in compute[3:]] == [[calls[0].name], both, both, both]
    assert line_names(stores[0]) == [calls[1].name]
    assert other.getvalue().strip() == "buf0 = empty()"


# -- the records ----------------------------------------------------------------------------------

def test_the_fx_map_rides_the_compiled_graphs_json_and_the_profile():
    trace = lambda line: f'  File "{MODEL}", line {line}, in forward\n    y = f(x)\n'  # noqa: E731
    nodes = {"sin": type("N", (), {"meta": {"stack_trace": trace(10)}})(),
             "add": type("N", (), {"meta": {"stack_trace": trace(11)}})(),
             "view": type("N", (), {"meta": {}})()}
    fx = kernel_fx({"triton_fused_0:1": ["sin", "add", "view", "gone"]}, nodes)
    assert fx == {"triton_fused_0:1": {"sin": trace(10), "add": trace(11)}}
    source = (f"# kernel path: {KFILE}\n# Topologically Sorted Source Nodes: [sin, add]\n"
              "triton_fused_0 = async_compile.triton('triton_fused_0', \'\'\'\nimport triton\n\'\'\', device_str='cuda')\n"
              "def call(args):\n    # [Provenance debug handles] triton_fused_0:1\n    triton_fused_0.run(a, b)\n")
    traces = {"triton_fused_0:1": [trace(11), trace(10)], FX_KEY: [json.dumps(fx)]}
    mod = compiled_module(GEN, source, json.dumps(traces), False)
    (kp,) = mod.kernels.values()
    assert [t[-1].line for t in kp.traces] == [11, 10]
    assert dict(kp.fx) == {"sin": 1, "add": 0}  # indices into kp.traces, in its order
    assert kp.traces_of(["sin"]) == {1} and kp.traces_of(["add", "sin"]) == {0, 1} and kp.traces_of(["x"]) == set()
    back = Provenance.from_dict(json.loads(json.dumps(Provenance.to_dict(_one(mod)))))
    assert back.modules[GEN].kernels["triton_fused_0:1"].fx == kp.fx
    assert kp.source == KFILE and back.modules[GEN].kernels["triton_fused_0:1"].source == KFILE


def test_only_the_kernel_whose_file_was_sampled_takes_a_lines_samples():
    from dlpt.compiled.sample_lines import line_weights

    # A CUDA-graph replay of `triton_fused_0`: two graphs each have one (same name, own file),
    # both candidates; both have an `add` node, on model lines 10 and 11.
    tr = lambda ln: ((SourceFrame(MODEL, ln, "forward"),),)  # noqa: E731
    a = KernelProvenance("triton_fused_0:1", "triton_fused_0", tr(10), fx=(("add", 0),), source="/k/a.py")
    b = KernelProvenance("triton_fused_0:1", "triton_fused_0", tr(11), fx=(("add", 0),), source="/k/b.py")
    contrib = [[(a, 0, 5)], [(b, 0, 5)]]  # one path each, equal shares
    assert line_weights(contrib, ["add"], "/k/a.py") == [5, 0]
    assert line_weights(contrib, ["add"], "/k/b.py") == [0, 5]
    assert line_weights(contrib, ["add"], "/k/c.py") is None  # neither: the unit's shares
    assert line_weights(contrib, ["mul"], "/k/a.py") is None
    # where a kernel's file is not known, its nodes alone decide
    c = KernelProvenance("triton_fused_0:1", "triton_fused_0", tr(10), fx=(("add", 0),))
    assert line_weights([[(c, 0, 5)], [(b, 0, 5)]], ["add"], "/k/a.py") == [5, 0]


def _one(mod: CompiledModule) -> Provenance:
    p = Provenance()
    p.modules = {mod.file: mod}
    return p


# -- the model's split ----------------------------------------------------------------------------

CALL = [source_frame("/home/u/train.py", 30, "<module>"), source_frame(MODEL, 8, "forward"),
        source_frame(GEN, 50, "call"), Frame("kernel", "triton_fused_0")]


def _profile(samples: dict[int, int], kernel_ns: int, fx_lines: dict[str, list[str]] | None) -> Profile:
    """The kernel launched once from generated line 50 (`kernel_ns`), with `samples[L]` PC samples
    on line L of its source file beneath it, all of them stalled on `wait`."""
    ft = FrameTable([Frame("root", "synthetic")])
    b = TreeBuilder(0)
    ids = [ft.intern(f) for f in CALL]
    leaf = b.path(ids)
    lines = {ln: b.path([*ids, ft.intern(source_frame(KFILE, ln, "triton_fused_0"))]) for ln in samples}
    parent, frame, new_of_old = b.preorder()
    acts = Activities.empty()
    acts = type(acts)(**{f.name: np.zeros(1, dtype=np.int64) for f in fields(acts)})
    acts.node, acts.kind, acts.name = new_of_old[np.array([leaf])], np.full(1, KERNEL), np.array([ids[-1]])
    acts.duration = np.array([kernel_ns], dtype=np.int64)
    if hasattr(acts, "count"):
        acts.count = np.ones(1, dtype=np.int64)
    exc = exclusive_matrix(len(parent), acts.node, acts.kind, acts.duration, acts.bytes,
                           np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    for ln, n in samples.items():
        exc[new_of_old[lines[ln]], COL["pc_samples"]] = n
        exc[new_of_old[lines[ln]], COL["stall_wait"]] = n
    meta = {"source": "record"}
    if fx_lines is not None:
        meta["pc_sampling"] = {"samples": sum(samples.values()), "fx_lines": {KFILE: fx_lines}}
    return Profile(ft.frames, CCT(parent, frame, exc), acts, meta=meta)


def _prov(fx: tuple, source: str = KFILE) -> Provenance:
    """triton_fused_0 (its source file `source`) from model lines 10 (sin, work 3) and 11 (add, work 1)."""
    mod = CompiledModule(GEN, False, lines={50: "triton_fused_0:1"})
    traces = ((SourceFrame(MODEL, 10, "forward"),), (SourceFrame(MODEL, 11, "forward"),))
    mod.kernels = {"triton_fused_0:1": KernelProvenance("triton_fused_0:1", "triton_fused_0", traces, False, (3, 1), fx,
                                                        source)}
    return _one(mod)


def _on_model_lines(p: Profile, col: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for i in range(len(p.cct)):
        if p.frame_of(i).name == f"{FUSED_PREFIX}triton_fused_0]":
            line = [f.line for f in p.call_path(i) if f.kind == "python" and f.file == MODEL][-1]
            out[line] = out.get(line, 0) + int(p.cct.inclusive[i, COL[col]])
    return out


def test_samples_follow_the_lines_they_hit_and_time_keeps_its_work_shares():
    # Kernel line 7 was written under `sin` (model line 10), line 8 under `add` (model line 11);
    # line 9 under no node (index arithmetic): its samples keep the work shares 3:1.
    samples = {7: 100, 8: 60, 9: 40}
    before = _profile(samples, 4000, {"7": ["sin"], "8": ["add"]})
    after = attribute_compiled(before, _prov((("sin", 0), ("add", 1))))
    assert (after.cct.inclusive[0] == before.cct.inclusive[0]).all()
    # by hand: line 10 = 100 + 40 * 3/4 = 130, line 11 = 60 + 40 * 1/4 = 70
    assert _on_model_lines(after, "pc_samples") == {10: 130, 11: 70}
    assert _on_model_lines(after, "stall_wait") == {10: 130, 11: 70}
    assert _on_model_lines(after, "gpu_time") == {10: 3000, 11: 1000}  # time: the work shares
    assert after.meta["compiled_provenance"]["pc_sample_lines_split_by_line"] == 2
    # the TUI's detail pane says which split a PC-sample column shows, and not for time
    from dlpt.viewers.tui.detail import fused_note

    fused = [i for i in range(len(after.cct)) if after.frame_of(i).name.startswith(FUSED_PREFIX)]
    note = fused_note(after, fused[0], "pc_samples")
    assert "split by the generated lines they hit" in note and "(2 sampled lines in this recording)" in note
    assert "PC samples" not in fused_note(after, fused[0], "gpu_time")
    # each sampled kernel line went only where its node's trace points
    for i in range(len(after.cct)):
        f = after.frame_of(i)
        if f.kind == "python" and f.file == KFILE and after.cct.inclusive[i, COL["pc_samples"]]:
            model = [g.line for g in after.call_path(i) if g.kind == "python" and g.file == MODEL][-1]
            assert (f.line, model) in {(7, 10), (8, 11), (9, 10), (9, 11)}, (f.line, model)


def test_without_the_map_samples_keep_the_work_shares():
    samples = {7: 100, 8: 60, 9: 40}
    sin_add = (("sin", 0), ("add", 1))
    tags = {"7": ["sin"], "8": ["add"]}
    # no tags; no FX map; tags and map, but the kernel's own file is not the one sampled
    for fx_lines, fx, source in ((None, sin_add, KFILE), (tags, (), KFILE), (tags, sin_add, "/tmp/other.py")):
        after = attribute_compiled(_profile(samples, 4000, fx_lines), _prov(fx, source))
        # 200 samples 3:1: each line's samples split 3:1 and rounded by the largest remainder,
        # line by line (100 → 75/25, 60 → 45/15, 40 → 30/10)
        assert _on_model_lines(after, "pc_samples") == {10: 150, 11: 50}
        assert "pc_sample_lines_split_by_line" not in after.meta["compiled_provenance"] or \
            after.meta["compiled_provenance"]["pc_sample_lines_split_by_line"] == 0


def test_the_recording_keeps_the_tags_of_the_sampled_lines(tmp_path):
    from dlpt.collectors.record.pcsamples import _fx_lines

    k = tmp_path / "ck.py"
    k.write_text("def kernel():\n"  # 1
                 f"    tmp0 = tl.load(in_ptr0)  {TAG} sin\n"  # 2
                 "    x0 = xindex\n"  # 3
                 f"    tl.store(out_ptr0, tmp0)  {TAG} add\n")  # 4
    names = [str(k), "/usr/lib/libcublas.so", str(tmp_path / "other.py")]
    # samples (file index, line): lines 2, 3, 4 of the kernel, none of a file without a line
    # table (-1), a library path, a Python file that is gone
    file = np.array([0, 0, 0, 0, -1, 1, 2])
    line = np.array([2, 3, 4, 2, 0, 7, 9])
    assert _fx_lines(file, line, names) == {str(k): {"2": ["sin"], "4": ["add"]}}


def test_tagged_recordings_compile_into_cache_entries_of_their_own():
    pytest.importorskip("torch._inductor.custom_graph_pass")
    from dlpt.collectors.record.inductor_hooks import MARK, marked_pass, marks

    plain = marked_pass(None).uuid()
    marks["fx_lines"] = True
    try:
        tagged = marked_pass(None).uuid()
    finally:
        marks["fx_lines"] = False
    assert plain == MARK and tagged != plain and tagged.startswith(MARK)


def test_a_line_of_a_fused_chain_splits_by_work_and_other_nodes_lines_stay_apart():
    # One scheduler node inlined the chain sin → add (model lines 10 and 11, work 3 and 1): its
    # lines carry both names. A reduction's node (`sum`, model line 12, work 4) wrote line 8.
    mod = CompiledModule(GEN, False, lines={50: "triton_fused_0:1"})
    traces = tuple((SourceFrame(MODEL, ln, "forward"),) for ln in (10, 11, 12))
    mod.kernels = {"triton_fused_0:1": KernelProvenance("triton_fused_0:1", "triton_fused_0", traces, False,
                                                        (3, 1, 4), (("sin", 0), ("add", 1), ("sum", 2)))}
    samples = {7: 80, 8: 40, 9: 80}
    after = attribute_compiled(_profile(samples, 8000, {"7": ["add", "sin"], "8": ["sum"]}), _one(mod))
    # by hand: line 7's 80 by 3:1 → 60 and 20; line 8's 40 all to line 12; untagged line 9's 80 by
    # the work 3:1:4 → 30, 10, 40
    assert _on_model_lines(after, "pc_samples") == {10: 90, 11: 30, 12: 80}
    assert _on_model_lines(after, "gpu_time") == {10: 3000, 11: 1000, 12: 4000}


def test_a_recording_marks_the_cache_while_it_tags_and_a_nested_one_leaves_it_marked():
    pytest.importorskip("torch._inductor.output_code")
    from dlpt.collectors.record.inductor_hooks import marks
    from dlpt.collectors.record.provenance import ProvenanceRecorder

    outer, inner = ProvenanceRecorder(fx_lines=True), ProvenanceRecorder(fx_lines=False)
    outer.start()
    try:
        assert marks["fx_lines"] is True
        inner.start()  # dlpt.profile inside dlpt record --pc-samples: the outer run still tags
        assert marks["fx_lines"] is True
        inner.stop()
        assert marks["fx_lines"] is True
    finally:
        outer.stop()
    assert marks["fx_lines"] is False
