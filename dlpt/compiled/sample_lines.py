"""A fused kernel's PC samples split by the lines they sampled: the codegen map.

By default a fused kernel's metrics follow its work shares onto the model lines it was generated
from (fused.py). Its PC samples can do better where the recording knows which FX nodes wrote each
line of the generated kernel (`meta.pc_sampling["fx_lines"]`, from the tags
collectors/record/fx_lines.py puts on the lines while Inductor generates them): a sample on
line L goes to the model lines of L's nodes, through each node's stack trace
(`KernelProvenance.fx`). The kernel's time keeps its work shares, so the two splits stand side
by side on the same rows (`gpu_time` by work, `pc_samples` by the instructions sampled). A
sampled line no node's context wrote (index arithmetic, loop headers), or whose nodes have no
trace, keeps the work shares.
"""

from __future__ import annotations

from typing import Any

from dlpt.compiled.provenance import KernelProvenance

# For each target path of a unit, in order: the (kernel, trace index) pairs that made it.
Contributions = list[list[tuple[KernelProvenance, int]]]


def fx_lines_of(meta: Any) -> dict[str, dict[int, list[str]]]:
    """{kernel file: {line: FX node names}} from a recording's `pc_sampling` meta."""
    pcs = getattr(meta, "pc_sampling", None) or {}
    raw = pcs.get("fx_lines") if isinstance(pcs, dict) else None
    out: dict[str, dict[int, list[str]]] = {}
    for file, lines in (raw or {}).items():
        if isinstance(lines, dict):
            out[str(file)] = {int(k): [str(n) for n in v] for k, v in lines.items() if isinstance(v, list)}
    return out


def line_weights(contrib: Contributions, names: list[str]) -> list[int] | None:
    """Integer weights over a unit's paths for a sample on a line that nodes `names` wrote: each
    path counts the traces of those nodes it was made from. None where no path has one (the
    line then keeps the unit's work shares)."""
    ws = [sum(1 for kp, t in pairs if t in kp.traces_of(names)) for pairs in contrib]
    return ws if sum(ws) else None
