"""The collector's host-side cost in instructions, counted by callgrind: deterministic, so it can
be measured on a small, shared, noisy machine where timings cannot.

nanoGPT's own model (`shared/programs/nanoGPT/model.py`, 2 layers, 32 wide, CPU) runs training
steps (forward, backward, gradient clipping, AdamW) inside `itertools.starmap`, and callgrind
counts only what runs inside it (`--toggle-collect=starmap_next`): the steps, nothing of start-up
or of building the profile. Every configuration runs twice, 1 and 1 + N steps, and the difference
counts N steady steps:

    python bench/cpu_instr.py [--steps N] [CONFIG...]

CONFIG is `none` (unprofiled), `dlpt`, or `LABEL=dlpt:DLPT_DIAG=...`; without any, the default
set below. Prints a Markdown table: instructions per step and the ratio to unprofiled. Needs
valgrind; about 4 minutes per configuration on two cores.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["none", "dlpt", "switching RecordFunction off per op=dlpt:DLPT_DIAG=toggle",
           "callback returning at once=dlpt:DLPT_DIAG=noop", "backward() without RecordFunction=dlpt:DLPT_DIAG=bwoff"]


def program(mode: str, n: int) -> None:
    import torch

    sys.path.insert(0, os.path.join(ROOT, "shared", "programs", "nanoGPT"))
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(block_size=16, vocab_size=65, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=False))
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    data = torch.randint(0, 65, (2, 17))
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    rec = None
    if mode == "dlpt":
        from dlpt.collectors.record.session import Recorder

        rec = Recorder(command="cpu_instr", quiet=True)
        rec.start()
        step()  # first sight of every line and op: interning, not the steady state
    collections.deque(itertools.starmap(step, [()] * n), maxlen=0)
    if rec is not None:
        rec.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--program":
        program(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    from dlpt.collectors.record import native

    native.load(quiet=True)  # built here, not under valgrind
    rows = []
    for config in a.configs or DEFAULT:
        head, _, envs = config.partition(":")
        label, _, mode = head.rpartition("=")
        env = {**os.environ, "PYTHONHASHSEED": "0", **dict(kv.split("=", 1) for kv in envs.split(",") if kv)}
        # Two runs, 1 and 1 + STEPS steps, at once: their difference is STEPS steady steps, without
        # what the first steps through the loop's call site cost (new contexts to intern).
        with tempfile.TemporaryDirectory() as tmp:
            procs = [subprocess.Popen(["valgrind", "--tool=callgrind", "--toggle-collect=starmap_next",
                                       f"--callgrind-out-file={tmp}/cg.{k}", sys.executable, __file__, "--program",
                                       mode, str(k)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True) for k in (1, 1 + a.steps)]
            outs = [(p.wait(), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
        counts = [re.search(r"Collected : (\d+)", err) for _, err in outs]
        if any(rc != 0 for rc, _ in outs) or not all(counts):
            print(f"{config}: failed\n{outs[-1][1][-2000:]}", file=sys.stderr)
            continue
        per_step = (int(counts[1].group(1)) - int(counts[0].group(1))) / a.steps  # type: ignore[union-attr]
        rows.append((label or config, per_step))
        print(f"{rows[-1][0]}: {per_step:,.0f} instructions/step", file=sys.stderr, flush=True)
    base = next((v for k, v in rows if k == "none"), None)
    print("| configuration | instructions / step | × unprofiled |\n| --- | --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v:,.0f} | {v / base:.3f} |" if base else f"| {k} | {v:,.0f} | - |")


if __name__ == "__main__":
    main()
