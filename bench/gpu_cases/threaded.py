"""Two Python threads started while recording, each running a matmul."""
import threading

import torch

dev = torch.device("cuda")
w = torch.randn(2048, 2048, device=dev)


def worker(out):
    y = w @ w  # CASE: worker matmul
    out.append(y.relu().sum())


for _ in range(3):
    outs = []
    ts = [threading.Thread(target=worker, args=(outs,)) for _ in range(2)]
    for t in ts:
        t.start()  # CASE: thread start
    for t in ts:
        t.join()
    total = sum(o.item() for o in outs)
torch.cuda.synchronize()
