"""`-f hotspots`: the ranked source lines as the `dlpt.hotspots/1` JSON document."""

from __future__ import annotations

import json
from typing import TextIO

from dlpt.hotspots import hotspots
from dlpt.profile import Profile
from dlpt.viewers.exporters.base import ExportOptions


class HotspotsExporter:
    name = "hotspots"
    suffix = ".hotspots.json"
    description = "the costliest source lines as JSON (schema dlpt.hotspots/1), for CI and dashboards"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        doc = hotspots(profile, metric=options.metric_for(profile), top=options.top,
                       include_library=options.include_library,
                       include_compile=options.include_compile)
        json.dump(doc, out, indent=1, ensure_ascii=False)
        out.write("\n")
