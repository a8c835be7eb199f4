"""The bench suite's runner: every case it names imports and parses its options (the cases
themselves measure, on the device machine or for minutes, and are never run as tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# In one child: bench/ on sys.path as the runner puts it, each case's --help through the runner.
HELP_ALL = """
import contextlib, io, sys
sys.path.insert(0, "bench")
import run
for name in run.CASES:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = run.main([name, "--help"])
        except SystemExit as e:
            rc = e.code or 0
    assert rc == 0 and "bench/run.py" in out.getvalue(), (name, rc, out.getvalue()[-500:])
    print(name)
"""


def test_every_case_is_listed_imports_and_parses_its_options() -> None:
    listed = subprocess.run([sys.executable, "bench/run.py", "--list"], cwd=ROOT, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    assert {"read", "tui", "cpu-record", "gpu-overhead", "gpu-fidelity", "gpu-cases"} <= set(names)
    helped = subprocess.run([sys.executable, "-c", HELP_ALL], cwd=ROOT, capture_output=True, text=True)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert helped.stdout.split() == names


def test_an_unknown_case_or_device_part_exits_2() -> None:
    for argv in (["nope"], ["device", "nope"], ["device"]):
        r = subprocess.run([sys.executable, "bench/run.py", *argv], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert "bench/run.py" in r.stderr


def test_configurations_with_several_variables_split_on_semicolons() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import runlib
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert runlib.parse_configs("dlpt,proton") == [("dlpt", "dlpt", {}), ("proton", "proton", {})]
    assert runlib.parse_configs("dlpt;lean=dlpt:DLPT_HOST=0,DLPT_SAMPLE_US=0;torch.profiler-cuda") == [
        ("dlpt", "dlpt", {}),
        ("lean", "dlpt", {"DLPT_HOST": "0", "DLPT_SAMPLE_US": "0"}),
        ("torch.profiler-cuda", "torch.profiler-cuda", {}),
    ]


def test_a_measured_run_that_hangs_says_where_it_waited(tmp_path: Path) -> None:
    """A run past its time is ended by SIGABRT before SIGKILL, with faulthandler on: the log then
    holds every thread's Python stack (an HF Trainer process under `dlpt record` once hung with
    nothing but dlpt's start line to show for 420 s)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import runlib
    finally:
        sys.path.remove(str(ROOT / "bench"))
    prog = tmp_path / "stuck.py"
    prog.write_text("import time\n\ndef wait_here():\n    time.sleep(600)\n\nprint('started', flush=True)\nwait_here()\n")
    res = runlib.run([sys.executable, str(prog)], cwd=str(tmp_path), timeout=3, log=str(tmp_path / "log"))
    assert res["timed_out"] and res["wall_s"] < 30
    assert res.out_lines == ["started"]
    assert any("wait_here" in x for x in res.err_lines), res.err_lines
    assert "wait_here" in (tmp_path / "log").read_text()


# A program whose every process takes 0.3 s, estimated at 5 s, in a budget of 5.5 s: only what the
# processes already took can tell that all four fit (the static estimate alone allows two or three).
PROGRAMS_BUDGET = """
import argparse, sys
sys.path.insert(0, "bench")
import programs as pg
pg.PROGRAMS["quick"] = pg.Program(lambda work: (["-c", "import time; time.sleep(0.3); print(7.0)"], work),
                                  lambda r: float(r.out_lines[-1]) if r.out_lines else None, "x", True, 5.0)
a = argparse.Namespace(budget=5.5, configs="plain", env=[], gpus=1, procs=4, warm=False, programs="quick")
run = pg.Programs(a)
run.program("quick")
print("FIGURES", run.res["programs"]["quick"]["figures"]["plain"])
"""


def test_programs_estimate_a_turn_from_the_processes_already_run(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", PROGRAMS_BUDGET], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OUT": str(tmp_path)}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "FIGURES [7.0, 7.0, 7.0, 7.0]" in r.stdout, r.stdout[-2000:]


# A child that prints, then hangs with a grandchild holding its output pipe: the deadline still holds.
HANGS = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("started", flush=True)
time.sleep(60)
"""


def test_a_device_step_is_killed_at_its_deadline_with_what_it_started() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import runlib
    finally:
        sys.path.pop(0)
    said: list[str] = []
    t0 = time.monotonic()
    rc = runlib.stream([sys.executable, "-c", HANGS], 2, said.append)
    assert rc == -9 and time.monotonic() - t0 < 15, (rc, said)
    assert said[0] == "started" and said[-1].startswith("(killed after 2 s"), said
    assert runlib.stream([sys.executable, "-c", "print('done')"], 30, said.append) == 0 and said[-1] == "done"


# A recorded process's figure is set beside what dlpt says of it (dlpt report's findings and the
# steady state's GPU share), in programs.json and in a section of the tables.
PROGRAMS_VERDICTS = """
import argparse, json, os, sys
sys.path.insert(0, "bench")
import programs as pg
script = os.path.join(sys.argv[1], "prog.py")
with open(script, "w") as f:
    f.write("import torch\\nx = torch.ones(64, 64)\\nfor _ in range(50):\\n    x = (x @ x).tanh()\\nprint(3.5)\\n")
pg.PROGRAMS["tiny"] = pg.Program(lambda work: ([script], work),
                                 lambda r: float(r.out_lines[-1]) if r.out_lines else None, "x", True, 30.0)
a = argparse.Namespace(budget=300, configs="plain,dlpt", env=[], gpus=1, procs=1, warm=False, programs="tiny")
run = pg.Programs(a)
run.program("tiny")
print("RUNS", json.dumps(run.res["programs"]["tiny"]["runs"]))
print("TABLES", json.dumps(run.tables))
"""


def test_programs_set_dlpts_verdict_beside_each_recorded_figure(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", PROGRAMS_VERDICTS, str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "OUT": str(tmp_path)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RUNS "))[5:])
    tables = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("TABLES "))[7:])
    by = {x["config"]: x for x in runs}
    assert by["plain"]["figure"] == by["dlpt"]["figure"] == 3.5 and "dlpt" not in by["plain"]
    said = by["dlpt"]["dlpt"]
    assert isinstance(said["findings"], list) and said["line"], said
    assert said["steady_gpu_busy"] is None  # no GPU here: no share, not a zero
    assert said["split"]["device"] == 0 and said["split"]["kernels"] == 0  # what the rules saw: no GPU time
    assert any(t.startswith("tiny: dlpt's verdicts") and said["line"] in t for t in tables), tables
