"""Reading benchmark (docs/BENCHMARKS.md): `dlpt report` against Holistic Trace Analysis on the same
Kineto traces, at several sizes.

Each measurement is a fresh process (imports included, as a user would run it); dlpt and HTA
runs are interleaved so that load from other processes on the machine falls on both alike, and
medians are reported. Peak memory is the child's own `ru_maxrss` from `wait4`.

    python bench/bench_read.py            # 4 sizes from gpt_train (~72k .. ~523k events), 3 repeats
    python bench/bench_read.py --quick    # 2 small sizes, 2 repeats
    python bench/bench_read.py --repeats 5 --sizes 4,8,16,29

Traces are made once with shared/tools/synth_big.py under bench/out/ (git-ignored), one
directory per size, as HTA's `TraceAnalysis(trace_dir=...)` wants (no `distributedInfo` in the
file: HTA then takes it as rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")
SHARED = os.environ.get("DLPT_SHARED", os.path.join(os.path.dirname(HERE), "..", "shared"))
if not os.path.isdir(SHARED):
    SHARED = "/work/shared"
FIXTURE = os.path.join(SHARED, "fixtures", "kineto", "gpt_train.pt.trace.json.gz")
SYNTH = os.path.join(SHARED, "tools", "synth_big.py")

HTA_CODE = "import sys; from hta.trace_analysis import TraceAnalysis; TraceAnalysis(trace_dir=sys.argv[1])"


def dlpt_command() -> list[str]:
    """The `dlpt` console script run by this interpreter (not a pyenv shim, whose start-up
    would be counted against dlpt)."""
    script = shutil.which("dlpt")
    if script and os.path.isfile(os.path.join(os.path.dirname(sys.executable), "dlpt")):
        script = os.path.join(os.path.dirname(sys.executable), "dlpt")
    if not script:
        return [sys.executable, "-m", "dlpt"]
    return [sys.executable, script]


def make_trace(repeats: int) -> tuple[str, str, int]:
    """(directory, file, events) of the gpt_train trace repeated `repeats` times."""
    d = os.path.join(OUT, f"gpt_x{repeats}")
    f = os.path.join(d, f"gpt_x{repeats}.json")
    meta = os.path.join(d, "events.txt")
    if not (os.path.exists(f) and os.path.exists(meta)):
        os.makedirs(d, exist_ok=True)
        res = subprocess.run([sys.executable, SYNTH, FIXTURE, f, str(repeats)], check=True,
                             capture_output=True, text=True)
        with open(meta, "w") as fh:
            fh.write(res.stdout.split()[0])
    with open(meta) as fh:
        return d, f, int(fh.read().strip())


def run_child(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one run of `cmd`, output discarded."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-2000:]}")
    return wall, ru.ru_maxrss / 1024.0  # Linux: kilobytes


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,8,16,29", help="repeats of gpt_train (18k events each)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each tool per size")
    ap.add_argument("--quick", action="store_true", help="sizes 1,4 and 2 repeats")
    ap.add_argument("--no-hta", action="store_true", help="time dlpt alone")
    ap.add_argument("--json", default=None, help="also write the raw runs here")
    args = ap.parse_args()
    sizes = [1, 4] if args.quick else [int(x) for x in args.sizes.split(",")]
    repeats = 2 if args.quick else args.repeats
    dlpt = dlpt_command()
    if not args.no_hta:
        import hta.version as hv

        hta_version = ".".join(map(str, hv.__version_tuple__))
    else:
        hta_version = "-"
    print(f"dlpt: {' '.join(dlpt)}; HTA {hta_version}; {os.cpu_count()} CPUs; {repeats} runs each, medians",
          flush=True)
    rows = []
    raw = []
    for reps in sizes:
        d, f, events = make_trace(reps)
        mb = os.path.getsize(f) / 1e6
        res: dict[str, list[tuple[float, float]]] = {"dlpt": [], "hta": []}
        for _ in range(repeats):
            # Interleaved: one dlpt run, one HTA run, so that both see the same machine load.
            res["dlpt"].append(run_child(dlpt + ["report", f, "--view", "flat", "--by", "line"]))
            if not args.no_hta:
                res["hta"].append(run_child([sys.executable, "-c", HTA_CODE, d]))
        med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) if v else (float("nan"),) * 2
               for k, v in res.items()}
        rows.append((events, mb, *med["dlpt"], *med["hta"]))
        raw.append({"events": events, "mb": mb, **res})
        print(f"  {events} events done: dlpt {med['dlpt'][0]:.2f} s, HTA {med['hta'][0]:.2f} s", flush=True)
    print()
    print("| events | trace MB | dlpt s | HTA s | speed-up | dlpt peak MB | HTA peak MB | memory ratio "
          "| dlpt µs/event | HTA µs/event |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for events, mb, dt, dm, ht, hm in rows:
        print(f"| {events:,} | {mb:.0f} | {dt:.2f} | {ht:.2f} | {ht / dt:.1f}× | {dm:.0f} | {hm:.0f} | "
              f"{dm / hm:.2f} | {1e6 * dt / events:.2f} | {1e6 * ht / events:.2f} |")
    if len(rows) >= 2:
        # Linearity: a least-squares line through the medians, and how far any size is from it.
        ev = [r[0] for r in rows]
        print()
        for label, col, unit, scale in (("dlpt time", 2, "µs", 1e6), ("HTA time", 4, "µs", 1e6),
                                        ("dlpt peak memory", 3, "kB", 1e3), ("HTA peak memory", 5, "kB", 1e3)):
            ys = [r[col] for r in rows]
            slope, icpt = _fit(ev, ys)
            dev = max(abs(y - (icpt + slope * x)) / y for x, y in zip(ev, ys))
            print(f"{label}: {icpt:.2f} + {slope * scale:.3f} {unit}/event × events "
                  f"(largest deviation from the line {100 * dev:.1f}%)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"hta": hta_version, "runs": raw}, fh, indent=1)


if __name__ == "__main__":
    main()
