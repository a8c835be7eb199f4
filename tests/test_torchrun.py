"""Real ranks: `dlpt record` under torchrun (gloo, CPU), rank 1 given sixteen times the batch.

One recording per launch style is shared by the tests of this module (each launch starts two
Python processes with torch and takes a while on a small machine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import dlpt_in_process

from dlpt.merge import rank_of
from dlpt.ranks import rank_nodes
from dlpt.store import load

pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

SCRIPT = """\
import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
# Big enough that rank 1's extra forward (tens of ms) stands above a loaded machine's noise
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64 * (16 if rank == 1 else 1), 512)  # rank 1: sixteen times the batch (four read as noise on a loaded CI machine)
for _ in range(6):
    loss = model(x).square().mean()  # the forward line
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""
FORWARD_LINE = next(i for i, ln in enumerate(SCRIPT.splitlines(), 1) if "# the forward line" in ln)
TIMEOUT = 420  # the first recording on a machine also builds dlpt's native reader


def torchrun(*args: str, cwd: str) -> subprocess.CompletedProcess:
    # `python -m torch.distributed.run` is what the torchrun script runs; --standalone picks a
    # free port, so that concurrent runs on one machine do not meet.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def dlpt(*args: str, cwd: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlpt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=env)


def dlpt_program() -> str:
    """The `dlpt` console script of this environment, as `torchrun --no-python dlpt` finds it."""
    here = os.path.join(os.path.dirname(sys.executable), "dlpt")
    if os.path.exists(here):
        return here
    pytest.skip("no dlpt console script beside this python")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> str:
    """`torchrun --no-python dlpt record -o run.dlpt ddp.py`; the directory it ran in."""
    d = tmp_path_factory.mktemp("torchrun")
    (d / "ddp.py").write_text(SCRIPT)
    r = torchrun("--no-python", dlpt_program(), "record", "-o", "run.dlpt", "ddp.py", cwd=str(d))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return str(d)


def summary(*paths: str, extra: tuple[str, ...] = ()) -> dict:
    # A reading command, in this process (conftest.dlpt_in_process): what this module checks is
    # in the ranks' files; `dlpt record` and torchrun above run as processes of their own.
    r = dlpt_in_process("export", *paths, "-f", "hotspots", "-o", "-", "--metric", "cpu_time", "--top", "50", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_each_rank_writes_its_own_file(recorded):
    files = sorted(n for n in os.listdir(recorded) if n.endswith(".dlpt"))
    assert files == ["run.rank0.dlpt", "run.rank1.dlpt"]
    for r in (0, 1):
        meta = load(os.path.join(recorded, f"run.rank{r}.dlpt")).meta
        assert (meta["rank"], meta["world_size"], meta["local_rank"]) == (r, 2, r) and meta["host"]


def test_a_rank_never_overwrites_an_existing_profile(recorded):
    before = os.stat(os.path.join(recorded, "run.rank1.dlpt")).st_mtime_ns
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    r = dlpt("record", "-o", "run.dlpt", "ddp.py", cwd=recorded, env=env)
    assert r.returncode == 2 and r.stderr.startswith("dlpt: run.rank1.dlpt exists"), r.stderr
    assert os.stat(os.path.join(recorded, "run.rank1.dlpt")).st_mtime_ns == before


def test_merged_totals_are_the_sums_of_the_ranks(recorded):
    paths = [os.path.join(recorded, f"run.rank{r}.dlpt") for r in (0, 1)]
    one = [summary(p)["summary"] for p in paths]
    both = summary(*paths)
    assert both["summary"]["cpu_time"] == pytest.approx(one[0]["cpu_time"] + one[1]["cpu_time"], abs=0.002)
    assert [r["cpu_time"] for r in both["summary"]["ranks"]] == pytest.approx([s["cpu_time"] for s in one], abs=0.001)
    for h in both["hotspots"]:
        assert sum(h["per_rank"].values()) == pytest.approx(h["cpu_time"], abs=0.002)
    # The directory reads the same; --rank 1 is rank 1's own profile.
    assert summary(recorded)["summary"]["cpu_time"] == both["summary"]["cpu_time"]
    assert summary(recorded, extra=("--rank", "1"))["summary"]["cpu_time"] == one[1]["cpu_time"]
    # `dlpt import` of the gathered files is the merge, saved.
    assert dlpt_in_process("import", *paths, "-o", os.path.join(recorded, "all.dlpt")).returncode == 0
    merged = load(os.path.join(recorded, "all.dlpt"))
    assert [r for r, _ in rank_nodes(merged)] == [0, 1]
    assert summary(os.path.join(recorded, "all.dlpt"))["summary"]["cpu_time"] == both["summary"]["cpu_time"]
    os.unlink(os.path.join(recorded, "all.dlpt"))


def test_the_rank_with_the_bigger_batch_is_the_straggler_on_its_forward_line(recorded):
    doc = summary(recorded)
    v = doc["summary"]["straggler"]
    assert v["straggler"] and v["rank"] == 1 and v["phase"] == "steady", v  # judged on the steps, not start-up
    assert v["line"]["line"] == FORWARD_LINE and v["line"]["file"].endswith("ddp.py"), v
    fwd = next(h for h in doc["hotspots"] if h["line"] == FORWARD_LINE)
    assert fwd["per_rank"]["1"] > fwd["per_rank"]["0"]
    # The header tells the diagnosis's story (rank-wait: who waited, for whom, on which line),
    # whatever the metric shown: rank 1's extra host time is on its forward or backward line.
    text = dlpt_in_process("report", recorded, "--view", "flat", "--metric", "cpu_time").stdout
    head = text.split("straggler:")[1].splitlines()[0]
    wait = next(f for f in doc["summary"]["findings"] if f["rule"] == "rank-wait")
    assert head.startswith(" rank 1 spends") and "rank 1 spends" in wait["figure"], (head, wait)
    line = wait["lines"][0].rpartition(":")[2]
    assert int(line) in (FORWARD_LINE, FORWARD_LINE + 2) and f"ddp.py:{line} " in head, (head, wait)


def test_python_m_dlpt_as_torchruns_program_with_default_names(tmp_path):
    (tmp_path / "ddp.py").write_text(SCRIPT.replace("range(6)", "range(2)"))
    r = torchrun("-m", "dlpt", "record", "ddp.py", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = sorted(n for n in os.listdir(tmp_path) if n.endswith(".dlpt"))
    m = [re.fullmatch(r"dlpt-ddp\.(\d+)\.rank(\d)\.dlpt", n) for n in files]
    assert len(files) == 2 and all(m), files
    assert {x.group(2) for x in m} == {"0", "1"} and len({x.group(1) for x in m}) == 1  # one launcher's pid
    merged = load(os.path.join(tmp_path, files[0]))
    assert merged.meta["rank"] == int(m[0].group(2))
    assert rank_of(merged.frames[0]) is None
