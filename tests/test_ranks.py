"""Several ranks without a launcher: output names, the merge, rank selection, comm_time, the
straggler rule, old profiles without comm_time. (tests/test_torchrun.py runs real ranks.)"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from conftest import dlpt_in_process, trace_path

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.record.rank_env import default_output, rank_info, rank_output
from dlpt.errors import DlptError
from dlpt.frames import Frame, FrameTable
from dlpt.loader import Inputs, open_profile, open_profiles
from dlpt.merge import merge_profiles
from dlpt.metrics import COL, KERNEL, METRICS, METRICS_V1, is_collective
from dlpt.ranks import rank_nodes, select_rank, straggler
from dlpt.store import load, save
from dlpt.viewers.hotspots import hotspots


def dlpt(*args: str) -> subprocess.CompletedProcess:
    # A reading command, in this process (conftest.dlpt_in_process): a process each was most of
    # this file's time; `python -m dlpt` itself, its exit codes and tracebacks are tested in processes
    # elsewhere (tests/test_cli.py, tests/test_bad_input.py).
    return dlpt_in_process(*args)


def gpu_profile(lines: dict[int, list[tuple[str, int]]], rank: int | None = None, path: str = "",
                world: int = 2) -> object:
    """A profile of `train.py` lines, each launching (kernel name, ns) kernels, built by the
    shared `build_profile` (so comm_time is computed the way every profile gets it)."""
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "t")))
    out = ActivityColumns()
    for line, kernels in lines.items():
        node = b.child(0, frames.intern(Frame("python", f"train.py({line}): step", "train.py", line, "step")))
        for name, ns in kernels:
            fid = frames.intern(Frame("kernel", name))
            leaf = b.child(node, fid)
            for col, v in (("node", leaf), ("kind", KERNEL), ("name", fid), ("device", 0), ("stream", 7),
                           ("start", 0), ("duration", ns), ("nbytes", 0)):
                getattr(out, col).append(v)
    meta = {"source": "kineto"} if rank is None else {"source": "kineto", "rank": rank, "world_size": world}
    prof = build_profile(b, frames, out, meta)
    prof.path = path
    return prof


AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_rank_output_names():
    assert rank_output("run.dlpt", 1, 2) == "run.rank1.dlpt"
    assert rank_output("out/run.DLPT", 3, 8) == "out/run.rank3.DLPT"
    assert rank_output("prof", 0, 2) == "prof.rank0"
    assert rank_output("p/{rank}/x.dlpt", 5, 8) == "p/5/x.dlpt"
    assert rank_output("x-{rank}.dlpt", 0, 1) == "x-0.dlpt"
    assert rank_output("run.dlpt", 0, 1) == "run.dlpt"  # one process: the name as given
    names = {rank_output("run.dlpt", r, 4) for r in range(4)}
    assert len(names) == 4


def test_rank_info_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = rank_info()
    assert (info["rank"], info["world_size"], info["local_rank"]) == (3, 4, 1) and info["host"]
    assert default_output("train", info).endswith(".rank3.dlpt")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k)
    info = rank_info()
    assert (info["rank"], info["world_size"]) == (0, 1)
    assert ".rank" not in default_output("train", info)
    # torchrun's run id names the run (dlpt/runs.py); its default, "none", names nothing.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "5f0c")
    assert rank_info()["run_id"] == "5f0c"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert "run_id" not in rank_info()


def test_collective_names():
    assert is_collective(AR) and is_collective("ncclKernel_AllGather_RING_LL_Sum_int8_t")
    assert not is_collective("void at::native::vectorized_elementwise_kernel<4>") and not is_collective("gemm_nccl")


def test_merge_sums_ranks_keeps_preorder_and_activities():
    a = gpu_profile({10: [("gemm", 500), (AR, 900)], 20: [("relu", 100)]}, rank=0, path="a", world=3)
    b = gpu_profile({10: [("gemm", 1400), (AR, 50)], 30: [("copy_kernel", 70)]}, rank=1, path="b", world=3)
    m = merge_profiles([b, a])  # given out of order: the tree reads rank 0, rank 1
    assert [r for r, _ in rank_nodes(m)] == [0, 1]
    np.testing.assert_array_equal(m.cct.exclusive.sum(axis=0), a.cct.exclusive.sum(axis=0) + b.cct.exclusive.sum(axis=0))
    assert (m.cct.parent[1:] < np.arange(1, len(m.cct))).all()  # preorder: parents first
    for r, node in rank_nodes(m):
        src = (a, b)[r]
        np.testing.assert_array_equal(m.cct.inclusive[node], src.cct.inclusive[0])
    # Every activity still sits on a leaf of its kernel's name, under its rank.
    assert len(m.activities) == len(a.activities) + len(b.activities)
    for i in range(len(m.activities)):
        assert m.frames[m.activities.name[i]] == m.frame_of(int(m.activities.node[i]))
    assert len(m.frames) == len(set(m.frames))  # frames interned once across ranks
    # A merged profile merged again keeps its rank nodes instead of nesting them.
    c = gpu_profile({40: [("gemm", 10)]}, rank=2, path="c", world=3)
    mm = merge_profiles([m, c])
    assert [r for r, _ in rank_nodes(mm)] == [0, 1, 2]
    assert mm.cct.exclusive.sum() == m.cct.exclusive.sum() + c.cct.exclusive.sum()


def test_comm_time_is_part_of_gpu_time():
    a = gpu_profile({10: [("gemm", 500), (AR, 900)]}, rank=0)
    tot = a.cct.exclusive.sum(axis=0)
    assert tot[COL["comm_time"]] == 900 and tot[COL["gpu_time"]] == 1400 and tot[COL["kernel_time"]] == 1400


def test_straggler_names_the_slow_rank_its_line_and_the_mirrored_wait():
    # Rank 1 computes 900 ns more on line 10; rank 0 waits in the all-reduce for it.
    a = gpu_profile({10: [("gemm", 500), (AR, 950)], 20: [("relu", 100)]}, rank=0)
    b = gpu_profile({10: [("gemm", 1400), (AR, 50)], 20: [("relu", 100)]}, rank=1)
    v = straggler(merge_profiles([a, b]), "gpu_time")
    assert v["straggler"] and v["rank"] == 1 and v["excess"] == 900
    assert v["line"]["line"] == 10 and v["line"]["excess"] == 900
    assert v["comm_wait"] == 900 and v["mirrored"]
    # Balanced ranks: no straggler, whatever the noise.
    c = gpu_profile({10: [("gemm", 1010), (AR, 50)]}, rank=0)
    d = gpu_profile({10: [("gemm", 1000), (AR, 60)]}, rank=1)
    v = straggler(merge_profiles([c, d]), "gpu_time")
    assert not v["straggler"]
    # One rank: no verdict at all.
    assert straggler(a, "gpu_time") is None


def host_profile(lines: dict[int, dict[str, int]], rank: int) -> object:
    """A rank of `train.py` lines, each with host metrics (host_time, sync_time, comm_wait_time)."""
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "t")))
    out = ActivityColumns()
    cols: dict[str, tuple[list[int], list[int]]] = {}
    for line, metrics in lines.items():
        node = b.child(0, frames.intern(Frame("python", f"train.py({line}): step", "train.py", line, "step")))
        for metric, v in metrics.items():
            cols.setdefault(metric, ([], []))[0].append(node)
            cols[metric][1].append(v)
    out.extra = {m: (np.array(n), np.array(v)) for m, (n, v) in cols.items()}
    return build_profile(b, frames, out, {"source": "record", "rank": rank, "world_size": 2})


MS = 1_000_000


def test_host_straggler_counts_no_wait_as_work():
    # Rank 0 (NCCL) waits 1 s for rank 1: its comm wait is estimated on the backward line (28),
    # where its host did not block, and its host waits at `.item()` (36) for its GPU, which
    # waits for rank 1. Rank 1 sleeps 1 s on line 31. Rank 0 also waits 300 ms more at `.item()`
    # for its own GPU's work: waiting, not host work.
    r0 = host_profile({28: {"host_time": 10 * MS, "comm_wait_time": 1000 * MS},
                       36: {"host_time": 1300 * MS, "sync_time": 1300 * MS}, 40: {"host_time": 50 * MS}}, rank=0)
    r1 = host_profile({28: {"host_time": 10 * MS}, 31: {"host_time": 1000 * MS},
                       36: {"host_time": 5 * MS, "sync_time": 5 * MS}, 40: {"host_time": 50 * MS}}, rank=1)
    v = straggler(merge_profiles([r0, r1]), "host_time")
    # Compute by hand: rank 0's lines 0 (10 - 1000, at least 0), 0 (1300 - 1300), 50; rank 1's
    # 10, 1000, 0, 50. Without sync_time taken, rank 0 would read 300 ms more of "work" at `.item()`.
    assert v["compute"] == {"0": 50 * MS, "1": 1060 * MS}, v["compute"]
    assert v["straggler"] and v["rank"] == 1 and v["excess"] == 1010 * MS
    assert v["line"]["line"] == 31 and v["line"]["excess"] == 1000 * MS
    # Mirrored: rank 0 sat in collectives as long as rank 1 computed more.
    assert v["comm_wait"] == 1000 * MS and v["mirrored"]


def test_select_rank_is_that_rank_alone():
    a = gpu_profile({10: [("gemm", 500)]}, rank=0)
    b = gpu_profile({10: [("gemm", 1400)], 30: [("x", 5)]}, rank=1)
    m = merge_profiles([a, b])
    one = select_rank(m, 1)
    np.testing.assert_array_equal(one.cct.exclusive.sum(axis=0), b.cct.exclusive.sum(axis=0))
    assert one.meta["rank"] == 1 and "ranks" not in one.meta
    with pytest.raises(DlptError, match="no rank 5.*0, 1"):
        select_rank(m, 5)


def test_hotspots_per_rank_and_summary_ranks():
    a = gpu_profile({10: [("gemm", 500), (AR, 950)], 20: [("relu", 100)]}, rank=0)
    b = gpu_profile({10: [("gemm", 1400), (AR, 50)], 20: [("relu", 300)]}, rank=1)
    doc = hotspots(merge_profiles([a, b]), "gpu_time")
    assert doc["schema"] == "dlpt.hotspots/2"
    ranks = doc["summary"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sum(r["gpu_time"] for r in ranks) == pytest.approx(doc["summary"]["gpu_time"])
    assert ranks[0]["comm_time"] == pytest.approx(0.95)
    for h in doc["hotspots"]:
        assert sum(h["per_rank"].values()) == pytest.approx(h["gpu_time"])
    assert doc["summary"]["straggler"]["rank"] == 1 and doc["summary"]["straggler"]["line"]["line"] == 10
    assert "ranks" not in hotspots(a, "gpu_time")["summary"]


@pytest.mark.parametrize("version", [1, 2])
def test_profiles_from_before_comm_time_open_with_it_from_their_kernels(tmp_path, version):
    prof = gpu_profile({10: [("gemm", 500), (AR, 900)]}, rank=0)
    p = tmp_path / "old.dlpt"
    save(prof, str(p))
    # Make it what dlpt wrote before comm_time: its 14 metric columns and no names for them
    # (version 2); version 1 had no activity counts either.
    con = sqlite3.connect(p)
    exc = load(str(p)).cct.exclusive
    old = np.ascontiguousarray(exc[:, [COL[m] for m in METRICS_V1]])
    con.execute("UPDATE arrays SET dtype=?, data=? WHERE name='exclusive'",
                (f"{old.dtype.str}:{old.shape[0]},{old.shape[1]}", old.tobytes()))
    con.execute("DELETE FROM meta WHERE key IN ('metrics', 'checksums')")  # neither was written then
    if version == 1:
        con.execute("DELETE FROM arrays WHERE name='activity.count'")
    con.execute(f"PRAGMA user_version={version}")
    con.commit()
    con.close()
    back = load(str(p))
    np.testing.assert_array_equal(back.cct.exclusive, exc)
    assert back.cct.exclusive[:, COL["comm_time"]].sum() == 900
    assert back.cct.exclusive.shape[1] == len(METRICS)


def test_reading_commands_take_several_profiles_and_a_directory(tmp_path):
    a = gpu_profile({10: [("gemm", 500)]}, rank=0)
    b = gpu_profile({10: [("gemm", 1400)]}, rank=1)
    d = tmp_path / "ranks"
    d.mkdir()
    save(a, str(d / "run.rank0.dlpt"))
    save(b, str(d / "run.rank1.dlpt"))
    files = [str(d / "run.rank0.dlpt"), str(d / "run.rank1.dlpt")]
    both = open_profiles(files)
    assert both.cct.exclusive[:, COL["gpu_time"]].sum() == 1900
    assert open_profiles([str(d)]).cct.exclusive[:, COL["gpu_time"]].sum() == 1900
    import dlpt as api

    assert api.load(files).cct.exclusive[:, COL["gpu_time"]].sum() == 1900
    assert api.load(files, rank=1).cct.exclusive[:, COL["gpu_time"]].sum() == 1400
    r = dlpt("report", *files, "--view", "flat", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["rank"] for x in doc["summary"]["ranks"]] == [0, 1]
    assert doc["rows"][0]["per_rank"] == {"0": 500, "1": 1400}
    text = dlpt("report", str(d), "--view", "flat").stdout
    assert "2 ranks, gpu_time per rank" in text and "straggler: rank 1" in text and "median" in text
    assert dlpt("report", str(d), "--rank", "1", "--format", "json").stdout.count('"rank"') == 0
    out = tmp_path / "all.dlpt"
    assert dlpt("import", str(d), "-o", str(out)).returncode == 0
    assert [r for r, _ in rank_nodes(load(str(out)))] == [0, 1]
    assert dlpt("export", *files, "-o", str(tmp_path / "h.json")).returncode == 0
    assert json.loads((tmp_path / "h.json").read_text())["hotspots"][0]["per_rank"] == {"0": 0.5, "1": 1.4}
    diff = dlpt("diff", str(d), str(d), "--rank", "0")
    assert diff.returncode == 0, diff.stderr
    bad = dlpt("report", str(d), "--rank", "7")
    assert bad.returncode == 2 and bad.stderr.startswith("dlpt: no rank 7") and "Traceback" not in bad.stderr


def test_kineto_traces_merge_the_same_way(tmp_path):
    one = open_profile(str(trace_path("copies")))
    # One trace twice is one process twice, not two ranks: merged only when asked to.
    with pytest.raises(DlptError, match="one process.*--as-ranks"):
        open_profiles([str(trace_path("copies")), str(trace_path("copies"))])
    two = open_profiles([str(trace_path("copies")), str(trace_path("copies"))], as_ranks=True)
    assert len(rank_nodes(two)) == 2
    np.testing.assert_array_equal(two.cct.exclusive.sum(axis=0), 2 * one.cct.exclusive.sum(axis=0))


def test_tui_flat_view_shows_the_spread_over_ranks():
    import asyncio

    from dlpt.viewers.format import fmt_metric
    from dlpt.viewers.tui import DlptApp

    a = gpu_profile({10: [("gemm", 5000)], 20: [("relu", 7000)]}, rank=0)
    b = gpu_profile({10: [("gemm", 14000)], 20: [("relu", 1000)]}, rank=1)

    async def go() -> tuple[str, list[str]]:
        app = DlptApp(profile=merge_profiles([a, b]))
        async with app.run_test(size=(160, 20)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.press("3")
            await app.workers.wait_for_complete()
            await pilot.pause()
            return app.table.render_line(0).text, [app.table.render_line(y).text for y in (1, 2)]

    head, rows = asyncio.run(go())
    assert "min" in head and "median" in head and "max" in head and "rank" in head
    line10 = next(r for r in rows if "train.py:10" in r)
    line20 = next(r for r in rows if "train.py:20" in r)
    assert fmt_metric("gpu_time", 14000) in line10 and "r1" in line10
    assert fmt_metric("gpu_time", 7000) in line20 and "r0" in line20


def test_tui_opens_several_paths_and_one_rank(tmp_path):
    import asyncio

    from dlpt.viewers.tui import DlptApp

    files = []
    for r, ns in ((0, 500), (1, 1400)):
        f = tmp_path / f"run.rank{r}.dlpt"
        save(gpu_profile({10: [("gemm", ns)]}, rank=r), str(f))
        files.append(str(f))

    async def total(rank: int | None) -> int:
        app = DlptApp(Inputs(files, rank))
        async with app.run_test(size=(120, 20)) as pilot:
            for _ in range(100):
                await app.workers.wait_for_complete()
                await pilot.pause()
                if app.base is not None and app.variants:
                    break
            assert app.base is not None
            return int(app.base.cct.exclusive[:, COL["gpu_time"]].sum())

    assert asyncio.run(total(None)) == 1900
    assert asyncio.run(total(1)) == 1400


def test_straggler_percent_is_against_the_median_of_the_others(tmp_path):
    # Rank 1 computes 1363 us to rank 0's 1000 us: 36.3% more than the others' median (the rule's
    # own share, 363 of rank 1's 1363, is 26.6%: the wording says the former).
    a = gpu_profile({10: [("gemm", 1000)]}, rank=0)
    b = gpu_profile({10: [("gemm", 1363)]}, rank=1)
    v = straggler(merge_profiles([a, b]), "gpu_time")
    assert v is not None and v["rank"] == 1 and v["excess_percent"] == pytest.approx(36.3)
    save(a, str(tmp_path / "r0.dlpt"))
    save(b, str(tmp_path / "r1.dlpt"))
    r = subprocess.run([sys.executable, "-m", "dlpt", "report", str(tmp_path / "r0.dlpt"), str(tmp_path / "r1.dlpt")],
                       capture_output=True, text=True, timeout=120)
    assert "(36.3%) more than the median of the others" in r.stdout, r.stdout
