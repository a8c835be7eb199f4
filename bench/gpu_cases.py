"""`dlpt record` on the hard cases, on a real GPU: a torch.compile'd module, a CUDA-graph replay,
threads started while recording, and every copy kind. For each program in bench/gpu_cases/ it
records a profile and reports, per line marked `# CASE: ...`, the GPU time dlpt puts on that
line, plus the share of GPU time at a source line and what stayed unattributed; it exits 1 when a
program fails or keeps under 99.5% of its GPU time at a source line. The backward cases:
activation checkpointing (reentrant and not), a second-order gradient, a custom backward on the
CPU queue, and `mode="reduce-overhead"` training.

    python bench/gpu_cases.py [CASE...]   # on the device machine; profiles, gpu_cases.json under $OUT
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT") or os.path.join(ROOT, "bench-out")
CASES = ("compiled", "cudagraph", "threaded", "copies", "checkpoint", "cpu_queue", "reduce_overhead", "double_backward")


def case_lines(path: str) -> dict[int, str]:
    out = {}
    for i, text in enumerate(open(path).read().splitlines(), 1):
        m = re.search(r"# CASE: (.*)$", text)
        if m:
            out[i] = m.group(1).strip()
    return out


def main() -> None:
    import dlpt
    from dlpt.hotspots import summary
    from dlpt.metrics import COL
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    os.makedirs(OUT, exist_ok=True)
    results = {}
    for name in sys.argv[1:] or CASES:
        src = os.path.join(ROOT, "bench", "gpu_cases", f"{name}.py")
        out = os.path.join(OUT, f"{name}.dlpt")
        # cwd=OUT: the checkout's dlpt/ folder would shadow the installed package's layout.
        r = subprocess.run([sys.executable, "-m", "dlpt", "record", "--force", "-o", out, src],
                           capture_output=True, text=True, cwd=OUT, timeout=300)
        if r.returncode != 0:
            results[name] = {"error": r.stderr[-2000:]}
            print(name, "FAILED", r.stderr[-2000:], flush=True)
            continue
        prof = dlpt.load(out)
        view = hide_library_unless(prof, False)
        s = summary(view)
        fv = flat(view, "line")
        marks = case_lines(src)
        per_line = {}
        for g, fr in enumerate(fv.frame):
            if fr.kind == "python" and fr.file and os.path.basename(fr.file) == f"{name}.py":
                per_line[fr.line] = per_line.get(fr.line, 0) + int(fv.exclusive[g, COL["gpu_time"]])
        tot = prof.cct.exclusive.sum(axis=0)
        results[name] = {
            "gpu_time_us": s["gpu_time"], "attributed_to_source_us": s["attributed_to_source"],
            "unattributed": s["unattributed"], "activities": int(len(prof.activities)),
            "cases": {f"{ln}: {label}": per_line.get(ln, 0) / 1000.0 for ln, label in marks.items()},
            "other_lines_us": {str(ln): v / 1000.0 for ln, v in per_line.items() if ln not in marks},
            "htod_bytes": int(tot[COL["htod_bytes"]]), "dtoh_bytes": int(tot[COL["dtoh_bytes"]]),
            "dtod_bytes": int(tot[COL["dtod_bytes"]]), "memset_time_us": s["memset_time"],
            "post_processing_s": prof.meta.get("post_processing_s"),
            "profile_bytes": os.path.getsize(out),
        }
        print(f"== {name}: GPU {s['gpu_time']:.1f} us, at a source line "
              f"{100 * s['attributed_to_source'] / max(s['gpu_time'], 1e-9):.2f}%, unattributed {s['unattributed']}",
              flush=True)
        for k, v in results[name]["cases"].items():
            print(f"   {k:<40} {v:10.1f} us", flush=True)
        for k, v in results[name]["other_lines_us"].items():
            print(f"   (line {k}){'':<31} {v:10.1f} us", flush=True)
    with open(os.path.join(OUT, "gpu_cases.json"), "w") as f:
        json.dump({"torch": __import__("torch").__version__,
                   "gpu": __import__("torch").cuda.get_device_name(), "results": results}, f, indent=1)
    # Every program must run to its end and keep all but 0.5% of its GPU time on source lines.
    bad = [n for n, r in results.items()
           if "error" in r or r["attributed_to_source_us"] < 0.995 * r["gpu_time_us"]]
    if bad:
        raise SystemExit(f"gpu_cases: failed or under 99.5% at a source line: {', '.join(bad)}")


if __name__ == "__main__":
    main()
