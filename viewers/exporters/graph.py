"""`-f dot` and `-f graphml`: the function-level caller/callee graph (`dlpt.interop.callgraph`).

DOT is written here rather than through pydot: kernel names hold `<>":{}` and `::`, which
networkx's pydot bridge rejects or mangles, while a DOT quoted string only needs `"` and `\\`
escaped. Nodes are `n0`, `n1`, ... with the function in `label` and `fullname`, the graph
node id in `key`, every metric as an
attribute (integers in their units), and a heat colour by the inclusive share of --metric.
GraphML goes through networkx and carries every node and edge attribute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

from dlpt.interop.callgraph import call_graph
from dlpt.metrics import metric_column
from dlpt.profile import Profile
from dlpt.viewers.exporters.base import ExportOptions
from dlpt.viewers.format import fmt_metric, short_kernel_name

if TYPE_CHECKING:
    import networkx as nx


def dot_quote(text: str) -> str:
    """A DOT quoted string. Newlines become graphviz's `\\n` line break; other control
    characters are dropped (DOT has no escape for them)."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\r\n", "\n").replace("\n", "\\n")
    s = "".join(ch for ch in s if ch == "\t" or ch >= " ")
    return f'"{s}"'


def _attrs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={dot_quote(v)}" for k, v in d.items())


def _heat(frac: float) -> str:
    """Pale yellow (cold) to red (hot), like gprof2dot's colour map."""
    f = min(max(frac, 0.0), 1.0)
    r, g, b = 255, int(247 - 200 * f), int(204 - 190 * f)
    return f"#{r:02x}{g:02x}{b:02x}"


def write_dot(g: nx.DiGraph, out: TextIO, metric: str = "gpu_time") -> None:
    metric_column(metric)
    root_total = max((d[f"{metric}_inc"] for _, d in g.nodes(data=True) if d["kind"] == "root"), default=0)
    total = root_total or max((d[f"{metric}_inc"] for _, d in g.nodes(data=True)), default=0)
    ids = {n: f"n{i}" for i, n in enumerate(g.nodes)}
    out.write(f"digraph {dot_quote(g.graph.get('name') or 'dlpt')} {{\n")
    out.write(f"  graph [{_attrs({'label': f'dlpt call graph · {metric} · total {fmt_metric(metric, total)}', 'labelloc': 't', 'metric': metric, 'total': total})}];\n")
    out.write('  node [shape="box", style="filled", fontname="Helvetica"];\n')
    out.write('  edge [fontname="Helvetica"];\n')
    for n, d in g.nodes(data=True):
        inc, exc = d[f"{metric}_inc"], d[metric]
        frac = inc / total if total else 0.0
        shown = short_kernel_name(d["name"], 60) if d["kind"] == "kernel" else d["name"]
        label = f"{shown}\n{fmt_metric(metric, inc)} ({100 * frac:.1f}%)\nself {fmt_metric(metric, exc)}"
        # `name` would clash with pydot's Node(name=...): the full name travels as `fullname`.
        attrs = {"label": label, "fillcolor": _heat(frac), "key": n,
                 **{("fullname" if k == "name" else k): v for k, v in d.items()}}
        out.write(f"  {ids[n]} [{_attrs(attrs)}];\n")
    for a, b, d in g.edges(data=True):
        v = d[metric]
        frac = v / total if total else 0.0
        attrs = {"label": f"{fmt_metric(metric, v)}\n{d['calls']}×", "penwidth": f"{1 + 5 * frac:.2f}", **d}
        out.write(f"  {ids[a]} -> {ids[b]} [{_attrs(attrs)}];\n")
    out.write("}\n")


def _graph(profile: Profile, options: ExportOptions) -> nx.DiGraph:
    # Library frames are hidden (or not) by the scope; call_graph takes the tree as it is.
    return call_graph(options.scope.for_trees().apply(profile), include_library=True)


class DotExporter:
    name = "dot"
    suffix = ".dot"
    description = "function-level call graph as Graphviz DOT, every metric on nodes and edges"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        write_dot(_graph(profile, options), out, options.metric_for(profile))


class GraphMLExporter:
    name = "graphml"
    suffix = ".graphml"
    description = "function-level call graph as GraphML (networkx, Gephi, yEd), every metric on nodes and edges"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        metric = options.metric_for(profile)
        metric_column(metric)
        g = _graph(profile, options)
        g.graph["metric"] = metric
        # networkx writes bytes; the exporter interface hands us a text stream.
        import networkx as nx  # imported here: every dlpt command would pay for it at start-up

        for line in nx.generate_graphml(g, encoding="utf-8", prettyprint=True):
            out.write(line)
            out.write("\n")
