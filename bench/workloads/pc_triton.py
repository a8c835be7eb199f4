"""A Triton kernel of known inside: a memory-bound loop and a math-bound loop on lines of their
own, for `--pc-samples` (issue #37's judge). Its truth is its own CUDA events: the kernel with
only the memory loop, with only the math loop, and with both, timed in this run.

    python pc_triton.py [--iters N] [--proton NAME] [--json OUT]

Prints one JSON line: each variant's mean time (ms), the source lines of the two loops' bodies,
and, with --proton, where Proton's PC-sampling profile was written.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _now():
    # The GPU's nanosecond timer, read where the statement stands (volatile: not moved or merged).
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def mixed(x_ptr, out_ptr, t_ptr, n, MEM_ITERS: tl.constexpr, MATH_ITERS: tl.constexpr, BLOCK: tl.constexpr,
          DO_MEM: tl.constexpr, DO_MATH: tl.constexpr, MATH_T: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    a = tl.zeros([BLOCK], dtype=MATH_T)
    b = tl.zeros([BLOCK], dtype=MATH_T) + 1.0
    c = tl.zeros([BLOCK], dtype=MATH_T) + 2.0
    d = tl.zeros([BLOCK], dtype=MATH_T) + 3.0
    t0 = _now()
    if DO_MEM:
        for i in range(MEM_ITERS):
            a += tl.load(x_ptr + (offs * 33 + i * 1048573) % n)  # MEM LINE
    t1 = _now()
    if DO_MATH:
        for _i in range(MATH_ITERS):
            a, b, c, d = a * 1.0001 + b, b * 0.9999 + c, c * 1.0002 + d, d * 0.9998 + a  # MATH LINE
    t2 = _now()
    tl.store(out_ptr + offs, (a + b + c + d).to(tl.float32))
    # Each block's time in each loop (its first thread's timer): the in-kernel truth of how the
    # kernel's warp-time splits between the loops, in the very launches a recording samples.
    tl.store(t_ptr + pid * 2 + tl.arange(0, 1), tl.full([1], 0, tl.int64) + (t1 - t0))
    tl.store(t_ptr + pid * 2 + 1 + tl.arange(0, 1), tl.full([1], 0, tl.int64) + (t2 - t1))


def line_of(marker: str) -> int:
    src, first = inspect.getsourcelines(mixed.fn)
    return first + next(i for i, s in enumerate(src) if marker in s)


TIMES: dict[str, torch.Tensor] = {}  # per launch variant: each block's (memory, math) loop times


def run(x: torch.Tensor, out: torch.Tensor, mem: bool, math: bool, args: argparse.Namespace) -> None:
    grid = (out.numel() // args.block,)
    t = TIMES.setdefault(f"{mem}{math}", torch.zeros(grid[0] * 2, dtype=torch.int64, device=out.device))
    mixed[grid](x, out, t, x.numel(), MEM_ITERS=args.mem_iters, MATH_ITERS=args.math_iters, BLOCK=args.block,
                DO_MEM=mem, DO_MATH=math, MATH_T=tl.float64 if args.fp64 else tl.float32)


def timed(x: torch.Tensor, out: torch.Tensor, mem: bool, math: bool, args: argparse.Namespace) -> float:
    run(x, out, mem, math, args)  # compiled and loaded outside the timing
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(args.iters):
        run(x, out, mem, math, args)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / args.iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--mem-iters", type=int, default=64)
    ap.add_argument("--math-iters", type=int, default=2048)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--out-elems", type=int, default=1 << 20)
    ap.add_argument("--proton", default="", help="profile the combined kernel's runs under Proton's PC sampling")
    ap.add_argument("--json", default="")
    ap.add_argument("--fp64", action="store_true", help="the math loop in float64, a pipe of a fraction of FP32's "
                    "rate on most GPUs: math-pipe-bound where FP32 is issue-bound")
    ap.add_argument("--no-truth", action="store_true", help="run only the combined kernel (a recording's samples "
                    "then are all of it)")
    args = ap.parse_args()
    x = torch.randn(args.size_mb * (1 << 20) // 4, device="cuda")
    out = torch.empty(args.out_elems, device="cuda")
    t_mem = 0.0 if args.no_truth else timed(x, out, True, False, args)
    t_math = 0.0 if args.no_truth else timed(x, out, False, True, args)
    res = {"mem_ms": t_mem, "math_ms": t_math, "mem_line": line_of("# MEM LINE"), "math_line": line_of("# MATH LINE"),
           "file": inspect.getsourcefile(mixed.fn), "iters": args.iters}
    if args.proton:
        # Before the kernel's first launch: Proton keeps a module's cubin (its line table) when
        # the module loads, as dlpt does.
        import triton.profiler as proton

        try:
            proton.start(args.proton, backend="cupti", mode="pcsampling")
        except TypeError:
            proton.start(args.proton, backend="cupti_pcsampling")
        res["proton"] = args.proton
    run(x, out, True, True, args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    both = timed(x, out, True, True, args)
    res["both_wall_s"] = time.perf_counter() - t0
    if args.proton:
        proton.finalize()
    res["both_ms"] = both
    # The last launch's blocks: the loops' shares of the kernel's block-time (ns, summed).
    t = TIMES["TrueTrue"].view(-1, 2).sum(dim=0).tolist()
    res["timer_ns"] = {"mem": t[0], "math": t[1]}
    res["timer_math_share"] = t[1] / (t[0] + t[1])
    res["launch_line"] = next(first + i for src, first in [inspect.getsourcelines(run)]
                              for i, s in enumerate(src) if "mixed[grid]" in s)
    line = json.dumps(res)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
