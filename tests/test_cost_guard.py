"""A tripwire for the collector's host-side cost (issue 33): on the CPU, what recording costs per
op on an op-bound loop, counted in instructions by callgrind (deterministic: noise cannot fail
it, a timing could), against the figure committed in bench/baselines/cpu_cost.json. It fails
when the cost rises by more than the file's `limit` (15%).

One process under callgrind (bench/workloads/cpu_loop.py `cost`): the oploop's steps unprofiled
and recorded, 1 and 1 + K steps each, counted apart; only those steps are instrumented, so the
run takes well under a minute. The differences are K steady steps each way; their difference,
over the ops a step enters, is the collector's cost per op: its op callback and what torch's
RecordFunction machinery costs because a callback is registered. The host sampler is off
(DLPT_SAMPLE_US=0): its thread runs on its own clock, which would make the count vary. The full
measurement is `python bench/run.py cpu-record --callgrind` (docs/BENCHMARKS.md).

Where valgrind is not installed it skips, saying so; on CI (.ci/run sets DLPT_CI=1 and installs
valgrind) it runs. After an intended change of cost, write the new figure with
`DLPT_COST_UPDATE=1 python3 -m pytest -q tests/test_cost_guard.py` and commit the file.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "bench", "baselines", "cpu_cost.json")
WORKLOAD = os.path.join(ROOT, "bench", "workloads", "cpu_loop.py")
STEPS = 2  # K: the steady steps counted each way


def measure(k: int = STEPS, extra_env: dict[str, str] | None = None) -> dict:
    """Instructions per step unprofiled and recorded, ops per step, and the collector's cost per op
    (`extra_env`: DLPT_DIAG=noop and the like, for docs/BENCHMARKS.md's table)."""
    from dlpt.collectors.record import native

    native.load(quiet=True)  # built here, not under valgrind
    env = {key: v for key, v in os.environ.items() if not key.startswith("DLPT_")}
    env.update(PYTHONHASHSEED="0", DLPT_SAMPLE_US="0", CUDA_VISIBLE_DEVICES="", **(extra_env or {}))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg")
        r = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                            f"--callgrind-out-file={out}", sys.executable, WORKLOAD, "cost", str(k)],
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        counts = {}
        for path in glob.glob(out + ".*"):
            with open(path) as f:
                text = f.read()
            label = re.search(r"^desc: Trigger: Client Request: (dlpt-cost-\S+)", text, re.M)
            # `totals:` (the sum of the dump's cost lines), not `summary:`, which callgrind sometimes
            # writes wrapped around below zero (an unsigned 64-bit count) in dumps made on request.
            total = re.search(r"^totals: (\d+)", text, re.M)
            if label and total:
                counts[label.group(1)] = int(total.group(1))
    ops = re.search(r"^COST_OPS ([\d.]+)", r.stdout, re.M)
    want = {f"dlpt-cost-{w}-{n}" for w in ("none", "dlpt") for n in (1, 1 + k)}
    assert ops and want <= set(counts), (sorted(counts), r.stdout[-2000:], r.stderr[-2000:])
    none = (counts[f"dlpt-cost-none-{1 + k}"] - counts["dlpt-cost-none-1"]) / k
    dlpt = (counts[f"dlpt-cost-dlpt-{1 + k}"] - counts["dlpt-cost-dlpt-1"]) / k
    n_ops = float(ops.group(1))
    # A count that makes no sense (recording cheaper than not, nothing recorded) is a broken
    # measurement, not a pass.
    assert 0 < none < dlpt < 10 * none and n_ops > 0, (counts, n_ops)
    return {"unprofiled_per_step": round(none), "recorded_per_step": round(dlpt), "ops_per_step": n_ops,
            "ratio": round(dlpt / none, 4), "instructions_per_op": round((dlpt - none) / n_ops, 1)}


def _versions() -> dict:
    import torch

    v = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    return {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "valgrind": v}


def test_collector_cost_per_op() -> None:
    if shutil.which("valgrind") is None:
        if os.environ.get("DLPT_CI"):
            pytest.fail("valgrind is not installed on CI: .ci/run installs it with apt-get (the cost guard needs it)")
        pytest.skip("valgrind is not installed: the collector's cost guard counts instructions with callgrind "
                    "(apt-get install valgrind); CI runs it")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the cost guard's figure is an x86-64 count (and its client requests are x86-64 code)")
    t0 = time.perf_counter()
    got = measure()
    wall = time.perf_counter() - t0
    if os.environ.get("DLPT_COST_UPDATE"):
        doc = {
            "what": "the collector's host-side cost per op entered: instructions per step recorded minus "
                    "unprofiled, over the ops a step enters (tests/test_cost_guard.py)",
            "instructions_per_op": got["instructions_per_op"],
            "limit": 1.15,
            "measured": got,
            "how": f"bench/workloads/cpu_loop.py cost {STEPS} under valgrind --tool=callgrind --instr-atstart=no "
                   "--collect-atstart=no, DLPT_SAMPLE_US=0 PYTHONHASHSEED=0 (tests/test_cost_guard.py); "
                   "update: DLPT_COST_UPDATE=1 python3 -m pytest -q tests/test_cost_guard.py",
            "environment": _versions(),
            "date": time.strftime("%Y-%m-%d"),
        }
        with open(BASELINE, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"wrote {BASELINE}: {got} ({wall:.0f} s)")
        return
    with open(BASELINE) as f:
        base = json.load(f)
    figure, limit = base["instructions_per_op"], base["limit"]
    assert got["instructions_per_op"] <= figure * limit, (
        f"the collector's cost rose to {got['instructions_per_op']:.0f} instructions per op, above the limit "
        f"{figure * limit:.0f} (the committed figure {figure:.0f} × {limit}, {os.path.relpath(BASELINE, ROOT)}; "
        f"measured now: {got}; there: {base['measured']} with {base['environment']}, now {_versions()}). "
        "Find where the instructions go with `python bench/run.py cpu-record --callgrind` and callgrind_annotate; "
        "if the rise is intended, re-measure and update the figure: "
        "DLPT_COST_UPDATE=1 python3 -m pytest -q tests/test_cost_guard.py, and commit the file.")
