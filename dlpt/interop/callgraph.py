"""The function-level caller/callee graph, as a networkx DiGraph.

Calling contexts collapse onto functions: every CCT node maps to one graph node — a Python
function (file + function name), or a module, op, kernel, copy, thread... by its name — and
every CCT edge to the edge between the two functions. Recursion becomes a cycle (or a self
loop) instead of an ever deeper path.

Node attributes: `kind`, `name`, `file`, `function`, `line` (the def line, for imported
traces; 0 otherwise), `calls` (how many calling contexts map to
the node), and for every metric `M` the exclusive `M` and the inclusive `M_inc`. Edge
attributes: `calls` and, for every metric, `M`: the inclusive value of the callee when called
from this caller. Inclusive values count each subtree once even under recursion (a function
below itself on a path is not counted again), so no node's inclusive exceeds the total."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dlpt.frames import Frame, short_path
from dlpt.metrics import METRICS
from dlpt.transforms import hide_library_unless

if TYPE_CHECKING:
    import networkx as nx

    from dlpt.profile import Profile


def function_key(frame: Frame, def_lines: bool = False) -> tuple[str, str, str]:
    """(kind, file, function-or-name): what calling contexts of one function share.

    With `def_lines` (imported traces, whose python frames carry the line of the `def`), the
    line is part of the function's identity: two classes' `forward` in one file stay apart.
    Recorded profiles carry call-site lines instead, which vary within one function."""
    if frame.kind == "python" and frame.file:
        name = frame.function or frame.name
        return ("python", frame.file, f"{name}:{frame.line}" if def_lines and frame.line > 0 else name)
    return (frame.kind, "", frame.name)


def node_id(key: tuple[str, str, str]) -> str:
    """A readable, unique string id (GraphML and DOT need strings)."""
    kind, file, name = key
    return f"{kind}:{file}:{name}" if file else f"{kind}:{name}"


def _display(frame: Frame, def_lines: bool) -> str:
    if frame.kind == "python" and frame.file:
        where = f"{short_path(frame.file)}:{frame.line}" if def_lines and frame.line > 0 else short_path(frame.file)
        return f"{frame.function or frame.name} ({where})"
    return frame.name


def call_graph(profile: Profile, include_library: bool = False) -> nx.DiGraph:
    """The function-level call graph of the (library-hidden unless `include_library`) profile.
    The tree's root is a node of its own (kind `root`), so node exclusive values sum to the
    profile's totals and the root's inclusive values are those totals."""
    import networkx as nx

    prof = hide_library_unless(profile, include_library)
    cct = prof.cct
    n = len(cct)
    def_lines = prof.collector == "kineto"
    # Function id of every frame, then of every node.
    fkeys: dict[tuple[str, str, str], int] = {}
    reps: list[Frame] = []
    func_of_frame = np.empty(len(prof.frames), dtype=np.int64)
    for fi, fr in enumerate(prof.frames):
        k = function_key(fr, def_lines)
        g = fkeys.get(k)
        if g is None:
            g = fkeys[k] = len(reps)
            reps.append(fr)
        func_of_frame[fi] = g
    func = func_of_frame[cct.frame]
    F = len(reps)
    ncol = cct.exclusive.shape[1]
    exc = np.zeros((F, ncol), dtype=np.int64)
    np.add.at(exc, func, cct.exclusive)
    calls = np.bincount(func, minlength=F)

    # One preorder pass keeps the functions and edges open on the current path; a node counts
    # towards a function's (an edge's) inclusive only when that function (edge) is not open
    # above it.
    parent = cct.parent.tolist()
    end = cct.end.tolist()
    fl = func.tolist()
    top_node = np.zeros(n, dtype=bool)
    top_edge = np.zeros(n, dtype=bool)
    open_f: dict[int, int] = {}
    open_e: dict[tuple[int, int], int] = {}
    stack: list[tuple[int, int, tuple[int, int] | None]] = []
    for i in range(n):
        while stack and stack[-1][0] <= i:
            _, f, e = stack.pop()
            open_f[f] -= 1
            if e is not None:
                open_e[e] -= 1
        f = fl[i]
        if not open_f.get(f):
            top_node[i] = True
        open_f[f] = open_f.get(f, 0) + 1
        e = None
        if i > 0:
            e = (fl[parent[i]], f)
            if not open_e.get(e):
                top_edge[i] = True
            open_e[e] = open_e.get(e, 0) + 1
        stack.append((end[i], f, e))

    inc = np.zeros((F, ncol), dtype=np.int64)
    tn = np.flatnonzero(top_node)
    np.add.at(inc, func[tn], cct.inclusive[tn])

    g = nx.DiGraph(name=str(prof.meta.command or prof.path or prof.frame_of(0).name),
                   include_library=bool(include_library))
    for fid, fr in enumerate(reps):
        kind, file, fname = function_key(fr, def_lines)
        attrs: dict[str, Any] = {"kind": kind, "name": _display(fr, def_lines), "file": file,
                                 "function": (fr.function or fr.name) if kind == "python" else "",
                                 "line": int(fr.line) if def_lines and kind == "python" else 0,
                                 "calls": int(calls[fid])}
        for m, j in zip(METRICS, range(ncol)):
            attrs[m] = int(exc[fid, j])
        for m, j in zip(METRICS, range(ncol)):
            attrs[f"{m}_inc"] = int(inc[fid, j])
        if calls[fid]:
            g.add_node(node_id((kind, file, fname)), **attrs)

    ids = [node_id(function_key(fr, def_lines)) for fr in reps]
    child = np.arange(1, n)
    pf = func[cct.parent[1:]]
    cf = func[1:]
    # Edge totals: one row per distinct (caller, callee) pair.
    pairs, inverse = np.unique(np.stack([pf, cf], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    ecalls = np.bincount(inverse, minlength=len(pairs))
    einc = np.zeros((len(pairs), ncol), dtype=np.int64)
    te = top_edge[1:]
    np.add.at(einc, inverse[te], cct.inclusive[child[te]])
    for row, (a, b) in enumerate(pairs.tolist()):
        attrs = {"calls": int(ecalls[row])}
        for m, j in zip(METRICS, range(ncol)):
            attrs[m] = int(einc[row, j])
        g.add_edge(ids[a], ids[b], **attrs)
    return g
