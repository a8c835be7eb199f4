"""A Hugging Face `Trainer` run of our own making, for `bench/run.py trainer`: a small GPT-2
built from a config with random weights (no hub download: the GPU machines are offline), a
synthetic dataset, 2 dataloader worker processes, bf16, no saving, no reporting.

    python bench/workloads/hf_trainer.py [--steps 40] [--workers 2] [--no-bf16]

Prints, as its last line, `TRAINER_RESULT {json}`: Trainer's metrics (train_runtime, …) and the
wall time of every optimizer step seen by a callback, so a pause inside the program (a profiler
stopping the world at a step) shows as the longest step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

SEQ = 128
VOCAB = 8192


class Synthetic(torch.utils.data.Dataset):
    """Random token ids, the same for a given index in every run (seeded per item), made in the
    worker processes: the dataloader workers do real (if small) work."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


class StepTimes(TrainerCallback):
    def __init__(self) -> None:
        self.t: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's callback signature
        self.t.append(time.perf_counter())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-bf16", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_layer=4, n_embd=256, n_head=4,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    out = tempfile.mkdtemp(prefix="hf-trainer-")  # Trainer wants an output_dir; nothing is saved there
    args = TrainingArguments(
        output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch, learning_rate=3e-4,
        dataloader_num_workers=a.workers, bf16=cuda and not a.no_bf16, use_cpu=not cuda,
        report_to=[], save_strategy="no", logging_strategy="steps", logging_steps=10,
        disable_tqdm=True, seed=0,
    )
    cb = StepTimes()
    trainer = Trainer(model=model, args=args, train_dataset=Synthetic(a.steps * a.batch * 2), callbacks=[cb])
    t0 = time.perf_counter()
    res = trainer.train()
    wall = time.perf_counter() - t0
    steps = [b - a_ for a_, b in zip([t0, *cb.t[:-1]], cb.t)]
    doc = {"metrics": res.metrics, "train_wall_s": round(wall, 4), "steps_seen": len(cb.t),
           "step_s_median": round(statistics.median(steps), 5) if steps else None,
           "step_s_max_after_first": round(max(steps[1:]), 5) if len(steps) > 1 else None,
           "step_s": [round(s, 5) for s in steps], "device": "cuda" if cuda else "cpu", "pid": os.getpid()}
    print("TRAINER_RESULT " + json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
