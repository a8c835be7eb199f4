"""Compiled kernels on the model lines they were generated from: a pure tree transformation.

A recording puts every kernel of torch.compile'd code under the compiled call's line (under
the generated module's `call()` frame, or the `Torch-Compiled Region` op around it).
`attribute_compiled(profile, provenance)` moves each such unit of work (the subtree of one
kernel call: an `extern_kernels.mm` op with its cuBLAS kernel, a Triton or C++ kernel) to

    compiled call's context → model frames of the stack trace → [backward]? → [fused K] → unit

once per distinct stack trace the kernel was generated from, each copy carrying a share.

Shares: by work done. Inductor's compile records, for each kernel, the post-grad FX nodes in it;
the recorder (collectors/record/inductor_hooks.py) weighs each node by the bytes it would read
and write as an op of its own (views, reshapes, expands, permutes, slices, selects: 0) and sums
them per source stack trace (`KernelProvenance.weights`). A fused kernel's time is split between
its lines in proportion to those weights; a line whose nodes are all views gets no share (and no
node). An extern kernel (mm, SDPA, a convolution, a library call) carries only the node it
implements (Inductor's `origin_node`), so it lands whole on that op's line, not on the views that
feed it. Where no weight exists (a torch without the hook, a node of unknown size, a kernel of
views only) the split is even, and the profile says so: `meta.compiled_provenance["shares"]`
lists, per `[fused K]` frame, the lines and weights used or the reason for the even split, which
the TUI's detail pane of that node shows. Every metric column of every moved node is split into
integers by the largest-remainder rule, so shares sum to the original to the nanosecond (counts
too: one launch shared by three lines counts 1, 0, 0, so totals stay the launches made); the
activity rows are split so that each moved leaf's rows still sum to its metrics. The same rule
serves forward, backward and CUDA-graph replays: they all find their kernel's provenance.
PC samples beneath a kernel, on its generated lines, follow those lines' own FX nodes instead
where the recording tagged them (`--pc-samples`; sample_lines.py).

Placement of the context: the stack trace's outermost frame is the compiled function itself
(a `forward`), which is on the recorded path (dynamo runs its frame); everything above its
innermost occurrence is the call's context. A backward kernel's traces are the forward lines
it differentiates; the recorder already places compiled backward under the forward call's
context (its sequence-number rule), so the same cut applies, with `[backward]` (the eager
recorder's marker) between the lines and `[fused K]`. Found through a region op (below), the
context is everything above that op.

Finding the kernel of a unit, most exact first:
1. A generated-code frame on the path: its (file, line) is a kernel's call line.
2. Inside a `Torch-Compiled Region: ID` op, or a `CompiledFunction` op, with no generated-code
   frame (ops with no Python frames beneath: a recorder reading frames only where no op is
   open, and backward ops, placed under the forward's `CompiledFunction` by sequence number):
   the compile id (the region's; for `CompiledFunction`, those of the forward modules whose
   code ran beside it) and `[backward]` name the module; the unit's
   kernel or op name names the kernel (`triton_poi_fused_add_0`, `graph_0_cpp_fused_sum_1`), or
   the aten op an extern kernel calls (`aten::mm` ← `extern_kernels.mm`; several such calls in
   one module share the op's time equally). A library kernel with no op open in a region (a
   CUDA-graph replay under `mode="reduce-overhead"`) goes where the same kernel went under an
   aten op in that region's runs before the capture.
3. A CUDA-graph replay (device leaves beneath Inductor's CUDA-graph runtime, itself beneath the
   generated module's `call`): that module's kernels of the leaf's name, or for a library kernel
   the extern calls that launched it before the capture (see `replay`).
Autotuning: the first run of a Triton kernel (and Inductor's `max-autotune` choices) benchmarks
candidate configs on the GPU, beneath Inductor's benchmarking frames. That is compile-time work,
run once, often more GPU time in a short run than the model itself: each such subtree goes to
the compiled call's context under `[torch.compile autotuning]`, never on the model lines (it
would swell them with work that no later step does).
Units without provenance keep their place; those with device time get an
`<unattributed: no provenance>` node naming the reason (allocations' memsets, unknown regions).
Eager code never passes through generated frames or region ops, with one exception: eager ops
run inside a region (code between the graphs of a frame a graph break split) look like the
region's own; an eager `aten::mm` there is shared between the module's extern mm lines. A
recorder that reads Python frames inside regions gives them their own lines (rule 1 then).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from dlpt.cct import CCT, renumber, sum_rows
from dlpt.compile_time import AUTOTUNING
from dlpt.compiled.machinery import CUDAGRAPH_RUNTIME, REGION_PREFIX, is_aten_op, is_autotuning, is_transparent
from dlpt.compiled.provenance import CompiledModule, KernelProvenance, Provenance, Trace, kernel_name
from dlpt.compiled.sample_lines import SampleLines
from dlpt.compiled.shares import keep_families, split_activities, split_int
from dlpt.frames import (
    ACTIVITY_KINDS,
    BACKWARD_FRAME,
    Frame,
    FrameTable,
    fused_frame,
    is_library,
    source_frame,
    unattributed_frame,
)
from dlpt.metrics import COL
from dlpt.profile import Profile
from dlpt.transforms import drop_subtrees, nearest_marked, propagate_down

NO_PROVENANCE = unattributed_frame("no provenance")
# A library kernel (cuBLAS) or an aten kernel replayed from a CUDA graph names no compiled kernel;
# only the runs before the capture show which extern call launched it. Without such a run (a
# `--steps` window after the capture) or where that call has no provenance (an aten fallback's RNG
# kernel in gpt-fast's decode graph, whose warm-up was recorded), it keeps its place. The reason
# said "whose capture was not recorded" for both, which read false on recordings made from the start.
NOT_LEARNED = unattributed_frame("no provenance: kernel in a CUDA-graph replay, no compiled call seen launching "
                                 "it before the capture")


def _context(anc: list[Frame], trace: Trace, backward: bool, region: int | None = None) -> int:
    """How many of the ancestors (outermost first) are the compiled call's context. `region`:
    the index of the `Torch-Compiled Region` op the unit was found under, if it was."""
    top = trace[0] if trace else None
    if top is not None:
        for i in range(len(anc) - 1, -1, -1):
            f = anc[i]
            if f.kind == "python" and f.file == top.file and f.function == top.function:
                return i
    if region is not None:
        return region
    if backward:
        for i in range(len(anc) - 1, -1, -1):
            if anc[i] == BACKWARD_FRAME:
                return i
    for i in range(len(anc) - 1, -1, -1):
        if anc[i].kind == "python" and not is_library(anc[i]):
            return i + 1
    return len(anc)


Targets = tuple[list[tuple[int, ...]], list[int]]
Region = tuple[tuple[str, ...], bool, int]  # (compile ids, under [backward], depth of the anchor op)


class _Attributor:
    def __init__(self, profile: Profile, provenance: Provenance) -> None:
        self.p = profile
        self.prov = provenance
        self.frames = FrameTable.keeping_ids(profile.frames)
        self.bwd = self.frames.intern(BACKWARD_FRAME)
        self.noprov = self.frames.intern(NO_PROVENANCE)
        self.not_learned = self.frames.intern(NOT_LEARNED)
        self.tuning = self.frames.intern(AUTOTUNING)
        self.tune_root = np.zeros(0, dtype=bool)  # outermost autotuning frames
        self.tuned = 0
        self._anc: dict[int, list[int]] = {}
        self._targets: dict[tuple, Targets] = {}
        # node -> (compile id, under [backward], depth of the region op) for nodes inside a region
        self._region: dict[int, Region | None] = {0: None}
        self._learned: dict[tuple[str, str], list[KernelProvenance]] | None = None
        self.without = 0  # units kept in place under the no-provenance reason
        self.replayed = np.zeros(0, dtype=bool)  # device leaves under CUDA-graph runtime frames
        # `[fused K]` frame name → kernel key → the weights its shares used (see the docstring)
        self.shares: dict[str, dict[str, dict]] = {}
        self.samples = SampleLines(profile.meta)  # PC samples by the generated line they hit

    def ancestors(self, node: int) -> list[int]:
        """Frame ids from the root's child down to `node`."""
        a = self._anc.get(node)
        if a is None:
            cct = self.p.cct
            a = self._anc[node] = [int(cct.frame[i]) for i in cct.path(node)]
        return a

    def region_of(self, node: int) -> Region | None:
        """The compiled region `node` lies in with only transparent frames between, if any: a
        `Torch-Compiled Region: ID` op, or a `CompiledFunction` op (where the recorder shows no
        region op: backward ops are placed under it by sequence number, with no frames), whose
        compile ids are those of the forward modules run beside it (under the same parent)."""
        if node in self._region:
            return self._region[node]
        cct = self.p.cct
        chain = []
        n = node
        while n not in self._region:
            chain.append(n)
            n = int(cct.parent[n])
        r = self._region[n]
        for n in reversed(chain):
            f = self.p.frames[int(cct.frame[n])]
            if f.kind == "op" and f.name.startswith(REGION_PREFIX):
                r = ((f.name[len(REGION_PREFIX):].strip(),), False, int(cct.depth[n]) - 1)
            elif f.kind == "op" and f.name == "CompiledFunction" and r is None:
                ids = self._forward_ids(int(cct.parent[n]))
                r = (ids, False, int(cct.depth[n]) - 1) if ids else None
            elif r is not None and is_transparent(f):
                r = (r[0], r[1] or f.kind == "backward", r[2])
            else:
                r = None
            self._region[n] = r
        return self._region[node]

    def _forward_ids(self, node: int) -> tuple[str, ...]:
        """Compile ids of the forward modules whose generated code ran in `node`'s subtree."""
        cct = self.p.cct
        files = {self.p.frames[f].file for f in set(cct.frame[node:int(cct.end[node])].tolist())}
        return tuple(sorted({cid for (cid, bwd), file in self.prov.regions.items() if not bwd and file in files}))

    def modules_of(self, reg: Region) -> list[CompiledModule]:
        out: list[CompiledModule] = []
        for cid in reg[0]:
            m = self.prov.region(cid, reg[1])
            if m is not None and m not in out:
                out.append(m)
        return out

    def targets(self, parent: int, module: str, kps: list[KernelProvenance], region: int | None = None) -> Targets:
        """New parent paths (frame ids) and integer weights for a unit found under node `parent`
        that is one of the kernels `kps` (equally likely), each shared equally by its traces."""
        key = (parent, module, tuple(k.key for k in kps), region)
        hit = self._targets.get(key)
        if hit is not None:
            return hit
        anc = self.ancestors(parent)
        anc_frames = [self.frames.frames[f] for f in anc]
        per = [self.weights_of(kp) for kp in kps]
        unit = math.lcm(*(sum(w) for w in per)) if kps else 1
        paths: dict[tuple[int, ...], int] = {}
        made: dict[tuple[int, ...], list[tuple[KernelProvenance, int, int]]] = {}
        for kp, ws in zip(kps, per):
            fused = self.frames.intern(fused_frame(kp.name))
            for t, (trace, w) in enumerate(zip(kp.traces, ws)):
                if w == 0:
                    continue  # views only: no share, no node
                cut = _context(anc_frames, trace, kp.backward, region)
                path = list(anc[:cut]) + [self.frames.intern(source_frame(*f)) for f in trace]
                if kp.backward:
                    path.append(self.bwd)
                path.append(fused)
                paths[tuple(path)] = paths.get(tuple(path), 0) + w * (unit // sum(ws))
                made.setdefault(tuple(path), []).append((kp, t, w * (unit // sum(ws))))
        hit = self._targets[key] = (list(paths), list(paths.values()))
        self.samples.note(hit[0], list(made.values()))
        return hit

    def weights_of(self, kp: KernelProvenance) -> list[int]:
        """Integer weights of kp's traces (reduced by their gcd), work-based where Inductor's
        compile gave any, else even; what was used is kept for the profile (`shares`)."""
        w = list(kp.weights) if kp.weights is not None and len(kp.weights) == len(kp.traces) else None
        if len(kp.traces) == 1:
            basis = "one source line"
            ws = [1]
        elif w is None:
            basis = "even: Inductor gave no per-node work for this kernel"
            ws = [1] * len(kp.traces)
        elif sum(w) == 0:
            basis = "even: no node of this kernel does work of its own (views only)"
            ws = [1] * len(kp.traces)
        else:
            basis = "work: bytes each line's nodes read and write on their own (views 0)"
            g = math.gcd(*w)
            ws = [x // g for x in w]
        name = fused_frame(kp.name).name
        entries = self.shares.setdefault(name, {})
        if kp.key not in entries:
            entries[kp.key] = {"kernel": kp.key, "basis": basis, "backward": kp.backward, "lines": [
                [t[-1].file, t[-1].line, int(x if w is not None and sum(w) > 0 else 1)]
                for t, x in zip(kp.traces, w or [1] * len(kp.traces)) if t]}
        return ws

    def learned(self) -> dict[tuple[str, str], list[KernelProvenance]]:
        """(module file, device kernel name) → the kernels of that module whose calls launched
        it in the runs before a CUDA-graph capture (cudagraph trees' warm-up runs the generated
        code eagerly): how a replayed cuBLAS kernel is recognised. The generated line above the
        launch names the call, whatever lies between (an aten op, or Python of a dispatch mode
        that cudagraph trees runs the warm-up under); inside a region with no generated frame,
        the aten op's name does."""
        if self._learned is None:
            learned: dict[tuple[str, str], list[KernelProvenance]] = {}
            cct = self.p.cct
            frames = self.p.frames
            kinds = np.array([f.kind in ACTIVITY_KINDS for f in frames], dtype=bool)
            for i in np.flatnonzero(kinds[cct.frame] & ~self.replayed).tolist():
                up = int(cct.parent[i])
                g = int(self.near_gen[up])
                pairs: list[tuple[CompiledModule, list[KernelProvenance]]] = []
                if g >= 0:
                    gen = frames[int(cct.frame[g])]
                    mod = self.prov.modules[gen.file]
                    kp = mod.at_line(gen.line)
                    pairs = [(mod, [kp])] if kp is not None else []
                else:
                    op = frames[int(cct.frame[up])]
                    reg = self.region_of(int(cct.parent[up])) if is_aten_op(op) else None
                    pairs = [(m, m.calling_op(op.name)) for m in self.modules_of(reg)] if reg is not None else []
                name = frames[int(cct.frame[i])].name
                for m, ks in pairs:
                    have = learned.setdefault((m.file, name), [])
                    have += [k for k in ks if k not in have]
            self._learned = learned
        return self._learned

    def autotuning(self, i: int) -> Targets:
        """Autotuning subtree `i` goes to the compiled call's context, under the autotuning node:
        the context the kernel it tunes (the generated-code line above it) would get, or where
        no such line is on the path, everything down to the innermost source line."""
        self.tuned += 1
        parent = int(self.p.cct.parent[i])
        anc = self.ancestors(parent)
        anc_frames = [self.frames.frames[f] for f in anc]
        g = int(self.near_gen[parent])
        gen = self.p.frames[int(self.p.cct.frame[g])] if g >= 0 else None
        kp = self.prov.modules[gen.file].at_line(gen.line) if gen is not None else None
        trace = kp.traces[0] if kp is not None and kp.traces else ()
        cut = _context(anc_frames, trace, kp.backward if kp is not None else False)
        return [tuple(anc[:cut]) + (self.tuning,)], [1]

    def _reason(self, parent: int, reason: int | None = None) -> Targets:
        self.without += 1
        return [tuple(self.ancestors(parent)) + (self.noprov if reason is None else reason,)], [1]

    def resolve(self, i: int, parent_frame: Frame, frame: Frame) -> Targets | None:
        """Where unit root `i` goes, or None when it is not a unit (stays in place)."""
        cct = self.p.cct
        parent = int(cct.parent[i])
        has_gpu = cct.inclusive[i, COL["gpu_time"]] > 0
        mod = self.prov.modules.get(parent_frame.file) if parent_frame.kind == "python" else None
        if mod is not None:
            if frame.kind == "python" and frame.file == mod.file:
                return None  # a nested function of the same generated module (graph partitions)
            kp = mod.at_line(parent_frame.line)
            if kp is None and frame.kind in ACTIVITY_KINDS:
                kp = mod.named(frame.name)
            if kp is not None and kp.traces:
                return self.targets(parent, mod.file, [kp])
            if kp is None and self.holds_replay(i):
                return None  # the module's CUDA-graph runtime: its replayed leaves are units of their own
            return self._reason(parent) if has_gpu else None
        reg = self.region_of(parent)
        if reg is not None:
            # No generated-code frame (a recording reads no Python frames while an op is open):
            # the region's compile id names the module, the kernel's or op's name the kernel.
            if is_transparent(frame) or frame.file in self.prov.modules or (
                    frame.kind == "op" and frame.name.startswith(REGION_PREFIX)):
                return None
            mods = self.modules_of(reg)
            kps: list[KernelProvenance] = []
            if frame.kind in ("op", *ACTIVITY_KINDS):
                named = [k for m in mods for k in [m.named(frame.name)] if k is not None]
                kps = named or [k for m in mods for k in m.calling_op(frame.name)]
                if not kps and frame.kind in ACTIVITY_KINDS:
                    # A library kernel (cuBLAS) with no op open: a CUDA-graph replay. The runs
                    # before the capture launched it under an aten op: those calls are the candidates.
                    kps = [k for m in mods for k in self.learned().get((m.file, frame.name), [])]
            kps = [k for k in kps if k.traces]
            if kps:
                return self.targets(parent, "|".join(m.file for m in mods), kps, reg[2])
            return self._reason(parent) if has_gpu else None
        if frame.kind not in ACTIVITY_KINDS or not self.replayed[i]:
            return None
        return self.replay(i, parent, frame)

    def replay(self, i: int, parent: int, frame: Frame) -> Targets:
        """A device leaf of a CUDA-graph replay: no op and no generated line launched it. The
        generated module whose `call` runs the replay (else: the modules of its direction, by
        `[backward]` above it) names the candidates: its kernels of that name (several calls of
        one kernel share it equally), else, for a library kernel (cuBLAS), the extern calls that
        launched it in the runs before the capture."""
        g = int(self.near_gen[parent])
        if g >= 0:
            mods = [self.prov.modules[self.p.frames[int(self.p.cct.frame[g])].file]]
        else:
            backward = BACKWARD_FRAME in [self.frames.frames[f] for f in self.ancestors(parent)]
            mods = [m for m in self.prov.modules.values() if m.backward == backward]
        name = kernel_name(frame.name)
        kps = [k for m in mods for k in m.kernels.values() if k.name == name and k.traces]
        if not kps:
            kps = [k for m in mods for k in self.learned().get((m.file, frame.name), []) if k.traces]
        if kps:
            return self.targets(parent, "|".join(m.file for m in mods), kps)
        return self._reason(parent, self.not_learned)

    def _candidates(self) -> np.ndarray:
        """Nodes that may be units, in numpy: children of generated-code frames, nodes inside a
        region op, replayed device leaves (beneath Inductor's CUDA-graph runtime, nearer than any
        generated frame), and the outermost autotuning frames.
        The per-node rules then run on these only, not on the whole recording."""
        cct = self.p.cct
        frames = self.p.frames
        gen = np.fromiter((f.kind == "python" and f.file in self.prov.modules for f in frames), bool, len(frames))
        region = np.fromiter((f.kind == "op" and (f.name.startswith(REGION_PREFIX) or f.name == "CompiledFunction")
                              for f in frames), bool, len(frames))
        graph = np.fromiter((bool(CUDAGRAPH_RUNTIME.search(f.file)) for f in frames), bool, len(frames))
        leaf = np.fromiter((f.kind in ACTIVITY_KINDS for f in frames), bool, len(frames))
        par = np.maximum(cct.parent, 0)
        tune = np.fromiter((is_autotuning(f) for f in frames), bool, len(frames))[cct.frame]
        self.tune_root = tune & ~propagate_down(cct, tune)[par]
        self.tune_root[0] = False
        # A CUDA-graph replay launches from Inductor's runtime, which runs beneath the generated
        # module's `call` (`mode="reduce-overhead"`): a device leaf is replayed when the nearest
        # runtime frame above it is nearer than the nearest generated-code frame, and no aten op
        # launched it. The runtime's own eager work is an op's: cudagraph trees copying a call's
        # inputs into the graph's buffers (`aten::_foreach_copy_`) and `CUDAGraph.replay()` filling
        # the RNG's seed and offset (`aten::fill_`) stay where they ran, on the compiled call's line
        # (gpt-fast `--compile` on an H100: 4.2 ms of its 561 ms of GPU time outside compiling had
        # read as replayed library kernels whose capture was not recorded; the capture was).
        self.near_gen = nearest_marked(cct, gen[cct.frame])
        near_graph = nearest_marked(cct, graph[cct.frame])
        g, r = self.near_gen[par], near_graph[par]
        depth = cct.depth
        aten = np.fromiter(map(is_aten_op, frames), bool, len(frames))
        under_runtime = leaf[cct.frame] & (r >= 0) & ((g < 0) | (depth[np.maximum(r, 0)] > depth[np.maximum(g, 0)]))
        under_runtime[0] = False
        self.replayed = under_runtime & ~aten[cct.frame[par]]
        # A runtime subtree with device work of either kind stays where it is (resolve).
        self._replays_upto = np.cumsum(under_runtime)
        cand = gen[cct.frame][par] | propagate_down(cct, region[cct.frame])[par] | self.replayed | self.tune_root
        cand[0] = False
        return cand

    def holds_replay(self, i: int) -> bool:
        """Whether node i's subtree holds replayed device leaves."""
        c = self._replays_upto
        return bool(c[int(self.p.cct.end[i]) - 1] - (c[i - 1] if i else 0) > 0)

    def run(self) -> Profile:
        """The old tree keeps its node ids; units are copied under their new paths (appended),
        and the whole is renumbered in preorder once: Python work only for the units' nodes."""
        p = self.p
        cct = p.cct
        n = len(cct)
        frames = self.frames.frames
        parent = cct.parent.tolist()
        frame_ids = cct.frame.tolist()
        new_parent, new_frame = list(parent), list(frame_ids)
        edges = dict(zip(zip(parent, frame_ids), range(n)))  # a trie: (parent, frame) is unique

        def child(q: int, f: int) -> int:
            c = edges.get((q, f))
            if c is None:
                c = edges[(q, f)] = len(new_parent)
                new_parent.append(q)
                new_frame.append(f)
            return c

        first = np.arange(n, dtype=np.int64)  # each old node's (first) place, before renumbering
        copies: dict[int, list[int]] = {}
        weights: dict[int, list[int]] = {}
        end = cct.end
        skip = 0
        cand = self._candidates()
        tune_root = self.tune_root
        units = 0
        for i in np.flatnonzero(cand).tolist():
            if i < skip and not tune_root[i]:
                continue  # inside a unit already moved (autotuning inside it moves on its own)
            if tune_root[i]:
                unit: Targets | None = self.autotuning(i)
            else:
                unit = self.resolve(i, frames[frame_ids[parent[i]]], frames[frame_ids[i]])
            if unit is None:
                continue
            units += 1
            paths, w = unit
            stop = int(end[i])
            skip = max(skip, stop)
            bases = []
            for pth in paths:
                q = 0
                for f in pth:
                    q = child(q, f)
                bases.append(q)
            placed: dict[int, list[int]] = {}
            j = i
            while j < stop:
                if j != i and tune_root[j]:
                    j = int(end[j])  # an autotuning subtree: placed when the loop reaches it
                    continue
                ups = bases if j == i else placed[parent[j]]
                placed[j] = [child(q, frame_ids[j]) for q in ups]
                weights[j] = (self.samples and j != i and self.samples.weights(paths, frames[frame_ids[j]])) or w
                first[j] = placed[j][0]
                if len(ups) > 1:
                    copies[j] = placed[j]
                j += 1
        bparent, bframe, new_of_old = renumber(np.asarray(new_parent, dtype=np.int64),
                                               np.asarray(new_frame, dtype=np.int64))
        shares: dict[int, np.ndarray] = {}
        idx = [first]
        rows = [cct.exclusive]
        if copies:
            multi = np.fromiter(copies, dtype=np.int64, count=len(copies))
            rows[0] = cct.exclusive.copy()
            rows[0][multi] = 0
            for i, ids in copies.items():
                s = shares[i] = keep_families(split_int(cct.exclusive[i], weights[i]), cct.exclusive[i], weights[i])
                idx.append(np.asarray(ids, dtype=np.int64))
                rows.append(s)
        exc = sum_rows(new_of_old[np.concatenate(idx)], np.concatenate(rows), len(bparent))
        acts = split_activities(p.activities, first, copies, shares, weights, new_of_old)
        out = replace(p, frames=frames, cct=CCT(bparent, bframe, exc), activities=acts)
        # The generated-code frames the units left are empty now: drop them (and only them), so
        # the compiled call's line does not keep a row of zeros per kernel call.
        nonzero = np.asarray(cct.inclusive.any(axis=1), dtype=bool)
        had = np.zeros(len(bparent), dtype=bool)
        had[new_of_old[first[nonzero]]] = True
        for i, ids in copies.items():
            if nonzero[i]:
                had[new_of_old[ids]] = True
        drop = had & ~out.cct.inclusive.any(axis=1)
        if weights:  # the moved units' old places
            drop[new_of_old[np.fromiter(weights, dtype=np.int64, count=len(weights))]] = True
        out = drop_subtrees(out, propagate_down(out.cct, drop))
        # What a reader needs to trust the tree: how much was placed by provenance, how much not.
        out.meta = replace(p.meta, compiled_provenance={
            "modules": len(self.prov.modules), "kernels": sum(len(m.kernels) for m in self.prov.modules.values()),
            "units_placed": units - self.without - self.tuned, "units_without_provenance": self.without,
            "autotuning_subtrees": self.tuned,
            "share": "by work: bytes each line's nodes read and write on their own (views 0); even where unknown",
            "shares": {name: list(e.values()) for name, e in self.shares.items()},
            **({"pc_sample_lines_split_by_line": self.samples.split} if self.samples else {})})
        return out


def attribute_compiled(profile: Profile, provenance: Provenance) -> Profile:
    """Each unit of compiled work with provenance under the model lines it was generated from
    (see the module's docstring). Pure: the input is not changed; without provenance, or with
    no compiled code in the profile, the profile itself is returned. Totals of every metric and
    of the activity rows' durations, bytes and counts are unchanged."""
    if not provenance or len(profile.cct) < 2:
        return profile
    gen_files = set(provenance.modules)
    if not any((f.kind == "python" and f.file in gen_files) or CUDAGRAPH_RUNTIME.search(f.file)
               or (f.kind == "op" and (f.name.startswith(REGION_PREFIX) or f.name == "CompiledFunction"))
               for f in profile.frames):
        return profile
    return _Attributor(profile, provenance).run()
