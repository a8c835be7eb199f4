"""Every copy kind and a memset, each from its own line."""
import torch

dev = torch.device("cuda")
host = torch.randn(2048, 2048)
pinned = host.pin_memory()
g = torch.randn(2048, 2048, device=dev)
for _ in range(3):
    a = host.to(dev)  # CASE: pageable HtoD
    b = pinned.to(dev, non_blocking=True)  # CASE: pinned HtoD
    c = g.clone()  # CASE: DtoD
    z = torch.zeros(1 << 22, device=dev)  # CASE: memset
    f = c.cpu()  # CASE: DtoH
torch.cuda.synchronize()
