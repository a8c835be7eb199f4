"""Exporters share one interface (`base.Exporter`) and a name registry behind `dlpt export
--format`, the way py-spy's recorders do. Each one writes a profile to a text stream in its
format. A new format is a module here and one line in `EXPORTERS`."""

from __future__ import annotations

from dlpt.errors import DlptError
from dlpt.viewers.exporters.base import Exporter, ExportOptions
from dlpt.viewers.exporters.folded import FoldedExporter
from dlpt.viewers.exporters.graph import DotExporter, GraphMLExporter
from dlpt.viewers.exporters.hatchet import HatchetExporter
from dlpt.viewers.exporters.hotspots import HotspotsExporter
from dlpt.viewers.exporters.html import HtmlExporter
from dlpt.viewers.exporters.speedscope import SpeedscopeExporter

# In the order `dlpt export --help` lists them.
_CLASSES: tuple[type[Exporter], ...] = (
    HotspotsExporter, HatchetExporter, FoldedExporter, SpeedscopeExporter, DotExporter, GraphMLExporter,
    HtmlExporter)
EXPORTERS: dict[str, type[Exporter]] = {cls.name: cls for cls in _CLASSES}


def formats() -> list[str]:
    return list(EXPORTERS)


def get_exporter(name: str) -> Exporter:
    cls = EXPORTERS.get(name)
    if cls is None:
        raise DlptError(f"unknown export format {name!r}; choose one of: {', '.join(EXPORTERS)}")
    return cls()


__all__ = ["EXPORTERS", "ExportOptions", "Exporter", "formats", "get_exporter"]
