"""Proof of `dlpt record` on a real GPU (run on the device machine; writes under $OUT):

(a) ground truth: `bench/gpu_truth.py` launches sleep kernels of known lengths from known lines
    (forward, and a custom Function's backward); dlpt's GPU time per line vs CUDA events;
(b) both examples: the share of GPU time attributed to a source line of the program;
(c) overhead: median step time unprofiled, under torch.profiler(with_stack=True), under dlpt,
    interleaved in one process;
(d) post-processing time per 100k GPU events;
plus small recorded profiles for tests/data.

    python bench/gpu_proof.py            # prints a table, writes $OUT/gpu_proof.json
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT") or os.path.join(ROOT, "bench-out")
os.makedirs(OUT, exist_ok=True)
sys.path.insert(0, os.path.join(ROOT, "examples"))


def record(out: str, *program: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "--force", "-o", out, *program],
                       capture_output=True, text=True, cwd=OUT)  # not ROOT: its dlpt/ would shadow an installed dlpt
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"record {program} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    print("   ", r.stderr.strip().splitlines()[-2] if r.stderr.strip() else "", flush=True)
    return wall


def per_line_gpu(prof) -> dict[tuple[str, int], int]:
    from dlpt.metrics import COL
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    fv = flat(hide_library_unless(prof, False), "line")
    out: dict[tuple[str, int], int] = {}
    for g, fr in enumerate(fv.frame):
        if fr.kind == "python" and fr.file:
            key = (os.path.basename(fr.file), fr.line)
            out[key] = out.get(key, 0) + int(fv.exclusive[g, COL["gpu_time"]])
    return out


def truth() -> dict:
    import dlpt

    src = os.path.join(ROOT, "bench", "gpu_truth.py")
    lines = {m.group(1): i + 1 for i, text in enumerate(open(src).read().splitlines())
             if (m := re.search(r"# LINE:(\w+)", text))}
    tj = os.path.join(OUT, "truth.json")
    record(os.path.join(OUT, "truth.dlpt"), src, tj)
    ev = json.load(open(tj))["cuda_event_ns"]
    prof = dlpt.load(os.path.join(OUT, "truth.dlpt"))
    got = per_line_gpu(prof)
    rows = {}
    for name, line in lines.items():
        d = got.get(("gpu_truth.py", line), 0)
        rows[name] = {"line": line, "dlpt_ns": d, "cuda_events_ns": ev[name],
                      "error_pct": round(100 * (d - ev[name]) / ev[name], 3)}
    from dlpt.hotspots import summary

    s = summary(prof)
    return {"lines": rows, "summary": s, "meta_links": prof.meta.get("device_links"),
            "unlinked_backward": prof.meta.get("unlinked_backward_ops")}


def examples() -> dict:
    import dlpt
    from dlpt.hotspots import summary

    res = {}
    for name, args in (("resnet_infer", ["--batches", "20", "--batch-size", "64"]),
                       ("transformer_train", ["--steps", "20"])):
        out = os.path.join(OUT, f"{name}.dlpt")
        wall = record(out, os.path.join(ROOT, "examples", f"{name}.py"), *args)
        prof = dlpt.load(out)
        s = summary(prof)
        res[name] = {"gpu_time_us": s["gpu_time"], "attributed_to_source_us": s["attributed_to_source"],
                     "attributed_pct": round(100 * s["attributed_to_source"] / max(s["gpu_time"], 1e-9), 3),
                     "backward_us": s["backward_time"], "memcpy_us": s["memcpy_time"],
                     "unattributed": s["unattributed"], "activities": len(prof.activities),
                     "nodes": len(prof.cct), "file_bytes": os.path.getsize(out), "record_wall_s": round(wall, 2),
                     "links": prof.meta.get("device_links"), "post_s": prof.meta.get("post_processing_s")}
        os.unlink(out) if name == "resnet_infer" else None
    return res


def overhead(steps: int = 40, rounds: int = 2) -> dict:
    from transformer_train import TinyLM

    from dlpt.collectors.record.session import Recorder

    torch.manual_seed(0)
    model = TinyLM(dim=256, heads=8, layers=4, ctx=128).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, 512, (16, 129), device="cuda")

    def one() -> float:
        t0 = time.perf_counter()
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        return time.perf_counter() - t0

    for _ in range(10):
        one()
    times: dict[str, list[float]] = {"none": [], "torch.profiler": [], "dlpt": []}
    post = []
    for _ in range(rounds):
        times["none"] += [one() for _ in range(steps)]
        from torch.profiler import ProfilerActivity, profile

        cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True,
                     experimental_config=cfg):
            times["torch.profiler"] += [one() for _ in range(steps)]
        rec = Recorder(command="overhead", quiet=True)
        rec.start()
        times["dlpt"] += [one() for _ in range(steps)]
        t0 = time.perf_counter()
        rec.stop()
        post.append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"median_step_ms": {k: round(v, 3) for k, v in med.items()},
            "dlpt_over_torch_profiler": round(med["dlpt"] / med["torch.profiler"], 4),
            "dlpt_over_none": round(med["dlpt"] / med["none"], 4),
            "torch_profiler_over_none": round(med["torch.profiler"] / med["none"], 4),
            "steps_each": steps * rounds, "note": "dlpt: the online collector"}


def many_events(iters: int = 25_000) -> dict:
    from dlpt.collectors.record.session import Recorder

    x = torch.ones(256, device="cuda")
    torch.cuda.synchronize()
    rec = Recorder(command="many", quiet=True)
    rec.start()
    for _ in range(iters):
        x.add_(1.0)
        x.mul_(0.5)
        x.sub_(0.25)
        x.abs_()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prof = rec.stop()
    total = time.perf_counter() - t0
    n = int(prof.activities.count.sum())
    return {"gpu_events": n, "ingest_s": round(rec.post_seconds, 3), "stop_total_s": round(total, 3),
            "s_per_100k_events": round(total / n * 1e5, 3) if n else None, "nodes": len(prof.cct)}


def main() -> None:
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
                 "python": sys.version.split()[0]}
    for name, fn in (("truth", truth), ("examples", examples), ("overhead", overhead), ("many_events", many_events)):
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - report and go on to the next measurement
            import traceback

            traceback.print_exc()
            res[name] = {"error": repr(e)}
        print(json.dumps(res[name], indent=1, default=str)[:3000], f"({time.perf_counter() - t0:.1f} s)", flush=True)
    with open(os.path.join(OUT, "gpu_proof.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    # A small recorded profile, GPU-shaped, for tests/data.
    try:
        record(os.path.join(OUT, "gpu_train_small.dlpt"), "--steps", "1:3",
               os.path.join(ROOT, "examples", "transformer_train.py"), "--steps", "4")
    except SystemExit as e:
        print(e)


if __name__ == "__main__":
    main()
