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
for _ in range(3):
    if rank == 1:
        t0 = time.perf_counter()
        time.sleep(0.5)  # SLOW
        slept["all_reduce"] += time.perf_counter() - t0
    dist.all_reduce(t)  # ALLREDUCE
# DDP: its buckets are all-reduced from hooks inside the backward pass, several per step
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)  # WRAP
x = torch.randn(32, 256)
for step in range(3):
    loss = ddp(x).square().mean()  # FWD
    if rank == 1 and step > 0:
        t0 = time.perf_counter()
        time.sleep(0.2)  # DDP-SLOW
        slept["ddp"] += time.perf_counter() - t0
    loss.backward()  # BACKWARD
json.dump(slept, open(f"truth{rank}.json", "w"))
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
    # Rank 0 waits for rank 1's sleep and what rank 1 does between its timer and the collective:
    # +0.24..+0.80 ms over the 1.5 s slept (0.016-0.053%) in 6 runs on a loaded 2-core machine.
    # 0.5% (7.5 ms) leaves room for rank 1 being scheduled late once, not for a missed sleep.
    assert waits.get(0, 0) / 1e9 == pytest.approx(slept["all_reduce"], rel=0.005), (waits, slept)
    assert waits.get(1, 0) < 0.1 * waits[0]  # the sleeper arrives last: it hardly waits


def test_ddp_buckets_wait_once_under_the_backward_line(merged: tuple[dlpt.Profile, dict[str, float]]) -> None:
    """DDP's several buckets per step all wait for the same late rank: the wait is counted once
    (not once per bucket), on the bucket hook beneath the line that called backward()."""
    prof, slept = merged
    waits = _per_rank_line(prof, "comm_wait_time", _line("# BACKWARD"))
    # Here rank 0 also waits for rank 1's backward up to its first bucket, so the wait only ever
    # exceeds the sleep: +1.6..+13.6 ms over the 0.4 s slept (0.4-3.4%) in 6 runs on a loaded
    # 2-core machine, and +45 ms (+11.2%) once with the suite's two workers on both cores
    # (2026-11-28). Bounds: 5% under (timing alone), 25% over (twice the largest seen); a wait
    # counted once per bucket (DDP makes several) reads 2x and more.
    w = waits.get(0, 0) / 1e9
    assert 0.95 * slept["ddp"] <= w <= 1.25 * slept["ddp"], (waits, slept)
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
