"""`dlpt diff`: matching entries across runs and the deltas between them."""

from __future__ import annotations

import functools
import json
import subprocess

import pytest
from conftest import dlpt_in_process, synthetic_profile, trace_path

import dlpt
from dlpt.diff import diff_profiles
from dlpt.frames import Frame
from dlpt.metrics import COL
from dlpt.profile import Profile
from dlpt.viewers.diff import diff_json, render_text
from dlpt.views import GROUPINGS


@functools.cache
def prof(name: str) -> Profile:
    return dlpt.load(str(trace_path(name)))


@pytest.mark.parametrize("by", GROUPINGS)
def test_diff_with_itself_is_all_zeros(by):
    p = prof("gpt_train")
    d = diff_profiles(p, p, by=by)
    assert d.rows and all(r.delta == 0 for r in d.rows)
    assert {r.match for r in d.rows} == {by}  # every row matched exactly, none added or removed
    doc = diff_json(d)
    assert doc["delta"] == 0 and all(r["delta"] == 0 for r in doc["rows"])
    assert doc["a"]["total"] == doc["b"]["total"]
    assert "no differences" in render_text(d)


def test_gpt_train_vs_resnet_by_kernel():
    a, b = prof("gpt_train"), prof("resnet_infer")
    d = diff_profiles(a, b, by="kernel")
    col = COL["gpu_time"]
    assert sum(r.before for r in d.rows) == a.cct.total(col)
    assert sum(r.after for r in d.rows) == b.cct.total(col)
    assert sum(r.delta for r in d.rows) == d.delta == b.cct.total(col) - a.cct.total(col)
    deltas = [abs(r.delta) for r in d.rows]
    assert deltas == sorted(deltas, reverse=True)
    by_name = {r.entry.frame.name: r for r in d.rows}
    # cuDNN convolutions and batch norm only run in the ResNet; the GPT's cuBLAS/cutlass GEMMs
    # and its memory-efficient attention kernels only in the GPT.
    cudnn = [r for n, r in by_name.items() if "cudnn::" in n]
    assert cudnn and all(r.match == "added" and r.before == 0 and r.after > 0 for r in cudnn)
    attn = [r for n, r in by_name.items() if n.startswith("fmha_cutlass")]
    assert attn and all(r.match == "removed" and r.after == 0 and r.percent == -100.0 for r in attn)
    # Both read their batch from the host: that copy is matched and grew with the image batch.
    htod = by_name["Memcpy HtoD (Pageable -> Device)"]
    assert htod.match == "kernel" and htod.after > htod.before > 0


def test_shifted_lines_match_by_code_then_function():
    k = Frame("kernel", "gemm")
    src_a = "\n".join(f"l{i}" for i in range(1, 9)).replace("l3", "x = conv(x)").replace("l4", "x = relu(x)")
    src_b = "\n".join(f"l{i}" for i in range(1, 11)).replace("l5", "x = conv(x)").replace("l6", "x = relu(x)")
    a = synthetic_profile([([Frame("python", "", "m.py", 3, "fwd"), k], 100),
                      ([Frame("python", "", "m.py", 4, "fwd"), k], 50)], sources={"m.py": src_a})
    b = synthetic_profile([([Frame("python", "", "m.py", 5, "fwd"), k], 130),
                      ([Frame("python", "", "m.py", 6, "fwd"), k], 40)], sources={"m.py": src_b})
    d = diff_profiles(a, b, by="line")
    rows = {(r.a.frame.line if r.a else None, r.b.frame.line if r.b else None): r for r in d.rows}
    assert rows[(3, 5)].match == "code" and rows[(3, 5)].delta == 30
    assert rows[(4, 6)].match == "code" and rows[(4, 6)].delta == -10
    text = render_text(d)
    assert "m.py:3→5 fwd" in text and "+30 ns" in text and "+30.0%" in text and "-20.0%" in text
    # Without source snapshots, the leftovers of one function pair up in line order.
    a.sources.clear()
    b.sources.clear()
    d = diff_profiles(a, b, by="line")
    rows = {(r.a.frame.line if r.a else None, r.b.frame.line if r.b else None): r.match for r in d.rows}
    assert rows[(3, 5)] == "function" and rows[(4, 6)] == "function"


def test_same_line_number_other_code_is_not_matched_by_line():
    k = Frame("kernel", "gemm")
    a = synthetic_profile([([Frame("python", "", "m.py", 2, "fwd"), k], 10)], sources={"m.py": "a = 1\nx = conv(x)\n"})
    b = synthetic_profile([([Frame("python", "", "m.py", 2, "fwd"), k], 10),
                      ([Frame("python", "", "m.py", 3, "fwd"), k], 10)], sources={"m.py": "a = 1\ny = new(y)\nx = conv(x)\n"})
    d = diff_profiles(a, b, by="line")
    got = {(r.a.frame.line if r.a else None, r.b.frame.line if r.b else None): r.match for r in d.rows}
    assert got[(2, 3)] == "code" and got[(None, 2)] == "added"


def run_dlpt(*args: str) -> subprocess.CompletedProcess:
    # A reading command, in this process (conftest.dlpt_in_process): a process each was most of
    # this file's time; `python -m dlpt` itself, its exit codes and tracebacks are tested in processes
    # elsewhere (tests/test_cli.py, tests/test_bad_input.py).
    return dlpt_in_process(*args)


def test_cli_diff_text_and_json(tmp_path):
    a, b = str(trace_path("gpt_train")), str(trace_path("resnet_infer"))
    r = run_dlpt("diff", a, b, "--by", "kernel", "--top", "5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "dlpt diff · by kernel · gpu_time"
    table = lines[lines.index("") + 1:]
    assert table[0].split()[:5] == ["change", "%", "before", "after", "matched"]
    assert len([ln for ln in table[1:] if not ln.startswith("…")]) == 5
    assert all(ln.lstrip()[0] in "+-" for ln in table[1:6])
    out = tmp_path / "d.json"
    r = run_dlpt("diff", a, b, "--by", "op", "--format", "json", "--top", "0", "--metric", "cpu_time", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "dlpt.diff/1" and doc["metric"] == "cpu_time" and doc["unit"] == "ns"
    assert sum(row["before"] for row in doc["rows"]) == doc["a"]["total"]["cpu_time"] == doc["before"]
    assert sum(row["after"] for row in doc["rows"]) == doc["b"]["total"]["cpu_time"] == doc["after"]
    assert any(row["match"] == "op" and row["a"]["label"] == "aten::addmm" for row in doc["rows"])


def test_cli_diff_self_and_bad_input(tmp_path):
    a = str(trace_path("copies"))
    r = run_dlpt("diff", a, a)
    assert r.returncode == 0 and "no differences in gpu_time" in r.stdout
    r = run_dlpt("diff", a, str(tmp_path / "missing.dlpt"))
    assert r.returncode == 2 and r.stderr.startswith("dlpt: ") and "Traceback" not in r.stderr
    r = run_dlpt("diff", a, a, "--by", "planet")
    assert r.returncode == 2 and r.stderr.startswith("dlpt: ")
