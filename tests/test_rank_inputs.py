"""Several inputs: only the ranks of one run are merged as ranks (dlpt/runs.py), unless
`--as-ranks`; a rank with no GPU activity is left out of the GPU straggler rule."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import dlpt_in_process
from kineto_builder import BASE_NS, TraceBuilder
from test_ranks import gpu_profile

from dlpt import load as dlpt_load
from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.errors import DlptError
from dlpt.frames import Frame, FrameTable
from dlpt.merge import merge_profiles
from dlpt.ranks import rank_nodes, straggler
from dlpt.store import save

HOUR_NS = 3600 * 10**9
COMMANDS_WITH_INPUTS = ("report", "view", "export", "import", "diff")


def dlpt(*args: str) -> subprocess.CompletedProcess:
    return dlpt_in_process(*args)  # reading commands: in this process (conftest.dlpt_in_process)


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


def test_recordings_are_placed_by_their_start_and_window_length(tmp_path):
    """A recording's wall-clock window is its start_time plus its window's length: two 3 s
    recordings that overlap are one run; one that starts 10 s after the other ended is another."""
    def rec(rank: int, start: str) -> str:
        p = gpu_profile({10: [("gemm", 100)]}, rank=rank)
        p.meta.update(start_time=start, window={"start": 5_000_000_000, "end": 8_000_000_000})
        path = str(tmp_path / f"{rank}-{start[14:19].replace(':', '')}.dlpt")
        save(p, path)
        return path

    a = rec(0, "2025-01-01T10:00:00.000000+00:00")
    assert dlpt("report", a, rec(1, "2025-01-01T10:00:01.500000+00:00")).returncode == 0
    late = rec(1, "2025-01-01T10:00:13.000000+00:00")
    refused(dlpt("report", a, late))
    # A --steps recording made before start_time meant the window's start said the session's
    # start: placed by its start alone, with a minute's slack.
    for path in (a, late):
        p = dlpt_load(path)
        p.meta["steps"] = [10, 20]
        save(p, path)
    assert dlpt("report", a, late).returncode == 0


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


# ----- a rank with no GPU activity -----


def cpu_profile(rank: int, ns: int):
    """A rank that ran host ops only (a CPU-only rank, or one whose GPU was not traced)."""
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "t")))
    out = ActivityColumns()
    node = b.child(0, frames.intern(Frame("python", "train.py(10): step", "train.py", 10, "step")))
    op = b.child(node, frames.intern(Frame("op", "aten::mm")))
    out.cpu_node.append(op)
    out.cpu_self.append(ns)
    return build_profile(b, frames, out, {"source": "kineto", "rank": rank, "world_size": 2})


def test_a_cpu_only_rank_is_left_out_of_the_gpu_straggler_rule(tmp_path):
    save(gpu_profile({10: [("gemm", 5000)]}, rank=0), str(tmp_path / "r0.dlpt"))
    save(cpu_profile(1, 9000), str(tmp_path / "r1.dlpt"))
    files = [str(tmp_path / "r0.dlpt"), str(tmp_path / "r1.dlpt")]
    r = dlpt("report", *files, "--view", "flat")
    assert r.returncode == 0, r.stderr
    assert "rank 1 has no GPU activity; left out of the straggler rule" in r.stdout
    assert "straggler:" not in r.stdout and "ranks balanced" not in r.stdout, r.stdout
    doc = json.loads(dlpt("export", *files, "-o", "-").stdout)
    assert doc["summary"]["straggler"]["straggler"] is False and doc["summary"]["straggler"]["left_out"] == [1]
    # In host op time every rank takes part: rank 1 ran 9 us of ops, rank 0 none.
    r = dlpt("report", *files, "--view", "flat", "--metric", "cpu_time")
    assert "left out" not in r.stdout and "straggler: rank 1" in r.stdout, r.stdout


def test_the_rule_runs_on_the_gpu_ranks_alone():
    world = [gpu_profile({10: [("gemm", 1000)]}, rank=0, world=3), gpu_profile({10: [("gemm", 3000)]}, rank=1, world=3),
             cpu_profile(2, 50)]
    world[2].meta["world_size"] = 3
    v = straggler(merge_profiles(world), "gpu_time")
    assert v is not None and v["straggler"] and v["rank"] == 1 and v["left_out"] == [2]
    assert set(v["compute"]) == {"0", "1"} and v["excess"] == 2000
    assert v["line"]["per_rank"] == {"0": 1000, "1": 3000}
    assert straggler(merge_profiles(world), "cpu_time")["left_out"] == []
