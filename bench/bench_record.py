"""Post-processing benchmark for `dlpt record` (DESIGN §7: at most 1 s per 100k GPU events after
the program ends).

Each run records a workload of many tiny ops with the torch recorder, in this process, then
times `Recorder.stop()`: torch's own profiler stop (its C++ post-processing), and dlpt's part
(the walk of the live event tree, the device events, the CCT). Every (workload, size) runs in a
fresh child process so that one run's leftovers (allocator, interned strings) do not help the
next; the median over repeats is reported.

    python bench/bench_record.py                      # CPU: ops per 100k; GPU: GPU events per 100k
    python bench/bench_record.py --quick
    python bench/bench_record.py --baseline OLD.py    # also time another torch_recorder.py, interleaved
    python bench/bench_record.py --native             # native reader ("new") vs the Python path ("python")
    python bench/bench_record.py --native --free now  # also time freeing torch's results (not done by dlpt record)

Workloads (each iteration):
- `flat`: 4 in-place ops on one tensor, called straight from the loop (as gpu_proof's (d));
- `deep`: the same 4 ops 4 Python calls down, so every op sits under a chain of call sites;
- `train`: a 2-layer MLP forward, backward and SGD step (ops, nn.Module calls, autograd's
  thread, the optimizer's Python code).
`--json PATH` writes every run. On a GPU the ops run on the GPU and each launches one kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import gc, json, sys, time
import torch
spec = json.loads(sys.argv[1])
if spec["recorder"]:
    import importlib.util
    m = importlib.util.spec_from_file_location("dlpt.collectors._bench_old_recorder", spec["recorder"])
    mod = importlib.util.module_from_spec(m); m.loader.exec_module(mod)
    Recorder = mod.Recorder
else:
    from dlpt.collectors.torch_recorder import Recorder
dev = "cuda" if torch.cuda.is_available() else "cpu"
iters, kind = spec["iters"], spec["workload"]

def ops(x):
    x.add_(1.0); x.mul_(0.5); x.sub_(0.25); x.abs_()

def d1(x): ops(x)
def d2(x): d1(x)
def d3(x): d2(x)
def d4(x): d3(x)

if kind == "train":
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(16, 32, device=dev)
    def step():
        loss = model(data).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
x = torch.ones(256, device=dev)
if dev == "cuda":
    torch.cuda.synchronize()
try:  # one window: the time and memory bounds would split it
    rec = Recorder(command="bench", window=None, quiet=True, window_seconds=None, window_bytes=None)
except TypeError:  # a baseline recorder from before the bounds
    rec = Recorder(command="bench", window=None, quiet=True)
if hasattr(rec, "final_free"):
    rec.final_free = spec["free"]
rec.start()
t0 = time.perf_counter()
if kind == "flat":
    for _ in range(iters):
        x.add_(1.0); x.mul_(0.5); x.sub_(0.25); x.abs_()
elif kind == "deep":
    for _ in range(iters):
        d4(x)
else:
    for _ in range(iters):
        step()
if dev == "cuda":
    torch.cuda.synchronize()
run_s = time.perf_counter() - t0
cp = None
if spec.get("cprofile"):
    # Around the fold only: torch's own tracer holds the profile hook until its stop.
    import cProfile
    cp = cProfile.Profile()
    ingest = rec._ingest
    def profiled(kr):
        cp.enable()
        try:
            ingest(kr)
        finally:
            cp.disable()
    rec._ingest = profiled
t0 = time.perf_counter()
prof = rec.stop()
stop_s = time.perf_counter() - t0
# A window freed on a background thread: how long after stop() it still runs.
wait_s = 0.0
if getattr(rec, "_native", None) is not None and hasattr(rec._native, "join_released"):
    t1 = time.perf_counter()
    rec._native.join_released()
    wait_s = time.perf_counter() - t1
if cp is not None:
    import pstats
    with open(spec["cprofile"], "w") as f:
        pstats.Stats(cp, stream=f).sort_stats("tottime").print_stats(25)
# Structure digests, to compare recorders or device-event sources: op instances per path, and
# device activities (path, kind, name, device, stream, start, duration, bytes), order-free.
import collections, hashlib
b, fr = rec.builder, rec.frames
def path_of(node):
    p = []
    while node > 0:
        p.append(fr[b.frame[node]].name); node = b.parent[node]
    return " / ".join(reversed(p))
ops_per_path = collections.Counter(map(path_of, rec.out.cpu_node))
o = rec.out
acts = sorted(zip(map(path_of, o.node), o.kind, [fr[i].name for i in o.name], o.device, o.stream, o.start, o.duration, o.nbytes))
digest = {"ops": hashlib.sha256(json.dumps(sorted(ops_per_path.items())).encode()).hexdigest()[:16],
          "activities": hashlib.sha256(json.dumps(acts).encode()).hexdigest()[:16],
          "activity_paths": hashlib.sha256(json.dumps(sorted(collections.Counter(a[0] for a in acts).items())).encode()).hexdigest()[:16]}
print(json.dumps({"digest": digest, "native": getattr(rec, "native_used", False), "run_s": run_s, "stop_s": stop_s, "free_wait_s": wait_s, "post_s": rec.post_seconds, "torch_stop_s": stop_s - rec.post_seconds,
                  "parts": dict(getattr(rec, "post_parts", {})), "ops": len(rec.out.cpu_node), "gpu_events": len(prof.activities), "nodes": len(prof.cct),
                  "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__}))
"""


def run_one(workload: str, iters: int, recorder: str | None, cprofile: str | None = None,
            env: dict | None = None, free: str = "exit") -> dict:
    spec = json.dumps({"workload": workload, "iters": iters, "recorder": recorder, "cprofile": cprofile,
                       "free": free})
    r = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True, timeout=1200,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"{workload} x{iters} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="flat,deep,train")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every size")
    ap.add_argument("--baseline", metavar="OLD.py", help="another torch_recorder.py to time alongside")
    ap.add_argument("--json", metavar="PATH", help="write all runs here")
    ap.add_argument("--cprofile", metavar="DIR", help="also write a cProfile of each first stop() here")
    ap.add_argument("--events-source", action="store_true",
                    help="also time device events read from kineto_results.save()'s trace "
                    "(DLPT_DEVICE_EVENTS=trace), interleaved, and compare the two profiles' digests")
    ap.add_argument("--native", action="store_true",
                    help="time the native reader (collectors/native/) against the Python path (DLPT_NATIVE=0), "
                    "interleaved, and compare the two profiles' digests")
    ap.add_argument("--free", choices=("exit", "background", "now"), default="exit",
                    help="how the last window's events are freed: not at all, as `dlpt record` does since "
                    "the process exits (default); on a background thread (dlpt.profile); now, timed")
    ap.add_argument("--sizes", metavar="N,N", help="iterations for every workload (default: per workload)")
    a = ap.parse_args()
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("bench_record needs torch")
    # Iterations per workload for ~50k and ~100k GPU events (flat/deep: 4 kernels an iteration).
    sizes = {"flat": [12_500, 25_000], "deep": [12_500, 25_000], "train": [1_000, 2_000]}
    repeats = 1 if a.quick else a.repeats
    if a.sizes:
        sizes = {k: [int(x) for x in a.sizes.split(",")] for k in sizes}
    if a.quick:
        sizes = {k: [v[0] // 4] for k, v in sizes.items()}
    versions = [("new", None)] + ([("baseline", os.path.abspath(a.baseline))] if a.baseline else []) \
        + ([("trace", None)] if a.events_source else []) + ([("python", None)] if a.native else [])
    runs: list[dict] = []
    for wl in a.workloads.split(","):
        for iters in sizes[wl]:
            iters = max(1, int(iters * a.scale))
            for rep in range(repeats):
                for vname, path in versions:  # interleaved: load on the machine falls on both alike
                    cpf = (os.path.join(a.cprofile, f"cprofile_{vname}_{wl}_{iters}.txt")
                           if a.cprofile and rep == 0 else None)
                    env = {"DLPT_DEVICE_EVENTS": "trace"} if vname == "trace" else {}
                    if a.native:  # "new" is the native reader, "python" the same recorder without it
                        env["DLPT_NATIVE"] = "0" if vname == "python" else "1"
                    r = run_one(wl, iters, path, cpf, env, a.free)
                    r.update(workload=wl, iters=iters, version=vname, repeat=rep)
                    runs.append(r)
                    if a.native and r["native"] != (vname != "python"):
                        raise SystemExit(f"{vname}: the native reader was {'not ' if not r['native'] else ''}used")
                    print(f"  {vname:8s} {wl:5s} x{iters:<6d} ops {r['ops']:>8,} gpu {r['gpu_events']:>8,} "
                          f"torch stop {r['torch_stop_s']:6.2f}s dlpt {r['post_s']:6.2f}s "
                          + " ".join(f"{k} {v:.2f}" for k, v in r.get("parts", {}).items()), file=sys.stderr, flush=True)
    rows = []
    for wl in a.workloads.split(","):
        for iters in sorted({r["iters"] for r in runs if r["workload"] == wl}):
            for vname, _ in versions:
                rs = [r for r in runs if r["workload"] == wl and r["iters"] == iters and r["version"] == vname]
                med = {k: statistics.median(r[k] for r in rs) for k in ("post_s", "torch_stop_s", "stop_s")}
                ops, gpu = rs[0]["ops"], rs[0]["gpu_events"]
                rows.append({"workload": wl, "iters": iters, "version": vname, "ops": ops, "gpu_events": gpu,
                             "nodes": rs[0]["nodes"], **{k: round(v, 4) for k, v in med.items()},
                             "dlpt_s_per_100k_gpu_events": round(med["post_s"] / gpu * 1e5, 4) if gpu else None,
                             "dlpt_s_per_100k_ops": round(med["post_s"] / ops * 1e5, 4) if ops else None,
                             "repeats": len(rs)})
    for r in runs:  # same structure? (start times differ between runs: `activities` only within one)
        for vname, _ in versions[1:]:
            o = [x for x in runs if x["version"] == vname and x["workload"] == r["workload"]
                 and x["iters"] == r["iters"] and x["repeat"] == r["repeat"] and "digest" in x]
            if r["version"] == "new" and o:
                same = {k: r["digest"][k] == o[0]["digest"][k] for k in r["digest"]}
                print(f"digest new vs {vname}: {r['workload']} x{r['iters']}: {same}", flush=True)
    dev = runs[0]["device"] if runs else "?"
    print(f"\ndlpt record post-processing, {dev}, torch {runs[0]['torch'] if runs else '?'}, "
          f"median of {repeats}, {time.strftime('%Y-%m-%d')}")
    hdr = ("workload", "version", "ops", "GPU events", "torch stop s", "dlpt s", "dlpt s/100k GPU ev", "dlpt s/100k ops")
    print("| " + " | ".join(hdr) + " |")
    print("| " + " | ".join("---" for _ in hdr) + " |")
    for r in rows:
        per_gpu = f"{r['dlpt_s_per_100k_gpu_events']:.3f}" if r["dlpt_s_per_100k_gpu_events"] is not None else "—"
        print(f"| {r['workload']} ×{r['iters']} | {r['version']} | {r['ops']:,} | {r['gpu_events']:,} | "
              f"{r['torch_stop_s']:.2f} | {r['post_s']:.3f} | {per_gpu} | {r['dlpt_s_per_100k_ops']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "rows": rows, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
