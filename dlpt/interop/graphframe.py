"""hatchet interop: a profile as a hatchet GraphFrame, and as hatchet's literal (a list of
nested dicts that `GraphFrame.from_literal` reads).

The GraphFrame is built directly from the CCT arrays: one `Node` per CCT node, linked in one
preorder pass, and one DataFrame built column-wise. hatchet's own route (literal → reader)
walks dicts recursively and, when node ids are given, checks them against a list (quadratic).
Exclusive metrics keep dlpt's names (`gpu_time`, integer ns); inclusive ones follow hatchet's
convention (`gpu_time (inc)`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from dlpt.frames import Frame
from dlpt.metrics import COL, METRICS, metric_column
from dlpt.transforms import hide_library_unless

if TYPE_CHECKING:
    import hatchet

    from dlpt.profile import Profile

EXC_METRICS = list(METRICS)
INC_METRICS = [f"{m} (inc)" for m in METRICS]


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small objects: its full passes
    rescan everything allocated so far and made construction superlinear (2.1 s instead of
    0.2 s for 85k nodes). Nothing built here is garbage, so pausing it loses nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def frame_attrs(frame: Frame) -> dict[str, Any]:
    """The attributes of a hatchet Frame for a dlpt frame. hatchet compares frames by these
    attributes, so they must tell any two dlpt frames apart: `name` is the display label and
    source frames add file, line and function."""
    attrs: dict[str, Any] = {"name": frame.label(), "type": frame.kind}
    if frame.file:
        attrs["file"] = frame.file
        attrs["line"] = int(frame.line)
        attrs["function"] = frame.function
    return attrs


def to_graphframe(profile: Profile, metric: str, include_library: bool = False) -> hatchet.GraphFrame:
    """The profile's calling-context tree as a hatchet GraphFrame.

    Node `i` of the (library-hidden unless `include_library`) CCT becomes the hatchet node with
    `_hatchet_nid == i`, so `gf.dataframe` rows line up with the CCT's preorder. `metric` picks
    the GraphFrame's default metric (its inclusive column); `Profile.to_graphframe` passes the
    profile's own (`dlpt.profile.default_metric`) when the caller names none."""
    import pandas as pd
    from hatchet import GraphFrame
    from hatchet.frame import Frame as HFrame
    from hatchet.graph import Graph
    from hatchet.node import Node

    metric_column(metric)  # a clear error for an unknown name, before any work
    prof = hide_library_unless(profile, include_library)
    cct = prof.cct
    n = len(cct)
    attrs = [frame_attrs(f) for f in prof.frames]
    parent = cct.parent.tolist()
    frame = cct.frame.tolist()
    depth = cct.depth.tolist()
    nodes: list[Node] = []
    append = nodes.append
    with _no_gc():
        for i in range(n):
            p = parent[i]
            # Each node gets its own Frame (hatchet's transformations may edit frames in place).
            node = Node(HFrame(dict(attrs[frame[i]])), nodes[p] if p >= 0 else None, hnid=i, depth=depth[i])
            if p >= 0:
                nodes[p].children.append(node)
            append(node)
    graph = Graph([nodes[0]])

    fr = np.asarray(cct.frame)
    names = np.array([a["name"] for a in attrs], dtype=object)[fr]
    kinds = np.array([f.kind for f in prof.frames], dtype=object)[fr]
    data: dict[str, Any] = {"node": nodes, "name": names, "type": kinds}
    for m in METRICS:
        data[m] = cct.exclusive[:, COL[m]]
    inc = cct.inclusive
    for m, im in zip(METRICS, INC_METRICS):
        data[im] = inc[:, COL[m]]
    df = pd.DataFrame(data).set_index("node")
    return GraphFrame(graph, df, exc_metrics=list(EXC_METRICS), inc_metrics=list(INC_METRICS),
                      default_metric=f"{metric} (inc)",
                      metadata={"dlpt_source": prof.collector, "dlpt_path": prof.path})


def to_literal(profile: Profile, include_library: bool = False) -> list[dict[str, Any]]:
    """hatchet's literal format: `[{"frame": {...}, "metrics": {...}, "children": [...]}]`,
    built without recursion (children are appended in preorder, so sibling order is kept).

    No `_hatchet_nid` is written: hatchet's reader checks those against a list, which is
    quadratic; without them it numbers nodes itself."""
    prof = hide_library_unless(profile, include_library)
    cct = prof.cct
    attrs = [frame_attrs(f) for f in prof.frames]
    exc = cct.exclusive.tolist()
    inc = cct.inclusive.tolist()
    parent = cct.parent.tolist()
    frame = cct.frame.tolist()
    out: list[dict[str, Any]] = []
    with _no_gc():
        for i in range(len(cct)):
            metrics = dict(zip(EXC_METRICS, exc[i]))
            metrics.update(zip(INC_METRICS, inc[i]))
            d: dict[str, Any] = {"frame": dict(attrs[frame[i]]), "metrics": metrics}
            out.append(d)
            p = parent[i]
            if p >= 0:
                out[p].setdefault("children", []).append(d)
    return [out[0]]
