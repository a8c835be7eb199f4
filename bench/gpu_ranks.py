"""Several ranks on a GPU pair (run on the device machine, 2 GPUs, NCCL; writes under $OUT):

DDP training of an MLP where rank 1 is given twice the batch of rank 0, run twice under torchrun:
unprofiled, then under `torchrun --no-python dlpt record -o run.dlpt` (one profile per rank).
Then the merged profiles are read as users read them (`dlpt report`, `dlpt export`), and this
prints: per rank the median step time unprofiled and under dlpt (the overhead), GPU time, the
share in collectives (comm_time), the share attributed to source lines; the straggler verdict
(rank and line); and the flat report of the merged ranks.

    python bench/gpu_ranks.py [--steps 30] [--batch 4096] [--width 4096]
    python bench/gpu_ranks.py --cpu --steps 3 --batch 64 --width 256     a dry run on CPU (gloo)

Results: $OUT/gpu_ranks/{ranks/run.rank*.dlpt, report.txt, hotspots.json, gpu_ranks.json}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(os.environ.get("OUT") or os.path.join(ROOT, "bench-out"), "gpu_ranks")

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


def run(cmd: list[str], cwd: str, timeout: int = 540) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    print(f"  ({time.perf_counter() - t0:.1f} s, exit {r.returncode}) {' '.join(cmd[2:8])} ...", flush=True)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def dlpt_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlpt", *args]


def step_times(d: str) -> dict[int, float]:
    out = {}
    for r in (0, 1):
        with open(os.path.join(d, f"rank{r}.json")) as f:
            out[r] = json.load(f)["median_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="30")
    ap.add_argument("--batch", default="4096")
    ap.add_argument("--width", default="4096")
    ap.add_argument("--cpu", action="store_true", help="a dry run of this script with gloo on CPU "
                    "(small sizes; the figures mean nothing)")
    args = ap.parse_args()
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    ranks_dir = os.path.join(OUT, "ranks")
    for d in (OUT, ranks_dir, os.path.join(OUT, "t_plain"), os.path.join(OUT, "t_dlpt")):
        os.makedirs(d, exist_ok=True)
    prog = os.path.join(OUT, "ddp_imbalanced.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    common = ["--steps", args.steps, "--batch", args.batch, "--width", args.width, *(["--cpu"] if args.cpu else [])]
    # Runs start in OUT, not in the repository: its dlpt/ folder would shadow the installed dlpt.
    print("unprofiled:", flush=True)
    run(torchrun(prog, *common, "--times", os.path.join(OUT, "t_plain")), cwd=OUT)
    print("under dlpt record:", flush=True)
    # The dlpt of this python's environment (beside it, else on PATH), as a user's torchrun finds it.
    dlpt_exe = os.path.join(os.path.dirname(sys.executable), "dlpt")
    if not os.path.exists(dlpt_exe):
        dlpt_exe = shutil.which("dlpt") or dlpt_exe
    launcher = ["--no-python", dlpt_exe] if os.path.exists(dlpt_exe) else ["-m", "dlpt"]
    rec = run(torchrun(*launcher, "record", "-o", os.path.join(ranks_dir, "run.dlpt"), prog, *common,
                       "--times", os.path.join(OUT, "t_dlpt")), cwd=OUT)
    saved = [ln for ln in rec.stderr.splitlines() if "profile saved" in ln]
    files = sorted(os.listdir(ranks_dir))
    report = run(dlpt_cmd("report", ranks_dir, "--view", "flat", "--top", "15"), cwd=OUT).stdout
    with open(os.path.join(OUT, "report.txt"), "w") as f:
        f.write(report)
    hot_path = os.path.join(OUT, "hotspots.json")
    metric = "cpu_time" if args.cpu else "gpu_time"
    run(dlpt_cmd("export", ranks_dir, "-f", "hotspots", "--metric", metric, "-o", hot_path), cwd=OUT)
    with open(hot_path) as f:
        hot = json.load(f)
    per_rank = {}
    for r in (0, 1):
        doc = json.loads(run(dlpt_cmd("export", ranks_dir, "--rank", str(r), "-f", "hotspots", "--metric", metric,
                                      "-o", "-"), cwd=OUT).stdout)
        s = doc["summary"]
        # attributed_to_source is in the ranked metric (gpu_time; cpu_time in a --cpu dry run).
        per_rank[r] = {"gpu_time_ms": s["gpu_time"] / 1e3, "comm_time_ms": s["comm_time"] / 1e3,
                       "attributed_percent": 100.0 * s["attributed_to_source"] / s[metric] if s[metric] else 0.0,
                       "unattributed": s["unattributed"]}
    plain, profiled = step_times(os.path.join(OUT, "t_plain")), step_times(os.path.join(OUT, "t_dlpt"))
    import torch

    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "?",
              "torch": torch.__version__, "files": files, "saved": saved,
              "ranks": {str(r): {"step_ms_unprofiled": plain[r], "step_ms_dlpt": profiled[r],
                                 "overhead": profiled[r] / plain[r], **per_rank[r]} for r in (0, 1)},
              "straggler": hot["summary"].get("straggler"), "summary_ranks": hot["summary"].get("ranks")}
    with open(os.path.join(OUT, "gpu_ranks.json"), "w") as f:
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


if __name__ == "__main__":
    main()
