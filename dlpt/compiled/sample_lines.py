"""A fused kernel's PC samples split by the lines they sampled: the codegen map.

By default a fused kernel's metrics follow its work shares onto the model lines it was generated
from (fused.py). Its PC samples can do better where the recording knows which FX nodes wrote each
line of the generated kernel (`meta.pc_sampling["fx_lines"]`, from the tags
collectors/record/fx_lines.py puts on the lines while Inductor generates them): a sample on
line L goes to the model lines of L's nodes, through each node's stack trace
(`KernelProvenance.fx`), in proportion to their work. The kernel's time keeps its work shares,
so the two splits stand side by side on the same rows (`gpu_time` by work, `pc_samples` by the
instructions sampled). A sampled line no node's context wrote (loop headers, the signature), or
whose nodes have no trace, keeps the work shares.

The resolution is the op: the recorder tags each line with the FX node of the loop-body op that
wrote it (collectors/record/fx_lines.py `per_op`), so within a chain of pointwise ops fused into
one scheduler node a `sin` line's samples go to the `sin`'s model line alone. A line written
outside any one op (index and mask arithmetic) carries the scheduler node's names, and a torch
whose loop bodies cannot be stamped tags every line that way: such lines split by those nodes'
work. On the H200 (bench/workloads/pc_inductor.py, docs/BENCHMARKS.md) the heavy line took 96.7%
of the fused kernel's samples by the lines sampled, against 83.3% by work.
"""

from __future__ import annotations

from typing import Any

from dlpt.compiled.provenance import KernelProvenance
from dlpt.frames import Frame

# For each target path of a unit, in order: the (kernel, trace index, that trace's share of the
# unit by work) triples that made it.
Contributions = list[list[tuple[KernelProvenance, int, int]]]


def fx_lines_of(meta: Any) -> dict[str, dict[int, list[str]]]:
    """{kernel file: {line: FX node names}} from a recording's `pc_sampling` meta."""
    pcs = getattr(meta, "pc_sampling", None) or {}
    raw = pcs.get("fx_lines") if isinstance(pcs, dict) else None
    out: dict[str, dict[int, list[str]]] = {}
    for file, lines in (raw or {}).items():
        if isinstance(lines, dict):
            out[str(file)] = {int(k): [str(n) for n in v] for k, v in lines.items() if isinstance(v, list)}
    return out


def line_weights(contrib: Contributions, names: list[str], file: str = "") -> list[int] | None:
    """Integer weights over a unit's paths for a sample on a line that nodes `names` wrote: each
    path keeps the work share of the traces of those nodes it was made from, and nothing of the
    others. A line tagged with one op's FX node goes to that op's lines alone; one tagged with a
    scheduler node's names (written outside any one op) splits as the work shares do among
    those nodes' lines. None where no path has one (the line then
    keeps the unit's work shares). Where a unit may be one of several kernels (same-named
    kernels of several graphs, in a CUDA-graph replay), only those whose own source file is the
    sampled `file` count."""
    ws = [sum(w for kp, t, w in triples if (not kp.source or not file or kp.source == file)
              and t in kp.traces_of(names)) for triples in contrib]
    return ws if sum(ws) else None


class SampleLines:
    """What fused.py's transformation asks of the map: `note` each unit's contributions as its
    targets are made (keyed by the cached path list's identity: the cache holds it for the whole
    run, and two units with the same paths may hold different kernels), then `weights` for each
    sampled kernel line beneath a unit; `split` counts the sampled lines so split."""

    def __init__(self, meta: Any) -> None:
        self.fx_lines = fx_lines_of(meta)
        self._contrib: dict[int, Contributions] = {}
        self.split = 0

    def __bool__(self) -> bool:
        return bool(self.fx_lines)

    def note(self, paths: list[tuple[int, ...]], contrib: Contributions) -> None:
        self._contrib[id(paths)] = contrib

    def weights(self, paths: list[tuple[int, ...]], frame: Frame) -> list[int] | None:
        """A sampled kernel line's own weights over its unit's paths, or None (the unit's)."""
        names = self.fx_lines.get(frame.file, {}).get(frame.line) if frame.kind == "python" else None
        contrib = self._contrib.get(id(paths)) if names else None
        ws = line_weights(contrib, names, frame.file) if contrib is not None and names else None
        self.split += ws is not None
        return ws
