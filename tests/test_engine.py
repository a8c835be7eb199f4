"""The attribution engine on the real H200 traces: conservation, linking, views, invariants."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import TRACE_NAMES, raw_events, trace_path

import dlpt
from dlpt.metrics import COL, METRICS
from dlpt.transforms import hide_library, hide_library_unless
from dlpt.viewers.hotspots import hotspots, summary
from dlpt.views import GROUPINGS, bottom_up, flat

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}

_cache: dict[str, dlpt.Profile] = {}


def load(name: str) -> dlpt.Profile:
    if name not in _cache:
        _cache[name] = dlpt.load(str(trace_path(name)))
    return _cache[name]


def input_gpu_ns(name: str) -> int:
    return sum(round(e["dur"] * 1000) for e in raw_events(name)
               if e.get("ph") == "X" and e.get("cat") in GPU_CATS)


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_gpu_time_is_conserved_to_the_nanosecond(name):
    prof = load(name)
    expected = input_gpu_ns(name)
    assert expected > 0
    assert prof.cct.exclusive[:, COL["gpu_time"]].sum() == expected
    assert prof.cct.inclusive[0, COL["gpu_time"]] == expected
    assert int(prof.activities.duration.sum()) == expected
    n_gpu = sum(1 for e in raw_events(name) if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
    assert len(prof.activities) == n_gpu


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_inclusive_is_exclusive_plus_children(name):
    cct = load(name).cct
    child_sum = np.zeros_like(cct.inclusive)
    np.add.at(child_sum, cct.parent[1:], cct.inclusive[1:])
    assert (cct.inclusive == cct.exclusive + child_sum).all()
    # Preorder: every parent precedes its children and subtrees are contiguous slices.
    assert (cct.parent[1:] < np.arange(1, len(cct))).all()
    for i in range(len(cct)):
        kids = cct.children(i)
        assert all(i < k < cct.end[i] for k in kids)


@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize("include_library", [False, True])
def test_views_agree_on_totals(name, include_library):
    prof = hide_library_unless(load(name), include_library)
    total = prof.cct.exclusive.sum(axis=0)
    assert (load(name).cct.exclusive.sum(axis=0) == total).all()
    assert (bottom_up(prof).cct.inclusive[0] == total).all()
    for by in GROUPINGS:
        fv = flat(prof, by)
        assert (fv.exclusive.sum(axis=0) == total).all(), by
        # A group's total never exceeds the whole, and covers its own self time.
        assert (fv.inclusive <= total).all() and (fv.inclusive >= fv.exclusive).all(), by


def test_every_copy_kind_and_its_bytes():
    prof = load("copies")
    events = [e for e in raw_events("copies") if e.get("cat") == "gpu_memcpy"]
    tot = prof.cct.exclusive.sum(axis=0)
    for direction, time_m, bytes_m in (("HtoD", "htod_time", "htod_bytes"), ("DtoH", "dtoh_time", "dtoh_bytes"),
                                       ("DtoD", "dtod_time", "dtod_bytes")):
        sel = [e for e in events if direction in e["name"]]
        assert sel, direction
        assert tot[COL[time_m]] == sum(round(e["dur"] * 1000) for e in sel)
        assert tot[COL[bytes_m]] == sum(e["args"]["bytes"] for e in sel)
    # Pageable and pinned copies stay apart: they are different leaves.
    names = {f.name for f in prof.frames if f.kind == "memcpy"}
    assert {"Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)",
            "Memcpy DtoD (Device -> Device)"} <= names
    assert any("DtoH" in n for n in names)
    assert tot[COL["kernel_count"]] == sum(1 for e in raw_events("copies") if e.get("cat") == "kernel")


def test_memsets_are_counted_as_memsets():
    prof = load("gpt_train")
    memsets = [e for e in raw_events("gpt_train") if e.get("cat") == "gpu_memset"]
    tot = prof.cct.exclusive.sum(axis=0)
    assert tot[COL["memset_time"]] == sum(round(e["dur"] * 1000) for e in memsets)
    assert tot[COL["memset_count"]] == len(memsets)


def test_gpt_train_backward_is_linked_through_its_forward_op():
    prof = load("gpt_train")
    s = summary(hide_library(prof), unit="ns")
    gpu = s["gpu_time"]
    assert s["attributed_to_source"] >= 0.995 * gpu
    # Backward work is, to the nanosecond, the GPU time launched inside autograd's
    # `evaluate_function` ops, read from the raw JSON (5.37 of 8.68 ms, 61.86%).
    ev = [e for e in raw_events("gpt_train") if e.get("ph") == "X"]
    bwd = [e for e in ev if e.get("cat") == "cpu_op" and e["name"].startswith("autograd::engine::evaluate_function: ")]
    launches = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    in_backward = {corr for corr, la in launches.items()
                   if any((b["pid"], b["tid"]) == (la["pid"], la["tid"]) and b["ts"] <= la["ts"] <= b["ts"] + b["dur"]
                          for b in bwd)}
    assert s["backward_time"] == sum(round(e["dur"] * 1000) for e in ev
                                     if e.get("cat") in GPU_CATS and e["args"].get("correlation") in in_backward)
    assert s["unattributed"] == {}
    # A backward kernel sits under the forward op that created its node, beneath [backward].
    for i in range(len(prof.cct)):
        fr = prof.frame_of(i)
        if fr.kind == "kernel" and "fmha_cutlassB" in fr.name:
            path = [f for f in prof.call_path(i)]
            kinds = [f.kind for f in path]
            assert "backward" in kinds
            fwd = path[kinds.index("backward") - 1]
            assert fwd.name == "aten::_scaled_dot_product_efficient_attention"
            assert any(f.has_source and f.file == "capture_traces.py" for f in path)
            break
    else:
        pytest.fail("no backward attention kernel found")


def backward_by_forward_context(prof: dlpt.Profile) -> dict[tuple[str, ...], tuple[int, int]]:
    """(GPU time, host op time) under each `[backward]` marker, by the forward context above it
    (the labels of the path from the root to the marker's parent)."""
    out: dict[tuple[str, ...], tuple[int, int]] = {}
    gpu, cpu = COL["gpu_time"], COL["cpu_time"]
    for i in range(len(prof.cct)):
        if prof.frame_of(i).kind == "backward":
            key = tuple(f.label() for f in prof.call_path(i)[:-1])
            g, c = out.get(key, (0, 0))
            out[key] = (g + int(prof.cct.inclusive[i, gpu]), c + int(prof.cct.inclusive[i, cpu]))
    return out


def test_backward_links_by_sequence_number_where_the_trace_has_no_flows(tmp_path):
    """Every backward op of gpt_train is linked through a `fwdbwd` flow; the same trace with the
    flows taken out must link each through its sequence number instead, to the same forward op:
    the last forward op to carry the number (the one that created the autograd node; an op
    that calls others, like scaled_dot_product_attention around its efficient kernel's op,
    carries it first). The import with the flows is the oracle."""
    with gzip.open(trace_path("gpt_train"), "rt") as f:
        trace = json.load(f)
    flows = [e for e in trace["traceEvents"] if e.get("cat") == "fwdbwd"]
    assert len(flows) == 2 * 570  # a start and an end for each backward op
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "fwdbwd"]
    stripped = tmp_path / "gpt_train_noflows.pt.trace.json.gz"
    with gzip.open(stripped, "wt") as f:
        json.dump(trace, f)
    want = backward_by_forward_context(load("gpt_train"))
    got = backward_by_forward_context(dlpt.load(str(stripped)))
    assert sum(g for g, _ in want.values()) > 0.5 * input_gpu_ns("gpt_train")
    assert any(k[-1] == "aten::_scaled_dot_product_efficient_attention" and g > 0 for k, (g, _) in want.items())
    assert got == want


@pytest.mark.parametrize("name", ["threaded", "cudagraph_mlp"])
def test_no_time_lost_on_threads_and_graph_replays(name):
    prof = load(name)
    s = summary(prof)
    assert s["unattributed"] == {}
    assert s["attributed_to_source"] == s["gpu_time"]


def test_threads_hang_under_the_line_that_started_them():
    prof = load("threaded")
    threads = [i for i in range(len(prof.cct)) if prof.frame_of(i).kind == "thread"]
    assert len(threads) == 2
    total = prof.cct.inclusive[0, COL["gpu_time"]]
    for t in threads:
        path = prof.call_path(t)
        assert path[-2].has_source and path[-2].function == "run"
    assert sum(prof.cct.inclusive[t, COL["gpu_time"]] for t in threads) > 0.9 * total


def test_graph_replay_kernels_under_the_replay_call():
    prof = load("cudagraph_mlp")
    replay = [i for i in range(len(prof.cct)) if prof.frame_of(i).function == "replay"]
    assert replay
    got = sum(prof.cct.inclusive[i, COL["kernel_count"]] for i in replay)
    graph_kernels = 0
    corr = {e["args"]["correlation"]: e["name"] for e in raw_events("cudagraph_mlp")
            if e.get("cat") == "cuda_runtime"}
    for e in raw_events("cudagraph_mlp"):
        if e.get("cat") == "kernel" and corr.get(e["args"]["correlation"]) == "cudaGraphLaunch":
            graph_kernels += 1
    assert got == graph_kernels > 0


def test_hiding_library_frames_keeps_user_code_and_totals():
    prof = load("resnet_infer")
    hidden = hide_library(prof)
    assert (hidden.cct.exclusive.sum(axis=0) == prof.cct.exclusive.sum(axis=0)).all()
    files = {f.file for i in range(len(hidden.cct)) for f in [hidden.frame_of(i)] if f.has_source}
    assert "capture_traces.py" in files
    # torchvision is model code: it stays. torch's own machinery goes.
    assert any(f.startswith("torchvision/") for f in files)
    assert not any(f.startswith("torch/") for f in files)


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_hotspots_document(name):
    prof = load(name)
    doc = hotspots(prof, top=10)
    assert doc["schema"] == "dlpt.hotspots/2" and doc["unit"] == "us"
    s = doc["summary"]
    gpu = input_gpu_ns(name) / 1000
    assert s["gpu_time"] == pytest.approx(gpu, abs=1e-3)
    mc = s["memcpy_time"]
    assert s["kernel_time"] + s["memset_time"] + mc["HtoD"] + mc["DtoH"] + mc["DtoD"] + mc["other"] == \
        pytest.approx(s["gpu_time"], abs=0.01)
    hs = doc["hotspots"]
    assert hs and [h["position"] for h in hs] == list(range(1, len(hs) + 1))
    assert all(a["gpu_time"] >= b["gpu_time"] for a, b in zip(hs, hs[1:]))
    for h in hs:
        assert h["file"] and h["line"] > 0 and h["call_path"][-1].endswith(f":{h['line']} {h['function']}")
        assert h["top_kernels"] and h["count"] >= 1
    # Hotspots partition the source-attributed time: the full list sums to it.
    full = hotspots(prof, top=10**6)["hotspots"]
    assert sum(h["gpu_time"] for h in full) == pytest.approx(s["attributed_to_source"], rel=1e-9, abs=0.01)


def test_cpu_time_metric_ranks_host_ops():
    doc = hotspots(load("gpt_train"), metric="cpu_time", top=5)
    assert doc["metric"] == "cpu_time"
    assert doc["hotspots"][0]["cpu_time"] > 0
    assert doc["summary"]["cpu_time"] > 0


# Host span categories, in the order that breaks a tie of equal start and length (the outer
# one first), as torch.profiler writes them.
HOST_KINDS = {"python_function": 0, "user_annotation": 1, "cpu_op": 2, "cuda_runtime": 3, "cuda_driver": 3}


def host_spans(name: str) -> dict[tuple, list[tuple[int, int, int, str]]]:
    """Each host thread's spans from the raw JSON: (start ns, -duration ns, kind, name), sorted."""
    spans: dict[tuple, list] = {}
    for e in raw_events(name):
        if e.get("ph") == "X" and e.get("cat") in HOST_KINDS:
            start = round(e["ts"] * 1000)
            spans.setdefault((e["pid"], e["tid"]), []).append((start, -round(e["dur"] * 1000), HOST_KINDS[e["cat"]],
                                                               e["name"]))
    return {t: sorted(v) for t, v in spans.items()}


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_host_op_time_fits_in_the_threads_wall(name):
    """Ops' self times never overlap on a thread, so the host op time (cpu_time, exclusive)
    fits in the sum over threads of each one's span, first host event's start to last one's end.
    An op's self time that kept its children's time would not: gpt_train's ops then sum to
    72.30 ms against 71.09 ms of thread spans (26.36 ms is right), copies' to 410 against 143."""
    wall = sum(max(s - d for s, d, *_ in v) - v[0][0] for v in host_spans(name).values())
    cpu = int(load(name).cct.exclusive[:, COL["cpu_time"]].sum())
    assert 0 < cpu <= wall


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_op_self_time_is_its_duration_less_the_ops_directly_inside(name):
    """Each op name's host op time (cpu_time, exclusive, over the tree) against the raw JSON:
    per event, its duration less those of the ops directly inside it on its thread (Python
    frames and launches may lie between, no other op or annotation). Spans nest by time; one that
    overruns its parent is cut at the parent's end (Dynamo's `Pregraph bytecode` op in
    compiled_mlp ends after the Python frame it began in). An op that holds an annotation
    (compiled_mlp's `CompiledFunction` around `## Call CompiledFxGraph ##`) is left out: what
    its self time is, less the annotation (torch's rule) or not, is not checked here."""
    OP, ANNOT = HOST_KINDS["cpu_op"], HOST_KINDS["user_annotation"]
    want: dict[str, int] = {}
    holds_annotation: set[str] = set()
    for spans in host_spans(name).values():
        stack: list[list] = []  # [end, kind, name, self time] of the spans open around this one
        for start, neg_dur, kind, op in spans + [(2**62, 0, -1, "")]:  # the sentinel closes all
            while stack and stack[-1][0] <= start:
                _, k, closed, self_time = stack.pop()
                if k == OP:
                    want[closed] = want.get(closed, 0) + self_time
            end = min(start - neg_dur, stack[-1][0]) if stack else start - neg_dur
            around = [x for x in stack if x[1] in (OP, ANNOT)]  # the nearest op or annotation
            if around and around[-1][1] == OP and kind == OP:
                around[-1][3] -= end - start
            if around and around[-1][1] == OP and kind == ANNOT:
                holds_annotation.add(around[-1][2])
            stack.append([end, kind, op, end - start])
    prof = load(name)
    got: dict[str, int] = {}
    for i in np.flatnonzero(prof.cct.exclusive[:, COL["cpu_time"]]).tolist():
        f = prof.frame_of(i)
        got[f.name] = got.get(f.name, 0) + int(prof.cct.exclusive[i, COL["cpu_time"]])
    want = {k: v for k, v in want.items() if v and k not in holds_annotation}
    assert len(want) >= 2 and {k: v for k, v in got.items() if k not in holds_annotation} == want
    assert holds_annotation == ({"CompiledFunction"} if name == "compiled_mlp" else set())


def test_metric_columns_are_consistent():
    for name in TRACE_NAMES:
        tot = load(name).cct.exclusive.sum(axis=0)
        parts = sum(tot[COL[m]] for m in ("kernel_time", "htod_time", "dtoh_time", "dtod_time",
                                          "memcpy_other_time", "memset_time"))
        assert tot[COL["gpu_time"]] == parts
        assert len(tot) == len(METRICS)


def test_dlpt_runner_frames_are_library_wherever_dlpt_was_installed():
    from dlpt.frames import is_library_file

    for path in ("/tmp/pkg/dlpt/cli.py", "/opt/venv/src/dlpt/commands/record.py", "/srv/x/dlpt/api.py",
                 "/work/main/collectors/record/session.py", "torch/nn/modules/module.py", "threading.py",
                 "/usr/lib/python3.11/runpy.py", "/tmp/torchinductor_root/ab/cab.py"):
        assert is_library_file(path), path
    for path in ("/home/u/proj/train.py", "/home/u/dlpt_user/model.py", "capture_traces.py",
                 "/venv/lib/python3.11/site-packages/torchvision/models/resnet.py", "transformers/models/gpt2.py"):
        assert not is_library_file(path), path


def test_prune_empty_drops_only_nodes_without_metrics():
    from conftest import synthetic_profile

    from dlpt.frames import Frame
    from dlpt.transforms import prune_empty

    k = Frame("kernel", "k")
    prof = synthetic_profile([([Frame("python", "a", "m.py", 1, "a"), k], 10),
                              ([Frame("python", "b", "m.py", 2, "b"), Frame("python", "c", "m.py", 3, "c"), k], 0),
                              ([Frame("python", "d", "m.py", 4, "d"), k], 5)])
    # The b → c → k path carries a kernel count but no time: counts keep it. Zero it out fully.
    exc = prof.cct.exclusive.copy()
    for i in range(len(prof.cct)):
        if prof.frame_of(i).function in ("b", "c") or (prof.cct.parent[i] >= 0 and prof.frame_of(int(prof.cct.parent[i])).function == "c"):
            exc[i] = 0
    from dataclasses import replace

    from dlpt.cct import CCT
    prof = replace(prof, cct=CCT(prof.cct.parent, prof.cct.frame, exc))
    pruned = prune_empty(prof)
    assert len(pruned.cct) == len(prof.cct) - 3
    assert {pruned.frame_of(i).function for i in range(1, len(pruned.cct))} == {"a", "d", ""}
    assert (pruned.cct.exclusive.sum(axis=0) == prof.cct.exclusive.sum(axis=0)).all()
    assert all(f.function not in ("b", "c") for f in pruned.frames)
    assert (pruned.cct.parent[1:] < np.arange(1, len(pruned.cct))).all()
    assert prune_empty(pruned) is pruned


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_imported_trees_hold_no_empty_nodes(name):
    cct = load(name).cct
    assert cct.inclusive.any(axis=1).all()


# An annotation inside an op is a child of it, as in torch's tables: compiled_mlp's CompiledFunction
# ops each hold a `## Call CompiledFxGraph ##` span holding the graph's ops, which used to be
# counted twice (host op time 3.47 ms where ops ran for 2.70 ms).
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_host_op_time_fits_in_the_time_ops_ran(name):
    """Ops' self times never overlap on a thread: their sum is at most, per thread, the time
    some op was running (the union of its cpu_op intervals, from the raw JSON)."""
    per_thread: dict[tuple, list[tuple[int, int]]] = {}
    for e in raw_events(name):
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            s = round(e["ts"] * 1000)
            per_thread.setdefault((e["pid"], e["tid"]), []).append((s, s + round(e["dur"] * 1000)))
    running = 0
    for spans in per_thread.values():
        reach = None
        for s, e in sorted(spans):
            if reach is None or s > reach:
                reach = s
            running += max(e - reach, 0)
            reach = max(reach, e)
    cpu = int(load(name).cct.exclusive[:, COL["cpu_time"]].sum())
    assert cpu <= running


def test_compiled_function_self_time_leaves_out_its_graph_call():
    """compiled_mlp: each `CompiledFunction` op holds a `## Call CompiledFxGraph ... ##`
    annotation that holds the graph's ops (aten::addmm, triton kernels' ops), whose own self
    time is counted. CompiledFunction's self time is at most its duration less the annotation's."""
    ev = [e for e in raw_events("compiled_mlp") if e.get("ph") == "X"]
    cf = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "CompiledFunction"]
    bound = 0
    for c in cf:
        inner = [e for e in ev if e.get("cat") == "user_annotation" and e["tid"] == c["tid"]
                 and c["ts"] <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"]]
        bound += round(c["dur"] * 1000) - sum(round(e["dur"] * 1000) for e in inner)
    prof = load("compiled_mlp")
    got = sum(int(prof.cct.exclusive[i, COL["cpu_time"]]) for i in range(len(prof.cct))
              if prof.frame_of(i).kind == "op" and prof.frame_of(i).name == "CompiledFunction")
    assert len(cf) == 3 and got <= bound + 3


def test_flat_rows_owners_labels_and_nodes_by_hand():
    """A tree written out node by node: model.py's `forward` (line 10) calls `block` (line 20,
    a 30 ns kernel) and a C builtin with no file (a 50 ns kernel); util.py's `helper` (line 5)
    calls `block` too, which makes a 70 ns host→device copy (GPU time, no kernel time); a
    queued kernel (5 ns) sits under an `<unattributed: …>` frame. Every grouping's rows, labels
    and owners are written out here."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame, unattributed_frame

    fwd = source_frame("/home/u/proj/model.py", 10, "forward")
    blk = source_frame("/home/u/proj/model.py", 20, "block")
    hlp = source_frame("/home/u/proj/util.py", 5, "helper")
    builtin = Frame("python", "<built-in method sum>")

    def kernel(name, ns):
        return Frame("kernel", name), {"gpu_time": ns, "kernel_time": ns, "kernel_count": 1}

    prof = by_hand([
        (-1, Frame("root", "r"), {}),
        (0, fwd, {}),                                               # 1
        (1, blk, {}), (2, *kernel("k1", 30)),                       # 2, 3
        (1, builtin, {}), (4, *kernel("k2", 50)),                   # 4, 5
        (0, hlp, {}),                                               # 6
        (6, blk, {}), (7, Frame("memcpy", "Memcpy HtoD"), {"gpu_time": 70, "htod_time": 70, "copy_count": 1}),
        (0, unattributed_frame("work queued"), {}), (9, *kernel("k3", 5)),  # 9, 10
    ])
    gpu = COL["gpu_time"]

    def rows(by):
        fv = flat(prof, by)
        return fv, {lbl: (int(e), int(i)) for lbl, e, i in zip(fv.labels, fv.exclusive[:, gpu], fv.inclusive[:, gpu])}

    fv, got = rows("line")
    F, B, H = "proj/model.py:10 forward", "proj/model.py:20 block", "proj/util.py:5 helper"
    # (exclusive, inclusive): the builtin has no line, so its kernel is forward's own.
    assert got == {F: (50, 80), B: (100, 100), H: (0, 70), "<no source line: work queued>": (5, 5)}
    assert [fv.labels[g] if g >= 0 else g for g in fv.owner.tolist()] == [-1, F, B, B, F, F, H, B, B, -1, -1]
    assert fv.node[fv.labels.index(B)] == 7  # block's node with the most GPU time: under helper
    assert fv.occurrences[fv.labels.index(B)] == 2

    fv, got = rows("function")  # the builtin is a function of no file, named by its frame's name
    assert got == {"forward (proj/model.py)": (0, 80), "block (proj/model.py)": (100, 100),
                   "<built-in method sum>": (50, 50), "helper (proj/util.py)": (0, 70),
                   "<no function: work queued>": (5, 5)}
    fv, got = rows("file")  # a frame of no file has no file: its kernel is model.py's
    assert got == {"proj/model.py": (150, 150), "proj/util.py": (0, 70), "<no file: work queued>": (5, 5)}
    fv, got = rows("kernel")
    assert got == {"k1": (30, 30), "k2": (50, 50), "Memcpy HtoD": (70, 70), "k3": (5, 5), "<no GPU activity>": (0, 0)}
    fv, got = rows("op")
    assert got == {"<no op>": (155, 155)}


def random_tree(seed: int, size: int) -> list[tuple]:
    """(parent, frame, own metrics) rows in preorder for by_hand: a few frames called from one
    another at random (recursion, one frame under several callers), kernels as leaves, host time
    of their own on some Python lines and on the root, the first node a Python line."""
    import random

    from dlpt.frames import Frame, source_frame

    rnd = random.Random(seed)
    pool = [source_frame("m.py", ln, f"f{ln}") for ln in range(1, 5)] + [Frame("kernel", "k1"), Frame("kernel", "k2")]
    rnd.shuffle(pool)  # frame ids follow first use: vary which frames get the high ids
    nodes = [(-1, Frame("root", "r"), {"host_time": 7})]
    stack = [0]
    while len(nodes) < size:
        del stack[rnd.randint(1, min(len(stack), 6)):]  # a child of one of the last path's nodes
        frame = rnd.choice(pool) if len(nodes) > 1 else next(f for f in pool if f.kind == "python")
        own = {"host_time": rnd.choice([0, 0, 3, 11])}
        if frame.kind == "kernel":
            own = {"gpu_time": rnd.randint(1, 99)}
        nodes.append((stack[-1], frame, own))
        if frame.kind != "kernel":
            stack.append(len(nodes) - 1)
    return nodes


@pytest.mark.parametrize("seed", range(12))
def test_bottom_up_is_every_reversed_path_of_the_tree(seed):
    """The inverted tree against one built here from the top-down tree's paths: each node with
    metrics of its own gives its frame, its caller's, ... up to the outermost, and every prefix
    of that reversed path is one node of the inverted tree holding the node's metrics. The root's
    own time (dlpt's start and end) stays the root's."""
    from conftest import by_hand

    from dlpt.views import bottom_up_self

    nodes = random_tree(seed, 80)
    prof = by_hand(nodes)
    cct = prof.cct
    cols = [COL["gpu_time"], COL["host_time"]]

    want: dict[tuple, list[int]] = {}
    for i in range(1, len(nodes)):
        own = [int(cct.exclusive[i, c]) for c in cols]
        if not any(own):
            continue
        reversed_path = []
        j = i
        while j > 0:
            reversed_path.append(int(cct.frame[j]))
            j = nodes[j][0]
        for k in range(1, len(reversed_path) + 1):
            acc = want.setdefault(tuple(reversed_path[:k]), [0, 0])
            acc[0] += own[0]
            acc[1] += own[1]

    bu = bottom_up(prof).cct
    got = {tuple(int(bu.frame[j]) for j in bu.path(i)): [int(bu.inclusive[i, c]) for c in cols]
           for i in range(1, len(bu))}
    assert len(got) == len(bu) - 1  # no two nodes of one path
    assert got == want
    assert bu.exclusive[0].tolist() == cct.exclusive[0].tolist()  # the root's own time, once
    assert bu.exclusive.sum(axis=0).tolist() == cct.exclusive.sum(axis=0).tolist()
    # Self values: a level-one row holds its frame's own time over the whole tree; the root its own.
    own = bottom_up_self(bu)
    per_frame: dict[int, list[int]] = {}
    for i in range(1, len(nodes)):
        acc = per_frame.setdefault(int(cct.frame[i]), [0, 0])
        acc[0] += int(cct.exclusive[i, cols[0]])
        acc[1] += int(cct.exclusive[i, cols[1]])
    level_one = {int(bu.frame[j]): [int(own[j, c]) for c in cols] for j in np.flatnonzero(bu.parent == 0).tolist()}
    assert level_one == {f: v for f, v in per_frame.items() if any(v)}
    assert own[0].tolist() == cct.exclusive[0].tolist()
    assert not own[(bu.parent > 0)].any()  # callers spend nothing of their own

def test_propagate_down_and_nearest_marked_by_hand():
    """On a tree of seven nodes (root 0; 1 with children 2 and 3, 3 with child 4; 5 with child
    6): which nodes have a marked ancestor-or-self, and the nearest one (-1: none), walked here
    one parent at a time. A marked root marks everything, and is the nearest mark of the nodes
    with none of their own on the way."""
    from dlpt.cct import CCT
    from dlpt.transforms import nearest_marked, propagate_down

    parent = [-1, 0, 1, 1, 3, 0, 5]
    cct = CCT(parent, list(range(7)), np.zeros((7, len(METRICS)), dtype=np.int64))

    def nearest(marked, i):
        while i >= 0 and i not in marked:
            i = parent[i]
        return i

    for marked in ({3}, {1, 4}, {0}, {0, 3, 6}, set()):
        mask = np.array([i in marked for i in range(7)])
        want = [nearest(marked, i) for i in range(7)]
        assert nearest_marked(cct, mask).tolist() == want, marked
        assert propagate_down(cct, mask).tolist() == [w >= 0 for w in want], marked


def test_hiding_library_frames_by_hand():
    """torch's `_call_impl` between the program's line and its `forward` goes, its own time to
    the line; two of its calls under one line merge their children. A library frame with no
    caller to take its time (directly under the root, or under a rank's node) stays where it is."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame

    prog = source_frame("/home/u/prog.py", 3, "<module>")
    call = source_frame("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1700, "_call_impl")
    call2 = source_frame("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1750, "_call_impl")
    fwd = source_frame("/home/u/model.py", 5, "forward")
    tok = source_frame("/usr/lib/python3.11/tokenize.py", 100, "tokenize")
    k = Frame("kernel", "k")
    prof = by_hand([
        (-1, Frame("root", "r"), {}),
        (0, prog, {"host_time": 1}),                 # 1
        (1, call, {"host_time": 2}),                 # 2
        (2, fwd, {"host_time": 3}),                  # 3
        (3, k, {"gpu_time": 10}),                    # 4
        (1, call2, {"host_time": 20}),               # 5
        (5, fwd, {"host_time": 30}),                 # 6: merges with 3
        (6, k, {"gpu_time": 100}),                   # 7: merges with 4
        (0, tok, {"host_time": 4}),                  # 8: under the root, stays
        (0, Frame("rank", "rank 1"), {}),            # 9
        (9, call, {"host_time": 6}),                 # 10: under a rank, stays
        (10, fwd, {"host_time": 7}),                 # 11
    ])
    view = hide_library(prof)
    cct = view.cct
    got = {tuple(view.frame_of(j).name for j in cct.path(i)): (int(cct.exclusive[i, COL["host_time"]]),
                                                               int(cct.exclusive[i, COL["gpu_time"]]))
           for i in range(1, len(cct))}
    assert got == {
        (prog.name,): (1 + 2 + 20, 0),
        (prog.name, fwd.name): (3 + 30, 0),
        (prog.name, fwd.name, "k"): (0, 110),
        (tok.name,): (4, 0),
        ("rank 1",): (0, 0),
        ("rank 1", call.name): (6, 0),
        ("rank 1", call.name, fwd.name): (7, 0),
    }
    assert len(cct) == 8
    assert view.cct.exclusive.sum(axis=0).tolist() == prof.cct.exclusive.sum(axis=0).tolist()


def test_merge_map_moves_children_of_hidden_nodes_up_and_merges_them():
    """merge_map (collapse's engine; phases and notebook blocks give it their own masks) on a
    tree whose first node is hidden: every node goes where its path of kept frames leads,
    hidden nodes to their nearest kept ancestor's place, and equal paths are one node."""
    from dlpt.cct import CCT
    from dlpt.transforms import merge_map

    A, B, C, D = 1, 2, 3, 4  # frame ids
    parent = [-1, 0, 1, 2, 3, 1, 5, 6, 0, 8, 9]
    frame = [0, A, B, C, B, C, B, D, B, A, D]
    cct = CCT(parent, frame, np.zeros((len(parent), len(METRICS)), dtype=np.int64))

    def kept_path(i, hide):  # the kept frames from the root's child down to i, walked by hand
        out = []
        while i > 0:
            if not hide[i]:
                out.append(frame[i])
            i = parent[i]
        return tuple(reversed(out))

    # A and C hidden (the first node among them), then C alone (A > B and the root's B apart).
    for hidden, paths in (((A, C), [(), (B,), (B, B), (B, D)]),
                          ((C,), [(), (A,), (A, B), (A, B, B), (A, B, D), (B,), (B, A), (B, A, D)])):
        hide = np.array([f in hidden for f in frame])
        bparent, bframe, node_map = merge_map(cct, hide)
        new = CCT(bparent, bframe, np.zeros((len(bparent), len(METRICS)), dtype=np.int64))
        new_path = [tuple(int(new.frame[j]) for j in new.path(i)) for i in range(len(new))]
        assert [new_path[j] for j in node_map.tolist()] == [kept_path(i, hide) for i in range(len(parent))]
        assert sorted(new_path) == paths  # one node per path
        assert (bparent[1:] < np.arange(1, len(bparent))).all() and bparent[0] == -1


# --- transforms on trees written out by hand ---------------------------------------------------

def tree_rows(prof: dlpt.Profile) -> dict[tuple, tuple[int, int, int]]:
    """Each node as (names on its path from the root's child) -> (host, idle, GPU time of its own)."""
    cct = prof.cct
    return {tuple(prof.frame_of(j).name for j in cct.path(i)): tuple(
        int(cct.exclusive[i, COL[m]]) for m in ("host_time", "gpu_idle_time", "gpu_time")) for i in range(len(cct))}


def with_activities(prof: dlpt.Profile, nodes: list[int], durations: list[int]) -> dlpt.Profile:
    """prof with one GPU activity row at each node, named by that node's frame."""
    from dataclasses import replace

    from dlpt.profile import Activities

    z = np.zeros(len(nodes), dtype=np.int64)
    return replace(prof, activities=Activities(np.array(nodes), z, prof.cct.frame[nodes], z, z, z,
                                               np.array(durations), z))


def activity_paths(prof: dlpt.Profile) -> list[tuple[tuple, int]]:
    return [(tuple(prof.frame_of(j).name for j in prof.cct.path(int(n))), int(d))
            for n, d in zip(prof.activities.node, prof.activities.duration)]


def small_tree() -> dlpt.Profile:
    """root; e (nothing) > f (nothing); a > b > k1 (10 ns), a > k2 (5 ns); d > k1 (20 ns); g
    (nothing) — with an activity row on each kernel."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame

    a, b, d, e, f, g = (source_frame("m.py", n, fn) for n, fn in ((1, "a"), (2, "b"), (4, "d"), (5, "e"),
                                                                  (6, "f"), (7, "g")))
    k1, k2 = Frame("kernel", "k1"), Frame("kernel", "k2")
    prof = by_hand([(-1, Frame("root", "r"), {}),
                    (0, e, {}), (1, f, {}),                                     # 1, 2
                    (0, a, {"host_time": 1}), (3, b, {"host_time": 2}),         # 3, 4
                    (4, k1, {"gpu_time": 10}), (3, k2, {"gpu_time": 5}),        # 5, 6
                    (0, d, {"host_time": 8}), (7, k1, {"gpu_time": 20}),        # 7, 8
                    (0, g, {})])                                                # 9
    return with_activities(prof, [5, 6, 8], [10, 5, 20])


def test_focus_is_a_subtree_with_its_activities():
    from dlpt.transforms import focus

    prof = small_tree()
    sub = focus(prof, 4)  # b > k1; k2 (node 6, the next after b's subtree) is not in it
    assert sub.cct.parent.tolist() == [-1, 0]
    assert tree_rows(sub) == {(): (2, 0, 0), ("k1",): (0, 0, 10)}
    assert activity_paths(sub) == [(("k1",), 10)]
    leaf = focus(prof, 5)  # the kernel alone: its activity is on the new root
    assert leaf.cct.parent.tolist() == [-1] and activity_paths(leaf) == [((), 10)]
    whole = focus(prof, 3)
    assert whole.cct.parent.tolist() == [-1, 0, 1, 0]
    assert activity_paths(whole) == [(("b (m.py:2)", "k1"), 10), (("k2",), 5)]


def test_drop_subtrees_keeps_the_rest_in_preorder():
    from dlpt.transforms import drop_subtrees

    prof = small_tree()
    assert drop_subtrees(prof, np.zeros(len(prof.cct), dtype=bool)) is prof
    for dropped, top in (([1, 2], "e (m.py:5)"), ([9], "g (m.py:7)")):  # the first subtree; the last
        mask = np.zeros(len(prof.cct), dtype=bool)
        mask[dropped] = True
        out = drop_subtrees(prof, mask)
        assert tree_rows(out) == {k: v for k, v in tree_rows(prof).items() if top not in k}, dropped
        assert len(out.cct) == len(prof.cct) - len(dropped)
        assert (out.cct.parent[1:] < np.arange(1, len(out.cct))).all()
        assert activity_paths(out) == activity_paths(prof)


def test_drop_subtrees_keeps_the_root_even_when_the_mask_marks_it():
    """The root is never dropped: a mask that marks it and e > f (nodes 0, 1, 2) gives the tree
    without e > f, preorder kept (nodes 3-9 become 1-7, each parent renumbered with it); a mask
    of every node leaves the root alone (small_tree's root holds nothing of its own)."""
    from dataclasses import replace

    from dlpt.profile import Activities
    from dlpt.transforms import drop_subtrees

    prof = small_tree()
    mask = np.zeros(len(prof.cct), dtype=bool)
    mask[[0, 1, 2]] = True
    out = drop_subtrees(prof, mask)
    assert tree_rows(out) == {k: v for k, v in tree_rows(prof).items() if "e (m.py:5)" not in k}
    assert out.cct.parent.tolist() == [-1, 0, 1, 2, 1, 0, 5, 0]
    assert activity_paths(out) == activity_paths(prof)
    bare = replace(prof, activities=Activities.empty())
    everything = drop_subtrees(bare, np.ones(len(prof.cct), dtype=bool))
    assert everything.cct.parent.tolist() == [-1] and tree_rows(everything) == {(): (0, 0, 0)}


def test_fold_into_parents_adds_each_subtree_to_its_parent():
    from dataclasses import replace

    from dlpt.profile import Activities
    from dlpt.transforms import fold_into_parents

    prof = small_tree()
    bare = replace(prof, activities=Activities.empty())
    fold = np.zeros(len(prof.cct), dtype=bool)
    fold[[0, 1, 4, 7]] = True  # the root never folds; e > f, b > k1 and d > k1 do
    out = fold_into_parents(bare, fold)
    assert tree_rows(out) == {(): (8, 0, 20), ("a (m.py:1)",): (1 + 2, 0, 10), ("a (m.py:1)", "k2"): (0, 0, 5),
                              ("g (m.py:7)",): (0, 0, 0)}
    assert fold_into_parents(bare, np.zeros(len(prof.cct), dtype=bool)) is bare
    # With activities: a subtree without any folds (e > f); one with some may not.
    one = np.zeros(len(prof.cct), dtype=bool)
    one[1] = True
    assert ("e (m.py:5)",) not in tree_rows(fold_into_parents(prof, one))
    one[:] = False
    one[4] = True
    with pytest.raises(ValueError):
        fold_into_parents(prof, one)


def test_to_block_keeps_the_blocks_code_and_the_threads_with_gpu_work():
    """A notebook cell (cell.py) run by the kernel's machinery (kernelapp.py > zmqshell.py, which
    also compiled the cell beside it), a heartbeat thread with host time only, a loader thread
    with a kernel. The heartbeat goes with its time; the machinery is hidden, its own time on the
    root; the cell's line moves up to the root; the loader thread stays."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame
    from dlpt.transforms import to_block

    start = source_frame("/venv/ipykernel/kernelapp.py", 10, "start")
    run = source_frame("/venv/ipykernel/zmqshell.py", 20, "run_cell")
    comp = source_frame("/venv/ipykernel/zmqshell.py", 30, "compile")
    cell = source_frame("cell.py", 1, "<module>")
    beat = source_frame("/venv/ipykernel/heartbeat.py", 2, "run")
    load = source_frame("/home/u/loader.py", 3, "load")
    k = Frame("kernel", "k")
    prof = by_hand([(-1, Frame("root", "r"), {}),
                    (0, Frame("thread", "[thread heartbeat]"), {"host_time": 50}),   # 1
                    (1, beat, {"host_time": 40}),                                     # 2
                    (0, start, {"host_time": 5}),                                     # 3
                    (3, run, {"host_time": 6}),                                       # 4
                    (4, cell, {"host_time": 7}),                                      # 5
                    (5, k, {"gpu_time": 10}),                                         # 6
                    (4, comp, {"host_time": 3}),                                      # 7
                    (0, Frame("thread", "[thread loader]"), {"host_time": 9}),        # 8
                    (8, load, {"host_time": 1}),                                      # 9
                    (9, k, {"gpu_time": 4})])                                         # 10
    prof = with_activities(prof, [6, 10], [10, 4])
    out = to_block(prof, "cell.py")
    assert tree_rows(out) == {(): (5 + 6 + 3, 0, 0), (cell.name,): (7, 0, 0), (cell.name, "k"): (0, 0, 10),
                              ("[thread loader]",): (9, 0, 0), ("[thread loader]", load.name): (1, 0, 0),
                              ("[thread loader]", load.name, "k"): (0, 0, 4)}
    assert activity_paths(out) == [((cell.name, "k"), 10), (("[thread loader]", load.name, "k"), 4)]
    assert to_block(prof, "other.py") is prof  # no frame of the block: as it was
    # A thread under the root that ran the cell's code, with host time only, stays; so does a
    # thread the cell started, beneath its line, that never ran the cell's code.
    worker = by_hand([(-1, Frame("root", "r"), {}), (0, start, {"host_time": 5}), (1, cell, {"host_time": 7}),
                      (2, Frame("thread", "[thread started]"), {"host_time": 4}), (3, beat, {"host_time": 2}),
                      (0, Frame("thread", "[thread worker]"), {"host_time": 3}),
                      (5, source_frame("cell.py", 9, "work"), {"host_time": 1})])
    assert tree_rows(to_block(worker, "cell.py")) == {
        (): (5, 0, 0), (cell.name,): (7, 0, 0), (cell.name, "[thread started]"): (4, 0, 0),
        (cell.name, "[thread started]", beat.name): (2, 0, 0), ("[thread worker]",): (3, 0, 0),
        ("[thread worker]", "work (cell.py:9)"): (1, 0, 0)}
    # The cell directly under the root, beside the heartbeat: nothing to hide, the thread goes.
    flat_prof = by_hand([(-1, Frame("root", "r"), {}), (0, cell, {"host_time": 7}),
                         (0, Frame("thread", "[thread heartbeat]"), {"host_time": 50})])
    assert tree_rows(to_block(flat_prof, "cell.py")) == {(): (0, 0, 0), (cell.name,): (7, 0, 0)}


def test_fold_sampled_library_folds_small_host_only_library_calls():
    """Library calls the sampler alone saw (host and idle time only) under 0.1% of the run's
    host time and of its idle time fold into their caller; anything larger, with GPU work, of
    the user's code, or with no caller but the root or a phase's node stays. The run's host
    time, summed by hand from the rows below: 2,001,917 ns (threshold 2,001.917 ns); its idle
    time 1,000 ns (threshold 1 ns)."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame
    from dlpt.transforms import fold_sampled_library

    prog = source_frame("/home/u/prog.py", 1, "<module>")
    user = source_frame("/home/u/prog.py", 2, "step")

    def lib(name):
        return source_frame(f"/venv/lib/python3.11/site-packages/torch/{name}.py", 1, name)

    prof = by_hand([(-1, Frame("root", "r"), {"host_time": 1_000_000}),
                    (0, prog, {"host_time": 997_910}),                      # 1
                    (1, lib("a"), {"host_time": 100}),                      # 2: folds, with its child
                    (2, lib("a2"), {"host_time": 100}),                     # 3
                    (1, lib("b"), {"host_time": 1_500}),                    # 4: folds (under 2,001.917)
                    (1, lib("c"), {"host_time": 2_003}),                    # 5: stays (over)
                    (1, lib("gpu"), {"host_time": 7}), (6, Frame("kernel", "k"), {"gpu_time": 10}),  # 6, 7: GPU
                    (1, lib("idle"), {"host_time": 7, "gpu_idle_time": 900}),  # 8: most of the idle
                    (1, user, {"host_time": 200, "gpu_idle_time": 100}),    # 9: the user's
                    (0, lib("top"), {"host_time": 50}),                     # 10: under the root
                    (0, Frame("phase", "step 1"), {}), (11, lib("p"), {"host_time": 40})])  # 11, 12
    total = int(prof.cct.exclusive[:, COL["host_time"]].sum())
    assert total == 1_000_000 + 997_910 + 100 + 100 + 1_500 + 2_003 + 7 + 7 + 200 + 50 + 40 == 2_001_917
    out = fold_sampled_library(prof)
    rows = tree_rows(out)
    assert rows[(prog.name,)] == (997_910 + 100 + 100 + 1_500, 0, 0)
    kept = {k[-1] for k in rows if k}
    assert kept == {prog.name, lib("c").name, lib("gpu").name, "k", lib("idle").name, user.name, lib("top").name,
                    "step 1", lib("p").name}
    assert {f.name for f in out.frames} == kept | {"r"}  # the folded frames are gone from the table
    assert out.cct.exclusive.sum(axis=0).tolist() == prof.cct.exclusive.sum(axis=0).tolist()


def test_fold_sampled_library_at_its_threshold():
    """"Under 0.1%": a library call holding exactly 0.1% of the run's host time stays; one
    nanosecond less folds. The run's host time: 998,001 + 1,000 + 999 = 1,000,000 ns, whose
    0.1% is 1,000 ns. Its idle time: 999 + 1 = 1,000 ns (0.1%: 1 ns): a library call of 1 ns of
    idle and no host time holds exactly that, and stays too."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame
    from dlpt.transforms import fold_sampled_library

    prog = source_frame("/home/u/prog.py", 2, "step")

    def lib(name):
        return source_frame(f"/venv/lib/python3.11/site-packages/torch/{name}.py", 1, name)

    prof = by_hand([(-1, Frame("root", "r"), {"host_time": 998_001, "gpu_idle_time": 999}),
                    (0, prog, {}),                                            # 1
                    (1, lib("at"), {"host_time": 1_000}),                     # 2: exactly 0.1%: stays
                    (1, lib("under"), {"host_time": 999}),                    # 3: folds into prog
                    (1, lib("idle"), {"gpu_idle_time": 1})])                  # 4: exactly 0.1% of idle
    rows = tree_rows(fold_sampled_library(prof))
    assert rows == {(): (998_001, 999, 0), (prog.name,): (999, 0, 0), (prog.name, lib("at").name): (1_000, 0, 0),
                    (prog.name, lib("idle").name): (0, 1, 0)}


def test_def_line_frames_go_to_their_callers():
    """A recording's frame on a `def` line (async too, on the file's first and last lines)
    is collapsed into the line that called it, as is a frame the caller names (`also`); lines
    that are no `def`, a decorator's line above one, line numbers past the file, files not
    stored and imported traces are left alone."""
    from dataclasses import replace

    from conftest import by_hand

    from dlpt.frames import Frame, source_frame
    from dlpt.transforms import def_line_mask, def_lines_to_callers

    src = "def first():\n    pass\n@torch.compile\ndef f(x):\n    return x + 1\n  async def g():\nlast = 1\ndef z(): pass"
    frames = [Frame("kernel", "k0"),                     # not Python: skipped, and the loop goes on
              source_frame("m.py", 1, "first"),          # def, line 1
              source_frame("m.py", 3, "f"),              # the decorator's line
              source_frame("m.py", 4, "f"),              # def
              source_frame("m.py", 5, "f"),              # its body
              source_frame("m.py", 6, "g"),              # async def, indented
              source_frame("m.py", 8, "z"),              # def, the last line
              source_frame("m.py", 9, "z"),              # past the end
              source_frame("other.py", 1, "h"),          # a file not stored
              Frame("python", "<built-in method sum>")]  # no source
    prof = by_hand([(-1, Frame("root", "r"), {})] + [(0, f, {"host_time": 1}) for f in frames])
    prof = replace(prof, sources={"m.py": src})
    want = [False, True, False, True, False, True, True, False, False, False]
    assert def_line_mask(prof)[1:].tolist() == want  # frame 0 is the root
    assert def_line_mask(replace(prof, meta={"source": "mixed"}))[1:].tolist() == want
    assert not def_line_mask(replace(prof, meta={"source": "kineto"})).any()

    # Collapsed: under a caller's line, the def frame's time and children go to that line.
    caller = source_frame("main.py", 10, "<module>")
    lib = source_frame("/usr/lib/python3.11/json/decoder.py", 5, "decode")
    tree = replace(by_hand([(-1, Frame("root", "r"), {}), (0, caller, {"host_time": 1}),
                            (1, frames[3], {"host_time": 2}), (2, frames[4], {"host_time": 4}),
                            (1, lib, {"host_time": 8})]), sources={"m.py": src})
    also = np.array([f == lib for f in tree.frames])
    assert tree_rows(def_lines_to_callers(tree)) == {(): (0, 0, 0), (caller.name,): (3, 0, 0),
                                                     (caller.name, frames[4].name): (4, 0, 0),
                                                     (caller.name, lib.name): (8, 0, 0)}
    assert tree_rows(def_lines_to_callers(tree, also)) == {(): (0, 0, 0), (caller.name,): (11, 0, 0),
                                                           (caller.name, frames[4].name): (4, 0, 0)}


def test_prune_empty_keeps_the_root_and_the_frames_activities_name():
    """A tree with no metrics at all is its root; a frame only an activity row names (a kernel's
    name, its node a line) stays in the frame table, and the rows still name it."""
    from conftest import by_hand

    from dlpt.frames import Frame, source_frame
    from dlpt.transforms import prune_empty

    empty = by_hand([(-1, Frame("root", "r"), {}), (0, source_frame("m.py", 1, "a"), {})])
    out = prune_empty(empty)
    assert out.cct.parent.tolist() == [-1] and [f.name for f in out.frames] == ["r"]

    line = source_frame("m.py", 2, "b")
    prof = by_hand([(-1, Frame("root", "r"), {}), (0, line, {"gpu_time": 10}), (0, Frame("kernel", "k"), {})])
    prof = with_activities(prof, [1], [10])
    prof.activities.name[:] = 2  # the kernel's frame (id 2), whose own node is empty
    out = prune_empty(prof)
    assert [prof.frames[i].name for i in prof.activities.name] == ["k"]
    assert [out.frames[i].name for i in out.activities.name] == ["k"]
    assert tree_rows(out) == {(): (0, 0, 0), (line.name,): (0, 0, 10)}
    kept = prune_empty(out)  # every node has metrics, every frame is used: as it was
    assert kept is out


@pytest.mark.parametrize("seed", range(24))
def test_merge_map_on_random_trees(seed):
    """merge_map against the kept frames of each node's path, walked by hand, on the random
    trees of the bottom-up test with a random third of their frames hidden."""
    import random

    from conftest import by_hand

    from dlpt.cct import CCT
    from dlpt.transforms import merge_map

    cct = by_hand(random_tree(seed, 200)).cct
    rnd = random.Random(seed)
    hidden = set(rnd.sample(range(1, int(cct.frame.max()) + 1), 2))
    hide = np.array([f in hidden for f in cct.frame.tolist()])
    parent, frame = cct.parent.tolist(), cct.frame.tolist()

    def kept_path(i):
        out = []
        while i > 0:
            if not hide[i]:
                out.append(frame[i])
            i = parent[i]
        return tuple(reversed(out))

    bparent, bframe, node_map = merge_map(cct, hide)
    new = CCT(bparent, bframe, np.zeros((len(bparent), len(METRICS)), dtype=np.int64))
    new_path = [tuple(int(new.frame[j]) for j in new.path(i)) for i in range(len(new))]
    assert [new_path[j] for j in node_map.tolist()] == [kept_path(i) for i in range(len(parent))]
    assert len(set(new_path)) == len(new_path) == len({kept_path(i) for i in range(len(parent))})
