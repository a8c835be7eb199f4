"""Phases (dlpt/phases.py): start-up, compile and the steady state kept apart in one profile, and
the diagnosis judged on the steady state (dlpt/findings.py).

Two kinds of input: profiles built here the way the recorder builds them (a tree with a phase
node per phase, GPU idle blamed phase by phase through collectors/record/phases.py), with figures
a reader can check by hand; and real CPU recordings of programs with steps, checked against
their own timers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest

from dlpt import findings as fd
from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.record.native import P_COMPILE, P_STARTUP, P_STEADY, P_WARMUP
from dlpt.collectors.record.phases import phase_idle, phase_names, phase_node, phase_walls
from dlpt.frames import Frame, FrameTable, source_frame
from dlpt.merge import merge_profiles
from dlpt.metrics import COL, KERNEL, METRICS
from dlpt.phases import COMPILE, STARTUP, STEADY, phase_figures, select_phase, split_phases, table_of
from dlpt.ranks import straggler
from dlpt.store import load, save

MS = 1_000_000
S = 1_000_000_000


def phased(phases: list[tuple[int, int, int]], lines: dict[int, tuple[int, str]], kernels: dict[int, list[tuple]],
           steps: int = 1, sync: dict[int, int] | None = None) -> object:
    """A recorded-shape profile of one thread and one GPU. `phases`: (raw phase, start, end) in
    order; `lines[raw]`: the (line, kernel name) the main thread runs in that phase, where it
    launches `kernels[raw]`: (start, duration) each; `sync[raw]`: sync time on that phase's line.
    Idle is blamed phase by phase as the recorder does; the tree is split as the recorder splits it."""
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    names = phase_names(steps, {p for p, _, _ in phases})
    spans = [(s, e, p) for p, s, e in phases]
    node_of, cols = {}, ActivityColumns()
    hs, he, hn = [], [], []
    for raw, s, e in phases:
        line, kname = lines[raw]
        top = phase_node(b, frames, raw)
        node = node_of[raw] = b.child(top, frames.intern(source_frame("train.py", line, "<module>")))
        hs.append(s)
        he.append(e)
        hn.append(node)
        leaf = frames.intern(Frame("kernel", kname))
        for ks, kd in kernels.get(raw, []):
            cols.node.append(b.child(node, leaf))
            cols.kind.append(KERNEL)
            cols.name.append(leaf)
            cols.device.append(0)
            cols.stream.append(7)
            cols.start.append(ks)
            cols.duration.append(kd)
            cols.nbytes.append(0)
    if sync:
        cols.extra["sync_time"] = (np.array([node_of[r] for r in sync]), np.array(list(sync.values())))
    w0, w1 = phases[0][1], phases[-1][2]
    busy = {0: (np.asarray(cols.start, dtype=np.int64), np.asarray(cols.start, dtype=np.int64)
                + np.asarray(cols.duration, dtype=np.int64))}
    meta = {"source": "record", "steps_seen": steps, "window": {"start": w0, "end": w1},
            "phases": phase_walls(spans, names), "phase_names": names}
    host = (np.array(hs), np.array(he), np.array(hn), np.zeros(len(hs), np.int64), np.zeros(len(hs), np.int64))
    cols.extra["gpu_idle_time"], meta["gpu_idle"] = phase_idle(b, frames, {0: (w0, w1)}, busy, spans, names, host,
                                                               meta["phases"])
    return split_phases(build_profile(b, frames, cols, meta), names)


def gpu_bound_after_startup():
    """10 s of start-up (building the model, no GPU work), then 2 s of steps whose 1 ms kernels
    keep the GPU 95.2% busy (50 us between them)."""
    ks = [(10 * S + i * 1_050_000, 1_000_000) for i in range(1904)]
    return phased([(P_STARTUP, 0, 10 * S), (P_STEADY, 10 * S, 12 * S)],
                  {P_STARTUP: (3, "-"), P_STEADY: (10, "ampere_sgemm_128x64")}, {P_STEADY: ks})


def test_ten_seconds_of_start_up_then_gpu_bound_steps_is_gpu_bound():
    prof = gpu_bound_after_startup()
    got = {f.rule: f for f in fd.findings(prof)}
    assert set(got) == {"gpu-bound"}
    f = got["gpu-bound"]
    busy = 1904 * 1_000_000 / (2 * S)  # 95.2%, by hand
    assert f.of == "steady state" and f.share == pytest.approx(busy)
    assert f.lines == ["train.py:10"]
    # The same run judged over its whole window (the phases thrown away) is 15.9% busy, most of
    # its idle on the start-up's line: what dlpt said before it had phases.
    whole = {f.rule for f in fd.findings(replace(prof, phases=None))}
    assert "gpu-bound" not in whole


def test_phase_figures_add_up_to_the_run():
    prof = gpu_bound_after_startup()
    figs = {f.name: f for f in phase_figures(prof)}
    assert set(figs) == {STARTUP, STEADY}
    assert figs[STARTUP].wall == 10 * S and figs[STEADY].wall == 2 * S
    assert figs[STARTUP].busy == 0 and figs[STARTUP].idle == 10 * S
    assert figs[STEADY].busy == 1904 * MS and figs[STEADY].busy + figs[STEADY].idle == 2 * S
    # Every metric of every node is conserved: the phases' profiles add up to the run's.
    total = np.zeros(len(METRICS), dtype=np.int64)
    for name in (STARTUP, COMPILE, STEADY):
        total += select_phase(prof, name).cct.exclusive.sum(axis=0)
    assert (total == prof.cct.exclusive.sum(axis=0)).all()
    # The idle column of a phase is its idle by time, to the nanosecond.
    steady = select_phase(prof, STEADY)
    assert int(steady.cct.exclusive[:, COL["gpu_idle_time"]].sum()) == figs[STEADY].idle


def test_warm_up_is_start_up_with_steps_and_steady_without():
    """The first step's one-off work (warm-up) is start-up when the program had steps; a loop with
    none (decode, inference) never ends it, and then it is the steady state."""
    ph = [(P_STARTUP, 0, S), (P_WARMUP, S, 2 * S), (P_STEADY, 2 * S, 3 * S)]
    lines = {P_STARTUP: (3, "-"), P_WARMUP: (8, "k"), P_STEADY: (10, "k")}
    with_steps = phased(ph, lines, {}, steps=5)
    assert {f.name: f.wall for f in phase_figures(with_steps)} == {STARTUP: 2 * S, STEADY: S}
    no_steps = phased(ph[:2], lines, {}, steps=0)
    assert {f.name: f.wall for f in phase_figures(no_steps)} == {STARTUP: S, STEADY: S}
    # A run that never left start-up (no GPU work, no step) was all steady state.
    assert phase_names(0, {P_STARTUP})["start-up"] == STEADY


def launch_bound_triton(compile_s: int = 0):
    """A steady state of 2,000 short Triton kernels (5 us each, 50 us apart: 9% busy), optionally
    after `compile_s` seconds of compiling."""
    t0 = compile_s * S
    ks = [(t0 + 100 * MS + i * 50_000, 5_000) for i in range(2000)]
    ph = ([(P_COMPILE, 0, t0)] if compile_s else []) + [(P_STEADY, t0, t0 + 200 * MS)]
    return phased(ph, {P_COMPILE: (5, "-"), P_STEADY: (12, "triton_poi_fused_add_0")}, {P_STEADY: ks}, steps=0)


def test_a_compiled_program_is_never_told_to_compile():
    got = {f.rule: f for f in fd.findings(launch_bound_triton())}
    f = got["launch-bound"]
    assert "compile the model with torch.compile" not in f.remedy and "already compiled" in f.remedy
    assert f.lines == ["train.py:12"]


def test_compiling_has_a_verdict_of_its_own():
    """45 s of compiling in a 45.2 s run: a `compile` finding of the run, and the steady state's
    own verdict beside it."""
    got = {f.rule: f for f in fd.findings(launch_bound_triton(compile_s=45))}
    c = got["compile"]
    assert c.of == "run" and c.share == pytest.approx(45 / 45.2)
    assert "launch-bound" in got and got["launch-bound"].of == "steady state"
    assert "compile" not in {f.rule for f in fd.findings(launch_bound_triton())}


def test_store_and_merge_keep_the_phases(tmp_path):
    prof = gpu_bound_after_startup()
    save(prof, str(tmp_path / "a.dlpt"))
    back = load(str(tmp_path / "a.dlpt"))
    t = table_of(back)
    assert t is not None and t.names == table_of(prof).names
    for name in (STARTUP, STEADY):
        assert (select_phase(back, name).cct.exclusive.sum(axis=0)
                == select_phase(prof, name).cct.exclusive.sum(axis=0)).all()
    two = merge_profiles([replace(back, meta={**back.meta, "rank": 0}), replace(back, meta={**back.meta, "rank": 1})])
    for name in (STARTUP, STEADY):
        assert (select_phase(two, name).cct.exclusive.sum(axis=0)
                == 2 * select_phase(prof, name).cct.exclusive.sum(axis=0)).all()
    assert {f.rule for f in fd.findings(two)} >= {"gpu-bound"}


def test_a_profile_without_phases_is_all_steady_state():
    prof = replace(gpu_bound_after_startup(), phases=None)
    assert select_phase(prof, STEADY) is prof
    assert len(select_phase(prof, STARTUP).cct) == 1  # the root alone


PROGRAM = """\
import json, sys, time
import torch
time.sleep(0.4)  # START-UP
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
steps = []
for i in range(40):
    t0 = time.perf_counter()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.004)  # IN STEP
    steps.append(time.perf_counter() - t0)
json.dump({"after_first": sum(steps[1:])}, open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("phases")
    (tmp / "prog.py").write_text(textwrap.dedent(PROGRAM))
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "-o", "run.dlpt", "prog.py", "truth.json"],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return load(str(tmp / "run.dlpt")), json.loads((tmp / "truth.json").read_text()), tmp


def test_a_recording_with_steps_has_start_up_then_steady_state(recorded):
    prof, truth, _ = recorded
    figs = {f.name: f for f in phase_figures(prof)}
    assert set(figs) == {STARTUP, STEADY}
    win = prof.meta["window"]
    assert figs[STARTUP].wall + figs[STEADY].wall == win["end"] - win["start"]
    # The steady state starts where the first step ends: it holds the other 39 steps, which the
    # program timed (the loop's end and the save are a few ms more). Measured: +0.3% to +1.5%.
    assert truth["after_first"] * 1e9 <= figs[STEADY].wall <= truth["after_first"] * 1e9 * 1.06
    # The start-up's sleep is start-up's alone, and none of the steps' lines is.
    steady = select_phase(prof, STEADY)
    startup = select_phase(prof, STARTUP)

    def lines(p):
        return {p.frames[f].line for f in np.unique(p.cct.frame) if p.frames[f].file.endswith("prog.py")}

    assert 3 in lines(startup) and 3 not in lines(steady)
    assert {10, 11, 13} <= lines(steady)


def test_report_and_export_take_a_phase(recorded):
    _, _, tmp = recorded
    r = subprocess.run([sys.executable, "-m", "dlpt", "report", "run.dlpt", "--phase", "steady", "--view", "flat"],
                       cwd=tmp, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()
    assert any(x.startswith("phases: start-up ") and "showing steady (--phase steady)" in x for x in head)
    assert "prog.py:3 " not in r.stdout  # the start-up's line is not in the steady state's view
    r = subprocess.run([sys.executable, "-m", "dlpt", "export", "run.dlpt", "--phase", "startup"],
                       cwd=tmp, capture_output=True, text=True, timeout=120)
    s = json.loads(r.stdout)["summary"]
    assert s["phase"] == STARTUP and set(s["phases"]) == {STARTUP, STEADY}
    assert s["wall_time"] == s["phases"][STARTUP]["wall_time"]
    r = subprocess.run([sys.executable, "-m", "dlpt", "report", "run.dlpt", "--phase", "warmup"],
                       cwd=tmp, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("dlpt: ") and "Traceback" not in r.stderr


def test_a_steps_window_is_steady_state(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "--steps", "5:10", "-o", "run.dlpt", "prog.py",
                        "truth.json"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert {f.name for f in phase_figures(load(str(tmp_path / "run.dlpt")))} == {STEADY}


def test_a_frame_on_its_def_line_is_its_callers_work():
    """A compiled function's frame stands on its `def` line while its compiled code runs beneath
    it: its time goes to the line that called it, in the views (dlpt.scope) and in the diagnosis."""
    from dlpt.evidence import Lines
    from dlpt.scope import Scope
    from dlpt.views import flat

    src = "def step(x):\n    return x * 2\n\nfor i in range(3):\n    y = step(i)\n"
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    caller = b.child(0, frames.intern(source_frame("prog.py", 5, "<module>")))
    entry = b.child(caller, frames.intern(source_frame("prog.py", 1, "step")))
    leaf = frames.intern(Frame("kernel", "triton_poi_fused_mul_0"))
    kernel = b.child(entry, leaf)
    cols = ActivityColumns(node=[kernel], kind=[KERNEL], name=[leaf], device=[0], stream=[7], start=[0],
                           duration=[5 * MS], nbytes=[0], count=[3])
    cols.extra["host_time"] = (np.array([entry]), np.array([2 * MS]))
    prof = replace(build_profile(b, frames, cols, {"source": "record"}), sources={"prog.py": src})
    fv = flat(Scope().apply(prof), "line")
    lines = {fr.line: int(fv.exclusive[g, COL["gpu_time"]]) for g, fr in enumerate(fv.frame) if fr.kind == "python"}
    assert lines == {5: 5 * MS}
    assert Lines(prof).labels == ["prog.py:5"]
    # A trace names functions by their def lines: kept there.
    kept = flat(Scope().apply(replace(prof, meta={"source": "kineto"})), "line")
    assert {fr.line: int(kept.exclusive[g, COL["gpu_time"]]) for g, fr in enumerate(kept.frame)
            if fr.kind == "python" and kept.exclusive[g, COL["gpu_time"]]} == {1: 5 * MS}


def test_the_straggler_is_judged_on_the_steady_state_whatever_phase_is_shown():
    """Rank 0 runs a 1 s kernel during its start-up (building the model, say) and 1,000 1-ms
    kernels in its steps; rank 1 none in start-up and 1,500 in its steps. Over the whole run rank
    0 has the more GPU time (2.0 s against 1.5 s); in the steps rank 1 computes 500 ms more, on
    line 10: the straggler."""
    from dlpt.scope import Scope
    from dlpt.viewers.hotspots import hotspots
    from dlpt.viewers.report import rank_lines

    def rank(r: int, n_steps: int, startup_kernel: bool) -> object:
        ks = [(10 * S + i * 1_050_000, 1_000_000) for i in range(n_steps)]
        p = phased([(P_STARTUP, 0, 10 * S), (P_STEADY, 10 * S, 12 * S)],
                   {P_STARTUP: (3, "init_kernel"), P_STEADY: (10, "gemm")},
                   {P_STARTUP: [(S, S)] if startup_kernel else [], P_STEADY: ks})
        return replace(p, meta={**p.meta, "rank": r, "world_size": 2})

    two = merge_profiles([rank(0, 1000, True), rank(1, 1500, False)])
    whole = straggler(two, "gpu_time")
    assert whole["rank"] == 0 and whole["excess"] == 500 * MS  # what the rule says of the whole run
    doc = hotspots(two, "gpu_time")["summary"]["straggler"]
    assert doc["rank"] == 1 and doc["phase"] == STEADY and doc["excess"] == pytest.approx(500_000)  # us
    assert doc["line"]["line"] == 10
    for phase in ("all", STARTUP, STEADY):  # the header says the same whatever the view shows
        text = "\n".join(rank_lines(Scope(phase=phase).apply(two), "gpu_time"))
        assert "straggler: rank 1 computes 500.00 ms" in text and "in the steady state" in text, text


def test_compile_hooks_before_the_first_recording_do_not_crash():
    """`dlpt record --steps 4:6` installs the compile hooks at once and starts the collector at
    step 4: a program that compiles before it called the collector's phase change with no trie yet
    and died of SIGSEGV (a child process here, so that a crash fails this test alone)."""
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        from dlpt.collectors.record import native
        mod = native.load(quiet=True)
        mod.compile_phase(1)
        mod.set_phase(native.P_STEADY)
        mod.compile_phase(-1)
        print("survived")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "survived", (r.returncode, r.stderr[-2000:])
