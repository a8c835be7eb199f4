"""`-f hatchet`: the calling-context tree in hatchet's literal format (JSON), which
`hatchet.GraphFrame.from_literal(json.load(f))` reads. Metrics are integers in dlpt's units
(ns, bytes, counts); exclusive as `gpu_time`, inclusive as `gpu_time (inc)`."""

from __future__ import annotations

from typing import TextIO

from dlpt.interop.graphframe import to_literal
from dlpt.output import write_json
from dlpt.profile import Profile
from dlpt.viewers.exporters.base import ExportOptions


class HatchetExporter:
    name = "hatchet"
    suffix = ".hatchet.json"
    description = "the calling-context tree as hatchet's literal JSON (GraphFrame.from_literal)"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        # Library frames are hidden (or not) by the scope; to_literal takes the tree as it is.
        # Compact: the literal repeats every metric name at every node.
        write_json(out, to_literal(options.scope.for_trees().apply(profile), include_library=True), compact=True)
