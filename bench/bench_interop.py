"""GraphFrame construction: dlpt's direct build from arrays vs hatchet's literal reader, on the
biggest fixture and on larger trees made by repeating it under rank nodes. Prints a table.
Usage: python bench/bench_interop.py [TRACE]"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import dlpt
from dlpt.cct import CCT
from dlpt.frames import Frame
from dlpt.interop.graphframe import to_graphframe, to_literal
from dlpt.profile import Profile

FIX = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "kineto" / "gpt_train.pt.trace.json.gz"


def replicate(p: Profile, k: int) -> Profile:
    """k copies of the tree under k rank nodes: a realistic shape, k times the nodes."""
    cct = p.cct
    n = len(cct) - 1
    frames = list(p.frames) + [Frame("rank", f"rank {r}") for r in range(k)]
    parent, frame, exc = [np.array([-1])], [np.array([0])], [np.zeros((1, cct.exclusive.shape[1]), np.int64)]
    base = 1
    for r in range(k):
        rank_node = base
        parent.append(np.array([0]))
        frame.append(np.array([len(p.frames) + r]))
        exc.append(np.zeros((1, cct.exclusive.shape[1]), np.int64))
        sub = cct.parent[1:]
        parent.append(np.where(sub == 0, rank_node, sub + rank_node))
        frame.append(cct.frame[1:])
        exc.append(cct.exclusive[1:])
        base += n + 1
    return Profile(frames, CCT(np.concatenate(parent), np.concatenate(frame), np.concatenate(exc)),
                   meta={"source": "kineto"})


def best(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    import hatchet as ht

    p = dlpt.load(sys.argv[1] if len(sys.argv) > 1 else str(FIX))
    print("| nodes | dlpt to_graphframe | to_literal + GraphFrame.from_literal | ratio | hatchet gf.to_literal() |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for k in (1, 10, 50):
        q = replicate(p, k) if k > 1 else p
        reps = 5 if k <= 10 else 3
        n = len(q.cct)
        t_direct = best(lambda q=q: to_graphframe(q, "gpu_time", include_library=True), reps)
        t_lit = best(lambda q=q: ht.GraphFrame.from_literal(to_literal(q, include_library=True)), reps)
        gf = to_graphframe(q, "gpu_time", include_library=True)
        t_export = best(lambda gf=gf: gf.to_literal(), 1) if n <= 20000 else float("nan")
        print(f"| {n:,} | {t_direct * 1e3:.0f} ms | {t_lit * 1e3:.0f} ms | {t_lit / t_direct:.1f}× | "
              + (f"{t_export * 1e3:.0f} ms |" if t_export == t_export else "not run (quadratic) |"))


if __name__ == "__main__":
    main()
