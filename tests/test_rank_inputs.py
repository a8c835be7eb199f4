"""Several inputs: only the ranks of one run are merged as ranks (dlpt/runs.py), unless
`--as-ranks`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kineto_builder import BASE_NS, TraceBuilder
from test_ranks import gpu_profile

from dlpt.errors import DlptError
from dlpt.merge import merge_profiles
from dlpt.ranks import rank_nodes
from dlpt.store import save

HOUR_NS = 3600 * 10**9
COMMANDS_WITH_INPUTS = ("report", "view", "export", "import", "diff")


def dlpt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlpt", *args], capture_output=True, text=True, timeout=120)


def step_trace(path, pid: int, gemm_us: float, base_ns: int = BASE_NS, rank: int | None = None,
               world: int | None = None):
    """One step of `train.py`: line 10 launches a kernel of `gemm_us`."""
    tb = TraceBuilder(pid=pid)
    tb.py(10, "step", 0.0, 1000.0)
    tb.kernel(1.0, 5.0, 10.0, gemm_us)
    return tb.write(path, base_ns=base_ns, rank=rank, world=world)


def refused(r: subprocess.CompletedProcess, *names: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("dlpt: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and "--as-ranks" in r.stderr
    for n in names:
        assert n in r.stderr, r.stderr
    assert r.stdout == ""


def test_a_folder_of_two_unrelated_runs_is_refused_unless_as_ranks(tmp_path):
    # Two runs an hour apart, no distributedInfo: before, rank 1 was "the straggler".
    d = tmp_path / "log"
    d.mkdir()
    step_trace(d / "host_100.1.pt.trace.json.gz", 100, 100.0)
    step_trace(d / "host_200.2.pt.trace.json.gz", 200, 900.0, base_ns=BASE_NS + HOUR_NS)
    r = dlpt("report", str(d), "--view", "flat")
    refused(r, "host_100.1.pt.trace.json.gz", "host_200.2.pt.trace.json.gz", "60 min apart")
    assert "UTC" in r.stderr
    r = dlpt("report", str(d), "--view", "flat", "--as-ranks", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [x["rank"] for x in json.loads(r.stdout)["summary"]["ranks"]] == [0, 1]
    # The same two as files; import, export and diff alike.
    files = [str(p) for p in sorted(d.iterdir())]
    refused(dlpt("report", *files), "--as-ranks")
    refused(dlpt("export", *files, "-o", "-"))
    out = tmp_path / "both.dlpt"
    refused(dlpt("import", *files, "-o", str(out)))
    assert not out.exists()
    refused(dlpt("diff", str(d), str(d)))
    assert dlpt("import", *files, "-o", str(out), "--as-ranks").returncode == 0
    assert dlpt("diff", str(d), str(d), "--as-ranks").returncode == 0
    assert dlpt("export", *files, "-o", "-", "--as-ranks").returncode == 0


def test_ranks_of_one_run_still_merge(tmp_path):
    d = tmp_path / "log"
    d.mkdir()
    # Profiled together (10 ms apart: clocks of two nodes), each its own process and rank.
    step_trace(d / "r0.pt.trace.json.gz", 100, 100.0, rank=0, world=2)
    step_trace(d / "r1.pt.trace.json.gz", 200, 900.0, base_ns=BASE_NS + 10**7, rank=1, world=2)
    r = dlpt("report", str(d), "--view", "flat")
    assert r.returncode == 0, r.stderr
    assert "straggler: rank 1" in r.stdout
    # Nothing recorded (no rank, no time, no pid): merged as before.
    a, b = gpu_profile({10: [("gemm", 5)]}), gpu_profile({10: [("gemm", 7)]})
    assert [r for r, _ in rank_nodes(merge_profiles([a, b]))] == [0, 1]


@pytest.mark.parametrize("case", ["same rank", "world size", "one process", "more ranks than the world"])
def test_inputs_that_contradict_one_run_are_refused(tmp_path, case):
    a, b = tmp_path / "a.pt.trace.json.gz", tmp_path / "b.pt.trace.json.gz"
    if case == "same rank":  # two profiling cycles of one rank, or two runs
        step_trace(a, 100, 100.0, rank=0, world=2)
        step_trace(b, 101, 100.0, rank=0, world=2)
        expect = "both rank 0"
    elif case == "world size":
        step_trace(a, 100, 100.0, rank=0, world=2)
        step_trace(b, 101, 100.0, rank=1, world=4)
        expect = "world size 2 and 4"
    elif case == "one process":  # no distributedInfo, one pid: one process's two traces
        step_trace(a, 100, 100.0)
        step_trace(b, 100, 100.0, base_ns=BASE_NS + 10**7)
        expect = "one process (pid 100)"
    else:
        step_trace(a, 100, 100.0, rank=0, world=1)
        step_trace(b, 101, 100.0)
        expect = "a run of 1 rank, but 2 ranks are given"
    refused(dlpt("report", str(a), str(b)), str(a), str(b), expect)
    assert dlpt("report", str(a), str(b), "--as-ranks").returncode == 0


def test_recorded_profiles_of_other_runs_are_refused(tmp_path):
    runs = {"run": ("c0ffee", "c0ffee"), "other-run": ("c0ffee", "beef")}
    for name, ids in runs.items():
        files = []
        for rank, run_id in enumerate(ids):
            p = gpu_profile({10: [("gemm", 100 * (rank + 1))]}, rank=rank)
            p.meta.update(run_id=run_id, start_time="2025-01-01T10:00:00+00:00")
            files.append(str(tmp_path / f"{name}.rank{rank}.dlpt"))
            save(p, files[-1])
        r = dlpt("report", *files)
        if name == "run":
            assert r.returncode == 0, r.stderr
        else:
            refused(r, "run ids (c0ffee and beef)")
    # Profiles from before dlpt kept a wall-clock window: their start times, a minute's slack.
    late = gpu_profile({10: [("gemm", 100)]}, rank=1)
    late.meta["start_time"] = "2025-01-01T10:05:00+00:00"
    save(late, str(tmp_path / "late.dlpt"))
    refused(dlpt("report", str(tmp_path / "run.rank0.dlpt"), str(tmp_path / "late.dlpt")), "5 min apart")


def test_as_ranks_numbers_merged_inputs_too():
    m = merge_profiles([gpu_profile({10: [("gemm", 5)]}, rank=r) for r in (0, 1)])
    with pytest.raises(DlptError, match="both rank 0.*--as-ranks"):
        merge_profiles([m, m])
    mm = merge_profiles([m, m], as_ranks=True)
    assert [r for r, _ in rank_nodes(mm)] == [0, 1, 2, 3]
    assert [r["rank"] for r in mm.meta["ranks"]] == [0, 1, 2, 3]
    assert int(mm.cct.exclusive.sum()) == 2 * int(m.cct.exclusive.sum())


def test_every_command_with_inputs_offers_as_ranks():
    for cmd in COMMANDS_WITH_INPUTS:
        r = dlpt(cmd, "--help")
        assert r.returncode == 0 and "--as-ranks" in r.stdout and "order given" in " ".join(r.stdout.split()), cmd
