"""The native collector's GPU PC samples (collectors/native/pcsampling.h, `dlpt record
--pc-samples`) → the PC-sample metric columns and `meta.pc_sampling`.

Where a sample goes, outside and inside its kernel:
* outside: the kernel's leaf beneath the node that launched it (the same leaf its GPU time is
  on, so backward work and CUDA-graph replays are placed as their time is);
* inside: beneath that leaf, the source line of the sampled instruction (a `python` frame of
  the kernel's file and line, named for the kernel), where the cubin has a line table (Triton
  and Inductor kernels, nvcc -lineinfo); a library kernel without one (cuBLAS, cuDNN, ATen)
  keeps its samples on its leaf.
Each sample counts once in `pc_samples` and once in the part its stall reason names
(dlpt.stalls.stall_metric), so the parts add up to the total on every node.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns
from dlpt.collectors.record.fx_lines import file_tags
from dlpt.frames import Frame, FrameTable, source_frame
from dlpt.header import Header
from dlpt.metrics import ACTIVITY_KIND_INFO, KERNEL
from dlpt.stalls import stall_metric

I64 = np.int64
ENV = "DLPT_PC_SAMPLES"  # "1": CUPTI's sampling period; 5..31: 2^N cycles (read by the collector)


def _col(raw: dict[str, Any], key: str) -> np.ndarray:
    return np.frombuffer(raw[key], dtype=I64)


def add_pc_samples(raw: dict[str, Any] | None, nmap: np.ndarray, names: list[str], builder: TreeBuilder,
                   frames: FrameTable, out: ActivityColumns, meta: Header) -> None:
    """The samples into `out.extra` (trie node → builder node through `nmap`; `names` the
    trie's names) and what CUPTI said into `meta.pc_sampling`; nothing when sampling was not
    asked for."""
    if raw is None or not os.environ.get(ENV) or os.environ.get(ENV) == "0":
        return
    if not raw:  # a collector built without CUPTI gives nothing at all
        meta.pc_sampling = {"samples": 0, "error": "this collector has no CUPTI (torch without CUDA)"}
        return
    node, name, file, line = _col(raw, "node"), _col(raw, "name"), _col(raw, "file"), _col(raw, "line")
    reason, samples = _col(raw, "reason"), _col(raw, "samples")
    reasons: list[str] = list(raw.get("reasons") or [])
    part_of_reason = [stall_metric(r) for r in reasons]
    leaf_kind = ACTIVITY_KIND_INFO[KERNEL].frame
    at: list[int] = []
    for n, k, f, ln in zip(node.tolist(), name.tolist(), file.tolist(), line.tolist()):
        leaf = builder.child(int(nmap[n]), frames.intern(Frame(leaf_kind, names[k])))
        if f >= 0 and ln > 0:
            leaf = builder.child(leaf, frames.intern(source_frame(names[f], ln, names[k])))
        at.append(leaf)
    nodes = np.asarray(at, dtype=I64)
    parts = np.asarray([part_of_reason[r] if 0 <= r < len(part_of_reason) else "stall_other"
                        for r in reason.tolist()], dtype=object)
    if len(nodes):
        out.extra["pc_samples"] = (nodes, samples)
        for part in sorted(set(parts.tolist())):
            sel = parts == part
            out.extra[part] = (nodes[sel], samples[sel])
    exponent = int(raw.get("period_exponent") or 0)
    meta.pc_sampling = {
        "samples": int(samples.sum()),
        "period_cycles": 2 ** exponent if exponent else None,
        "total": int(raw.get("total", 0)), "dropped": int(raw.get("dropped", 0)),
        "non_user": int(raw.get("non_user", 0)), "buffer_full": int(raw.get("buffer_full", 0)),
        "with_line": int(samples[file >= 0].sum()) if len(samples) else 0,
        "cubins": int(raw.get("cubins", 0)), "cubin_bytes": int(raw.get("cubin_bytes", 0)),
        "reasons": reasons,
        **({"error": raw["error"]} if raw.get("error") else {}),
    }
    fx = _fx_lines(file, line, names)
    if fx:
        meta.pc_sampling["fx_lines"] = fx


def _fx_lines(file: np.ndarray, line: np.ndarray, names: list[str]) -> dict[str, dict[str, list[str]]]:
    """{kernel file: {line: FX node names}} of the sampled lines that Inductor wrote under a
    node's context (fx_lines.py's tags; read now, while the compile cache still holds the files):
    what lets dlpt.compiled split a fused kernel's samples by the lines they sampled."""
    wanted: dict[str, set[int]] = {}
    for f, ln in set(zip(file.tolist(), line.tolist())):
        if f >= 0 and ln > 0:
            wanted.setdefault(names[f], set()).add(int(ln))
    out: dict[str, dict[str, list[str]]] = {}
    for path, lines in wanted.items():
        tags = file_tags(path, lines) if path.endswith(".py") else {}
        if tags:
            out[path] = {str(k): v for k, v in sorted(tags.items())}
    return out
