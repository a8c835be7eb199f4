"""nanoGPT's step under several profilers, side by side: `bench/gpu_inproc.py` run in turns, one
process per run, so every configuration sees the machine drift alike (nanoGPT's step moves by
±15% between processes on the GPU machine, more than the differences to measure).

    python bench/gpu_overhead_ab.py [--procs N] [--rounds R] CONFIG...

CONFIG is a mode gpu_inproc.py knows (dlpt, proton, torch.profiler, after, after-none), optionally with a label
and environment: `dlpt`, `proton`, `old-backward=dlpt:DLPT_DIAG=rfbackward`. Prints a Markdown
table: per configuration the median over processes of the profiled step against the pristine
one (before any profiler ran in that process) and against the unprofiled blocks in between,
then every process's line. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(config: str) -> tuple[str, str, dict[str, str]]:
    """`[LABEL=]PROFILER[:ENV=VAL,...]` → (label, profiler, environment)."""
    head, _, envs = config.partition(":")
    label, _, which = head.rpartition("=")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return label or config, which, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    configs = [parse(c) for c in a.configs]
    rows: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for p in range(a.procs):
        for label, which, env in configs:
            cmd = [sys.executable, os.path.join(HERE, "gpu_inproc.py"), which, str(a.rounds)]
            r = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("{")), None)
            if line is None:
                print(f"{label} #{p + 1}: failed\n{r.stdout[-2000:]}{r.stderr[-2000:]}", file=sys.stderr)
                continue
            d = json.loads(line)
            rows[label].append(d)
            print(f"{label} #{p + 1}: {line}", file=sys.stderr, flush=True)
    after = {label: ds for label, ds in rows.items() if ds and "after_ms" in ds[0]}
    profiled = {label: ds for label, ds in rows.items() if label not in after}
    if profiled:
        print("| configuration | processes | profiled / pristine (median) | profiled / between (median) "
              "| pristine ms | profiled ms |")
        print("| --- | --- | --- | --- | --- | --- |")
    for label, ds in profiled.items():
        if not ds:
            print(f"| {label} | 0 | failed | | | |")
            continue
        m = {k: statistics.median(d[k] for d in ds) for k in ("ratio_to_pristine", "ratio", "pristine_ms",
                                                                "profiled_ms")}
        print(f"| {label} | {len(ds)} | **{m['ratio_to_pristine']:.3f}** | {m['ratio']:.3f} "
              f"| {m['pristine_ms']:.2f} | {m['profiled_ms']:.2f} |")
    if after:
        print("\n| configuration | processes | after / before (median) | per process |\n| --- | --- | --- | --- |")
    for label, ds in after.items():
        per = ", ".join(f"{d['ratio']:.3f}" for d in ds)
        print(f"| {label} | {len(ds)} | **{statistics.median(d['ratio'] for d in ds):.3f}** | {per} |")
    print()
    for label, ds in rows.items():
        for i, d in enumerate(ds, 1):
            if "after_ms" in d:
                print(f"- {label} #{i}: before {d['before_ms']} ms, during {d['during_ms']} ms, "
                      f"after {d['after_ms']} ms ({d['ratio']})")
            else:
                print(f"- {label} #{i}: pristine {d['pristine_ms']} ms, between {d['unprofiled_ms']} ms, "
                      f"profiled {d['profiled_ms']} ms ({d['ratio_to_pristine']} / {d['ratio']})")


if __name__ == "__main__":
    main()
