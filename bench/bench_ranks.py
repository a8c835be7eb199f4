"""Merging rank profiles: time and peak memory of `dlpt.merge.merge_profiles` for 8, 64 and 256
synthetic ranks of the same program, and the time per merged node (flat when the merge is
linear in nodes).

    python bench/bench_ranks.py [--nodes 10000] [--ranks 8,64,256]

Each rank's profile is a random calling-context tree in preorder over a shared pool of frames
(the same program on every rank), with metrics and GPU activity rows, so the merge does all of
its work: frame interning, array shifts, activity remapping.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from dataclasses import fields

import numpy as np

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000, help="CCT nodes per rank (default: 10000)")
    ap.add_argument("--frames", type=int, default=2_000, help="distinct frames of the program (default: 2000)")
    ap.add_argument("--ranks", default="8,64,256")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; the median is shown")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
