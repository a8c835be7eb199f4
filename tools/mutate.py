"""Mutation testing of dlpt's model: small bugs planted one at a time in a module's functions,
each run against the fast tests that cover it; a mutant the tests still pass is a survivor.
CI does not run it (minutes per module); docs/MUTATION.md holds the last figures and why each
survivor is harmless.

    python tools/mutate.py --list                  # the modules and the test files of each
    python tools/mutate.py MODULE [MODULE...]      # mutate, test, print the kill rate and survivors
        [--json FILE] [--only FUNCTION] [--jobs 1]

Run it from a checkout with dlpt importable from that checkout (the editable install, or
PYTHONPATH set to a tree that maps collectors/ and viewers/ into dlpt as setuptools does).

Why a mutator of our own rather than mutmut or cosmic-ray: mutmut 3 copies the tree into
mutants/ and imports the package from there, which the package-dir mapping (collectors/ ->
dlpt.collectors, viewers/ -> dlpt.viewers) does not survive; mutmut 2 and cosmic-ray write each
mutant into the source file and start a fresh interpreter per mutant (2-3 s of imports before a
test runs, on a 2-core machine), and a stopped run can leave a mutant in a file that is then
committed. Here no file is ever written: the parent imports dlpt once; each mutant is compiled
from the module's mutated syntax tree, and a forked child swaps the mutated function's code
object into the live function (`__code__`, so every reference to it, rule tables and `from`
imports included, runs the mutant) and runs pytest in-process. A baseline run traces which test
runs which line of the module, so each mutant runs only the tests that reach it, in order, with
-x; a mutant no test reaches is a survivor without running anything.

What this cannot see: code a test runs in a subprocess (that process imports the unmutated
module), and code run only at import (module constants). The test files listed per module are
in-process ones.

The operators: `and`/`or` swapped; comparisons flipped (< <=, > >=, == !=, in / not in, is /
is not); arithmetic and bitwise operators swapped (+ -, * /, // *, & |); augmented assignments
likewise (+= -=, |= &=); `not x` -> `x` and `-x` -> `x`; an int constant n -> n + 1, a float
x -> 2x (0.0 -> 1.0); `return X` -> `return None`; a call statement, an augmented assignment or
an assignment into a subscript or attribute dropped; `break` <-> `continue`; min <-> max,
any <-> all. Docstrings, annotations, f-strings and default values are left alone.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import json
import os
import signal
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Module -> (its file under the repository, its dotted name, the fast in-process test files
# that cover it). A file here runs in seconds under `-n 0`; files that record programs or run
# subprocesses (test_cli, test_record, test_torchrun, ...) are left out.
KINETO_TESTS = ["tests/test_kineto_link.py", "tests/test_kineto_cpu_backward.py", "tests/test_engine.py", "tests/test_oracles.py", "tests/test_kineto_idle.py",
                "tests/test_kineto_kinds.py", "tests/test_kineto_paths.py", "tests/test_kineto_slices.py",
                "tests/test_kineto_memory.py", "tests/test_findings.py"]
MODULES: dict[str, tuple[str, str, list[str]]] = {
    "findings": ("dlpt/findings.py", "dlpt.findings",
                 ["tests/test_rule_thresholds.py", "tests/test_sync_kind.py", "tests/test_compile_verdict.py",
                  "tests/test_dataloader_verdict.py", "tests/test_rank_span.py",
                  "tests/test_findings.py", "tests/test_kineto_idle.py",
                  "tests/test_real_verdicts.py", "tests/test_rank_inputs.py"]),
    "idle": ("dlpt/idle.py", "dlpt.idle",
             ["tests/test_idle.py", "tests/test_phase_blame.py", "tests/test_kineto_idle.py", "tests/test_findings.py",
              "tests/test_oracles.py",
              "tests/test_real_verdicts.py"]),
    "waits": ("dlpt/waits.py", "dlpt.waits",
              ["tests/test_waits.py", "tests/test_idle.py", "tests/test_findings.py",
               "tests/test_kineto_idle.py", "tests/test_real_verdicts.py"]),
    "memory": ("dlpt/memory.py", "dlpt.memory",
               ["tests/test_memory.py", "tests/test_kineto_memory.py", "tests/test_findings.py"]),
    "views": ("dlpt/views.py", "dlpt.views",
              ["tests/test_tables.py", "tests/test_flat_labels.py", "tests/test_oracles.py", "tests/test_engine.py",
               "tests/test_host_time.py", "tests/test_findings.py"]),
    "transforms": ("dlpt/transforms.py", "dlpt.transforms",
                   ["tests/test_engine.py", "tests/test_tables.py", "tests/test_oracles.py", "tests/test_host_time.py",
                    "tests/test_findings.py", "tests/test_kineto_paths.py"]),
    "merge": ("dlpt/merge.py", "dlpt.merge",
              ["tests/test_merge_numbers.py", "tests/test_ranks.py", "tests/test_real_ranks.py", "tests/test_rank_inputs.py",
               "tests/test_findings.py"]),
    "diff": ("dlpt/diff.py", "dlpt.diff", ["tests/test_diff_moves.py", "tests/test_diff.py", "tests/test_findings.py"]),
    "link": ("collectors/kineto/link.py", "dlpt.collectors.kineto.link", KINETO_TESTS),
    "walk": ("collectors/kineto/walk.py", "dlpt.collectors.kineto.walk", KINETO_TESTS),
    "paths": ("collectors/kineto/paths.py", "dlpt.collectors.kineto.paths", KINETO_TESTS),
}

# Libraries the tests import, loaded once in the parent so that each child starts warm.
WARM = ["numpy", "pandas", "msgspec", "networkx", "hypothesis", "dlpt", "dlpt.collectors.kineto", "dlpt.views",
        "dlpt.findings", "dlpt.merge", "dlpt.diff", "dlpt.viewers.hotspots"]


@dataclass
class Mutant:
    function: str  # qualified name of the top-level function or method it is in
    line: int
    col: int
    end_line: int
    op: str  # what changed, e.g. "and -> or"
    path: tuple  # where in the module's tree: indices from the root to the node replaced
    status: str = ""  # killed, survived, timeout, unreached, skipped
    seconds: float = 0.0
    tests: list[str] = field(default_factory=list)


# --- the mutations ---------------------------------------------------------------------------

CMP_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BIN_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
            ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
SYM = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
       ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
       ast.Div: "/", ast.FloorDiv: "//", ast.BitAnd: "&", ast.BitOr: "|", ast.And: "and", ast.Or: "or"}
NAME_SWAP = {"min": "max", "max": "min", "any": "all", "all": "any"}


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def node_mutations(node: ast.AST) -> Iterator[tuple[str, ast.AST | None]]:
    """(description, replacement) for each mutation of this node alone; None drops a statement."""
    if isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield f"{SYM[type(node.op)]} -> {SYM[type(other)]}", ast.BoolOp(other, node.values)
    elif isinstance(node, ast.Compare):
        for i, o in enumerate(node.ops):
            if type(o) in CMP_FLIP:
                ops = list(node.ops)
                ops[i] = CMP_FLIP[type(o)]()
                yield f"{SYM[type(o)]} -> {SYM[type(ops[i])]}", ast.Compare(node.left, ops, node.comparators)
    elif isinstance(node, ast.BinOp):
        if type(node.op) in BIN_SWAP and not (_is_str(node.left) or _is_str(node.right)):
            new = BIN_SWAP[type(node.op)]()
            yield f"{SYM[type(node.op)]} -> {SYM[type(new)]}", ast.BinOp(node.left, new, node.right)
    elif isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            yield "not x -> x", node.operand
        elif isinstance(node.op, ast.USub):
            yield "-x -> x", node.operand
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, int) and not isinstance(v, bool):
            yield f"{v} -> {v + 1}", ast.Constant(v + 1)
        elif isinstance(v, float):
            yield f"{v} -> {v * 2 or 1.0}", ast.Constant(v * 2 or 1.0)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NAME_SWAP:
        yield (f"{node.func.id} -> {NAME_SWAP[node.func.id]}",
               ast.Call(ast.Name(NAME_SWAP[node.func.id], ast.Load()), node.args, node.keywords))
    elif isinstance(node, ast.Return):
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            yield "return X -> return None", ast.Return(ast.Constant(None))
    elif isinstance(node, ast.AugAssign):
        swap = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr}
        if type(node.op) in swap:
            new = swap[type(node.op)]()
            yield f"{SYM[type(node.op)]}= -> {SYM[type(new)]}=", ast.AugAssign(node.target, new, node.value)
        yield "drop augmented assignment", None
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        yield "drop call", None
    elif isinstance(node, ast.Assign) and all(isinstance(t, (ast.Subscript, ast.Attribute)) for t in node.targets):
        yield "drop assignment into subscript/attribute", None
    elif isinstance(node, ast.Break):
        yield "break -> continue", ast.Continue()
    elif isinstance(node, ast.Continue):
        yield "continue -> break", ast.Break()


def _children(node: ast.AST) -> Iterator[tuple[tuple, ast.AST]]:
    """(step, child) for each child to look into: annotations, f-strings and docstrings are skipped."""
    for name, value in ast.iter_fields(node):
        if name in ("annotation", "returns", "type_comment", "decorator_list") or isinstance(node, ast.JoinedStr):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and name == "args":
            continue  # defaults are evaluated when the def runs, not in the body
        if isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, ast.AST):
                    if (i == 0 and name == "body" and isinstance(v, ast.Expr) and _is_str(v.value)):
                        continue  # a docstring
                    yield (name, i), v
        elif isinstance(value, ast.AST):
            yield (name, None), value


def _walk(node: ast.AST, path: tuple) -> Iterator[tuple[tuple, ast.AST]]:
    for step, child in _children(node):
        p = (*path, step)
        yield p, child
        yield from _walk(child, p)


def functions(tree: ast.Module) -> Iterator[tuple[str, tuple, ast.AST]]:
    """(qualname, path, def) for top-level functions and methods of top-level classes (nested
    functions are mutated as part of the function around them)."""
    def visit(body: list, prefix: str, path: tuple) -> Iterator[tuple[str, tuple, ast.AST]]:
        for i, n in enumerate(body):
            p = (*path, ("body", i))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + n.name, p, n
            elif isinstance(n, ast.ClassDef):
                yield from visit(n.body, f"{prefix}{n.name}.", p)
    yield from visit(tree.body, "", ())


def mutants_of(tree: ast.Module) -> list[Mutant]:
    out = []
    for qual, fpath, fdef in functions(tree):
        for step in ("body",):
            for i, stmt in enumerate(getattr(fdef, step)):
                if i == 0 and isinstance(stmt, ast.Expr) and _is_str(stmt.value):
                    continue
                base = (*fpath, (step, i))
                for p, n in [(base, stmt), *_walk(stmt, base)]:
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        continue
                    for op, _ in node_mutations(n):
                        end = getattr(n, "end_lineno", None) or n.lineno
                        out.append(Mutant(qual, n.lineno, n.col_offset + 1, end, op, p))
    return out


def _at(tree: ast.AST, path: tuple) -> tuple[ast.AST, tuple]:
    """The parent of the node at path, and the last step."""
    node = tree
    for name, i in path[:-1]:
        node = getattr(node, name) if i is None else getattr(node, name)[i]
    return node, path[-1]


def apply(tree: ast.Module, m: Mutant) -> ast.Module:
    """A copy of tree with the mutant's node replaced (or its statement made `pass`)."""
    t = copy.deepcopy(tree)
    parent, (name, i) = _at(t, m.path)
    old = getattr(parent, name) if i is None else getattr(parent, name)[i]
    new = dict(node_mutations(old))[m.op]
    if new is None:
        new = ast.Pass()
    ast.copy_location(new, old)
    if i is None:
        setattr(parent, name, new)
    else:
        getattr(parent, name)[i] = new
    return ast.fix_missing_locations(t)


def _code_named(code: types.CodeType, qualname: str) -> types.CodeType | None:
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            if c.co_qualname == qualname:
                return c
            found = _code_named(c, qualname)
            if found is not None:
                return found
    return None


def live_function(module: types.ModuleType, qualname: str) -> types.FunctionType | None:
    """The function object the module runs for qualname, under its decorators."""
    obj: object = module
    for part in qualname.split("."):
        d = getattr(obj, "__dict__", {})
        obj = d[part] if part in d else getattr(obj, part, None)
    for _ in range(5):
        if isinstance(obj, types.FunctionType):
            return obj
        if isinstance(obj, property):
            obj = obj.fget
        elif isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif hasattr(obj, "__wrapped__"):
            obj = obj.__wrapped__
        else:
            return None
    return None


# --- running ---------------------------------------------------------------------------------

SETUP = "#setup"
UNMUTATED = "(none)"  # a control run: the selection machinery on the code as it is


class _Tracer:
    """pytest plugin for the baseline: which test runs which line of the module's file, and
    how long each test takes."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.current = ""
        self.lines: dict[int, list[str]] = {}
        self.seconds: dict[str, float] = {}
        self.failed: list[str] = []

    def _local(self, frame, event, arg):  # noqa: ANN001
        if event == "line":
            tests = self.lines.setdefault(frame.f_lineno, [])
            if not tests or tests[-1] != self.current:
                tests.append(self.current)
        return self._local

    def _global(self, frame, event, arg):  # noqa: ANN001
        if frame.f_code.co_filename == self.filename:
            return self._local
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item) -> None:  # noqa: ANN001
        # Fixtures run here, a module's once for all its tests: what they reach, every test of
        # the file may depend on.
        self.current = item.nodeid + SETUP
        sys.settrace(self._global)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item) -> None:  # noqa: ANN001
        self.current = item.nodeid
        sys.settrace(self._global)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item) -> None:  # noqa: ANN001
        sys.settrace(None)

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failed.append(report.nodeid)


def _quiet() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


def _quiet_call(f) -> None:  # noqa: ANN001
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        f()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)


def _pytest_args(tests: list[str]) -> list[str]:
    return ["-q", "-x", "-n", "0", "-p", "no:cacheprovider", "--no-header", *tests]


def baseline(module_file: str, tests: list[str]) -> tuple[dict[int, list[str]], dict[str, float], list[str]]:
    """In a forked child: the unmutated tests, traced. Returns (line -> test ids in run order,
    seconds per test, failed test ids)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        tracer = _Tracer(module_file)
        _quiet()
        try:
            pytest.main([a for a in _pytest_args(tests) if a != "-x"], plugins=[tracer])
        finally:
            sys.settrace(None)
            with os.fdopen(w, "w") as f:
                json.dump([{str(k): v for k, v in tracer.lines.items()}, tracer.seconds, tracer.failed], f)
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    lines, seconds, failed = json.loads(data)
    return {int(k): v for k, v in lines.items()}, seconds, failed


def reaching(lines: dict[int, list[str]], seconds: dict[str, float], first: int, last: int) -> list[str]:
    """The tests that ran lines first..last (a fixture's run: every test of its file), the
    quickest first, since -x stops at the first that fails."""
    reach: set[str] = set()
    for ln in range(first, last + 1):
        for t in lines.get(ln, []):
            if t.endswith(SETUP):
                file = t.split("::")[0]
                reach.update(u for u in seconds if u.split("::")[0] == file)
            else:
                reach.add(t)
    return sorted(reach, key=lambda t: (seconds.get(t, 0.0), t))


def run_mutant(module: types.ModuleType, code: types.CodeType, m: Mutant, timeout: float) -> str:
    fn = live_function(module, m.function)
    new = _code_named(code, m.function)
    if fn is None or new is None or new.co_freevars != fn.__code__.co_freevars:
        return "skipped"
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            if m.op != UNMUTATED:
                fn.__code__ = new
            _quiet()
            rc = int(pytest.main(_pytest_args(m.tests)))
        finally:
            os._exit(rc)
    t0 = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            # 1: a test failed. Anything else (2-5: interrupted, internal or usage error, no
            # tests collected; a signal) says nothing about the mutant.
            return {0: "survived", 1: "killed"}.get(rc, f"error {rc}")
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.02)


def mutate(name: str, only: str | None = None, log=print, first: int = 1) -> dict:  # noqa: ANN001
    rel, dotted, tests = MODULES[name]
    path = os.path.join(ROOT, rel)
    module = importlib.import_module(dotted)
    live = os.path.realpath(module.__file__ or "")
    if live != os.path.realpath(path):
        raise SystemExit(f"{dotted} is imported from {live}, not {path}: put this checkout on PYTHONPATH")
    src = open(path).read()
    tree = ast.parse(src, module.__file__)
    mutants = [m for m in mutants_of(tree) if only is None or m.function == only]
    total = len(mutants)
    mutants = mutants[first - 1:]
    t0 = time.monotonic()
    lines, seconds, failed = baseline(module.__file__ or path, tests)
    if failed:
        raise SystemExit(f"{name}: the unmutated tests fail: {failed[:5]}")
    log(f"{name}: {total} mutants{f', from the {first}th' if first > 1 else ''}; baseline {time.monotonic() - t0:.1f} s over {len(seconds)} tests")
    src_lines = src.splitlines()
    # Control: the tests that reach the module's first function, run the way a mutant's are,
    # must pass on the code as it is (a failure here is the machinery's, not a kill).
    control = next((m for m in mutants if reaching(lines, seconds, m.line, m.end_line)), None)
    if control is not None:
        c = Mutant(control.function, control.line, control.col, control.end_line, UNMUTATED, control.path,
                   tests=reaching(lines, seconds, control.line, control.end_line))
        status = run_mutant(module, compile(tree, module.__file__ or path, "exec"), c, 60 + 3 * sum(
            seconds.get(t, 1.0) for t in c.tests))
        if status != "survived":
            raise SystemExit(f"{name}: the control run (no mutant, {len(c.tests)} tests) ended {status}")
    for k, m in enumerate(mutants, start=first - 1):
        m.tests = reaching(lines, seconds, m.line, m.end_line)
        if not m.tests:
            m.status = "unreached"
            log(f"  [{k + 1}/{total}] reached by no test: {rel}:{m.line}:{m.col} {m.function}: {m.op}: "
                f"{src_lines[m.line - 1].strip()[:90]}")
            continue
        code = compile(apply(tree, m), module.__file__ or path, "exec")
        t1 = time.monotonic()
        timeout = 20 + 3 * sum(seconds.get(t, 1.0) for t in m.tests)
        m.status = run_mutant(module, code, m, timeout)
        m.seconds = time.monotonic() - t1
        if (k + 1) % 25 == 0:
            done = mutants[:k + 2 - first]
            log(f"  [{k + 1}/{total}] so far: killed {sum(x.status in ('killed', 'timeout') for x in done)}, "
                f"survived {sum(x.status == 'survived' for x in done)}, "
                f"reached by no test {sum(x.status == 'unreached' for x in done)} ({time.monotonic() - t0:.0f} s)")
        if m.status != "killed":
            log(f"  [{k + 1}/{total}] {m.status}: {rel}:{m.line}:{m.col} {m.function}: {m.op}: "
                f"{src_lines[m.line - 1].strip()[:90]}")
    counts = {s: sum(m.status == s for m in mutants) for s in ("killed", "timeout", "survived", "unreached", "skipped")}
    counts["error"] = sum(m.status.startswith("error") for m in mutants)
    made = len(mutants) - counts["skipped"] - counts["error"]
    rate = (counts["killed"] + counts["timeout"]) / made if made else 1.0
    log(f"{name}: made {made}, killed {counts['killed']}, timed out {counts['timeout']}, survived "
        f"{counts['survived']}, reached by no test {counts['unreached']}, errors (not counted) {counts['error']}, "
        f"not swappable {counts['skipped']}, kill rate {rate:.1%} "
        f"({time.monotonic() - t0:.0f} s)")
    return {"module": name, "file": rel, "made": made, **counts, "kill_rate": rate,
            "survivors": [{"line": m.line, "col": m.col, "function": m.function, "op": m.op, "status": m.status,
                           "source": src_lines[m.line - 1].strip()} for m in mutants
                          if m.status in ("survived", "unreached") or m.status.startswith("error")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/mutate.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help=f"of: {', '.join(MODULES)}")
    ap.add_argument("--list", action="store_true", help="the modules and their test files")
    ap.add_argument("--only", help="mutate this function (qualified name) only")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--first", type=int, default=1, help="start at this mutant (1-based), to resume a stopped run")
    a = ap.parse_args(argv)
    if a.list or not a.modules:
        for n, (rel, _, tests) in MODULES.items():
            print(f"{n:<11} {rel:<28} {' '.join(t.removeprefix('tests/') for t in tests)}")
        return 0
    bad = [n for n in a.modules if n not in MODULES]
    if bad:
        ap.error(f"unknown module {bad}; --list names them")
    os.chdir(ROOT)
    for w in WARM:
        importlib.import_module(w)
    # pytest's plugins (xdist, hypothesis, textual's snapshots...) imported once here: each
    # child's pytest.main then starts in about a second rather than three.
    _quiet_call(lambda: pytest.main(["-p", "no:cacheprovider", "--version"]))
    results = [mutate(n, a.only, log=lambda s: print(s, flush=True), first=a.first) for n in a.modules]
    print("\nmodule       made  killed  timeout  survived  unreached  kill rate")
    for r in results:
        print(f"{r['module']:<11} {r['made']:>5} {r['killed']:>7} {r['timeout']:>8} {r['survived']:>9} "
              f"{r['unreached']:>10}  {r['kill_rate']:>8.1%}" + (f"  ({r['error']} errors)" if r["error"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
