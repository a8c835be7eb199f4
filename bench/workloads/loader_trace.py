"""A DataLoader-bound training loop as torch.profiler records it (with stacks, a schedule, the
steps marked), its truth from its own timers: the trace dlpt reads is someone else's recording.

Run:    python bench/workloads/loader_trace.py OUT_DIR [--workers N]
Writes OUT_DIR/trace/*.pt.trace.json(.gz) (tensorboard_trace_handler) and OUT_DIR/truth.json:
the seconds each active step waited for its batch (`data_s`, the loop's own timer between the
end of one step and the batch's arrival) and the steps' wall (`steps_s`).
Check:  python bench/workloads/loader_trace.py --check OUT_DIR
reads the trace with dlpt and prints its dataloader-wait finding against the truth, and the share
of GPU idle time on source lines; exits 1 when the finding is missing, off by more than 15%, or
under 90% of the idle time is on a source line.
"""

import json
import os
import sys
import time


def run(out: str, workers: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    class Slow(torch.utils.data.Dataset):
        """A sample that takes 3 ms to load, as reading and decoding a file does (a sleep: the
        trace records one call for it, not the thousands of a Python loop, and stays small)."""

        def __len__(self) -> int:
            return 10_000

        def __getitem__(self, i: int):
            time.sleep(0.003)
            return torch.randn(512), i % 10

    dev = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=workers)
    sched = schedule(wait=1, warmup=2, active=6, repeat=1)
    data, steps = [], []
    os.makedirs(out, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True, schedule=sched,
                 on_trace_ready=tensorboard_trace_handler(os.path.join(out, "trace"))) as prof:
        end = time.perf_counter()
        for i, (x, y) in enumerate(loader):
            arrived = time.perf_counter()
            x, y = x.to(dev), y.to(dev)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            if 3 <= i < 9:  # the schedule's active steps
                data.append(arrived - end)
                steps.append(time.perf_counter() - end)
            prof.step()
            end = time.perf_counter()
            if i >= 10:
                break
    with open(os.path.join(out, "truth.json"), "w") as f:
        json.dump({"data_s": data, "steps_s": steps, "workers": workers}, f)


def check(out: str) -> int:
    import re

    import dlpt
    from dlpt.findings import findings
    from dlpt.metrics import COL
    from dlpt.views import node_flags

    truth = json.load(open(os.path.join(out, "truth.json")))
    # The trace's window opens at its first GPU activity, after the first active step's wait:
    # the waits of the other active steps are the GPU's idle time the loader caused.
    want = sum(truth["data_s"][1:])
    prof = dlpt.load(os.path.join(out, "trace"))
    found = {f.rule: f for f in findings(prof)}
    idle = prof.cct.exclusive[:, COL["gpu_idle_time"]]
    on_src, _ = node_flags(prof)
    share = float(idle[on_src].sum()) / max(float(idle.sum()), 1.0)
    f = found.get("dataloader-wait")
    got = None
    m = re.match(r"GPU idle ([0-9.]+) (s|ms|us)", f.figure) if f is not None else None
    if m:
        got = float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
    err = (got - want) / want if got is not None and want else None
    print(f"findings: {', '.join(found) or 'none'}")
    print(f"dataloader-wait: dlpt {got} s, truth {want:.4f} s" + (f" ({err:+.1%})" if err is not None else ""))
    print(f"GPU idle on source lines: {share:.1%}")
    ok = f is not None and err is not None and abs(err) <= 0.15 and share >= 0.90
    print("ok" if ok else "OFF")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    w = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 0
    run(sys.argv[1], w)
