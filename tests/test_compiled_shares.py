"""Shares by work and torch.compile's time apart, end to end: `dlpt record` on a real compiled
program (CPU: Inductor's C++ kernels are recorded as ops), then the profile, the report and the
hotspots as a user reads them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import copy_isa_probes

from dlpt.compile_time import compile_apart, compile_roots
from dlpt.frames import FUSED_PREFIX
from dlpt.metrics import COL
from dlpt.store import load
from dlpt.viewers.hotspots import hotspots
from dlpt.viewers.tui.detail import fused_note

R, C = 64, 256  # x is viewed as (R, C), then permuted

PROGRAM = f'''
import torch


def f(x, w):
    a = x.view({R}, {C})  # LINE: view
    b = a.permute(1, 0)  # LINE: permute
    c = torch.sin(b) * torch.cos(b) + 1.0  # LINE: heavy
    d = c * 2  # LINE: light
    dt = d.t()  # LINE: t
    e = dt @ w  # LINE: mm
    return e.relu()  # LINE: relu


cf = torch.compile(f)
x, w = torch.randn({R} * {C}), torch.randn({C}, 32)
for _ in range(3):
    cf(x, w)
'''


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, inductor_isa_probed):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("shares")
    prog = d / "fused_prog.py"
    prog.write_text(textwrap.dedent(PROGRAM))
    out = d / "p.dlpt"
    # A cache of its own: Inductor's FX-graph cache would serve another run's compile of the same
    # text, whose stack traces name that run's file. It starts with the run's ISA probes alone
    # (conftest.inductor_isa_probed), not with ten compiles of them again.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(copy_isa_probes(inductor_isa_probed, d / "inductor"))}
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "--force", "-o", str(out), str(prog)],
                       capture_output=True, text=True, timeout=900, cwd=d, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {m.group(1): i for i, ln in enumerate(prog.read_text().splitlines(), 1)
             for m in [re.search(r"# LINE: (\w+)", ln)] if m}
    return {"path": str(out), "prof": load(str(out)), "file": str(prog), "lines": lines}


def line_of(prof, node):
    return [f.line for f in prof.call_path(node) if f.kind == "python" and f.file.endswith("fused_prog.py")][-1]


def test_fused_shares_follow_work_and_views_get_none(recorded):
    prof, lines = recorded["prof"], recorded["lines"]
    col = COL["cpu_time"]
    fused = [i for i in range(len(prof.cct)) if prof.frame_of(i).name.startswith(FUSED_PREFIX)
             and "sin" in prof.frame_of(i).name]
    by_line = {}
    for i in fused:
        by_line[line_of(prof, i)] = by_line.get(line_of(prof, i), 0) + int(prof.cct.inclusive[i, col])
    # the view, permute lines are in the kernel's name and provenance, yet get no share and no node
    assert set(by_line) == {lines["heavy"], lines["light"]}
    # work: bytes each node reads and writes on its own. heavy: sin (in+out), cos (in+out), mul
    # (2 in + out), add of a scalar (in+out) = 9 tensors; light: mul by a scalar = 2 tensors.
    heavy, light = by_line[lines["heavy"]], by_line[lines["light"]]
    assert heavy > 0 and light > 0
    assert abs(heavy * 2 - light * 9) <= 11  # 9:2, up to the integer split's rounding
    (name,) = {prof.frame_of(i).name for i in fused}
    (entry,) = prof.meta["compiled_provenance"]["shares"][name]
    assert entry["basis"].startswith("work")
    w = {ln: wt for _, ln, wt in entry["lines"]}
    size = R * C * 4
    assert w == {lines["heavy"]: 9 * size, lines["light"]: 2 * size, lines["view"]: 0, lines["permute"]: 0}
    note = fused_note(prof, fused[0], "cpu_time")
    assert f"fused_prog.py:{lines['heavy']} 81.8%" in note and f"fused_prog.py:{lines['view']} 0.0%" in note


def test_extern_mm_on_its_ops_line(recorded):
    prof, lines = recorded["prof"], recorded["lines"]
    mm = [i for i in range(len(prof.cct)) if prof.frame_of(i).name == f"{FUSED_PREFIX}extern_kernels.mm]"]
    assert mm and {line_of(prof, i) for i in mm} == {lines["mm"]}
    ops = [i for i in range(len(prof.cct)) if prof.frame_of(i).name == "aten::mm"
           and any(prof.frame_of(a).name.startswith(FUSED_PREFIX) for a in prof.cct.path(i))]
    assert ops and int(prof.cct.inclusive[mm, COL["cpu_time"]].sum()) >= int(prof.cct.inclusive[ops, COL["cpu_time"]].sum()) > 0


def test_compile_time_apart_in_headline_flat_and_hotspots(recorded):
    prof, path = recorded["prof"], recorded["path"]
    roots, kinds = compile_roots(prof)
    assert len(roots) and "compiling" in set(kinds)
    compile_ns = int(prof.cct.inclusive[roots, COL["cpu_time"]].sum())
    assert compile_ns > 0
    # apart: conserved (what is dropped is exactly the compile subtrees)
    apart = compile_apart(prof)
    assert int(apart.cct.inclusive[0, COL["cpu_time"]]) == int(prof.cct.inclusive[0, COL["cpu_time"]]) - compile_ns
    assert apart.meta["torch_compile"]["compiling"]["cpu_time"] == int(
        prof.cct.inclusive[roots[kinds == "compiling"], COL["cpu_time"]].sum())
    inc = np.asarray(compile_apart(prof, include_compile=True).cct.inclusive[0])
    assert (inc == prof.cct.inclusive[0]).all()

    def report(*extra):
        r = subprocess.run([sys.executable, "-m", "dlpt", "report", path, "--view", "flat", "--top", "10", "--metric", "cpu_time", *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    text = report()
    head = [ln for ln in text.splitlines() if ln.startswith("torch.compile: ")]
    assert len(head) == 1 and "(compiling)" in head[0] and "not in the flat view" in head[0]
    rows = text.split("flat view by line", 1)[1].splitlines()[2:12]
    # the flat top 10 holds the model's lines, and no row holds compile time: the rows' self
    # times add up to the steady state's total, not to the total with compiling
    assert any("LINE: heavy" in r for r in rows)
    with_compile = report("--include-compile")
    assert "ranked with the rest" in with_compile
    # hotspots: left out by default, in with include_compile
    plain = hotspots(prof, metric="cpu_time", top=50)
    full = hotspots(prof, metric="cpu_time", top=50, include_compile=True)
    assert json.dumps(plain["summary"]) != json.dumps(full["summary"])


def test_a_cpu_program_starts_up_compiles_then_runs_steady(recorded):
    """No GPU work to end start-up: the first compile's end does, as it ends a GPU program's warm-up.
    Before, the imports and set-up were named the steady state, and the first compile then read
    as a compile "after the steady state began"."""
    from dlpt.findings import findings
    from dlpt.phases import COMPILE, STARTUP, STEADY

    prof = recorded["prof"]
    assert [s[2] for s in prof.meta.phase_spans] == [STARTUP, COMPILE, STEADY]
    (compiling,) = [f for f in findings(prof) if f.rule == "compile"]
    assert "more time" not in compiling.figure, compiling.figure


def test_importing_dynamo_is_not_compiling() -> None:
    """torch imports Dynamo lazily (AdamW's __init__ does): convert_frame.py's module body then
    runs under the program's line, and compiles nothing. Its frames in a function do."""
    from dlpt.compile_time import compile_kind
    from dlpt.frames import Frame

    conv = "/site-packages/torch/_dynamo/convert_frame.py"
    assert compile_kind(Frame("python", "<module> (convert_frame.py:1)", conv, 1, "<module>")) == ""
    assert compile_kind(Frame("python", "_compile", conv, 900, "_compile")) == "compiling"
    bench = "/site-packages/torch/_inductor/runtime/benchmarking.py"
    assert compile_kind(Frame("python", "<module>", bench, 1, "<module>")) == ""
    assert compile_kind(Frame("python", "benchmark_gpu", bench, 200, "benchmark_gpu")) == "autotuning"


def test_the_cpu_sample_keeps_its_host_time_in_the_views() -> None:
    """The shipped CPU sample imported Dynamo inside opt = AdamW(...): none of its host time is
    left out of the flat view as compile work."""
    from conftest import DATA

    import dlpt
    from dlpt.compile_time import compile_apart
    from dlpt.metrics import COL

    prof = dlpt.load(str(DATA / "cpu_train_small.dlpt"))
    apart = compile_apart(prof, False)
    assert "torch_compile" not in apart.meta
    assert int(apart.cct.exclusive[:, COL["host_time"]].sum()) == int(prof.cct.exclusive[:, COL["host_time"]].sum())
