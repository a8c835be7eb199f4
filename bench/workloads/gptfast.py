"""gpt-fast's `generate.py`, run as its users run it, offline: its own command line and output.

    python bench/workloads/gptfast.py [generate.py's options...]

The GPU machines cannot download a checkpoint or a tokenizer, so this driver (1) makes a
random-weight bf16 checkpoint of the named shape (`--model stories110M`, default) once, as
`checkpoints/<model>/model.pth` with an empty `tokenizer.model` beside it, (2) gives
`tokenizer.get_tokenizer` a stand-in (token ids in, text of ids out: generate.py only encodes
the prompt and decodes for printing) and, as the copy has no `tp.py`, a `tp` module whose
`maybe_init_dist()` returns None (what gpt-fast's does outside torchrun), and (3) runs the unmodified `generate.py` as `__main__`
with the rest of the command line. Pass `--prompt N` for a synthetic prompt of N tokens (as
generate.py itself allows). Everything else — loading, `torch.compile(mode="reduce-overhead")`
with `--compile`, the warm-up generation, the timed samples and the lines it prints
(`Compilation time`, `Time for inference i`, `Average tokens/sec`) — is generate.py's own.
gpt-fast comes from the project's shared/programs/gpt-fast (pytorch-labs/gpt-fast at 32971d3).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


class StandIn:
    """A tokenizer for synthetic prompts: ids stay ids."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids[:16])) + (" …" if len(ids) > 16 else "")

    def bos_id(self) -> int:
        return 1

    def eos_id(self) -> int:
        return 2


def main() -> None:
    import runlib

    src = os.path.join(runlib.programs_dir(), "gpt-fast")
    argv = sys.argv[1:]
    model = "stories110M"
    if "--model" in argv:
        i = argv.index("--model")
        model = argv[i + 1]
        del argv[i:i + 2]
    ckpt = Path(os.environ.get("GPTFAST_CKPT", "/tmp/gptfast")) / "checkpoints" / model / "model.pth"
    sys.path.insert(0, src)
    import torch
    from model import Transformer

    if not ckpt.is_file():
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        net = Transformer.from_name(model).to(torch.bfloat16)
        torch.save(net.state_dict(), ckpt)
        (ckpt.parent / "tokenizer.model").write_bytes(b"")
    import types

    import tokenizer

    tokenizer.get_tokenizer = lambda *a, **k: StandIn()  # no SentencePiece model offline
    # gpt-fast's tp.py (tensor parallelism) is not in the copy: on one GPU, outside torchrun, its
    # maybe_init_dist() returns None, which is all generate.py asks of it.
    tp = types.ModuleType("tp")
    tp.maybe_init_dist = lambda: None  # type: ignore[attr-defined]
    sys.modules.setdefault("tp", tp)
    sys.argv = [os.path.join(src, "generate.py"), "--checkpoint_path", str(ckpt), *argv]
    if os.environ.get("GPTFAST_THREADS") or os.environ.get("GPTFAST_REPLAYS"):
        import atexit
        import importlib.util
        import json

        spec = importlib.util.spec_from_file_location("graph_replay", os.path.join(HERE, "graph_replay.py"))
        gr = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(gr)  # type: ignore[union-attr]
        if os.environ.get("GPTFAST_THREADS"):  # each thread's CPU seconds and last CPU, at exit (overhead probes)
            atexit.register(lambda: print("THREADS " + json.dumps(gr.threads()), flush=True))
        if os.environ.get("GPTFAST_REPLAYS"):  # each CUDA-graph replay timed on the host and the GPU (overhead probes)
            _time_replays(torch, gr.py_us)
    runpy.run_path(sys.argv[0], run_name="__main__")


def _time_replays(torch, py_us) -> None:  # noqa: ANN001
    """Time every CUDA-graph replay: its call on the host (perf_counter), its span on the GPU (CUDA
    events around it) and the GPU's gap from the previous replay's end; the last 1,000 replays'
    quantiles are printed at exit as `REPLAYS {...}`. The events are the same with or without a
    profiler, so a profiler's cost shows as a longer call, a longer span, or a longer gap. `py_us`
    (a pure-Python loop, at start and at exit) is the host's own speed: on the device machines it
    differs by ~1.6x from process to process (docs/BENCHMARKS.md), so compare like with like."""
    import atexit
    import json
    import time

    graph_cls = torch.cuda.CUDAGraph
    plain = graph_cls.replay
    rows: list = []
    py_start = py_us()

    def replay(self) -> None:  # noqa: ANN001
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t = time.perf_counter()
        plain(self)
        call = time.perf_counter() - t
        b.record()
        rows.append((a, b, call))

    graph_cls.replay = replay

    def report() -> None:
        torch.cuda.synchronize()
        last = rows[-1000:]
        import numpy as np

        def q(xs: list) -> list[float]:
            return [round(float(x), 4) for x in np.quantile(xs, [0.1, 0.5, 0.9])]
        span = [a.elapsed_time(b) for a, b, _ in last]
        gap = [p[1].elapsed_time(c[0]) for p, c in zip(last, last[1:])]
        call = [c * 1e3 for _, _, c in last]
        print("REPLAYS " + json.dumps({"n": len(rows), "call_ms": q(call), "span_ms": q(span), "gap_ms": q(gap),
                                       "sum_span_ms": round(sum(span), 2), "sum_gap_ms": round(sum(gap), 2),
                                       "py_us": [py_start, py_us()]}), flush=True)

    atexit.register(report)


if __name__ == "__main__":
    main()
