"""`-f hotspots`: the ranked source lines as the `dlpt.hotspots/2` JSON document."""

from __future__ import annotations

from typing import TextIO

from dlpt.output import write_json
from dlpt.profile import Profile
from dlpt.viewers.exporters.base import ExportOptions
from dlpt.viewers.hotspots import hotspots_document


class HotspotsExporter:
    name = "hotspots"
    suffix = ".hotspots.json"
    description = "the costliest source lines as JSON (schema dlpt.hotspots/2), for CI and dashboards"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        doc = hotspots_document(options.scope.apply(profile), metric=options.metric_for(profile), top=options.top)
        write_json(out, doc)
