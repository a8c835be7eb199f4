"""Exporters share one interface and a name registry behind `dlpt export --format`, the way
py-spy's recorders do. Each one writes a profile to a text stream in its format."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import ClassVar, Protocol, TextIO

from dlpt.errors import DlptError
from dlpt.metrics import default_metric
from dlpt.profile import Profile


@dataclass
class ExportOptions:
    metric: str | None = None  # None: the profile's default (gpu_time, or cpu_time without a GPU)
    top: int = 20
    include_library: bool = False

    def metric_for(self, profile: Profile) -> str:
        return self.metric or default_metric(profile)


class Exporter(Protocol):
    name: ClassVar[str]
    suffix: ClassVar[str]
    description: ClassVar[str]

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None: ...


EXPORTERS: dict[str, type] = {}

# Modules that register exporters when imported; a module that is missing is simply skipped so
# that formats can be added one module at a time.
_MODULES = ("dlpt.viewers.exporters.hotspots", "dlpt.viewers.exporters.hatchet", "dlpt.viewers.exporters.folded",
            "dlpt.viewers.exporters.speedscope", "dlpt.viewers.exporters.graph")


def register(cls: type) -> type:
    EXPORTERS[cls.name] = cls
    return cls


def _load_all() -> None:
    for m in _MODULES:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            if e.name != m:
                raise


def formats() -> list[str]:
    _load_all()
    return list(EXPORTERS)


def get_exporter(name: str) -> Exporter:
    _load_all()
    cls = EXPORTERS.get(name)
    if cls is None:
        raise DlptError(f"unknown export format {name!r}; choose one of: {', '.join(EXPORTERS)}")
    return cls()
