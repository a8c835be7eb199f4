"""Comm wait on real ranks: two gloo processes under `dlpt record`, rank 1 sleeping on a known
line before each all_reduce; rank 0's wait lands on its all_reduce line, and the straggler
finding names the sleeping line. gloo's collectives are host ops: host-side timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import dlpt  # noqa: E402
from dlpt.metrics import COL  # noqa: E402
from dlpt.ranks import straggler  # noqa: E402
from dlpt.transforms import hide_library_unless  # noqa: E402

SCRIPT = """\
import json, os, sys, time
import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
dist.all_reduce(t)  # warm-up: the first call connects
slept = {"all_reduce": 0.0, "ddp": 0.0}
met = []  # when this rank reaches all_reduce, on the host's shared monotonic clock
for _ in range(3):
    if rank == 1:
        t0 = time.perf_counter()
        time.sleep(0.5)  # SLOW
        slept["all_reduce"] += time.perf_counter() - t0
    met.append(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    dist.all_reduce(t)  # ALLREDUCE
# DDP: its buckets are all-reduced from hooks inside the backward pass, several per step
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)  # WRAP
x = torch.randn(32, 256)
arrive = []  # when this rank reaches backward(), on the host's shared monotonic clock
for step in range(3):
    loss = ddp(x).square().mean()  # FWD
    if rank == 1 and step > 0:
        t0 = time.perf_counter()
        time.sleep(0.2)  # DDP-SLOW
        slept["ddp"] += time.perf_counter() - t0
    arrive.append(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    loss.backward()  # BACKWARD
json.dump({**slept, "met": met, "arrive": arrive}, open(f"truth{rank}.json", "w"))
dist.destroy_process_group()
"""


def _line(marker: str) -> int:
    return next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if marker in t)


def _dlpt_program() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "dlpt")
    if not os.path.exists(here):
        pytest.skip("no dlpt console script beside this python")
    return here


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> tuple[dlpt.Profile, dict[str, float]]:
    d = tmp_path_factory.mktemp("commwait")
    (d / "prog.py").write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "--no-python", _dlpt_program(), "record", "-o", "run.dlpt", "prog.py"],
                       cwd=d, capture_output=True, text=True, timeout=420, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    slept = json.loads((d / "truth1.json").read_text())
    # The wait rank 0 really had in backward(): how much later rank 1 reached it, each step, by the
    # host's monotonic clock (both ranks run on this machine). On a loaded machine rank 0 can be
    # late itself, so this, not the sleep, is what the estimate must match.
    zero = json.loads((d / "truth0.json").read_text())
    for name, key in (("all_reduce_wait", "met"), ("ddp_wait", "arrive")):
        slept[name] = sum(max(0, a1 - a0) for a0, a1 in zip(zero[key], slept.pop(key), strict=True)) / 1e9
    return dlpt.load([str(d / "run.rank0.dlpt"), str(d / "run.rank1.dlpt")]), slept


def _per_rank_line(prof: dlpt.Profile, metric: str, line: int) -> dict[int, int]:
    """metric at `line` of prog.py per rank (the rank node above each row)."""
    from dlpt.ranks import rank_nodes

    p = hide_library_unless(prof, False)
    col = p.cct.inclusive[:, COL[metric]]
    out: dict[int, int] = {}
    for r, k in rank_nodes(p):
        for i in range(k, int(p.cct.end[k])):  # the rank's subtree: a contiguous slice in preorder
            fr = p.frames[p.cct.frame[i]]
            if fr.kind == "python" and fr.line == line and fr.file.endswith("prog.py"):
                out[r] = out.get(r, 0) + int(col[i])
    return out


def test_the_waiting_rank_waits_on_its_all_reduce_line(merged: tuple[dlpt.Profile, dict[str, float]]) -> None:
    prof, slept = merged
    assert "estimated" in prof.meta.get("comm_wait", "")
    waits = _per_rank_line(prof, "comm_wait_time", _line("# ALLREDUCE"))
    # Rank 0 waits from its own arrival at all_reduce to rank 1's, by the shared clock: the sleep
    # when both run on time. 0.5% (7.5 ms of 1.5 s) is for the time between each rank's clock read
    # and its collective's start, should either be descheduled there; a missed sleep is 0.5 s.
    assert slept["all_reduce_wait"] > 0.5 * slept["all_reduce"], slept  # the sleep made the wait
    assert waits.get(0, 0) / 1e9 == pytest.approx(slept["all_reduce_wait"], rel=0.005), (waits, slept)
    assert waits.get(1, 0) < 0.1 * waits[0]  # the sleeper arrives last: it hardly waits


def test_ddp_buckets_wait_once_under_the_backward_line(merged: tuple[dlpt.Profile, dict[str, float]]) -> None:
    """DDP's several buckets per step all wait for the same late rank: the wait is counted once
    (not once per bucket), on the bucket hook beneath the line that called backward()."""
    prof, slept = merged
    waits = _per_rank_line(prof, "comm_wait_time", _line("# BACKWARD"))
    # The truth is how much later rank 1 reached backward() than rank 0, by the shared clock: the
    # sleep, less whatever delayed rank 0 itself (in CI once 38 ms of the 0.4 s slept, when the
    # estimate read 0.362 s and a bound on the sleep failed). What is left between the two is each
    # rank's time from backward() to its first bucket, where a descheduled rank moves the wait
    # either way (+45 ms, 11%, once against the sleep with both cores busy). Within -1.8..+6.8 ms
    # of the truth in 10 runs here, 6 of them with both cores busy (2026-11-28). Bounds: 20% each way;
    # a wait counted once per bucket (DDP makes several) reads 2x and more.
    w = waits.get(0, 0) / 1e9
    assert slept["ddp_wait"] > 0.5 * slept["ddp"], slept  # the sleep made the wait
    assert w == pytest.approx(slept["ddp_wait"], rel=0.20), (waits, slept)
    assert waits.get(1, 0) < 0.1 * waits[0]
    # the rest is where ranks met in other collectives: the warm-up all_reduce, DDP's construction
    # (it broadcasts the weights) and its forward (buffers); nothing else holds comm wait.
    rest = sum(sum(_per_rank_line(prof, "comm_wait_time", _line(m)).values()) for m in ("# warm-up", "# WRAP", "# FWD"))
    total = int(prof.cct.exclusive[:, COL["comm_wait_time"]].sum())
    on_lines = sum(_per_rank_line(prof, "comm_wait_time", _line("# ALLREDUCE")).values()) + sum(waits.values())
    assert total == on_lines + rest


def test_the_straggler_finding_names_the_sleeping_line(merged: tuple[dlpt.Profile, dict[str, float]]) -> None:
    prof, _ = merged
    v = straggler(hide_library_unless(prof, False), "host_time")
    assert v is not None and v["rank"] == 1 and v["line"] is not None
    assert v["line"]["line"] == _line("# SLOW")


def test_the_rank_wait_finding_names_the_sleeping_line(merged: tuple[dlpt.Profile, dict[str, float]]) -> None:
    """The diagnosis says who waits, for how long, and the line of the rank it waits for."""
    from dlpt.findings import findings

    prof, _ = merged
    shown = hide_library_unless(prof, False)  # as the report diagnoses it: library frames hidden
    f = next((f for f in findings(shown) if f.rule == "rank-wait"), None)
    assert f is not None, [x.rule for x in findings(shown)]
    assert f.lines and f.lines[0].endswith(f"prog.py:{_line('# SLOW')}"), f
    assert f.figure.startswith("rank 0 waited") and "rank 1 spends" in f.figure, f


def test_one_rank_alone_has_no_estimate(merged: tuple[dlpt.Profile, dict[str, float]], tmp_path) -> None:
    prof, _ = merged
    one = dlpt.load(prof.meta["ranks"][0]["path"])
    assert int(one.cct.exclusive[:, COL["comm_wait_time"]].sum()) == 0
    assert "comm_wait" not in one.meta


def _nccl_rank(host: tuple[int, int], kernel_start: int) -> dlpt.Profile:
    """One rank of an NCCL job: line 10 calls all_reduce once (the host call from host[0] to
    host[1]) and its kernel starts on the GPU at kernel_start (ms)."""
    from dlpt.cct import TreeBuilder
    from dlpt.collectors.assembly import ActivityColumns, build_profile
    from dlpt.frames import Frame, FrameTable

    ms = 1_000_000
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    line = Frame("python", "main (prog.py:10)", "prog.py", 10, "main")
    op = Frame("op", "c10d::allreduce_")
    node = b.child(b.child(0, frames.intern(line)), frames.intern(op))
    cols = ActivityColumns(cpu_node=[node], cpu_self=[host[1] * ms - host[0] * ms + 1])  # > 0: the node is kept
    path = [[f.kind, f.name, f.file, f.line, f.function] for f in (line, op)]
    meta = {"source": "record", "collectives": [
        {"path": path, "start": [host[0] * ms], "end": [host[1] * ms]},
        {"path": path, "start": [kernel_start * ms], "end": [(kernel_start + 5) * ms], "gpu": True}]}
    return build_profile(b, frames, cols, meta)


def test_nccl_host_calls_wait_only_while_they_block() -> None:
    """NCCL's host call returns at once; the kernels meet on the GPUs. A rank whose host ran
    80 ms ahead of the other's, both kernels starting together, waited for nothing; a first call
    that blocked 80 ms on the host (the communicator's rendezvous) waited those 80 ms."""
    from dlpt.commwait import comm_wait_columns

    ahead = comm_wait_columns([_nccl_rank((0, 0), 200), _nccl_rank((80, 80), 200)])
    assert ahead is not None and [int(c.sum()) for c in ahead] == [0, 0]
    blocked = comm_wait_columns([_nccl_rank((0, 80), 200), _nccl_rank((80, 80), 200)])
    assert blocked is not None and [int(c.sum()) for c in blocked] == [80_000_000, 0]
    # A gloo rank (no kernels): its call's wait runs to the last arrival, as the op returns at once.
    gloo = [replace(_nccl_rank((s, s), 0), meta={**_nccl_rank((s, s), 0).meta}) for s in (0, 80)]
    for g in gloo:
        g.meta["collectives"] = g.meta["collectives"][:1]
    got = comm_wait_columns(gloo)
    assert got is not None and [int(c.sum()) for c in got] == [80_000_000, 0]
