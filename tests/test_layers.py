"""The flow the code keeps: collector → profile → model → viewer/exporter, with the command line
on top. Read from the `import` statements (ast), so a layering slip fails here rather than as
an import cycle somewhere later."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Folder → package, as pyproject.toml maps them.
PACKAGES = {"dlpt": "dlpt", "collectors": "dlpt.collectors", "viewers": "dlpt.viewers"}


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
            names = [node.module]
        else:
            continue
        out += [(n, id(node) in top) for n in names if n == "dlpt" or n.startswith("dlpt.")]
    return out


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


MODULES = _modules()
# The model: everything in dlpt/ but the command line and the adapters to other libraries.
CORE = {m: p for m, p in MODULES.items()
        if m.startswith("dlpt.") and not _under(m, "dlpt.commands") and not _under(m, "dlpt.interop")
        and not _under(m, "dlpt.collectors") and not _under(m, "dlpt.viewers")
        and m not in ("dlpt.cli", "dlpt.__main__")}


def test_layout_is_read():
    assert "dlpt.profile" in CORE and "dlpt.diff" in CORE and "dlpt.viewers.diff" in MODULES
    assert "dlpt.collectors.kineto.link" in MODULES and "dlpt.interop.tables" in MODULES


def test_model_never_imports_viewers_or_commands():
    bad = [(m, n) for m, p in CORE.items() for n, _ in _imports(p)
           if _under(n, "dlpt.viewers") or _under(n, "dlpt.commands") or n == "dlpt.cli"]
    assert not bad, bad


def test_model_imports_interop_only_when_called():
    """pandas, hatchet and networkx come in only when a user asks for their objects."""
    bad = [(m, n) for m, p in CORE.items() for n, top in _imports(p) if _under(n, "dlpt.interop") and top]
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
