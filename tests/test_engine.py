"""The attribution engine on the real H200 traces: conservation, linking, views, invariants."""

from __future__ import annotations

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
    s = summary(hide_library(prof))
    gpu = s["gpu_time"]
    assert s["attributed_to_source"] >= 0.995 * gpu
    # About 60% of the kernel time of a training step is backward work.
    assert 0.4 * gpu < s["backward_time"] < 0.8 * gpu
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
