"""Which model lines each kernel of torch.compile'd code was generated from: collected from
Inductor while the program compiles, and read from its generated code into the model's plain
records (`dlpt.compiled.provenance`), which the model's transformation (`dlpt.compiled.fused`)
reads. Only this side knows torch and Inductor.

Where the provenance comes from (torch 2.11 and 2.13 alike)
-----------------------------------------------------------
Inductor's own provenance tracking, at its *basic* level: `torch._inductor.config.trace.
provenance_tracking_level = 2`. At any level above 0, every kernel Inductor generates (Triton,
C++, templates and `extern_kernels.*` calls into aten such as cuBLAS matmuls) goes through
`torch._inductor.debug.set_kernel_post_grad_provenance_tracing`, which

* names the kernel `NAME:HANDLE` (the handle is a counter, unique within one compilation),
* records the `stack_trace` of every post-grad FX node fused into it, under that name
  (`_inductor_kernel_stack_traces`), and
* writes `# [Provenance debug handles] NAME:HANDLE` into the generated wrapper code on the
  line before the kernel's call in `call()`.

Inductor stores the name → stack traces map, as JSON, on the compiled graph itself
(`CompiledFxGraph.inductor_provenance_stack_traces_str`), on a cache miss and on an FX-graph
cache hit alike (the cache entry carries it, and turning provenance on changes the cache key,
so a cached entry made without it is never served). We read it, with the generated source
(`source_code`) and the graph's `is_backward`, in `CompiledFxGraph.post_compile`, which runs
exactly once for every compiled graph whether or not it came from the cache, before the graph
first runs. The comments give, for every line of the generated file, the kernel called there:
the profile's generated-code frame (file, line) then names the kernel exactly, even for
extern kernels whose device kernels (cuBLAS, cuDNN) carry no Inductor name.

Why this source and not the others:
* Level 1 ("normal") also maps post-grad to pre-grad nodes, turning on
  `preserve_node_meta(True)` and node tracking through every graph pass: more compile time,
  and it adds nothing here, because post-grad nodes of both graphs carry `stack_trace`
  (AOTAutograd copies the forward node's stack trace onto the backward nodes it traces from
  it, so a backward kernel's traces are the forward lines it differentiates). Level 2 only
  fills the map and writes the comments: no pass, no computed value changes.
* The structured-trace artifact `inductor_provenance_tracking_kernel_stack_traces` (tlparse)
  holds the same JSON but only reaches a `TORCH_TRACE` log handler, and does not say which
  generated file a kernel lives in.
* `# Topologically Sorted Source Nodes` / `# Original ATen` comments name FX nodes and aten
  ops, not lines; `# Source Nodes` heads kernel definitions, not calls.
* Walking `node.meta["stack_trace"]` from a post-grad pass hook needs the kernel → node
  grouping that only the scheduler knows: the provenance map is that grouping.

Each module is also keyed by Dynamo's compile id (`CompileContext.current_compile_id()` in
`post_compile`; the backward graph is compiled in its forward's saved compile context), which
is the `Torch-Compiled Region: ID` op a recording shows around the compiled frame's run: where
the path holds no generated-code frame, that op names the module.

Kernel names are unique within one generated module only, and so are handles, so everything is
keyed by generated file (dlpt/compiled/provenance.py). A CUDA-graph replay
(`mode="reduce-overhead"`) has no generated line for its kernels, but runs beneath the generated
module's `call`: that module and the kernel's name find them.

The hooks `ProvenanceRecorder.start()` installs in Inductor (an import hook, a cache-key mark,
the mix-order reduction kernels' provenance) are in inductor_hooks.py, each with why it is
needed.

Nothing here changes what the program computes: level 2 adds comments to generated code and
a dict to the compile; the mark pass does nothing; the wrapper around `post_compile` only
reads.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from typing import Any

from dlpt.collectors.record.fx_lines import tag_kernel_lines
from dlpt.collectors.record.inductor_hooks import (
    FX_KEY,
    OUTPUT_CODE,
    TRITON_CODEGEN,
    WEIGHTS_KEY,
    AfterImport,
    handle_mix_order_kernels,
    marked_pass,
    module_file,
    record_work_weights,
)
from dlpt.collectors.record.inductor_hooks import marks as cache_marks
from dlpt.compiled.provenance import CompiledModule, KernelProvenance, Provenance, SourceFrame, Trace

HANDLE_COMMENT = "[Provenance debug handles] "
_TRACE_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')


def parse_trace(text: str, cwd: str = "") -> Trace:
    """`  File "m.py", line 12, in forward\\n    y = f(x)\\n` → frames, outermost first. A relative
    file (a script run as `python m.py`) is made absolute against `cwd`, as the recorder does."""
    out = []
    for ln in text.splitlines():
        m = _TRACE_LINE.match(ln)
        if m:
            file = m.group("file")
            if cwd and file and not file.startswith("<") and not os.path.isabs(file):
                file = os.path.normpath(os.path.join(cwd, file))
            out.append(SourceFrame(file, int(m.group("line")), m.group("func")))
    return tuple(out)


def _statement_end(src: list[str], i: int) -> int:
    """The last line (index) of the statement starting at index i: brackets balance there."""
    depth = 0
    for j in range(i, len(src)):
        s = src[j].split("#", 1)[0]
        depth += sum(s.count(c) for c in "([{") - sum(s.count(c) for c in ")]}")
        if depth <= 0:
            return j
    return len(src) - 1


def _calls(statement: str, name: str) -> bool:
    """Whether a statement calls kernel `name` (`triton_x_0.run(`, `extern_kernels.mm(`, `k(`)."""
    at = statement.find(name)
    while at >= 0:
        before = statement[at - 1] if at else " "
        after = statement[at + len(name):at + len(name) + 5]
        if not (before.isalnum() or before in "_.") and (after.startswith("(") or after.startswith(".run(")):
            return True
        at = statement.find(name, at + 1)
    return False


def call_lines(source: str) -> dict[int, str]:
    """Every 1-based line of a generated module that calls a kernel → that kernel's NAME:HANDLE.

    The comment precedes the call, but not always directly: Triton calls come after
    `stream0 = get_raw_stream(0)` (and C++ wrapper code may declare things between). So the
    call is the first statement up to the next handle comment that calls the kernel by its
    name; failing that (a name the code spells differently), the first statement after the
    comment. A call spanning several lines maps each of them."""
    src = source.splitlines()
    marks: list[tuple[int, str]] = []
    for i, ln in enumerate(src):
        s = ln.strip()
        k = s.find(HANDLE_COMMENT)
        if s.startswith(("#", "//")) and k >= 0:  # `//` in C++ wrapper code (cpp_wrapper)
            marks.append((i, s[k + len(HANDLE_COMMENT):].strip()))
    out: dict[int, str] = {}
    for m, (i, key) in enumerate(marks):
        stop = marks[m + 1][0] if m + 1 < len(marks) else len(src)
        name = key.rsplit(":", 1)[0]
        first: tuple[int, int] | None = None
        j = i + 1
        while j < stop:
            s = src[j].strip()
            if not s or s.startswith(("#", "//")):
                j += 1
                continue
            end = _statement_end(src, j)
            if first is None:
                first = (j, end)
            if _calls(" ".join(x.strip() for x in src[j:end + 1]), name):
                first = (j, end)
                break
            j = end + 1
        if first is not None:
            last = first[1]
            # A mix-order reduction kernel ends in "an extra round of reduction" over its
            # workspace (`buf8 = workspace_0[...].view(...).sum(dim=0)`): the kernel's work too.
            j = last + 1
            while j < stop and _EXTRA_ROUND.match(src[j]):
                last = _statement_end(src, j)
                j = last + 1
            for k in range(first[0], last + 1):
                out[k + 1] = key
    return out


_EXTRA_ROUND = re.compile(r"^\s*\w+ = workspace_\d+\[")
_KERNEL_PATH = re.compile(r"^\s*# kernel path: (?P<path>\S+)\s*$")
_KERNEL_DEF = re.compile(r"^(?P<name>\w+) = async_compile\.triton\(")


def kernel_paths(source: str) -> dict[str, str]:
    """Each Triton kernel's name → its source file, from the `# kernel path:` comment Inductor
    writes above the kernel's `NAME = async_compile.triton(...)` definition: the file its cubin's
    line table (and so a PC sample) names."""
    out: dict[str, str] = {}
    path = None
    for ln in source.splitlines():
        m = _KERNEL_PATH.match(ln)
        if m:
            path = m.group("path")
            continue
        d = _KERNEL_DEF.match(ln)
        if d and path is not None:
            out[d.group("name")] = path
            path = None
    return out


def compiled_module(file: str, source: str, traces_json: str | None, backward: bool,
                    cwd: str = "") -> CompiledModule:
    """The provenance of one generated module from its source and Inductor's JSON map."""
    mod = CompiledModule(file=file, backward=backward, lines=call_lines(source))
    try:
        raw = json.loads(traces_json) if traces_json else {}
    except ValueError:
        raw = {}
    work = _work(raw.get(WEIGHTS_KEY), cwd)
    fx = _fx(raw.get(FX_KEY), cwd)
    paths = kernel_paths(source) if fx else {}
    for key in dict.fromkeys(mod.lines.values()):  # in the module's order
        name = key.rsplit(":", 1)[0]
        traces: list[Trace] = []
        for t in raw.get(key, []):
            p = parse_trace(t, cwd)
            if p and p not in traces:
                traces.append(p)
        w = work.get(key)
        # A trace Inductor lists but no weighed node carries (an extern kernel's view inputs) did no work.
        weights = tuple(w.get(t, 0) for t in traces) if w is not None else None
        # Each FX node of the kernel → the index of its trace (fx_lines.py: which node wrote a line).
        node_trace = tuple((n, traces.index(t)) for n, t in fx.get(key, {}).items() if t in traces)
        mod.kernels[key] = KernelProvenance(key, name, tuple(traces), backward, weights, node_trace,
                                            paths.get(name, ""))
    return mod


def _entry(entry: Any) -> dict[str, Any]:
    """One of dlpt's entries in Inductor's kernel → stack traces map (a one-item list holding
    JSON of an object), read back; {} where it is missing or damaged."""
    try:
        raw = json.loads(entry[0]) if entry else {}
    except (ValueError, TypeError, IndexError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _fx(entry: Any, cwd: str) -> dict[str, dict[str, Trace]]:
    """Kernel key → FX node name → parsed trace, from the entry `record_work_weights` added
    while kernel lines were tagged (`--pc-samples`)."""
    out: dict[str, dict[str, Trace]] = {}
    for key, per in _entry(entry).items():
        if isinstance(per, dict):
            parsed = {str(n): parse_trace(str(t), cwd) for n, t in per.items()}
            out[key] = {n: t for n, t in parsed.items() if t}
    return out


def _work(entry: Any, cwd: str) -> dict[str, dict[Trace, int]]:
    """Kernel key → parsed trace → work, from the entry `record_work_weights` added."""
    out: dict[str, dict[Trace, int]] = {}
    for key, pairs in _entry(entry).items():
        per: dict[Trace, int] = {}
        for text, w in pairs:
            t = parse_trace(str(text), cwd)
            if t:
                per[t] = per.get(t, 0) + max(int(w), 0)
        out[key] = per
    return out


class ProvenanceRecorder(Provenance):
    """Collects the provenance of every graph Inductor compiles while started. It is the model's
    `Provenance` (`modules`, `regions`), filled in as graphs compile.

    `start()` before the program runs, `stop()` after it; `snapshot()` hands the records on as
    plain data. Safe to start when torch.compile is never used: nothing is compiled, nothing is
    collected."""

    def __init__(self, cwd: str | None = None, cpu_kernels: bool = False, fx_lines: bool = False) -> None:
        super().__init__()
        # Tag each generated Triton kernel line with the FX nodes that wrote it (fx_lines.py):
        # for PC samples (`--pc-samples`), which then split by the lines they sampled.
        self.fx_lines = fx_lines
        self._untag: Any = None
        self._saved_mark = False
        # Inductor's C++ kernels are plain calls from the generated code: a recording sees them
        # only with `cpp.enable_kernel_profile`, which runs each inside a RECORD_FUNCTION named
        # `graph_N_<kernel>` (same results; the compile-cache key changes). Worth it where host
        # time is the metric (no GPU); Triton and extern kernels need nothing.
        self.cpu_kernels = cpu_kernels
        self._saved_pass: Any = None
        self._waiting: AfterImport | None = None
        self._lock = threading.Lock()
        self.errors: list[str] = []  # graphs whose provenance could not be read (their kernels stay put)
        self._saved_cpu: bool | None = None
        # Relative files in stack traces resolve against the recording's working directory.
        self.cwd = cwd
        self._saved_level: int | None = None
        self._original: Any = None
        self._owner: Any = None
        self._unpatch: Any = None
        self._unweigh: Any = None
        self._waiting_codegen: AfterImport | None = None

    # -- collecting ----------------------------------------------------------------------------

    def start(self) -> None:
        """Turn Inductor's basic provenance tracking on and watch compiled graphs appear. Call it
        before the program compiles anything (a graph compiled earlier has no provenance).

        Importing Inductor costs a second or more, which a program that never compiles should
        not pay: until the program imports it (torch.compile does, before compiling anything),
        only an import hook waits for `torch._inductor.output_code`."""
        if self._original is not None or self._waiting is not None:
            return
        if self.cwd is None:
            self.cwd = os.getcwd()
        if OUTPUT_CODE in sys.modules:
            self._install()
        else:
            self._waiting = AfterImport(OUTPUT_CODE, self._install)
            sys.meta_path.insert(0, self._waiting)

    def _install(self) -> None:
        self._waiting_done()
        if self._original is not None:
            return
        import torch._inductor.config as inductor_config
        from torch._inductor.output_code import CompiledFxGraph

        self._saved_level = inductor_config.trace.provenance_tracking_level
        if self._saved_level == 0:
            # Level 1 (the user's TORCH_COMPILE_DEBUG=1) also fills the map: leave it as it is.
            inductor_config.trace.provenance_tracking_level = 2
        if self.cpu_kernels:
            self._saved_cpu = inductor_config.cpp.enable_kernel_profile
            inductor_config.cpp.enable_kernel_profile = True
        self._saved_pass = inductor_config.post_grad_custom_post_pass
        # Another recording's tagging (dlpt.profile inside dlpt record) stays marked until it stops.
        self._saved_mark = cache_marks["fx_lines"]
        cache_marks["fx_lines"] = self._saved_mark or self.fx_lines
        marked = marked_pass(self._saved_pass, self._weigh)
        if marked is not None:
            inductor_config.post_grad_custom_post_pass = marked
        original = CompiledFxGraph.post_compile
        collector = self

        def post_compile(graph: Any, example_inputs: Any, constants: Any, graph_kwargs: Any) -> Any:
            try:
                collector._collect(graph, graph_kwargs)
            except Exception as e:  # noqa: BLE001 - provenance is an extra; never break the program's compile
                collector.errors.append(f"{type(e).__name__}: {e}")
            return original(graph, example_inputs, constants, graph_kwargs)

        setattr(post_compile, "__wrapped__", original)  # noqa: B010 - functools' marker of a wrapper
        self._original, self._owner = original, CompiledFxGraph
        # setattr: replacing Inductor's method is the hook itself (undone on stop); a plain
        # assignment would read to a type checker as a mistake.
        setattr(CompiledFxGraph, "post_compile", post_compile)  # noqa: B010
        self._weigh()
        if TRITON_CODEGEN in sys.modules:
            self._patch_codegen()
        else:
            # Importing it here, inside output_code's own first import, is a circular import;
            # a program on a CPU never imports it at all.
            self._waiting_codegen = AfterImport(TRITON_CODEGEN, self._patch_codegen)
            sys.meta_path.insert(0, self._waiting_codegen)

    def _weigh(self) -> None:
        """Install the work weights' hook once Inductor's debug module is whole: on the import
        hook's path it is still being imported when `_install` runs, so the post-grad mark pass
        (which runs in every compile, before its code is generated) tries again."""
        if self._unweigh is None and self._original is not None:
            self._unweigh = record_work_weights()

    def _patch_codegen(self) -> None:
        self._codegen_done()
        if self._original is not None and self._unpatch is None:
            self._unpatch = handle_mix_order_kernels()
        if self._original is not None and self.fx_lines and self._untag is None:
            self._untag = tag_kernel_lines()

    def _codegen_done(self) -> None:
        if self._waiting_codegen is not None:
            if self._waiting_codegen in sys.meta_path:
                sys.meta_path.remove(self._waiting_codegen)
            self._waiting_codegen = None

    def _waiting_done(self) -> None:
        if self._waiting is not None:
            if self._waiting in sys.meta_path:
                sys.meta_path.remove(self._waiting)
            self._waiting = None

    def stop(self) -> None:
        """Restore Inductor's config and `post_compile`; what was collected stays."""
        self._waiting_done()
        if self._original is None:
            return
        import torch._inductor.config as inductor_config

        self._owner.post_compile = self._original
        self._original = self._owner = None
        self._codegen_done()
        if self._unweigh is not None:
            self._unweigh()
            self._unweigh = None
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        if self._untag is not None:
            self._untag()
            self._untag = None
        cache_marks["fx_lines"] = self._saved_mark
        inductor_config.post_grad_custom_post_pass = self._saved_pass
        self._saved_pass = None
        if self._saved_level is not None:
            inductor_config.trace.provenance_tracking_level = self._saved_level
            self._saved_level = None
        if self._saved_cpu is not None:
            inductor_config.cpp.enable_kernel_profile = self._saved_cpu
            self._saved_cpu = None

    def __enter__(self) -> ProvenanceRecorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _collect(self, graph: Any, graph_kwargs: Any) -> None:
        source = getattr(graph, "source_code", None)
        if not source:
            return  # AOTInductor and other outputs without a Python wrapper
        file = module_file(graph)
        if not file:
            return
        backward = bool(graph_kwargs.get("is_backward")) if hasattr(graph_kwargs, "get") else False
        mod = compiled_module(file, source, graph.inductor_provenance_stack_traces_str, backward, self.cwd or "")
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        with self._lock:
            self.modules[file] = mod
            if cid is not None:
                # Two compiles may generate the same file (same code, same hash): key regions apart.
                self.regions[(str(cid), backward)] = file

    def snapshot(self) -> Provenance:
        """The records as plain data, to read while the program may still be compiling (a
        profile snapshot's thread) or to hand to the model's transformation."""
        with self._lock:
            return super().snapshot()
