"""The native collector's GPU memory figures (collectors/native/memory.h) → metric columns and
meta for the recorder's profile.

Per node: `alloc_bytes`, `alloc_count`, and `peak_bytes` — bytes the node allocated that were
still live at each device's peak, summed over devices. What was allocated before recording
began and still live at a peak is the named row `BEFORE_RECORDING`, so the tree's total of
peak_bytes is the sum of the devices' peaks. `meta.memory` holds the peaks, where and at which
step they happened, the CUDA-graph private pools by the line that captured them, and the live
bytes by line at an out-of-memory error; `meta.timeline` allocated and reserved memory over
time (`mem_t`, ns from the start of recording).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns
from dlpt.frames import FrameTable, unattributed_frame
from dlpt.header import Header, Timeline
from dlpt.memory import BEFORE_RECORDING, node_place

I64 = np.int64
TOP_LINES = 20  # lines listed for graph pools and an out-of-memory error


def _col(raw: dict[str, Any], key: str) -> np.ndarray:
    return np.frombuffer(raw[key], dtype=I64)


def _lines(nodes: np.ndarray, values: np.ndarray, place: Any) -> list[dict[str, Any]]:
    """The largest holders, by place (`file:line`), biggest first."""
    by: dict[str, int] = {}
    for n, v in zip(nodes.tolist(), values.tolist()):
        if v > 0:
            at = place(n)
            by[at] = by.get(at, 0) + v
    return [{"at": k, "bytes": v} for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:TOP_LINES]]


def series(raw: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """(time, allocated, reserved) per bin up to the last with an event: a bin's highest value,
    the level it starts with included (carried from the bin before), so no peak is lost."""
    bins = _col(raw, "series_bin")
    if not len(bins):
        return [], [], []
    n = int(bins.max()) + 1
    out = []
    for hi_key, last_key in (("series_hi_alloc", "series_last_alloc"), ("series_hi_reserved", "series_last_reserved")):
        hi = np.full(n, -1, dtype=I64)
        last = np.full(n, -1, dtype=I64)
        hi[bins] = _col(raw, hi_key)
        last[bins] = _col(raw, last_key)
        level = np.maximum.accumulate(np.where(last >= 0, np.arange(n), -1))  # the last bin with events, so far
        carried = np.r_[0, np.where(level[:-1] >= 0, last[np.maximum(level[:-1], 0)], 0)]
        out.append(np.maximum(hi, carried).tolist())
    width = int(raw["series_width"])
    return (np.arange(n, dtype=I64) * width).tolist(), out[0], out[1]


def add_memory(raw: dict[str, Any] | None, nmap: np.ndarray, builder: TreeBuilder, frames: FrameTable,
               out: ActivityColumns, meta: Header) -> None:
    """The memory columns into `out.extra` (builder node ids through `nmap`, trie node → builder
    node) and the memory meta into `meta`; nothing when memory was not recorded."""
    if raw is None:
        return
    if not raw["recorded"]:
        if raw["error"]:
            meta.memory = {"recorded": False, "why": raw["error"]}
        return
    an = nmap[_col(raw, "alloc_node")]
    out.extra["alloc_bytes"] = (an, _col(raw, "alloc_bytes"))
    out.extra["alloc_count"] = (an, _col(raw, "alloc_count"))
    dev = _col(raw, "dev_id")
    before = int(_col(raw, "dev_before").sum())
    pn, pb = nmap[_col(raw, "peak_node")], _col(raw, "peak_bytes")
    if before > 0:
        rest = builder.child(0, frames.intern(unattributed_frame(BEFORE_RECORDING)))
        pn, pb = np.r_[pn, rest], np.r_[pb, before]
    out.extra["peak_bytes"] = (pn, pb)

    def place(trie_node: int) -> str:
        return node_place(builder.parent, builder.frame, frames, int(nmap[trie_node])) if trie_node >= 0 else ""

    peaks = _col(raw, "dev_peak")
    devices = {}
    for k, d in enumerate(dev.tolist()):
        devices[str(d)] = {"peak_allocated": int(peaks[k]), "peak_reserved": int(_col(raw, "dev_reserved_peak")[k]),
                           "before_recording": int(_col(raw, "dev_before")[k]),
                           "peak_at": place(int(_col(raw, "dev_peak_node")[k])),
                           "peak_step": int(_col(raw, "dev_peak_step")[k]),
                           "unmatched_frees": int(_col(raw, "dev_unmatched_frees")[k])}
    top = int(np.argmax(peaks)) if len(peaks) else -1
    pool_n, pool_b = _col(raw, "pool_node"), _col(raw, "pool_bytes")
    mem: dict[str, Any] = {
        "recorded": True,
        "peak_allocated": int(peaks.sum()),
        "peak_reserved": int(_col(raw, "dev_reserved_peak").sum()),
        "peak_at": devices[str(int(dev[top]))]["peak_at"] if top >= 0 else "",
        "peak_step": devices[str(int(dev[top]))]["peak_step"] if top >= 0 else None,
        "graph_pools": int(pool_b.sum()),
        "graph_pool_lines": _lines(pool_n, pool_b, place),
        "before_recording": before,
        "devices": devices,
        "events": int(raw["events"]), "live_blocks": int(raw["live_blocks"]), "approx_placed": int(raw["approx"]),
    }
    if int(raw["ooms"]):
        mem["oom"] = {"device": int(raw["oom_device"]), "requested": int(raw["oom_requested"]),
                      "free": int(raw["oom_free"]), "count": int(raw["ooms"]),
                      "lines": _lines(_col(raw, "oom_node"), _col(raw, "oom_bytes"), place)}
    meta.memory = mem
    t, alloc, reserved = series(raw)
    if t:
        tl = meta.timeline if meta.timeline is not None else Timeline()
        tl.update({"mem_t": t, "allocated": alloc, "reserved": reserved})
        meta.timeline = tl
