"""Where a GPU copy's byte count is in this torch's live profiler results (run on the device)."""
import torch
from torch.profiler import ProfilerActivity, profile

dev = torch.device("cuda")
h = torch.randn(1024, 1024)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    a = h.to(dev)
    b = a.clone()
    z = torch.zeros(1 << 20, device=dev)
    c = b.cpu()
    torch.cuda.synchronize()
for e in p.profiler.kineto_results.events():
    if e.device_type() != torch.autograd.DeviceType.CPU:
        print(repr(e.name())[:60])
        for m in ("nbytes", "metadata_json", "extra_meta", "flops", "device_index", "device_resource_id"):
            try:
                print("   ", m, repr(getattr(e, m)())[:300])
            except Exception as ex:  # noqa: BLE001 - a probe: report whatever the binding does
                print("   ", m, "raises", type(ex).__name__, ex)
tree = p.profiler.kineto_results.experimental_event_tree()
def walk(n, d=0):
    if d < 6 and ("Memcpy" in n.name or "Memset" in n.name):
        print("tree node:", n.name, n.tag, type(n.extra_fields).__name__, [a for a in dir(n.extra_fields) if not a.startswith("_")])
    for c in n.children:
        walk(c, d + 1)
for r in tree:
    walk(r)
