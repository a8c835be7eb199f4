"""Which model lines each kernel of torch.compile'd code was generated from, as plain data.

The recorder (collectors/record/provenance.py) fills these records while the program compiles:
one `CompiledModule` per generated wrapper module (one compiled graph), keyed by its generated
file, holding for each kernel called in it the stack traces of the post-grad FX nodes fused into
it (`KernelProvenance`), and which line of the generated code calls which kernel. `Provenance`
holds every module, and which module each of Dynamo's compile ids produced. The model's
transformation (fused.py) reads them; nothing here knows torch or Inductor.

Kernel names are unique within one generated module only (every module has its
`triton_poi_fused_add_0`), and so are handles, so everything is keyed by generated file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# A C++ kernel under `cpp.enable_kernel_profile` is recorded as `graph_N_cpp_fused_...`.
_GRAPH_PREFIX = re.compile(r"^graph_\d+_")


class SourceFrame(NamedTuple):
    """One frame of a stack trace: the model line an FX node was traced from."""

    file: str
    line: int
    function: str


Trace = tuple[SourceFrame, ...]  # outermost frame first, as Python prints tracebacks


@dataclass(frozen=True)
class KernelProvenance:
    key: str  # NAME:HANDLE, unique within its generated module
    name: str  # the kernel's name in the generated code (`triton_poi_fused_add_0`, `extern_kernels.mm`)
    traces: tuple[Trace, ...]  # one per distinct source stack trace of the nodes fused into it
    backward: bool = False
    # The work of each trace's nodes (bytes they read and write on their own; views 0), in the
    # order of `traces`; None where Inductor's compile gave none (then shares are even).
    weights: tuple[int, ...] | None = None
    # (post-grad FX node name, index of its trace in `traces`) for each node of the kernel, where
    # the recording tagged the kernel's lines with the nodes that wrote them (`--pc-samples`).
    fx: tuple[tuple[str, int], ...] = ()
    source: str = ""  # a Triton kernel's own source file (where its PC samples' lines are), if known

    def traces_of(self, names: list[str]) -> set[int]:
        """The indices of the traces of FX nodes `names` (a generated line's writers)."""
        want = set(names)
        return {t for n, t in self.fx if n in want}

    def lines(self) -> list[SourceFrame]:
        """The innermost frame of each trace: the lines the kernel was generated from."""
        return [t[-1] for t in self.traces if t]


@dataclass
class CompiledModule:
    """One generated wrapper module (one compiled graph: a forward, a backward or an inference)."""

    file: str
    backward: bool
    kernels: dict[str, KernelProvenance] = field(default_factory=dict)  # by key
    lines: dict[int, str] = field(default_factory=dict)  # generated-code line -> key called there

    def at_line(self, line: int) -> KernelProvenance | None:
        key = self.lines.get(line)
        return self.kernels.get(key) if key is not None else None

    def named(self, name: str) -> KernelProvenance | None:
        """The kernel of this module with that name, if exactly one has it."""
        name = kernel_name(name)
        found = [k for k in self.kernels.values() if k.name == name]
        return found[0] if len(found) == 1 else None

    def calling_op(self, op: str) -> list[KernelProvenance]:
        """The extern and fallback kernels of this module that call aten op `op` (`aten::mm` ←
        `extern_kernels.mm`, `aten::_scaled_dot_product_flash_attention` ←
        `torch.ops.aten._scaled_dot_product_flash_attention.default`)."""
        if not op.startswith("aten::"):
            return []
        want = op[len("aten::"):]
        return [k for k in self.kernels.values() if _extern_op(k.name) == want]


def kernel_name(recorded: str) -> str:
    """The generated code's name of a kernel as a recording names it (`graph_N_` prefixes of
    profiled C++ kernels dropped; Triton's device kernels carry their generated name)."""
    return _GRAPH_PREFIX.sub("", recorded)


def _extern_op(name: str) -> str:
    for prefix in ("extern_kernels.", "torch.ops.aten.", "aten."):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            return rest.split(".", 1)[0]
    return ""


class Provenance:
    """The provenance of every graph compiled during a recording: `modules` maps each generated
    file to its `CompiledModule`; `regions` maps (Dynamo compile id such as "0/0", backward) to
    the generated file that compile produced. A recording opens a `Torch-Compiled Region: ID` op
    around each run of a compiled frame, and the backward graph is compiled in its forward's
    compile context, so it carries the same id: where a path holds no generated-code frame, that
    op names the module. Empty (false) when nothing was compiled."""

    def __init__(self) -> None:
        self.modules: dict[str, CompiledModule] = {}
        self.regions: dict[tuple[str, bool], str] = {}

    def __bool__(self) -> bool:
        return bool(self.modules)

    def snapshot(self) -> Provenance:
        """A copy whose dicts later compiles do not change (the recorder's copy takes its lock)."""
        out = Provenance()
        out.modules = dict(self.modules)
        out.regions = dict(self.regions)
        return out

    def region(self, compile_id: str, backward: bool) -> CompiledModule | None:
        """The module Dynamo's compile `compile_id` produced for that direction."""
        file = self.regions.get((compile_id, backward))
        return self.modules.get(file) if file is not None else None

    def at(self, file: str, line: int) -> KernelProvenance | None:
        mod = self.modules.get(file)
        return mod.at_line(line) if mod is not None else None

    def by_name(self, name: str) -> list[KernelProvenance]:
        """Every kernel, over all modules, that carries this name (the device kernel's name for
        Triton kernels; `graph_N_` prefixes of profiled C++ kernels are ignored)."""
        name = kernel_name(name)
        return [k for m in self.modules.values() for k in m.kernels.values() if k.name == name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form, so a profile can carry what it was attributed with."""
        return {"modules": [
            {"file": m.file, "backward": m.backward, "lines": {str(k): v for k, v in m.lines.items()},
             "kernels": {k: [[list(f) for f in t] for t in p.traces] for k, p in m.kernels.items()},
             "weights": {k: list(p.weights) for k, p in m.kernels.items() if p.weights is not None},
             "fx": {k: [list(x) for x in p.fx] for k, p in m.kernels.items() if p.fx},
             "sources": {k: p.source for k, p in m.kernels.items() if p.source}}
            for m in self.modules.values()],
            "regions": [[cid, bwd, file] for (cid, bwd), file in self.regions.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        """`to_dict`'s form read back (the recorded profile's `provenance` meta)."""
        out = cls()
        for m in data.get("modules", []):
            mod = CompiledModule(file=m["file"], backward=bool(m["backward"]),
                                 lines={int(k): v for k, v in m["lines"].items()})
            weights = m.get("weights", {})
            fx = m.get("fx", {})
            sources = m.get("sources", {})
            for key, traces in m["kernels"].items():
                tr = tuple(tuple(SourceFrame(str(f[0]), int(f[1]), str(f[2])) for f in t) for t in traces)
                w = weights.get(key)
                nodes = tuple((str(n), int(t)) for n, t in fx.get(key, []) if 0 <= int(t) < len(tr))
                mod.kernels[key] = KernelProvenance(key, key.rsplit(":", 1)[0], tr, mod.backward,
                                                    tuple(int(x) for x in w) if w is not None and len(w) == len(tr) else None,
                                                    nodes, str(sources.get(key, "")))
            out.modules[mod.file] = mod
        for cid, bwd, file in data.get("regions", []):
            out.regions[(str(cid), bool(bwd))] = str(file)
        return out
