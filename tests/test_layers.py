"""The flow the code keeps: collector → profile → model → viewer/exporter, with the command line
on top. Read from the `import` statements (ast), so a layering slip fails here rather than as
an import cycle somewhere later."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from dlpt.layout import OWN_ROOTS, PACKAGES, is_own_file

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every dlpt import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    # `if TYPE_CHECKING:` blocks run at no time: imports there are for annotations only.
    typing_only = {id(n) for b in tree.body if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)
                   for n in ast.walk(b)}
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from dlpt.collectors.record import native` imports the module `native` too.
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names
                                    if f"{node.module}.{a.name}" in MODULES)]
        else:
            continue
        out += [(n, id(node) in top) for n in names if n == "dlpt" or n.startswith("dlpt.")]
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


MODULES = _modules()
# The entry points above the collectors: the recording API (dlpt.profile runs the recorder)
# and opening any input (a trace is read by the Kineto importer).
ENTRY = ("dlpt", "dlpt.api", "dlpt.loader", "dlpt.cli", "dlpt.__main__")
# The model: everything in dlpt/ but the command line, the entry points and the adapters to
# other libraries.
CORE = {m: p for m, p in MODULES.items()
        if m.startswith("dlpt.") and not _under(m, "dlpt.commands") and not _under(m, "dlpt.interop")
        and not _under(m, "dlpt.collectors") and not _under(m, "dlpt.viewers") and m not in ENTRY}


def test_layout_is_read():
    assert "dlpt.profile" in CORE and "dlpt.diff" in CORE and "dlpt.viewers.diff" in MODULES
    # torch.compile's transformation and its records are the model's (the recorder only fills them).
    assert "dlpt.compiled.fused" in CORE and "dlpt.compiled.provenance" in CORE
    assert "dlpt.collectors.kineto.link" in MODULES and "dlpt.interop.tables" in MODULES


def test_own_roots_are_the_three_folders():
    """dlpt's own files (hidden as library, left out of recorded paths and tracebacks) are
    exactly the folders pyproject.toml maps onto its packages: the one definition."""
    assert {os.path.basename(r.rstrip(os.sep)) for r in OWN_ROOTS} == set(PACKAGES)
    assert all(is_own_file(str(p)) for p in MODULES.values())
    assert not is_own_file(str(ROOT / "tests" / "test_layers.py")) and not is_own_file(str(ROOT / "bench"))


def test_no_import_circles():
    """No module imports, directly or through others (at any time: inside functions too), a
    module that imports it."""
    graph = {m: {n for n, _ in _imports(p) if n in MODULES and n != m} for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            part = []
            while True:
                n = stack.pop()
                part.append(n)
                if n == m:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert not circles, circles


def test_model_never_imports_collectors():
    """Collectors make profiles; the model reads them. Only the entry points run collectors."""
    bad = [(m, n) for m, p in CORE.items() for n, _ in _imports(p) if _under(n, "dlpt.collectors")]
    assert not bad, bad


def test_model_never_imports_viewers_or_commands():
    bad = [(m, n) for m, p in CORE.items() for n, _ in _imports(p)
           if _under(n, "dlpt.viewers") or _under(n, "dlpt.commands") or n == "dlpt.cli"]
    assert not bad, bad


def test_model_never_imports_interop():
    """The adapters read the model; the model never imports them, not even inside a function
    (the package binds `Profile.to_dataframe` and its kin), so no circle runs through them."""
    bad = [(m, n) for m, p in CORE.items() for n, _ in _imports(p) if _under(n, "dlpt.interop")]
    assert not bad, bad


def test_interop_comes_in_only_when_called():
    """pandas, hatchet and networkx come in only when a user asks for their objects."""
    bad = [n for n, top in _imports(MODULES["dlpt"]) if _under(n, "dlpt.interop") and top]
    assert not bad, bad


def test_collectors_and_interop_never_import_viewers_or_commands():
    lower = {m: p for m, p in MODULES.items() if _under(m, "dlpt.collectors") or _under(m, "dlpt.interop")}
    bad = [(m, n) for m, p in lower.items() for n, _ in _imports(p)
           if _under(n, "dlpt.viewers") or _under(n, "dlpt.commands") or n == "dlpt.cli"]
    assert not bad, bad


def test_viewers_never_import_commands():
    viewers = {m: p for m, p in MODULES.items() if _under(m, "dlpt.viewers")}
    bad = [(m, n) for m, p in viewers.items() for n, _ in _imports(p)
           if _under(n, "dlpt.commands") or n == "dlpt.cli"]
    assert not bad, bad
