"""Small Kineto traces in the schema torch.profiler writes (the fixtures' fields: `ph`, `cat`,
`pid`, `tid`, `ts`/`dur` in microseconds, `args` with `correlation`, `device`, `stream`,
`bytes`), for cases the real traces do not show: a program with a known problem, and one
without."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

PID, TID = 4242, 4242
BASE_NS = 1_700_000_000_000_000_000


class TraceBuilder:
    """Events of one Python thread and one GPU: Python frames and ops nest by time, a launch
    records a runtime call with a correlation and its GPU activity."""

    def __init__(self, script: str = "train.py", pid: int = PID) -> None:
        self.pid = pid  # the host process; GPU events sit at pid = device, as Kineto writes them
        self.events: list[dict] = [
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": TID, "args": {"name": "python3"}}]
        self.script = script
        self._corr = 1000

    def py(self, line: int, func: str, ts: float, dur: float, file: str | None = None) -> None:
        self.events.append({"ph": "X", "cat": "python_function", "name": f"{file or self.script}({line}): {func}",
                            "pid": self.pid, "tid": TID, "ts": ts, "dur": dur, "args": {}})

    def op(self, name: str, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": self.pid, "tid": TID, "ts": ts, "dur": dur,
                            "args": {"Sequence number": -1}})

    def runtime(self, name: str, ts: float, dur: float) -> int:
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": TID, "ts": ts,
                            "dur": dur, "args": {"correlation": self._corr}})
        return self._corr

    def gpu(self, cat: str, name: str, ts: float, dur: float, corr: int, nbytes: int = 0, device: int = 0) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": 7, "ts": ts, "dur": dur,
                            "args": {"device": device, "stream": 7, "correlation": corr, "bytes": nbytes}})

    def kernel(self, ts: float, launch_dur: float, gpu_ts: float, gpu_dur: float, name: str = "void k<1>()") -> None:
        """An op launching one kernel: the op, its cudaLaunchKernel, the kernel."""
        self.op("aten::add", ts, launch_dur + 1)
        corr = self.runtime("cudaLaunchKernel", ts + 0.5, launch_dur)
        self.gpu("kernel", name, gpu_ts, gpu_dur, corr)

    def write(self, path: Path, base_ns: int = BASE_NS, rank: int | None = None, world: int | None = None) -> Path:
        """The trace, gzipped; `rank` and `world` as torch.profiler's `distributedInfo`."""
        data: dict = {"schemaVersion": 1, "baseTimeNanoseconds": base_ns, "traceEvents": self.events}
        if rank is not None:
            data["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
        with gzip.open(path, "wt") as f:
            json.dump(data, f)
        return path
