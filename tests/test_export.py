"""Interop exporters read back by the libraries that consume them: hatchet, networkx, pydot,
folded-stack and speedscope parsers. Totals must survive to the nanosecond."""

from __future__ import annotations

import functools
import io
import json
import subprocess

import networkx as nx
import numpy as np
import pydot
import pytest
from conftest import TRACE_NAMES, dlpt_in_process, synthetic_profile, trace_path

import dlpt
from dlpt.frames import Frame
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.transforms import hide_library_unless
from dlpt.viewers.exporters import ExportOptions, formats, get_exporter


def _hatchet():
    """hatchet, imported by the tests that read its GraphFrame, not as the suite collects this file
    (hatchet and its pandas take most of a second, which every worker would pay)."""
    import hatchet

    return hatchet


@functools.cache
def prof(name: str) -> Profile:
    return dlpt.load(str(trace_path(name)))


def export(profile: Profile, fmt: str, **opts) -> str:
    buf = io.StringIO()
    get_exporter(fmt).export(profile, buf, ExportOptions(**opts))
    return buf.getvalue()


def totals(p: Profile) -> dict[str, int]:
    t = p.cct.exclusive.sum(axis=0)
    return {m: int(t[COL[m]]) for m in METRICS}


def test_registry_lists_every_interop_format():
    assert {"hotspots", "hatchet", "folded", "speedscope", "dot", "graphml"} <= set(formats())


# ---- hatchet ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize("include_library", [False, True])
def test_hatchet_literal_reads_back_with_equal_totals(name, include_library):
    p = prof(name)
    lit = json.loads(export(p, "hatchet", include_library=include_library))
    gf = _hatchet().GraphFrame.from_literal(lit)
    view = hide_library_unless(p, include_library)
    assert len(gf.graph) == len(view.cct)
    df = gf.dataframe
    for m, v in totals(p).items():
        assert int(df[m].sum()) == v, m
        root = gf.graph.roots[0]
        assert int(df.loc[root, f"{m} (inc)"]) == v, m
    assert set(gf.exc_metrics) == set(METRICS)
    assert set(gf.inc_metrics) == {f"{m} (inc)" for m in METRICS}


@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize("include_library", [False, True])
def test_to_graphframe_matches_the_cct(name, include_library):
    p = prof(name)
    view = hide_library_unless(p, include_library)
    cct = view.cct
    gf = p.to_graphframe(include_library=include_library)
    nodes = list(gf.graph.traverse())
    assert len(nodes) == len(cct)
    by_nid = {n._hatchet_nid: n for n in nodes}
    assert sorted(by_nid) == list(range(len(cct)))
    for i, n in by_nid.items():
        par = n.parents[0]._hatchet_nid if n.parents else -1
        assert par == cct.parent[i]
        assert n._depth == cct.depth[i]
        assert n.frame["name"] == view.frame_of(i).label()
        assert n.frame["type"] == view.frame_of(i).kind
    df = gf.dataframe.loc[[by_nid[i] for i in range(len(cct))]]
    for m in METRICS:
        assert np.array_equal(df[m].to_numpy(), cct.exclusive[:, COL[m]]), m
        assert np.array_equal(df[f"{m} (inc)"].to_numpy(), cct.inclusive[:, COL[m]]), m
    assert gf.default_metric == "gpu_time (inc)"
    # Same tree as hatchet's own reader makes from the literal export.
    lit = _hatchet().GraphFrame.from_literal(json.loads(export(p, "hatchet", include_library=include_library)))
    assert gf.graph == lit.graph


def test_graphframe_inclusive_agrees_with_hatchets_own_sums():
    gf = prof("gpt_train").to_graphframe()
    ours = gf.dataframe["gpu_time (inc)"].copy()
    # hatchet recomputes the inclusive column from the exclusive one itself, with the routine
    # update_inclusive_columns() runs for every metric (a pandas lookup per node and metric: 20 s
    # for all of them on this tree); the one checked here is enough
    gf.subgraph_sum(["gpu_time"], ["gpu_time (inc)"])
    assert (gf.dataframe["gpu_time (inc)"].astype(np.int64) == ours).all()
    text = gf.tree(metric_column="gpu_time (inc)", depth=3)
    assert "capture_traces.py" in text


def test_graphframe_metric_selects_default_and_rejects_unknown():
    assert prof("copies").to_graphframe(metric="htod_time").default_metric == "htod_time (inc)"
    with pytest.raises(dlpt.DlptError):
        prof("copies").to_graphframe(metric="bogus")


# ---- folded -------------------------------------------------------------------------------

def parse_folded(text: str) -> list[tuple[list[str], int]]:
    out = []
    for line in text.splitlines():
        stack, _, value = line.rpartition(" ")
        assert stack and value.isdigit(), line
        out.append((stack.split(";"), int(value)))
    return out


@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize("metric", ["gpu_time", "kernel_time", "htod_bytes", "cpu_time"])
def test_folded_sums_to_the_total(name, metric):
    p = prof(name)
    rows = parse_folded(export(p, "folded", metric=metric))
    assert sum(v for _, v in rows) == totals(p)[metric]
    view = hide_library_unless(p, False)
    assert len(rows) == int(np.count_nonzero(view.cct.exclusive[:, COL[metric]]))
    assert all(v > 0 for _, v in rows)


def test_folded_stacks_are_call_paths_and_hide_library_by_default():
    p = prof("gpt_train")
    rows = parse_folded(export(p, "folded"))
    view = hide_library_unless(p, False)
    labels = {view.frame_of(i).label() for i in range(1, len(view.cct))}
    assert all(f in labels for stack, _ in rows for f in stack)
    assert all(stack[0] == "capture_traces.py:145 <module>" for stack, _ in rows)
    lib = parse_folded(export(p, "folded", include_library=True))
    assert not any(f.startswith("nn/functional.py:") for stack, _ in rows for f in stack)
    assert any(f.startswith("nn/functional.py:") for stack, _ in lib for f in stack)
    assert sum(v for _, v in lib) == sum(v for _, v in rows)


def test_folded_names_cannot_break_the_format():
    p = synthetic_profile([([Frame("python", "f", "a;b.py", 3, "f"), Frame("kernel", "k;1\nx")], 7)])
    rows = parse_folded(export(p, "folded"))
    assert rows == [(["a,b.py:3 f", "k,1 x"], 7)]


# ---- speedscope ---------------------------------------------------------------------------

def check_evented(profile: dict, n_frames: int) -> None:
    """Events open and close like a stack, in time order, within [startValue, endValue]."""
    stack: list[int] = []
    last = profile["startValue"]
    for ev in profile["events"]:
        assert ev["at"] >= last
        last = ev["at"]
        assert 0 <= ev["frame"] < n_frames
        if ev["type"] == "O":
            stack.append(ev["frame"])
        else:
            assert stack and stack.pop() == ev["frame"]
    assert not stack
    assert last <= profile["endValue"]


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_speedscope_sampled_total_and_timelines(name):
    p = prof(name)
    doc = json.loads(export(p, "speedscope"))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    sampled = doc["profiles"][0]
    assert sampled["type"] == "sampled" and sampled["unit"] == "nanoseconds"
    assert sum(sampled["weights"]) == totals(p)["gpu_time"] == sampled["endValue"]
    assert len(sampled["samples"]) == len(sampled["weights"])
    assert all(0 <= f < len(frames) for s in sampled["samples"] for f in s)
    evented = doc["profiles"][1:]
    streams = {(d, s) for d, s in zip(p.activities.device.tolist(), p.activities.stream.tolist())}
    assert len(evented) == len(streams)
    for ev in evented:
        assert ev["type"] == "evented" and ev["unit"] == "nanoseconds"
        check_evented(ev, len(frames))


def test_speedscope_declares_the_unit_of_the_metric():
    p = prof("copies")
    doc = json.loads(export(p, "speedscope", metric="htod_bytes"))
    assert doc["profiles"][0]["unit"] == "bytes"
    assert sum(doc["profiles"][0]["weights"]) == totals(p)["htod_bytes"] > 0
    doc = json.loads(export(p, "speedscope", metric="copy_count"))
    assert doc["profiles"][0]["unit"] == "none"


# ---- call graph: networkx, DOT, GraphML ---------------------------------------------------

def test_call_graph_collapses_recursion_to_a_cycle():
    f1 = Frame("python", "f", "a.py", 3, "f")
    g = Frame("python", "g", "a.py", 9, "g")
    f2 = Frame("python", "f", "a.py", 4, "f")
    k = Frame("kernel", "gemm")
    p = synthetic_profile([([f1, g, f2, g, k], 10), ([f1, k], 5)])
    cg = p.call_graph()
    fid, gid = "python:a.py:f", "python:a.py:g"
    assert cg.has_edge(fid, gid) and cg.has_edge(gid, fid)
    assert nx.find_cycle(cg, fid)
    # f is on both paths twice over; its inclusive time counts each nanosecond once.
    assert cg.nodes[fid]["gpu_time_inc"] == 15
    assert cg.nodes[gid]["gpu_time_inc"] == 10
    assert cg.edges[fid, gid]["gpu_time"] == 10 and cg.edges[fid, gid]["calls"] == 2
    assert cg.edges[gid, fid]["gpu_time"] == 10
    assert cg.nodes["kernel:gemm"]["gpu_time"] == 15 and cg.nodes["kernel:gemm"]["calls"] == 2


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_graphml_reads_back_with_networkx(name, tmp_path):
    p = prof(name)
    path = tmp_path / "g.graphml"
    path.write_text(export(p, "graphml"), encoding="utf-8")
    g = nx.read_graphml(path)
    want = p.call_graph()
    assert set(g.nodes) == set(want.nodes) and set(g.edges) == set(want.edges)
    for m, v in totals(p).items():
        assert sum(int(d[m]) for _, d in g.nodes(data=True)) == v, m
        root = [d for _, d in g.nodes(data=True) if d["kind"] == "root"]
        assert len(root) == 1 and int(root[0][f"{m}_inc"]) == v
    for a, b, d in want.edges(data=True):
        assert int(g.edges[a, b]["gpu_time"]) == d["gpu_time"]
        assert int(g.edges[a, b]["calls"]) == d["calls"]


def _unquote(s: str) -> str:
    assert s.startswith('"') and s.endswith('"'), s
    out, i, body = [], 0, s[1:-1]
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n"}.get(nxt, nxt))
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


# pydot's parser (pyparsing) takes 11 s on resnet_infer's graph, 8 s on loader_bound's and more on
# gpt_train's: the three smallest traces (threads, a CUDA graph, compiled code) hold the same
# checks in 4.5 s; the writer has one code path for every profile.
@pytest.mark.parametrize("name", ["threaded", "cudagraph_mlp", "compiled_mlp"])
def test_dot_parses_with_pydot_and_keeps_metrics(name):
    p = prof(name)
    (g,) = pydot.graph_from_dot_data(export(p, "dot"))
    nodes = [n for n in g.get_nodes() if n.get_name() not in ("node", "edge", "graph")]
    want = p.call_graph()
    assert len(nodes) == want.number_of_nodes()
    assert len(g.get_edges()) == want.number_of_edges()
    for m, v in totals(p).items():
        assert sum(int(_unquote(n.get_attributes()[m])) for n in nodes) == v, m
    keys = {_unquote(n.get_attributes()["key"]): n for n in nodes}
    assert set(keys) == set(want.nodes)
    for k, n in keys.items():
        assert _unquote(n.get_attributes()["fullname"]) == want.nodes[k]["name"]


def test_dot_quotes_hostile_names():
    name = 'void k<"a">::{lambda()#1}\\x\nnext'
    p = synthetic_profile([([Frame("op", "aten::mm"), Frame("kernel", name)], 42)])
    (g,) = pydot.graph_from_dot_data(export(p, "dot"))
    names = [_unquote(n.get_attributes()["fullname"]) for n in g.get_nodes() if "fullname" in n.get_attributes()]
    assert name in names
    assert sum(int(_unquote(n.get_attributes()["gpu_time"])) for n in g.get_nodes()
               if "gpu_time" in n.get_attributes()) == 42


# ---- the command line ---------------------------------------------------------------------

def run_dlpt(*args: str) -> subprocess.CompletedProcess:
    # A reading command, in this process (conftest.dlpt_in_process): a process each was most of
    # this file's time; `python -m dlpt` itself, its exit codes and tracebacks are tested in processes
    # elsewhere (tests/test_cli.py, tests/test_bad_input.py).
    return dlpt_in_process(*args)


def test_cli_export_every_interop_format(tmp_path):
    src = str(trace_path("gpt_train"))
    total = totals(prof("gpt_train"))
    for fmt in ("hatchet", "folded", "speedscope", "dot", "graphml"):
        out = tmp_path / f"out.{fmt}"
        r = run_dlpt("export", src, "-f", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
        assert out.stat().st_size > 0
    gf = _hatchet().GraphFrame.from_literal(json.loads((tmp_path / "out.hatchet").read_text()))
    assert int(gf.dataframe["gpu_time"].sum()) == total["gpu_time"]
    assert sum(v for _, v in parse_folded((tmp_path / "out.folded").read_text())) == total["gpu_time"]
    r = run_dlpt("export", src, "-f", "folded", "--metric", "cpu_time", "-o", "-")
    assert r.returncode == 0 and sum(v for _, v in parse_folded(r.stdout)) == total["cpu_time"]
    assert nx.read_graphml(tmp_path / "out.graphml").number_of_nodes() > 10


def test_cli_export_bad_metric_is_one_line_exit_2(tmp_path):
    r = run_dlpt("export", str(trace_path("copies")), "-f", "folded", "--metric", "bogus", "-o", str(tmp_path / "x"))
    assert r.returncode == 2
    assert r.stderr.startswith("dlpt: ") and "Traceback" not in r.stderr
