"""torch.compile'd code: Inductor's provenance collected on CPU (the C++ backend) and the pure
transformation that puts each compiled kernel under the model lines it was generated from."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from dlpt.cct import TreeBuilder
from dlpt.collectors.record.provenance import ProvenanceRecorder, call_lines, compiled_module, parse_trace
from dlpt.compiled.fused import (
    AUTOTUNING,
    NO_PROVENANCE,
    NOT_LEARNED,
    attribute_compiled,
)
from dlpt.compiled.machinery import REGION_PREFIX
from dlpt.compiled.provenance import CompiledModule, KernelProvenance, Provenance, SourceFrame
from dlpt.compiled.shares import split_int, transport
from dlpt.frames import BACKWARD_FRAME, FUSED_PREFIX, Frame, FrameTable, fused_frame, source_frame
from dlpt.metrics import COL, KERNEL, exclusive_matrix
from dlpt.profile import Activities, Profile
from dlpt.store import load, save
from dlpt.viewers.tui.detail import fused_note

GEN = "/tmp/torchinductor_u/ab/cabc.py"
GEN2 = "/tmp/torchinductor_u/cd/ccdx.py"
MODEL = "/home/u/model.py"


# -- synthetic profiles ----------------------------------------------------------------------

def build(paths: list[tuple[list[Frame], int]], cpu: dict[int, int] | None = None) -> Profile:
    """A recorded-shape profile: each path ends in a kernel leaf launched once for `ns`;
    `cpu` adds host time to the op frame at that depth of each path."""
    ft = FrameTable([Frame("root", "synthetic")])
    b = TreeBuilder(0)
    leaves, names, cpu_nodes, cpu_ns = [], [], [], []
    for frames, ns in paths:
        ids = [ft.intern(f) for f in frames]
        leaves.append((b.path(ids), ns))
        names.append(ids[-1])
        for depth, v in (cpu or {}).items():
            cpu_nodes.append(b.path(ids[:depth + 1]))
            cpu_ns.append(v)
    parent, frame, new_of_old = b.preorder()
    node = new_of_old[np.array([n for n, _ in leaves])]
    dur = np.array([ns for _, ns in leaves], dtype=np.int64)
    k = len(leaves)
    acts = Activities.empty()
    acts = type(acts)(**{f.name: np.zeros(k, dtype=np.int64) for f in fields(acts)})
    acts.node, acts.kind, acts.name, acts.duration = node, np.full(k, KERNEL), np.array(names), dur
    acts.start = np.arange(k, dtype=np.int64) * 1000
    if hasattr(acts, "count"):
        acts.count = np.ones(k, dtype=np.int64)
    cn = new_of_old[np.array(cpu_nodes, dtype=np.int64)] if cpu_nodes else np.zeros(0, dtype=np.int64)
    exc = exclusive_matrix(len(parent), node, acts.kind, dur, acts.bytes, cn, np.array(cpu_ns, dtype=np.int64))
    from dlpt.cct import CCT

    return Profile(ft.frames, CCT(parent, frame, exc), acts, meta={"source": "record"})


def py(file: str, line: int, func: str) -> Frame:
    return source_frame(file, line, func)


def kernel(name: str) -> Frame:
    return Frame("kernel", name)


CALL = [py("/home/u/train.py", 30, "<module>"), py("/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", 1789, "_call_impl"),
        py(MODEL, 8, "forward"), py("/usr/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", 1446, "_fn")]


def tr(*lines: int) -> tuple:
    """One trace per line, each `forward` frame at that line of MODEL."""
    return tuple((SourceFrame(MODEL, ln, "forward"),) for ln in lines)


def provenance() -> Provenance:
    prov = Provenance()
    fwd = CompiledModule(GEN, False, lines={50: "triton_fused_0:1", 52: "extern_kernels.mm:2", 54: "orphan:3"})
    fwd.kernels = {"triton_fused_0:1": KernelProvenance("triton_fused_0:1", "triton_fused_0", tr(10, 11, 12)),
                   "extern_kernels.mm:2": KernelProvenance("extern_kernels.mm:2", "extern_kernels.mm", tr(9)),
                   "orphan:3": KernelProvenance("orphan:3", "orphan", ())}
    bwd = CompiledModule(GEN2, True, lines={70: "triton_fused_0:1"})
    bwd.kernels = {"triton_fused_0:1": KernelProvenance("triton_fused_0:1", "triton_fused_0", tr(10, 12), True)}
    prov.modules = {GEN: fwd, GEN2: bwd}
    return prov


def nodes_named(p: Profile, name: str) -> list[int]:
    return [i for i in range(len(p.cct)) if p.frame_of(i).name == name]


def lines_above(p: Profile, node: int) -> list[tuple[str, int]]:
    return [(f.file, f.line) for f in p.call_path(node) if f.kind == "python"]


def check_conserved(before: Profile, after: Profile) -> None:
    assert (after.cct.inclusive[0] == before.cct.inclusive[0]).all()
    assert int(after.activities.duration.sum()) == int(before.activities.duration.sum())
    # every leaf's kernel time is exactly the sum of its activity rows
    per_node = np.bincount(after.activities.node, weights=after.activities.duration, minlength=len(after.cct))
    assert (per_node.astype(np.int64) == after.cct.exclusive[:, COL["kernel_time"]]).all()
    if hasattr(after.activities, "count"):
        counts = np.bincount(after.activities.node, weights=after.activities.count, minlength=len(after.cct))
        assert (counts.astype(np.int64) == after.cct.exclusive[:, COL["kernel_count"]]).all()
        assert int(after.activities.count.sum()) == int(before.activities.count.sum())


# -- the split ---------------------------------------------------------------------------------

@pytest.mark.parametrize("values,weights", [([10, 0, 7, 1], [1, 1, 1]), ([2**62, 5], [3, 1, 7]), ([1], [1])])
def test_split_int_sums_exactly(values, weights):
    out = split_int(np.array(values, dtype=np.int64), weights)
    assert out.sum(axis=0).tolist() == values
    assert (out >= 0).all()
    # equal weights: shares differ by at most one
    if len(set(weights)) == 1:
        assert (out.max(axis=0) - out.min(axis=0) <= 1).all()


def test_transport_margins():
    rows, cols = np.array([5, 0, 9, 2]), np.array([7, 7, 2])
    x = transport(rows, cols)
    assert x.sum(axis=1).tolist() == rows.tolist() and x.sum(axis=0).tolist() == cols.tolist()
    assert (x >= 0).all()


# -- the transformation on synthetic profiles --------------------------------------------------

def test_fused_kernel_shared_between_its_lines():
    before = build([(CALL + [py(GEN, 50, "call"), kernel("triton_fused_0")], 1001),
                    (CALL + [py(GEN, 52, "call"), Frame("op", "aten::mm"), kernel("sgemm")], 500)],
                   cpu={len(CALL) + 1: 40})
    after = attribute_compiled(before, provenance())
    check_conserved(before, after)
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    assert len(fused) == 3
    shares = sorted(int(after.cct.inclusive[i, COL["kernel_time"]]) for i in fused)
    assert sum(shares) == 1001 and shares[-1] - shares[0] <= 1
    # each share sits under its own model line, below the compiled call's context (not the def line)
    got = sorted(lines_above(after, i)[-1] for i in fused)
    assert got == [(MODEL, 10), (MODEL, 11), (MODEL, 12)]
    for i in fused:
        path = after.call_path(i)
        assert path[0] == CALL[0] and (MODEL, 8) not in [(f.file, f.line) for f in path]
        assert after.frame_of(i) == fused_frame("triton_fused_0")
    # the extern mm keeps its op and kernel beneath, with its host time, on line 9
    (mm,) = nodes_named(after, "aten::mm")
    assert lines_above(after, mm)[-1] == (MODEL, 9)
    assert after.cct.exclusive[mm, COL["cpu_time"]] == 40
    assert not nodes_named(after, NO_PROVENANCE.name)
    assert not any(f.file == GEN for f in (after.frame_of(i) for i in range(len(after.cct))))
    cp = after.meta["compiled_provenance"]
    assert cp["units_placed"] == 2 and cp["units_without_provenance"] == 0 and "compiled_provenance" not in before.meta


TRITON = "/usr/lib/python3.11/site-packages/torch/_inductor/runtime/triton_heuristics.py"
BENCH = "/usr/lib/python3.11/site-packages/torch/_inductor/runtime/benchmarking.py"


def test_autotuning_goes_under_its_own_node_not_the_model_lines():
    """A Triton kernel's first run benchmarks its configs beneath the generated call line: that
    work goes to the compiled call's context under [torch.compile autotuning]; the kernel's own
    run (the same unit's other branch) still goes to its model lines."""
    run = [py(GEN, 50, "call"), py(TRITON, 1448, "run")]
    tune = run + [py(TRITON, 1176, "autotune_to_one_config"), py(TRITON, 1139, "benchmark_all_configs"),
                  py(BENCH, 419, "benchmark_gpu")]
    before = build([(CALL + run + [kernel("triton_fused_0")], 300),
                    (CALL + tune + [kernel("triton_fused_0")], 7000),
                    (CALL + tune + [Frame("op", "aten::zero_"), kernel("vectorized_elementwise_kernel")], 5000),
                    # max-autotune's choices benchmarked while compiling: no generated line above
                    (CALL[:2] + [py(BENCH, 95, "wrapper"), kernel("cutlass_gemm")], 11)])
    after = attribute_compiled(before, provenance())
    check_conserved(before, after)
    tuned = nodes_named(after, AUTOTUNING.name)
    assert len(tuned) == 2
    by_place = {tuple(lines_above(after, i)): int(after.cct.inclusive[i, COL["kernel_time"]]) for i in tuned}
    # beneath the line that calls the compiled model (not its def line); the compile-time
    # benchmark beneath the innermost source line above it
    assert by_place[((CALL[0].file, 30), (CALL[1].file, 1789))] == 12000
    assert by_place[((CALL[0].file, 30),)] == 11
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    assert sorted(int(after.cct.inclusive[i, COL["kernel_time"]]) for i in fused) == [100, 100, 100]
    for i in fused:
        assert AUTOTUNING not in after.call_path(i)
    assert not nodes_named(after, NO_PROVENANCE.name)
    assert after.meta["compiled_provenance"]["autotuning_subtrees"] == 2


DATA = Path(__file__).parent / "data" / "inductor"


@pytest.mark.parametrize("graph", ["forward", "backward"])
def test_real_triton_wrapper_calls_map_to_their_kernels(graph):
    """Real Triton wrapper code (tests/data/inductor): the handle comment is followed by
    `stream0 = get_raw_stream(0)` before the `.run(` call; each call line maps to its kernel, and
    every kernel, Triton or extern, carries the stack traces Inductor recorded for it."""
    src = (DATA / f"triton_mlp_{graph}.py.txt").read_text()
    raw = (DATA / f"triton_mlp_{graph}.json").read_text()
    lines = src.splitlines()
    mod = compiled_module("/tmp/torchinductor_u/x/cx.py", src, raw, graph == "backward")
    handles = [ln.split(HANDLE)[1].strip() for ln in lines if HANDLE in ln]
    assert handles and sorted(set(mod.lines.values())) == sorted(handles)
    for ln, key in mod.lines.items():
        name = key.rsplit(":", 1)[0]
        assert lines[ln - 1].strip().startswith((f"{name}.run(", f"{name}(")), (ln, key)
    assert sum(1 for k in mod.kernels.values() if k.name.startswith("triton_")) >= 5
    assert all(k.traces for k in mod.kernels.values() if not k.name.startswith("aten.randint"))
    # the extern addmm of `h = s.fc(h)`: its line in the probe's MLP
    if graph == "forward":
        fc = mod.kernels["extern_kernels.addmm:4"].lines()
        assert [(f.file.rsplit("/", 1)[-1], f.line) for f in fc] == [("prov_probe.py", 34)]


HANDLE = "[Provenance debug handles] "


def test_graph_break_resume_functions_read_as_the_function_they_resume():
    f = source_frame(MODEL, 47, "torch_dynamo_resume_in_forward_at_46")
    assert f == source_frame(MODEL, 47, "forward") and f.label().endswith(":47 forward")
    assert source_frame(MODEL, 3, "torch_dynamo_resume_in_my_fn_at_2").function == "my_fn"


def test_mix_order_reduction_call_and_its_extra_round():
    """A mix-order reduction kernel (layer-norm backward on GPUs) as the real wrapper writes it
    (tests/data/inductor's nanoGPT backward, with the handle dlpt's hook adds at `call_kernel`):
    the workspace allocation before the call is not the kernel, the extra round of reduction over
    the workspace after it is."""
    src = textwrap.dedent("""\
        def call():
            buf9 = empty_strided_cuda((64, 256, 384), (98304, 384, 1), torch.bfloat16)
            # Call mix order reduction kernel
            # Topologically Sorted Source Nodes: [view_30, sum_5], Original ATen: [aten.view]
            # [Provenance debug handles] triton_per_fused_norm_1:7
            workspace_0 = empty_strided_cuda((393216, ), (1, ), torch.float32)
            stream0 = get_raw_stream(0)
            triton_per_fused_norm_1.run(buf3, primals_16, mul_24,
                                        workspace_0, 16384, 384, stream=stream0)
            buf8 = workspace_0[0 * 1024 * 384 : (0 + 1) * 1024 * 384].view(1024, 384).sum(dim=0)
            buf7 = workspace_0[1 * 1024 * 384 : (1 + 1) * 1024 * 384].view(1024, 384).sum(dim=0)
            del buf3
            # [Provenance debug handles] extern_kernels.mm:8
            extern_kernels.mm(buf9, buf8, out=buf10)
        """)
    assert call_lines(src) == {8: "triton_per_fused_norm_1:7", 9: "triton_per_fused_norm_1:7",
                               10: "triton_per_fused_norm_1:7", 11: "triton_per_fused_norm_1:7",
                               14: "extern_kernels.mm:8"}


def test_rows_of_one_leaf_split_consistently():
    """Several activity rows on one leaf (an imported trace: one row per launch): every share's
    rows sum to that share's metrics, and no row is lost or invented."""
    leaf = CALL + [py(GEN, 50, "call"), kernel("triton_fused_0")]
    before = build([(leaf, 7), (leaf, 11), (leaf, 5), (leaf, 0)])
    after = attribute_compiled(before, provenance())
    check_conserved(before, after)
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    assert sorted(int(after.cct.inclusive[i, COL["kernel_count"]]) for i in fused) == [1, 1, 2]
    assert sorted(int(after.cct.inclusive[i, COL["kernel_time"]]) for i in fused) == [7, 8, 8]


def test_backward_kernels_under_forward_lines():
    bwd_path = CALL[:3] + [Frame("op", "CompiledFunction"), BACKWARD_FRAME, Frame("op", "CompiledFunctionBackward"),
                           py(GEN2, 70, "call"), kernel("triton_fused_0")]
    before = build([(CALL + [py(GEN, 50, "call"), kernel("triton_fused_0")], 90), (bwd_path, 31)])
    after = attribute_compiled(before, provenance())
    check_conserved(before, after)
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    bwd = [i for i in fused if BACKWARD_FRAME in after.call_path(i)]
    assert len(bwd) == 2 and len(fused) == 5
    assert sorted(int(after.cct.inclusive[i, COL["kernel_time"]]) for i in bwd) == [15, 16]
    for i in bwd:
        path = after.call_path(i)
        # forward context → model line → [backward] → [fused K], as eager backward ops read
        assert path[-2] == BACKWARD_FRAME and path[-3].file == MODEL and path[-3].line in (10, 12)
        assert path[0] == CALL[0]


def test_no_provenance_stays_with_reason():
    before = build([(CALL + [py(GEN, 54, "call"), kernel("orphan")], 70),
                    (CALL + [py(GEN, 60, "call"), Frame("op", "aten::zero_"), kernel("memset_k")], 5),
                    (CALL + [py(GEN, 61, "call"), Frame("op", "aten::empty")], 0)],
                   cpu={len(CALL) + 1: 3})
    after = attribute_compiled(before, provenance())
    check_conserved(before, after)
    reasons = nodes_named(after, NO_PROVENANCE.name)
    assert len(reasons) == 2 and after.meta["compiled_provenance"]["units_without_provenance"] == 2
    for r in reasons:
        assert after.call_path(r)[-2].file == GEN  # still under the compiled code's line
    # host-only work without provenance is left exactly where it was
    (empty,) = nodes_named(after, "aten::empty")
    assert after.call_path(empty)[-2] == py(GEN, 61, "call")


def test_cuda_graph_replays_by_module_and_direction():
    """CUDA-graph replays (`mode="reduce-overhead"`): no op and no generated line launched them.
    Beneath a generated module's `call` (how Inductor runs its graphs), that module's kernels of
    the leaf's name are the candidates; with no generated frame above, the modules of the
    replay's direction. A library kernel that no recorded run before the capture launched (the
    capture not recorded) keeps its place, with that reason; one whose capture was recorded goes
    where its extern call went then."""
    runtime = [py("/x/site-packages/torch/_inductor/cudagraph_trees.py", 2000, "run_graph")]
    replay = CALL + runtime
    prov = provenance()
    prov.modules[GEN].lines[56] = "triton_solo_9:4"
    prov.modules[GEN].kernels["triton_solo_9:4"] = KernelProvenance("triton_solo_9:4", "triton_solo_9", tr(13))
    bwd_ctx = CALL[:3] + [Frame("op", "CompiledFunction"), BACKWARD_FRAME, Frame("op", "CompiledFunctionBackward")]
    before = build([(replay + [kernel("triton_solo_9")], 40),
                    (replay + [kernel("triton_fused_0")], 30),  # forward: the forward module's lines
                    (bwd_ctx + [py(GEN2, 90, "call")] + runtime + [kernel("triton_fused_0")], 20),  # beneath GEN2
                    (replay + [kernel("sm90_xmma_gemm")], 9),  # cuBLAS, capture not recorded
                    (CALL[:1] + [kernel("triton_solo_9")], 7)])
    after = attribute_compiled(before, prov)
    check_conserved(before, after)
    (solo,) = nodes_named(after, f"{FUSED_PREFIX}triton_solo_9]")
    assert lines_above(after, solo)[-1] == (MODEL, 13)
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    fwd = sorted((lines_above(after, i)[-1][1], int(after.cct.inclusive[i, COL["kernel_time"]]))
                 for i in fused if BACKWARD_FRAME not in after.call_path(i))
    bwd = sorted((lines_above(after, i)[-1][1], int(after.cct.inclusive[i, COL["kernel_time"]]))
                 for i in fused if BACKWARD_FRAME in after.call_path(i))
    assert fwd == [(10, 10), (11, 10), (12, 10)] and bwd == [(10, 10), (12, 10)]
    (reason,) = nodes_named(after, NOT_LEARNED.name)
    assert after.frame_of(after.cct.children(reason)[0]).name == "sm90_xmma_gemm"
    assert after.meta["compiled_provenance"]["units_without_provenance"] == 1
    # a kernel outside compiled code and outside a graph replay is not touched
    assert any(after.call_path(i) == CALL[:1] + [kernel("triton_solo_9")] for i in nodes_named(after, "triton_solo_9"))
    # the capture recorded: the gemm launched under the module's extern mm (line 9) is recognised
    learned = build([(CALL + [py(GEN, 52, "call"), Frame("op", "aten::mm"), kernel("sm90_xmma_gemm")], 5),
                     (replay + [kernel("sm90_xmma_gemm")], 9)])
    placed = attribute_compiled(learned, prov)
    check_conserved(learned, placed)
    gemms = [i for i in nodes_named(placed, "sm90_xmma_gemm") if lines_above(placed, i)[-1] == (MODEL, 9)]
    assert sum(int(placed.cct.inclusive[i, COL["kernel_time"]]) for i in gemms) == 14
    # cudagraph trees' warm-up runs the generated code under a dispatch mode: Python frames, not
    # the aten op, lie between the generated line and the launch; the line still names the call
    ops = py("/x/site-packages/torch/_ops.py", 865, "__call__")
    warm = build([(CALL + [py(GEN, 52, "call"), ops, kernel("sm90_xmma_gemm")], 5), (replay + [kernel("sm90_xmma_gemm")], 9)])
    placed = attribute_compiled(warm, prov)
    check_conserved(warm, placed)
    assert not nodes_named(placed, NOT_LEARNED.name)
    gemms = [i for i in nodes_named(placed, "sm90_xmma_gemm") if (MODEL, 9) in lines_above(placed, i)]
    assert sum(int(placed.cct.inclusive[i, COL["kernel_time"]]) for i in gemms) == 14


def test_the_cudagraph_runtimes_own_ops_are_not_replays():
    """The runtime launches eager work of its own beside each replay: cudagraph trees copy a call's
    inputs into the graph's buffers, and `CUDAGraph.replay()` fills the RNG's seed and offset
    before the launch (paths as gpt-fast `--compile` recorded them on an H100). An aten op
    launched those kernels: they stay where they ran, never an unattributed 'replay'."""
    trees = "/x/site-packages/torch/_inductor/cudagraph_trees.py"
    run = CALL + [py(trees, 2258, "_run"), py(trees, 1150, "run")]
    copy = run + [py(trees, 1111, "_copy_inputs_and_remove_from_src"), Frame("op", "aten::_foreach_copy_"),
                  kernel("multi_tensor_apply_kernel")]
    graphs = py("/x/site-packages/torch/cuda/graphs.py", 139, "replay")
    fill = run + [py(trees, 1261, "run_graph"), graphs, Frame("op", "aten::fill_"), kernel("FillFunctor")]
    replayed = run + [py(trees, 1261, "run_graph"), graphs, kernel("triton_solo_9")]
    prov = provenance()
    prov.modules[GEN].kernels["triton_solo_9:4"] = KernelProvenance("triton_solo_9:4", "triton_solo_9", tr(13))
    before = build([(copy, 6), (fill, 4), (replayed, 40)])
    after = attribute_compiled(before, prov)
    check_conserved(before, after)
    assert not nodes_named(after, NOT_LEARNED.name)
    for path, ns in ((copy, 6), (fill, 4)):
        (i,) = [i for i in nodes_named(after, path[-1].name) if after.call_path(i) == path]
        assert int(after.cct.inclusive[i, COL["kernel_time"]]) == ns
    # the replay beside them still goes to its model line
    (solo,) = nodes_named(after, f"{FUSED_PREFIX}triton_solo_9]")
    assert lines_above(after, solo)[-1] == (MODEL, 13)
    assert after.meta["compiled_provenance"]["units_without_provenance"] == 0


def test_region_without_generated_frames():
    """A recording reads no Python frames while an op is open, so inside `Torch-Compiled Region`
    kernels and ops have no generated-code frame: the region's compile id names the module, the
    kernel's name (or the aten op an extern kernel calls) the kernel."""
    prov = provenance()
    prov.modules[GEN].lines[58] = "extern_kernels.mm:5"
    prov.modules[GEN].kernels["extern_kernels.mm:5"] = KernelProvenance("extern_kernels.mm:5", "extern_kernels.mm", tr(13))
    prov.regions = {("0/0", False): GEN, ("0/0", True): GEN2}
    region = CALL[:2] + [Frame("op", "Torch-Compiled Region: 0/0"), Frame("op", "CompiledFunction")]
    before = build([(region + [kernel("triton_fused_0")], 30),
                    (region + [Frame("op", "aten::mm"), kernel("sgemm")], 41),
                    (region + [BACKWARD_FRAME, Frame("op", "CompiledFunctionBackward"), kernel("triton_fused_0")], 8),
                    (region + [Frame("op", "aten::zero_"), kernel("memset")], 2),
                    (CALL[:2] + [Frame("op", "Torch-Compiled Region: 1/0"), kernel("triton_fused_0")], 5)])
    after = attribute_compiled(before, prov)
    check_conserved(before, after)
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    fwd = sorted(lines_above(after, i)[-1][1] for i in fused if BACKWARD_FRAME not in after.call_path(i))
    bwd = sorted(lines_above(after, i)[-1][1] for i in fused if BACKWARD_FRAME in after.call_path(i))
    assert fwd == [10, 11, 12] and bwd == [10, 12]
    for i in fused:  # the context is everything above the region op
        assert after.call_path(i)[:2] == CALL[:2]
    # two extern mm kernels in the module: the aten::mm op is shared between their lines
    mm = nodes_named(after, "aten::mm")
    assert sorted(lines_above(after, i)[-1][1] for i in mm) == [9, 13]
    assert sorted(int(after.cct.inclusive[i, COL["kernel_time"]]) for i in mm) == [20, 21]
    # a replay of the graph launches sgemm with no op open: it goes where aten::mm's sgemm went
    replayed = build([(region + [Frame("op", "aten::mm"), kernel("sgemm")], 41), (region + [kernel("sgemm")], 10)])
    again = attribute_compiled(replayed, prov)
    check_conserved(replayed, again)
    leaves = [i for i in nodes_named(again, "sgemm") if again.frame_of(int(again.cct.parent[i])).name != "aten::mm"]
    assert sorted(lines_above(again, i)[-1][1] for i in leaves) == [9, 13]
    assert sum(int(again.cct.inclusive[i, COL["kernel_time"]]) for i in leaves) == 10
    # not in the module, and a region with no collected module: kept, with the reason
    reasons = nodes_named(after, NO_PROVENANCE.name)
    assert sorted(after.frame_of(after.cct.children(r)[0]).name for r in reasons) == ["aten::zero_", "triton_fused_0"]


def test_backward_under_compiled_function_without_region_op():
    """The recorder's current shape: the forward's generated code runs beside the
    `CompiledFunction` op (frames read), its backward ops sit under that op by sequence number
    with no frames. The forward modules run there name the backward module by compile id; a
    CUDA-graph replay's cuBLAS kernel goes where the same kernel went under an aten op."""
    prov = provenance()
    gen3 = "/tmp/torchinductor_u/ef/cef3.py"  # a recompilation's forward, other kernels
    prov.modules[gen3] = CompiledModule(gen3, False, lines={50: "other_0:1"})
    prov.modules[gen3].kernels["other_0:1"] = KernelProvenance("other_0:1", "other_0", tr(15))
    prov.regions = {("0/0", False): GEN, ("0/0", True): GEN2, ("0/1", False): gen3}
    apply = CALL + [py("/x/site-packages/torch/autograd/function.py", 625, "apply")]
    replay = apply + [py("/x/site-packages/torch/_inductor/cudagraph_trees.py", 1000, "run")]
    before = build([(apply + [py(GEN, 50, "call"), kernel("triton_fused_0")], 60),
                    (apply + [py(gen3, 50, "call"), kernel("other_0")], 6),
                    (apply + [py(GEN, 52, "call"), Frame("op", "aten::mm"), kernel("sgemm")], 50),
                    (apply + [Frame("op", "CompiledFunction"), BACKWARD_FRAME, Frame("op", "CompiledFunctionBackward"),
                              kernel("triton_fused_0")], 20),
                    (replay + [kernel("sgemm")], 9)])
    after = attribute_compiled(before, prov)
    check_conserved(before, after)
    bwd = [i for i in nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]") if BACKWARD_FRAME in after.call_path(i)]
    assert sorted(lines_above(after, i)[-1][1] for i in bwd) == [10, 12]  # GEN2's traces, not GEN's
    assert sum(int(after.cct.inclusive[i, COL["kernel_time"]]) for i in bwd) == 20
    replayed = [i for i in nodes_named(after, "sgemm") if after.frame_of(int(after.cct.parent[i])).name.startswith(FUSED_PREFIX)]
    assert [lines_above(after, i)[-1][1] for i in replayed] == [9]
    assert not nodes_named(after, NO_PROVENANCE.name)


def test_pure_and_noop_without_provenance():
    before = build([(CALL + [py(GEN, 50, "call"), kernel("triton_fused_0")], 10)])
    snap = (before.cct.parent.copy(), before.cct.exclusive.copy(), list(before.frames), before.activities.node.copy())
    attribute_compiled(before, provenance())
    assert (before.cct.parent == snap[0]).all() and (before.cct.exclusive == snap[1]).all()
    assert before.frames == snap[2] and (before.activities.node == snap[3]).all()
    assert attribute_compiled(before, Provenance()) is before


def test_note_and_store_roundtrip(tmp_path):
    before = build([(CALL + [py(GEN, 50, "call"), kernel("triton_fused_0")], 3000)])
    after = attribute_compiled(before, provenance())
    fused = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    note = fused_note(after, fused[0], "kernel_time")
    assert "3.0" in note and all(f"model.py:{ln}" in note for ln in (10, 11, 12))
    assert fused_note(after, 0) == ""
    save(after, tmp_path / "a.dlpt")
    back = load(str(tmp_path / "a.dlpt"))
    assert (back.cct.inclusive[0] == after.cct.inclusive[0]).all()
    assert len(nodes_named(back, f"{FUSED_PREFIX}triton_fused_0]")) == 3


def test_provenance_roundtrip_and_parsers():
    prov = provenance()
    prov.regions[("0/0", False)] = GEN
    snap = prov.snapshot()
    assert snap.modules == prov.modules and snap.regions == prov.regions and snap.modules is not prov.modules
    back = Provenance.from_dict(prov.to_dict())
    assert back.regions == prov.regions
    assert back.modules[GEN2].backward and back.at(GEN, 52).traces == tr(9)
    t = parse_trace('  File "/a/m.py", line 12, in forward\n    y = f(x)\n        ^^^^\n'
                    '  File "/a/n.py", line 3, in f\n    return x\n')
    assert t == (SourceFrame("/a/m.py", 12, "forward"), SourceFrame("/a/n.py", 3, "f"))
    # a script run by a relative path: its frames are absolute in a recording, so here too
    assert parse_trace('  File "sub/m.py", line 2, in f\n', "/w")[0].file == "/w/sub/m.py"
    src = "def call():\n    # [Provenance debug handles] k:1\n    k.run(a,\n          b)\n    x = 1\n"
    assert call_lines(src) == {3: "k:1", 4: "k:1"}


# -- real provenance from Inductor's C++ backend -----------------------------------------------

PROGRAM = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):
        y = self.fc(x)  # LINE: fc
        y = torch.relu(y) * 2  # LINE: act
        torch._dynamo.graph_break()
        return self.ln(y).sum()  # LINE: ln
'''


def markers(text: str) -> dict[str, int]:
    return {m.group(1): i for i, ln in enumerate(text.splitlines(), 1) for m in [re.search(r"# LINE: (\w+)", ln)] if m}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """One compile of a two-region model (a graph break), forward and backward, with provenance
    collected and dlpt's recorder on, as `dlpt record` runs a program; then a second step."""
    torch = pytest.importorskip("torch")
    import torch._inductor.config as inductor_config

    from dlpt.collectors.record.session import Recorder

    d = tmp_path_factory.mktemp("compiled")
    path = d / "net_prog.py"
    path.write_text(textwrap.dedent(PROGRAM))
    spec = importlib.util.spec_from_file_location("net_prog", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["net_prog"] = mod
    spec.loader.exec_module(mod)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = mod.Net()
    x = torch.randn(8, 16)
    eager_out = net(x)
    eager_out.backward()
    eager_grad = net.fc.weight.grad.clone()
    net.zero_grad()
    level, cpu = inductor_config.trace.provenance_tracking_level, inductor_config.cpp.enable_kernel_profile
    # The recording as recorded (attribute=False): the tests attribute it with its provenance.
    rec = Recorder(command="compiled-test", quiet=True, attribute=False)
    prov = rec.provenance  # on CPU it also has Inductor's C++ kernels run as visible ops
    rec.start()
    try:
        # cpu_kernels: each C++ kernel runs inside a RECORD_FUNCTION the recorder sees as an op.
        with inductor_config.patch({"fx_graph_cache": False}):
            cnet = torch.compile(net)
            out = cnet(x)
            out.backward()
            grad = net.fc.weight.grad.clone()
            cnet(x).backward()
            cnet(torch.randn(4, 16)).backward()  # a new shape: a recompilation, new compile ids
    finally:
        profile = rec.stop()
    assert inductor_config.trace.provenance_tracking_level == level
    assert inductor_config.cpp.enable_kernel_profile == cpu
    yield {"prov": prov, "file": str(path), "lines": markers(path.read_text()), "eager": (eager_out, eager_grad),
           "compiled": (out, grad), "profile": profile}
    sys.modules.pop("net_prog", None)


def test_compiled_result_unchanged(compiled):
    torch = pytest.importorskip("torch")
    (eo, eg), (co, cg) = compiled["eager"], compiled["compiled"]
    torch.testing.assert_close(co, eo)
    torch.testing.assert_close(cg, eg)


def test_real_kernels_map_to_marked_lines(compiled):
    prov, file, lines = compiled["prov"], compiled["file"], compiled["lines"]
    mods = list(prov.modules.values())
    # two regions (the graph break), each a forward and a backward graph, compiled twice (two shapes)
    fwd = [m for m in mods if not m.backward]
    assert len(fwd) >= 2 and len(mods) == 2 * len(fwd)
    seen: dict[tuple[bool, str], set[str]] = {}
    for m in mods:
        assert m.lines and all(k in m.kernels for k in m.lines.values())
        src = Path(m.file).read_text().splitlines()
        for ln, key in m.lines.items():
            assert key.rsplit(":", 1)[0] in src[ln - 1]  # the mapped line calls that kernel
        for k in m.kernels.values():
            assert k.traces, k.key
            for t in k.traces:
                assert t[-1].file == file
            marks = {name for name, ln in lines.items() if ln in {f.line for f in k.lines()}}
            assert marks, (k.key, k.lines())
            seen.setdefault((m.backward, "mm" if "mm" in k.name else "other"), set()).update(marks)
    # the matmul (forward addmm, backward mm) comes from the Linear line, in both directions
    assert seen[(False, "mm")] == {"fc"} and seen[(True, "mm")] == {"fc"}
    assert {"act", "ln"} <= seen[(False, "other")] and {"act", "ln"} <= seen[(True, "other")]


def test_real_provenance_through_the_transformation(compiled):
    """Every kernel call line of every real generated module, placed as a recording would place
    it (forward under the compiled call, backward under `[backward]`), lands on marked lines."""
    prov, file, lines = compiled["prov"], compiled["file"], compiled["lines"]
    paths = []
    for m in prov.modules.values():
        for ln, key in m.lines.items():
            ctx = [py("/home/u/train.py", 5, "<module>"), py(file, lines["fc"] - 1, "forward")]
            if m.backward:
                ctx += [Frame("op", "CompiledFunction"), BACKWARD_FRAME]
            paths.append((ctx + [py(m.file, ln, "call"), kernel(key.rsplit(":", 1)[0])], 1000 + ln))
    before = build(paths)
    after = attribute_compiled(before, prov)
    check_conserved(before, after)
    marked = set(lines.values())
    leaves = [i for i in range(len(after.cct)) if after.frame_of(i).kind == "kernel"]
    assert leaves
    for i in leaves:
        path = after.call_path(i)
        assert path[-2].name.startswith(FUSED_PREFIX)
        src = [f for f in path if f.file == file]
        assert src[-1].line in marked
        assert (BACKWARD_FRAME in path) == (path[-3] == BACKWARD_FRAME)


def test_profiled_cpp_kernels_are_visible_and_named(compiled):
    """With `cpp.enable_kernel_profile`, each C++ kernel runs inside a RECORD_FUNCTION named
    `graph_N_<kernel>`: the recording has it as an op, and provenance resolves the name."""
    prov, prof = compiled["prov"], compiled["profile"]
    cpp = {prof.frame_of(i).name for i in range(len(prof.cct)) if re.match(r"graph_\d+_cpp_fused", prof.frame_of(i).name)}
    assert cpp
    for name in cpp:
        assert prov.by_name(name), name


def test_recorded_compiled_run_lands_on_marked_lines(compiled):
    """The recording of the compiled run, attributed: every compiled C++ kernel and every aten op
    called by the generated code sits under `[fused K]` beneath a marked model line, backward ones
    under `[backward]`, and the host time is what the recording measured, to the nanosecond."""
    prov, prof, file, lines = compiled["prov"], compiled["profile"], compiled["file"], compiled["lines"]
    after = attribute_compiled(prof, prov)
    assert (after.cct.inclusive[0] == prof.cct.inclusive[0]).all()
    marked = set(lines.values())
    placed: dict[bool, set[str]] = {False: set(), True: set()}
    for i in range(len(after.cct)):
        f = after.frame_of(i)
        if not f.name.startswith(FUSED_PREFIX):
            continue
        path = after.call_path(i)
        model = [p for p in path if p.file == file]
        assert model and model[-1].line in marked, [p.label() for p in path]
        bwd = path[-2] == BACKWARD_FRAME
        placed[bwd] |= {n for n, ln in lines.items() if ln == model[-1].line}
        assert after.cct.inclusive[i, COL["cpu_time"]] > 0
    # both regions (before and after the graph break), both directions, every marked line
    assert placed[False] == set(lines) and placed[True] == set(lines)
    # the recompilation's regions were collected apart from the first compile's, and used
    ids = {cid for cid, _ in prov.regions}
    assert len(ids) >= 3
    assert {REGION_PREFIX + cid for cid in ids} <= {f.name for f in prof.frames}
    # no compiled kernel is left outside a [fused] node, in the recording's compiled regions
    for i in range(len(after.cct)):
        if re.match(r"graph_\d+_cpp_fused", after.frame_of(i).name):
            assert any(p.name.startswith(FUSED_PREFIX) for p in after.call_path(i))


def test_tui_detail_shows_the_whole_fused_kernel():
    """The TUI's detail pane of a `[fused K]` row says K's full time and every line it spans."""
    from conftest import detail_text

    after = attribute_compiled(build([(CALL + [py(GEN, 50, "call"), kernel("triton_fused_0")], 3_000_000)]),
                               provenance())
    (fused, *_) = nodes_named(after, f"{FUSED_PREFIX}triton_fused_0]")
    text, _ = detail_text(after, lambda f: f == after.frame_of(fused))
    assert "triton_fused_0" in text and "3.0" in text
    assert all(f"model.py:{ln}" in text for ln in (10, 11, 12))


CACHED = '''
import torch


def f(x):
    return torch.relu(x) * 2 + 1  # LINE: f
'''


def test_warm_compile_cache_still_gives_provenance(tmp_path):
    """Inductor leaves `trace.*` out of its cache keys: a graph cached by an unrecorded run would
    come back without provenance. The recorded run must compile (or find) its own entry."""
    torch = pytest.importorskip("torch")
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import fresh_cache

    path = tmp_path / "cached_prog.py"
    path.write_text(textwrap.dedent(CACHED))
    spec = importlib.util.spec_from_file_location("cached_prog", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(64)
    before = inductor_config.post_grad_custom_post_pass
    with fresh_cache(), inductor_config.patch({"fx_graph_cache": True}):
        torch._dynamo.reset()
        torch.compile(mod.f)(x)  # an unrecorded run fills the cache
        torch._dynamo.reset()
        with ProvenanceRecorder() as prov:
            out = torch.compile(mod.f)(x)
    assert inductor_config.post_grad_custom_post_pass is before
    torch.testing.assert_close(out, mod.f(x))
    line = markers(path.read_text())["f"]
    kernels = [k for m in prov.modules.values() for k in m.kernels.values()]
    assert kernels and all(k.traces and k.lines()[-1].line == line for k in kernels)


LAZY = '''
import json, sys
import torch
from dlpt.collectors.record.provenance import ProvenanceRecorder

prov = ProvenanceRecorder()
prov.start()
before = "torch._inductor.config" in sys.modules


def f(x):
    return torch.sigmoid(x) * 3  # LINE: f


torch.compile(f)(torch.randn(8))
import torch._inductor.codegen.triton as T  # noqa: E402 - a GPU compile imports it; here, after Inductor

hooked = T.TritonScheduling.codegen_comment.__qualname__
prov.stop()
lines = sorted({fr.line for m in prov.modules.values() for k in m.kernels.values() for fr in k.lines()})
print(json.dumps({"imported_at_start": before, "lines": lines, "hooked": hooked,
                  "after_stop": T.TritonScheduling.codegen_comment.__qualname__}))
'''


def test_start_does_not_import_inductor_until_the_program_does(tmp_path):
    """Importing Inductor costs a second or more: a program that never compiles must not pay it;
    one that does still gets provenance, the hook installing itself as Inductor loads."""
    import json
    import subprocess

    pytest.importorskip("torch")
    path = tmp_path / "lazy_prog.py"
    path.write_text(textwrap.dedent(LAZY))
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["imported_at_start"] is False
    assert got["lines"] == [markers(path.read_text())["f"]]
    # the mix-order reduction hook is on Triton's codegen while recording, and only then
    assert got["hooked"].startswith("handle_mix_order_kernels.") and got["after_stop"] == "TritonScheduling.codegen_comment"


@pytest.mark.parametrize("seed", range(8))
def test_random_profiles_conserve_everything(seed):
    """Random mixes of eager paths, generated-code calls with 0-4 source lines, backward units,
    region units and several launches per leaf: totals, activity rows and counts all hold."""
    rng = np.random.default_rng(seed)
    prov = Provenance()
    mod = CompiledModule(GEN, False)
    bmod = CompiledModule(GEN2, True)
    for m in (mod, bmod):
        for ln in range(40, 60):
            key = f"k{ln}:{ln}"
            m.lines[ln] = key
            m.kernels[key] = KernelProvenance(key, f"k{ln}", tr(*rng.choice(np.arange(10, 20), rng.integers(0, 5), replace=False)),
                                              m.backward)
    prov.modules = {GEN: mod, GEN2: bmod}
    prov.regions = {("0/0", False): GEN, ("0/0", True): GEN2}
    paths = []
    for _ in range(int(rng.integers(5, 60))):
        ns = int(rng.integers(0, 10**9))
        ln = int(rng.integers(38, 62))
        r = rng.integers(0, 4)
        if r == 0:
            paths.append(([py("/home/u/train.py", ln, "<module>"), Frame("op", "aten::add"), kernel("eager_k")], ns))
        elif r == 1:
            paths.append((CALL + [py(GEN, ln, "call"), kernel(f"k{ln}")], ns))
        elif r == 2:
            paths.append((CALL[:3] + [Frame("op", "CompiledFunction"), BACKWARD_FRAME, py(GEN2, ln, "call"),
                                      Frame("op", "aten::mm"), kernel("gemm")], ns))
        else:
            paths.append((CALL[:2] + [Frame("op", "Torch-Compiled Region: 0/0"), kernel(f"k{ln}")], ns))
    before = build(paths, cpu={len(CALL): int(rng.integers(0, 1000))})
    after = attribute_compiled(before, prov)
    check_conserved(before, after)
    for i in range(len(after.cct)):
        f = after.frame_of(i)
        if f.name.startswith(FUSED_PREFIX):
            assert after.call_path(i)[-2].kind in ("python", "backward")
    # eager work is untouched
    eager = [i for i in range(len(before.cct)) if before.frame_of(i).name == "eager_k"]
    eager_after = [i for i in range(len(after.cct)) if after.frame_of(i).name == "eager_k"]
    assert sorted(before.cct.inclusive[eager, COL["kernel_time"]].tolist()) == \
        sorted(after.cct.inclusive[eager_after, COL["kernel_time"]].tolist())


def test_compiling_is_a_phase_of_its_own(compiled):
    """Dynamo's compiles (the first call, the lazy backward's, the recompile for a new shape) run
    inside the compile phase (collectors/record/phases.py's hooks), and the compile frames' host
    time is there, not in the steady state; what the compiled code runs after is another phase."""
    from dlpt.compile_time import compile_roots
    from dlpt.phases import COMPILE, phase_figures, select_phase

    prof = compiled["profile"]
    figs = {f.name: f for f in phase_figures(prof)}
    assert COMPILE in figs and figs[COMPILE].wall > 0
    spans = prof.meta["phase_spans"]
    # Three compiles at least (forward, backward, and the new shape's), each a stretch of its own.
    assert sum(1 for s in spans if s[2] == COMPILE) >= 2, spans

    def compile_host(p):
        roots, kinds = compile_roots(p)
        return int(p.cct.inclusive[roots[kinds == "compiling"], COL["host_time"]].sum()) if len(roots) else 0

    total = compile_host(prof)
    assert total > 0
    in_compile = compile_host(select_phase(prof, COMPILE))
    outside = total - in_compile
    # Measured: all of it but a sample or two taken as a compile ended (a sample's time is
    # that of the period before it): at most 2 ms here.
    assert outside <= 0.02 * total + 2_000_000, (in_compile, total)
