"""What every exporter is: a class with a format name, a file suffix, a description and an
`export(profile, out, options)` that writes the profile to a text stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TextIO

from dlpt.profile import Profile, default_metric
from dlpt.scope import Scope


@dataclass
class ExportOptions:
    metric: str | None = None  # None: the profile's default (gpu_time, or cpu_time without a GPU)
    top: int = 20
    include_library: bool = False
    include_compile: bool = False  # rank torch.compile's one-off work in hotspots (trees always keep it)
    phase: str = "all"  # the part of the run exported (dlpt/phases.py)

    @property
    def scope(self) -> Scope:
        """The export's one decision on library frames and torch.compile's work; tree formats
        use `scope.for_trees()`."""
        return Scope(self.include_library, self.include_compile, self.phase)

    def metric_for(self, profile: Profile) -> str:
        return self.metric or default_metric(profile)


class Exporter(Protocol):
    # Class attributes of each exporter (read from the class by `dlpt export --help`).
    name: str
    suffix: str
    description: str

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None: ...
