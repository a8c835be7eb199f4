"""Comm wait on real ranks: two gloo processes under `dlpt record`, rank 1 sleeping on a known
line before each all_reduce; rank 0's wait lands on its all_reduce line, and the straggler
finding names the sleeping line. gloo's collectives are host ops: host-side timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
dist.all_reduce(t)  # warm-up: the first call connects
slept = 0.0
for _ in range(3):
    if rank == 1:
        t0 = time.perf_counter()
        time.sleep(0.3)  # SLOW
        slept += time.perf_counter() - t0
    dist.all_reduce(t)  # ALLREDUCE
json.dump({"slept": slept}, open(f"truth{rank}.json", "w"))
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
def merged(tmp_path_factory) -> tuple[dlpt.Profile, float]:
    d = tmp_path_factory.mktemp("commwait")
    (d / "prog.py").write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "--no-python", _dlpt_program(), "record", "-o", "run.dlpt", "prog.py"],
                       cwd=d, capture_output=True, text=True, timeout=420, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    slept = json.loads((d / "truth1.json").read_text())["slept"]
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


def test_the_waiting_rank_waits_on_its_all_reduce_line(merged: tuple[dlpt.Profile, float]) -> None:
    prof, slept = merged
    assert "estimated" in prof.meta.get("comm_wait", "")
    waits = _per_rank_line(prof, "comm_wait_time", _line("# ALLREDUCE"))
    assert waits.get(0, 0) / 1e9 == pytest.approx(slept, rel=0.10), (waits, slept)
    assert waits.get(1, 0) < 0.1 * waits[0]  # the sleeper arrives last: it hardly waits
    warm = _per_rank_line(prof, "comm_wait_time", _line("# warm-up"))
    total = int(prof.cct.exclusive[:, COL["comm_wait_time"]].sum())
    assert total == sum(waits.values()) + sum(warm.values())  # all of it on the all_reduce lines


def test_the_straggler_finding_names_the_sleeping_line(merged: tuple[dlpt.Profile, float]) -> None:
    prof, _ = merged
    v = straggler(hide_library_unless(prof, False), "host_time")
    assert v is not None and v["rank"] == 1 and v["line"] is not None
    assert v["line"]["line"] == _line("# SLOW")


def test_one_rank_alone_has_no_estimate(merged: tuple[dlpt.Profile, float], tmp_path) -> None:
    prof, _ = merged
    one = dlpt.load(prof.meta["ranks"][0]["path"])
    assert int(one.cct.exclusive[:, COL["comm_wait_time"]].sum()) == 0
    assert "comm_wait" not in one.meta
