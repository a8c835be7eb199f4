"""GPU memory by line with known truth: what each line allocates and holds at the peak.

Run:    dlpt record -o mem.dlpt bench/gpu_cases/memory_truth.py mem_truth.json
Check:  python bench/gpu_cases/memory_truth.py --check mem.dlpt mem_truth.json

The program (sizes are multiples of 2 MiB, which the caching allocator hands out exactly):
- known lines: four `torch.empty` of 64, 128, 32 and 256 MiB, the 32 MiB one freed before the
  last; the peak of the run is at the last line, with 64 + 128 + 256 MiB live;
- a loop that allocates 2 MiB 20,000 times on one line (about 40 GiB in all) but holds at most
  two blocks, so it holds nothing at the peak;
- a small training step (forward, backward, AdamW), whose allocations are counted by the
  allocator's own cumulative counters around it, with backward's under `[backward]`;
- an out-of-memory error caught while a known line holds 64 MiB.
Truth: per line the expected alloc_bytes, alloc_count and peak_bytes; the training step's
totals; `torch.cuda.max_memory_allocated()` and `max_memory_reserved()`. The check compares the
profile with it line by line, exactly, and exits 1 on any difference.
"""

import json
import resource
import sys
from typing import Any

MIB = 1 << 20


def here() -> int:
    return sys._getframe(1).f_lineno + 1  # the line after the caller's


def run(out: str, loop: int = 20_000) -> None:
    import torch

    dev = "cuda"
    f4 = MIB // 4  # float32 elements in 1 MiB
    torch.cuda.reset_peak_memory_stats()
    lines: dict[str, dict[str, int]] = {}

    def note(line: int, mib: int, held: bool, count: int = 1) -> None:
        t = lines.setdefault(str(line), {"alloc_bytes": 0, "alloc_count": 0, "peak_bytes": 0})
        t["alloc_bytes"] += mib * MIB * count
        t["alloc_count"] += count
        t["peak_bytes"] += mib * MIB if held else 0

    # --- known lines, known peak set ---
    note(here(), 64, True)
    a = torch.empty(64 * f4, device=dev)
    note(here(), 128, True)
    b = torch.empty(128 * f4, device=dev)
    note(here(), 32, False)
    c = torch.empty(32 * f4, device=dev)
    del c
    note(here(), 256, True)
    d = torch.empty(256 * f4, device=dev)
    peak_expected = 448 * MIB
    del a, b, d

    # --- a loop that allocates a lot and holds little ---
    note(here() + 1, 2, False, loop)
    for _ in range(loop):
        t = torch.empty(2 * f4, device=dev)
    del t

    # --- a small training step: counted by the allocator around it ---
    def stats() -> tuple[int, int]:
        s = torch.cuda.memory_stats()
        return s["allocated_bytes.all.allocated"], s["allocation.all.allocated"]

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=dev)
    y = torch.randint(0, 10, (64,), device=dev)
    torch.cuda.synchronize()
    b0, n0 = stats()
    train_first = here()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    train_last = here() - 1
    b1, n1 = stats()
    del loss

    # --- out of memory while a known line holds 64 MiB ---
    note(here(), 64, False)
    keep = torch.empty(64 * f4, device=dev)
    oom_line = here() + 1
    try:
        torch.empty(1 << 44, dtype=torch.uint8, device=dev)  # 16 TiB
    except torch.OutOfMemoryError:
        pass
    del keep
    torch.cuda.synchronize()
    truth = {
        "file": __file__, "lines": lines, "peak_expected": peak_expected,
        "peak_line": int(max(lines, key=lambda k: lines[k]["peak_bytes"])),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "train": {"first": train_first, "last": train_last, "alloc_bytes": b1 - b0, "alloc_count": n1 - n0},
        "oom": {"line": oom_line, "held_line": oom_line - 3, "held_bytes": 64 * MIB},
        # The process's peak resident memory, dlpt's included: run with two loop lengths to see
        # that the profiler's memory does not grow with the number of allocations.
        "loop": loop, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    with open(out, "w") as fh:
        json.dump(truth, fh, indent=1)


def line_totals(prof: Any, suffix: str) -> dict[int, Any]:
    """Inclusive metrics of each line of the file, from the tree: the outermost nodes of each
    line (a node below another node of the same line is inside it), backward work included."""
    import numpy as np

    cct, frames = prof.cct, prof.frames
    out: dict[int, np.ndarray] = {}
    line_of = [frames[f].line if frames[f].kind == "python" and frames[f].file.endswith(suffix) else -1
               for f in cct.frame.tolist()]
    parent = cct.parent.tolist()
    for i, ln in enumerate(line_of):
        if ln < 0:
            continue
        p, inside = parent[i], False
        while p >= 0:
            if line_of[p] == ln:
                inside = True
                break
            p = parent[p]
        if not inside:
            out[ln] = out.get(ln, 0) + cct.inclusive[i]
    return out


def check(profile: str, truth_path: str) -> int:
    import numpy as np

    import dlpt
    from dlpt.metrics import COL

    truth = json.load(open(truth_path))
    prof = dlpt.load(profile)
    per_line = line_totals(prof, "memory_truth.py")
    bad = 0

    def cmp(what: str, want: int, got: int) -> None:
        nonlocal bad
        ok = want == got
        bad += not ok
        print(f"{what:<44} {want:>16,} {got:>16,} {'ok' if ok else 'OFF'}")

    def at(line: int, metric: str) -> int:
        v = per_line.get(line)
        return int(v[COL[metric]]) if v is not None else 0

    print(f"{'what':<44} {'truth':>16} {'dlpt':>16}")
    for line, t in sorted(truth["lines"].items(), key=lambda kv: int(kv[0])):
        for metric in ("alloc_bytes", "alloc_count", "peak_bytes"):
            cmp(f"line {line} {metric}", t[metric], at(int(line), metric))
    m = prof.meta.get("memory", {})
    cmp("peak = max_memory_allocated()", truth["max_memory_allocated"], int(m.get("peak_allocated", -1)))
    cmp("peak = the known peak set", truth["peak_expected"], int(m.get("peak_allocated", -1)))
    cmp("reserved peak = max_memory_reserved()", truth["max_memory_reserved"], int(m.get("peak_reserved", -1)))
    inc = prof.cct.inclusive
    cmp("sum of peak_bytes = peak", int(m.get("peak_allocated", -1)), int(inc[0, COL["peak_bytes"]]))
    cmp("before the recording", 0, int(m.get("before_recording", -1)))
    peak_at = m.get("peak_at", "")
    cmp("peak at the known line", truth["peak_line"], int(peak_at.rsplit(":", 1)[-1]) if ":" in peak_at else -1)
    tr = truth["train"]
    lines = range(tr["first"], tr["last"] + 1)
    cmp("training step alloc_bytes", tr["alloc_bytes"], sum(at(ln, "alloc_bytes") for ln in lines))
    cmp("training step alloc_count", tr["alloc_count"], sum(at(ln, "alloc_count") for ln in lines))
    bw = [i for i, f in enumerate(prof.cct.frame.tolist()) if prof.frames[f].kind == "backward"]
    under_bw = int(np.asarray([inc[i, COL["alloc_bytes"]] for i in bw]).sum()) if bw else 0
    print(f"{'bytes allocated under [backward]':<44} {'> 0':>16} {under_bw:>16,} {'ok' if under_bw > 0 else 'OFF'}")
    bad += under_bw <= 0
    held_line = truth["oom"]["held_line"]
    oom = {d["at"]: d["bytes"] for d in m.get("oom", {}).get("lines", [])}
    got = next((v for k, v in oom.items() if k.endswith(f"memory_truth.py:{held_line}")), 0)
    cmp(f"live at the OOM on line {held_line}", truth["oom"]["held_bytes"], int(got))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20_000)
