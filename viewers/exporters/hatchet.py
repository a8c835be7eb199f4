"""`-f hatchet`: the calling-context tree in hatchet's literal format (JSON), which
`hatchet.GraphFrame.from_literal(json.load(f))` reads. Metrics are integers in dlpt's units
(ns, bytes, counts); exclusive as `gpu_time`, inclusive as `gpu_time (inc)`."""

from __future__ import annotations

import json
from typing import TextIO

from dlpt.interop.graphframe import to_literal
from dlpt.profile import Profile
from dlpt.viewers.exporters.base import ExportOptions


class HatchetExporter:
    name = "hatchet"
    suffix = ".hatchet.json"
    description = "the calling-context tree as hatchet's literal JSON (GraphFrame.from_literal)"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        # Compact separators: the literal repeats every metric name at every node.
        json.dump(to_literal(profile, include_library=options.include_library), out,
                  ensure_ascii=False, separators=(",", ":"))
        out.write("\n")
