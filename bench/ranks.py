"""Several ranks, two parts of one case (docs/BENCHMARKS.md, "Several ranks", "Merging rank profiles").

`merge` (CPU): time and peak memory of `dlpt.merge.merge_profiles` for 8, 64 and 256 synthetic
ranks of the same program, and the time per merged node (flat when the merge is linear in nodes).
Each rank's profile is a random calling-context tree in preorder over a shared pool of frames
(the same program on every rank), with metrics and GPU activity rows, so the merge does all of
its work: frame interning, array shifts, activity remapping.

`ddp` (device machine, 2 GPUs, NCCL): DDP training of an MLP where rank 1 is given twice the
batch of rank 0, run twice under torchrun: unprofiled, then under `torchrun --no-python dlpt
record -o run.dlpt` (one profile per rank). Then the merged profiles are read as users read them
(`dlpt report`, `dlpt export`), and it prints: per rank the median step time unprofiled and under
dlpt (the overhead), GPU time, the share in collectives (comm_time), the share attributed to source
lines; the straggler verdict (rank and line); and the flat report of the merged ranks. Results:
$OUT/gpu_ranks/{ranks/run.rank*.dlpt, report.txt, hotspots.json, gpu_ranks.json}.

    python bench/run.py ranks [merge] [--nodes 10000] [--ranks 8,64,256]
    python bench/run.py ranks ddp [--steps 30] [--batch 4096] [--width 4096]
    python bench/run.py ranks ddp --cpu --steps 3 --batch 64 --width 256   # a dry run on CPU (gloo)

`wait` (device machine, 2 GPUs, NCCL; issue "Two GPUs"): DDP with equal batches where rank 1
sleeps a known time on a marked line before each measured step's backward; one run under
`dlpt record`. The truth comes from the program: each rank's own sleep timer and
`torch.cuda.max_memory_allocated()`. It checks rank 0's estimated comm wait under the measured
step's line against rank 1's sleep (within 10%), the rank-wait finding's line against the
sleeping line, and each rank's recorded allocated peak against max_memory_allocated. Results:
$OUT/gpu_wait/{report.txt, rank0.txt, rank1.txt, wait.json}.

    python bench/run.py ranks wait [--steps 10] [--sleep 0.1]
    python bench/run.py ranks wait --cpu --steps 3     # a dry run on CPU (gloo; no memory check)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from dataclasses import fields

import numpy as np
import runlib as rl

from dlpt.cct import CCT, renumber
from dlpt.frames import Frame
from dlpt.merge import merge_profiles
from dlpt.metrics import KERNEL, METRICS
from dlpt.profile import Activities, Profile


def frame_pool(n: int) -> list[Frame]:
    half = n // 2
    return ([Frame("root", "train.py")]
            + [Frame("python", f"model.py({i}): forward", "model.py", i + 1, "forward") for i in range(half)]
            + [Frame("kernel", f"kernel_{i}") for i in range(n - half - 1)])


def rank_profile(n_nodes: int, frames: list[Frame], rank: int, seed: int) -> Profile:
    rng = np.random.default_rng(seed)
    parent = np.r_[-1, rng.integers(np.maximum(np.arange(1, n_nodes) - 64, 0), np.arange(1, n_nodes))]
    frame = np.r_[0, rng.integers(1, len(frames), n_nodes - 1)]
    parent, frame, _ = renumber(parent, frame)
    exc = rng.integers(0, 1000, (n_nodes, len(METRICS)), dtype=np.int64)
    exc[0] = 0
    n_act = n_nodes // 2
    cols = {"node": rng.integers(1, n_nodes, n_act), "kind": np.full(n_act, KERNEL),
            "name": rng.integers(1, len(frames), n_act), "count": rng.integers(1, 100, n_act)}
    act = Activities(**{f.name: cols.get(f.name, rng.integers(0, 1 << 20, n_act)).astype(np.int64)
                        for f in fields(Activities)})
    return Profile(frames=list(frames), cct=CCT(parent, frame, exc), activities=act,
                   meta={"source": "record", "rank": rank, "world_size": 0}, path=f"run.rank{rank}.dlpt")


def merge(a: argparse.Namespace) -> None:
    """Time and peak memory of merge_profiles for each world size."""
    args = a
    frames = frame_pool(args.frames)
    print(f"{'ranks':>6} {'nodes':>11} {'activities':>11} {'merge s':>9} {'ns/node':>8} {'peak MiB':>9} {'out MiB':>8}")
    for world in (int(x) for x in args.ranks.split(",")):
        profs = [rank_profile(args.nodes, frames, r, seed=r) for r in range(world)]
        for p in profs:
            p.meta["world_size"] = world
        times, peaks = [], []
        merged = None
        for _ in range(args.repeat):
            merged = None
            gc.collect()
            tracemalloc.start()
            t0 = time.perf_counter()
            merged = merge_profiles(profs)
            times.append(time.perf_counter() - t0)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        assert merged is not None
        n = len(merged.cct)
        assert n == world * args.nodes + 1
        assert int(merged.cct.exclusive.sum()) == sum(int(p.cct.exclusive.sum()) for p in profs)
        out_bytes = (merged.cct.parent.nbytes + merged.cct.frame.nbytes + merged.cct.exclusive.nbytes
                     + sum(getattr(merged.activities, f.name).nbytes for f in fields(Activities)))
        t = float(np.median(times))
        print(f"{world:>6} {n:>11,} {len(merged.activities):>11,} {t:>9.3f} {1e9 * t / n:>8.0f} "
              f"{np.median(peaks) / 2**20:>9.0f} {out_bytes / 2**20:>8.0f}")



PROGRAM = '''\
import argparse, json, os, statistics, time
import torch
import torch.distributed as dist
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--batch", type=int, default=4096)
ap.add_argument("--width", type=int, default=4096)
ap.add_argument("--times", required=True)
ap.add_argument("--cpu", action="store_true")
args = ap.parse_args()

dist.init_process_group("gloo" if args.cpu else "nccl")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
dev = "cpu" if args.cpu else f"cuda:{local}"
sync = (lambda: None) if args.cpu else torch.cuda.synchronize
if not args.cpu:
    torch.cuda.set_device(local)
torch.backends.cuda.matmul.allow_tf32 = True
torch.manual_seed(0)
w = args.width
model = nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.GELU(),
                      nn.Linear(w, w)).to(dev)
ddp = nn.parallel.DistributedDataParallel(model, device_ids=None if args.cpu else [local])
opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
x = torch.randn(args.batch * (2 if rank == 1 else 1), w, device=dev)  # rank 1: twice the batch
times = []
for step in range(args.warmup + args.steps):
    sync()
    t0 = time.perf_counter()
    loss = ddp(x).square().mean()  # forward
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sync()
    if step >= args.warmup:
        times.append(time.perf_counter() - t0)
with open(os.path.join(args.times, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "median_ms": 1e3 * statistics.median(times), "steps_ms": [1e3 * t for t in times]}, f)
dist.destroy_process_group()
'''


def _run(cmd: list[str], cwd: str, timeout: int = 540) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    print(f"  ({time.perf_counter() - t0:.1f} s, exit {r.returncode}) {' '.join(cmd[2:8])} ...", flush=True)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def _dlpt(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlpt", *args]


def step_times(d: str) -> dict[int, float]:
    out = {}
    for r in (0, 1):
        with open(os.path.join(d, f"rank{r}.json")) as f:
            out[r] = json.load(f)["median_ms"]
    return out



def ddp(args: argparse.Namespace) -> None:
    """DDP with rank 1 given twice the batch, unprofiled and under dlpt record, then read back."""
    out = os.path.join(rl.out_dir(), "gpu_ranks")
    if os.path.isdir(out):
        shutil.rmtree(out)
    ranks_dir = os.path.join(out, "ranks")
    for d in (out, ranks_dir, os.path.join(out, "t_plain"), os.path.join(out, "t_dlpt")):
        os.makedirs(d, exist_ok=True)
    prog = os.path.join(out, "ddp_imbalanced.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    common = ["--steps", str(args.steps), "--batch", str(args.batch), "--width", str(args.width), *(["--cpu"] if args.cpu else [])]
    # Runs start in out, not in the repository: its dlpt/ folder would shadow the installed dlpt.
    print("unprofiled:", flush=True)
    _run(_torchrun(prog, *common, "--times", os.path.join(out, "t_plain")), cwd=out)
    print("under dlpt record:", flush=True)
    # The dlpt of this python's environment (beside it, else on PATH), as a user's torchrun finds it.
    dlpt_exe = os.path.join(os.path.dirname(sys.executable), "dlpt")
    if not os.path.exists(dlpt_exe):
        dlpt_exe = shutil.which("dlpt") or dlpt_exe
    launcher = ["--no-python", dlpt_exe] if os.path.exists(dlpt_exe) else ["-m", "dlpt"]
    rec = _run(_torchrun(*launcher, "record", "-o", os.path.join(ranks_dir, "run.dlpt"), prog, *common,
                       "--times", os.path.join(out, "t_dlpt")), cwd=out)
    saved = [ln for ln in rec.stderr.splitlines() if "profile saved" in ln]
    files = sorted(os.listdir(ranks_dir))
    report = _run(_dlpt("report", ranks_dir, "--view", "flat", "--top", "15"), cwd=out).stdout
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(report)
    hot_path = os.path.join(out, "hotspots.json")
    metric = "cpu_time" if args.cpu else "gpu_time"
    _run(_dlpt("export", ranks_dir, "-f", "hotspots", "--metric", metric, "-o", hot_path), cwd=out)
    with open(hot_path) as f:
        hot = json.load(f)
    per_rank = {}
    for r in (0, 1):
        doc = json.loads(_run(_dlpt("export", ranks_dir, "--rank", str(r), "-f", "hotspots", "--metric", metric,
                                      "-o", "-"), cwd=out).stdout)
        s = doc["summary"]
        # attributed_to_source is in the ranked metric (gpu_time; cpu_time in a --cpu dry run).
        per_rank[r] = {"gpu_time_ms": s["gpu_time"] / 1e3, "comm_time_ms": s["comm_time"] / 1e3,
                       "attributed_percent": 100.0 * s["attributed_to_source"] / s[metric] if s[metric] else 0.0,
                       "unattributed": s["unattributed"]}
    plain, profiled = step_times(os.path.join(out, "t_plain")), step_times(os.path.join(out, "t_dlpt"))
    import torch

    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "?",
              "torch": torch.__version__, "files": files, "saved": saved,
              "ranks": {str(r): {"step_ms_unprofiled": plain[r], "step_ms_dlpt": profiled[r],
                                 "overhead": profiled[r] / plain[r], **per_rank[r]} for r in (0, 1)},
              "straggler": hot["summary"].get("straggler"), "summary_ranks": hot["summary"].get("ranks")}
    with open(os.path.join(out, "gpu_ranks.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{result['device']}, torch {result['torch']}; profiles: {', '.join(files)}")
    print(f"{'rank':>4} {'step ms':>9} {'dlpt ms':>9} {'overhead':>8} {'GPU ms':>9} {'comm %':>7} {'on source %':>11}")
    for r in (0, 1):
        x = result["ranks"][str(r)]
        comm = 100.0 * x["comm_time_ms"] / x["gpu_time_ms"] if x["gpu_time_ms"] else 0.0
        print(f"{r:>4} {x['step_ms_unprofiled']:>9.2f} {x['step_ms_dlpt']:>9.2f} {x['overhead']:>7.3f}x "
              f"{x['gpu_time_ms']:>9.1f} {comm:>7.1f} {x['attributed_percent']:>11.2f}")
    v = result["straggler"]
    if v:
        where = f"{v['line']['file']}:{v['line']['line']} ({v['line']['code']})" if v.get("line") else "no line"
        print(f"straggler verdict: {'rank ' + str(v['rank']) if v['straggler'] else 'none'}; "
              f"excess {v['excess']:.0f} us ({v['excess_percent']:.1f}%); line {where}; "
              f"comm wait {v['comm_wait']} us, mirrored: {v['mirrored']}")
    print("\n" + report)



WAIT_PROGRAM = '''\
import argparse, json, os, time
import torch
import torch.distributed as dist
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--sleep", type=float, default=0.1)
ap.add_argument("--truth", required=True)
ap.add_argument("--cpu", action="store_true")
args = ap.parse_args()

dist.init_process_group("gloo" if args.cpu else "nccl")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
dev = "cpu" if args.cpu else f"cuda:{local}"
if not args.cpu:
    torch.cuda.set_device(local)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev)
ddp = nn.parallel.DistributedDataParallel(model, device_ids=None if args.cpu else [local], bucket_cap_mb=8)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
x = torch.randn(64, 1024, device=dev)
slept = 0.0


def step(slow: bool) -> float:
    global slept
    loss = ddp(x).square().mean()
    if slow and rank == 1:
        t0 = time.perf_counter()
        time.sleep(args.sleep)  # SLOW
        slept += time.perf_counter() - t0
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(3):
    step(False)  # WARM-UP
dist.barrier()
for _ in range(args.steps):
    step(True)  # MEASURED
peak = 0 if args.cpu else torch.cuda.max_memory_allocated()
with open(os.path.join(args.truth, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "slept": slept, "max_memory_allocated": peak}, f)
dist.destroy_process_group()
'''


def _line_of(program: str, marker: str) -> int:
    return next(i for i, t in enumerate(program.splitlines(), 1) if marker in t)


def wait(args: argparse.Namespace) -> None:
    """DDP where rank 1 sleeps before each measured backward: comm wait, rank-wait finding, memory."""
    import dlpt
    from dlpt.findings import findings
    from dlpt.ranks import rank_nodes, select_rank
    from dlpt.scope import Scope
    from dlpt.waits import memory_peak

    out = os.path.join(rl.out_dir(), "gpu_wait")
    if os.path.isdir(out):
        shutil.rmtree(out)
    work = os.path.join(rl.work_dir(), "gpu_wait")
    ranks_dir, truth = os.path.join(work, "ranks"), os.path.join(work, "truth")
    for d in (out, ranks_dir, truth):
        os.makedirs(d, exist_ok=True)
    prog = os.path.join(work, "ddp_wait.py")
    with open(prog, "w") as f:
        f.write(WAIT_PROGRAM)
    dlpt_exe = os.path.join(os.path.dirname(sys.executable), "dlpt")
    launcher = ["--no-python", dlpt_exe] if os.path.exists(dlpt_exe) else ["-m", "dlpt"]
    _run(_torchrun(*launcher, "record", "-o", os.path.join(ranks_dir, "run.dlpt"), prog, "--steps", str(args.steps),
                   "--sleep", str(args.sleep), "--truth", truth, *(["--cpu"] if args.cpu else [])), cwd=work)
    files = sorted(os.path.join(ranks_dir, f) for f in os.listdir(ranks_dir))
    for name, extra in (("report.txt", []), ("rank0.txt", ["--rank", "0"]), ("rank1.txt", ["--rank", "1"])):
        with open(os.path.join(out, name), "w") as f:
            f.write(_run(_dlpt("report", *files, *extra, "--view", "flat", "--top", "12"), cwd=work).stdout)
    t = {r: json.load(open(os.path.join(truth, f"rank{r}.json"))) for r in (0, 1)}
    prof = Scope().apply(dlpt.load(files))
    measured = _line_of(WAIT_PROGRAM, "# MEASURED")

    def at_line(p: dlpt.Profile, metric: str, line: int) -> int:
        from dlpt.metrics import COL
        col = p.cct.exclusive[:, COL[metric]]
        # inclusive below the line's nodes: the line's frames are outermost on their paths here
        total = 0
        for i in range(len(p.cct)):
            fr = p.frames[p.cct.frame[i]]
            if fr.line == line and fr.file.endswith("ddp_wait.py"):
                total += int(col[i:int(p.cct.end[i])].sum())
        return total

    per_rank = {}
    for r, _ in rank_nodes(prof):
        one = select_rank(prof, r)
        mp = memory_peak(one)
        log = dlpt.load(files[r]).meta.get("collectives") or []
        per_rank[r] = {"collective_entries": {"gpu": sum(len(e["start"]) for e in log if e.get("gpu")),
                                              "host": sum(len(e["start"]) for e in log if not e.get("gpu"))},
                       "comm_wait_on_measured_line": at_line(one, "comm_wait_time", measured),
                       "slept": t[r]["slept"], "max_memory_allocated": t[r]["max_memory_allocated"],
                       "recorded_peak_allocated": mp.peak_allocated if mp else None}
    found = [f.to_json() for f in findings(prof)]
    rw = next((f for f in found if f["rule"] == "rank-wait"), None)
    slow_line = f"ddp_wait.py:{_line_of(WAIT_PROGRAM, '# SLOW')}"
    wait0 = per_rank[0]["comm_wait_on_measured_line"] / 1e9
    result = {"per_rank": per_rank, "sleep_truth_s": t[1]["slept"], "rank0_wait_s": wait0,
              "wait_error": wait0 / t[1]["slept"] - 1 if t[1]["slept"] else None,
              "finding": rw, "finding_names_sleep_line": bool(rw and rw["lines"] and rw["lines"][0].endswith(slow_line)),
              "memory_exact": {str(r): v["recorded_peak_allocated"] == v["max_memory_allocated"] for r, v in per_rank.items()}}
    with open(os.path.join(out, "wait.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"rank 1 slept {t[1]['slept']:.4f} s; rank 0 comm wait under the measured line {wait0:.4f} s "
          f"({100 * (result['wait_error'] or 0):+.2f}%); rank 1's own {per_rank[1]['comm_wait_on_measured_line'] / 1e9:.4f} s")
    print(f"rank-wait finding: {rw['figure'] if rw else 'none'}; lines {rw['lines'] if rw else []}; "
          f"names {slow_line}: {result['finding_names_sleep_line']}")
    for r, v in per_rank.items():
        print(f"rank {r}: recorded peak allocated {v['recorded_peak_allocated']} B, "
              f"max_memory_allocated {v['max_memory_allocated']} B")
    print(open(os.path.join(out, "report.txt")).read())


def ranks(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench/run.py ranks", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", choices=("merge", "ddp", "wait"), default="merge")
    ap.add_argument("--nodes", type=int, default=10_000, help="merge: CCT nodes per rank (default: 10000)")
    ap.add_argument("--frames", type=int, default=2_000, help="merge: distinct frames of the program (default: 2000)")
    ap.add_argument("--ranks", default="8,64,256", help="merge: world sizes")
    ap.add_argument("--repeat", type=int, default=3, help="merge: runs per size; the median is shown")
    ap.add_argument("--steps", type=int, default=30, help="ddp, wait: measured steps")
    ap.add_argument("--sleep", type=float, default=0.1, help="wait: rank 1's sleep per measured step (s)")
    ap.add_argument("--batch", type=int, default=4096, help="ddp: rank 0's batch (rank 1 gets twice)")
    ap.add_argument("--width", type=int, default=4096, help="ddp: the MLP's width")
    ap.add_argument("--cpu", action="store_true", help="ddp, wait: a dry run with gloo on CPU (small sizes; the figures mean nothing)")
    a = ap.parse_args(argv)
    {"merge": merge, "ddp": ddp, "wait": wait}[a.part](a)
