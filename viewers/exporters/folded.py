"""`-f folded`: Brendan Gregg's folded stacks (`a;b;c 1234`), one line per calling context
with a nonzero value of the chosen metric, for flamegraph.pl, inferno and speedscope. The value
is the context's exclusive metric as an integer in the metric's unit (ns for times), so the
lines sum to the profile's total."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TextIO

import numpy as np

from dlpt.cct import CCT
from dlpt.frames import Frame
from dlpt.metrics import metric_column
from dlpt.profile import Profile
from dlpt.viewers.exporters.base import ExportOptions


def weighted_stacks(cct: CCT, values: np.ndarray) -> Iterator[tuple[list[int], int]]:
    """`(path, value)` for every node with a nonzero value, in preorder; `path` lists the node
    ids from the root's child down to the node (the root alone for the root's own value).

    One preorder pass with a stack of the current path: memory grows with depth, not with the
    number of nodes times depth as materialised paths would. The yielded list is reused; copy
    it to keep it."""
    parent = cct.parent.tolist()
    vals = values.tolist()
    path: list[int] = []
    if vals[0]:
        yield [0], int(vals[0])
    for i in range(1, len(parent)):
        p = parent[i]
        # Preorder: the parent is on the path; drop what lies below it.
        while path and path[-1] != p:
            path.pop()
        path.append(i)
        if vals[i]:
            yield path, int(vals[i])


def folded_name(frame: Frame) -> str:
    """A frame as one folded-stack field: `;` separates frames and a newline ends the record,
    so neither may appear inside a name."""
    return frame.label().replace(";", ",").replace("\n", " ").replace("\r", " ")


class FoldedExporter:
    name = "folded"
    suffix = ".folded"
    description = "folded stacks with integer values of --metric (ns for times): flamegraph.pl, inferno, speedscope"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        col = metric_column(options.metric_for(profile))
        prof = options.scope.for_trees().apply(profile)
        cct = prof.cct
        names = [folded_name(f) for f in prof.frames]
        frame = cct.frame.tolist()
        for path, v in weighted_stacks(cct, cct.exclusive[:, col]):
            out.write(";".join(names[frame[i]] for i in path))
            out.write(f" {v}\n")
