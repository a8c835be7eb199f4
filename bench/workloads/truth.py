"""Ground truth for `dlpt record` on a GPU (issue 10, "GPU fidelity"); `bench/run.py gpu-fidelity` runs
it under `dlpt record` and compares. Every GPU activity of the program is launched from a line
marked `# LINE:<name>` (or `# ALSO:<name>`, a second line of the same group), in every place
where a line can be hard to find: plain code, an nn.Module's forward, module-level code, operator expressions (`x + y`, `a @ b`,
`x * torch.sigmoid(x)`), a custom autograd Function's forward and backward (backward's time
belongs to the line that applied the Function), a thread of its own, a CUDA graph replay, and
copies of known size (pinned HtoD, pinned DtoH, DtoD).

Each marked line is bracketed by CUDA events. The GPU is kept busy (a long `_sleep` queued at
the start of each round, on a marked line too) so that the host is always ahead and no idle gap
falls between a pair of events: the events then time the line's own activities. Lines marked
`# ZERO:<name>` launch nothing and should get no GPU time. Tensors are made with torch.empty so
that no unmarked line launches a kernel; the `# WARM` lines run each kind of work once, tiny,
before the timed rounds (library handles, first-launch costs), and are all the unmarked GPU time.

    python bench/workloads/truth.py TRUTH.json [ROUNDS]

Writes TRUTH.json: CUDA-event nanoseconds, counts and expected copy bytes per marked line.
"""

import json
import sys
import threading

import torch

ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
CYCLES = {"busy": 60_000_000, "plain": 4_000_000, "module_fwd": 6_000_000, "module_level": 3_000_000,
          "fn_fwd": 5_000_000, "fn_bwd": 7_000_000, "thread": 8_000_000, "graph": 3_000_000}
N_ADD = 1 << 28  # float32: 1 GiB per tensor, ~1 ms for x + y on an H100: launch gaps stay far under 1%
N_MM = 8192  # bf16 8192³ matmul: ~1.4 ms
N_COPY = 256 << 20  # bytes per copy
EVENTS: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
BYTES: dict[str, list] = {}  # line → [copy kind, bytes]


class timed:  # noqa: N801 - reads as a statement: `with timed("name"):`
    """CUDA events around the body; records no GPU activity itself (an event record is not a
    kernel, copy or memset)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.s = torch.cuda.Event(enable_timing=True)
        self.e = torch.cuda.Event(enable_timing=True)
        self.s.record()

    def __exit__(self, *exc: object) -> None:
        self.e.record()
        EVENTS.append((self.name, self.s, self.e))


def plain() -> None:
    with timed("plain"):
        torch.cuda._sleep(CYCLES["plain"])  # LINE:plain


def operators(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    with timed("op_add"):
        z = x + y  # LINE:op_add
    with timed("op_matmul"):
        c = a @ b  # LINE:op_matmul
    with timed("op_silu"):
        s = x * torch.sigmoid(x)  # LINE:op_silu
    del z, c, s


class Block(torch.nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        with timed("module_fwd"):
            torch.cuda._sleep(CYCLES["module_fwd"])  # LINE:module_fwd
        return t


class Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, fwd_cycles, bwd_cycles):  # noqa: ANN001
        ctx.bwd_cycles = bwd_cycles
        if fwd_cycles:  # 0 in the warm-up: it launches nothing on a marked line
            with timed("fn_fwd"):
                torch.cuda._sleep(fwd_cycles)  # LINE:fn_fwd
        return t.view_as(t)  # a view: no kernel

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001
        # Runs on autograd's device thread; its kernel belongs to the line that applied Slow
        # (docs/ARCHITECTURE.md); this line has Python frames of its own, so a collector may put it here:
        # ALSO counts it in fn_apply's group and the comparison shows the split.
        if ctx.bwd_cycles:
            with timed("fn_apply"):
                torch.cuda._sleep(ctx.bwd_cycles)  # ALSO:fn_apply
        return None, None, None  # no gradient: nothing to accumulate, so no kernel on another line


def autograd_case(leaf: torch.Tensor, gy: torch.Tensor) -> None:
    y = Slow.apply(leaf, CYCLES["fn_fwd"], CYCLES["fn_bwd"])  # LINE:fn_apply
    y.backward(gy)  # ZERO:backward_call


def thread_body() -> None:
    with timed("thread"):
        torch.cuda._sleep(CYCLES["thread"])  # LINE:thread


def thread_case() -> None:
    t = threading.Thread(target=thread_body, name="fidelity-worker")
    t.start()
    t.join()  # ZERO:thread_join


def copies(hp: torch.Tensor, hp2: torch.Tensor, d1: torch.Tensor, d2: torch.Tensor) -> None:
    with timed("h2d"):
        d1.copy_(hp, non_blocking=True)  # LINE:h2d
    with timed("d2d"):
        d2.copy_(d1)  # LINE:d2d
    with timed("d2h"):
        hp2.copy_(d2, non_blocking=True)  # LINE:d2h


dev = torch.device("cuda")
x = torch.empty(N_ADD, device=dev)
y = torch.empty(N_ADD, device=dev)
a = torch.empty(N_MM, N_MM, device=dev, dtype=torch.bfloat16)
b = torch.empty(N_MM, N_MM, device=dev, dtype=torch.bfloat16)
hp = torch.empty(N_COPY, dtype=torch.uint8, pin_memory=True)
hp2 = torch.empty(N_COPY, dtype=torch.uint8, pin_memory=True)
d1 = torch.empty(N_COPY, dtype=torch.uint8, device=dev)
d2 = torch.empty(N_COPY, dtype=torch.uint8, device=dev)
leaf = torch.empty(4, device=dev, requires_grad=True)
gy = torch.empty(4, device=dev)
block = Block()

# Warm-up, tiny (microseconds of GPU time, all the unmarked time there is): cuBLAS handle and
# workspace, first launches, autograd's device thread. What it cannot warm (a kernel of the large
# shapes loaded lazily on first use) is absorbed by round 0's longer busy sleep: the host may
# stall that long on first calls without the GPU running dry.
torch.cuda._sleep(1000)  # WARM
_ = x[:1024] + y[:1024]  # WARM
_ = a[:64, :64] @ b[:64, :64]  # WARM
_ = x[:1024] * torch.sigmoid(x[:1024])  # WARM
d1[:1024].copy_(hp[:1024], non_blocking=True)  # WARM
Slow.apply(leaf, 0, 0).backward(gy)  # WARM: no kernel at all
torch.cuda.synchronize()

graph: torch.cuda.CUDAGraph | None = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph):  # capture: nothing runs on the GPU here
        torch.cuda._sleep(CYCLES["graph"])
        torch.cuda._sleep(CYCLES["graph"])
except RuntimeError as e:  # the other cases still count; the table shows the graph line untimed
    print(f"fidelity program: CUDA graph capture failed, graph case skipped: {e}", file=sys.stderr)
    graph = None

for _round in range(ROUNDS):
    busy = CYCLES["busy"] * (20 if _round == 0 else 1)  # ~0.6 s, then ~30 ms (at ~2 GHz)
    with timed("busy"):
        torch.cuda._sleep(busy)  # LINE:busy
    plain()
    block(leaf)
    operators(x, y, a, b)
    autograd_case(leaf, gy)
    thread_case()
    if graph is not None:
        with timed("graph"):
            graph.replay()  # LINE:graph
    copies(hp, hp2, d1, d2)
    with timed("module_level"):
        torch.cuda._sleep(CYCLES["module_level"])  # LINE:module_level
    with timed("module_add"):
        z = x + y  # LINE:module_add
    del z

torch.cuda.synchronize()
ns: dict[str, float] = {}
count: dict[str, int] = {}
for name, s, e in EVENTS:
    ns[name] = ns.get(name, 0.0) + s.elapsed_time(e) * 1e6  # ms → ns
    count[name] = count.get(name, 0) + 1
for name, kind in (("h2d", "htod_bytes"), ("d2d", "dtod_bytes"), ("d2h", "dtoh_bytes")):
    BYTES[name] = [kind, N_COPY * ROUNDS]
with open(sys.argv[1], "w") as f:
    json.dump({"cuda_event_ns": ns, "count": count, "bytes": BYTES, "rounds": ROUNDS, "graph_captured": graph is not None,
               "device": torch.cuda.get_device_name(0), "torch": torch.__version__}, f, indent=1)
print(f"fidelity program: {ROUNDS} rounds, {len(EVENTS)} timed lines, {sum(ns.values()) / 1e6:.1f} ms", flush=True)
