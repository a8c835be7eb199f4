"""One verdict of the diagnosis: the record every rule returns (dlpt/findings.py holds the rules;
dlpt/stalls.py the PC-sample one), the report, the TUI, hotspots and the header's `diagnosis` read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Finding:
    rule: str
    lines: list[str] = field(default_factory=list)  # "file:line", the costliest first
    figure: str = ""  # the profile's figure that crossed the threshold, in words
    remedy: str = ""
    share: float | None = None  # the share of `of` this finding explains (0..1)
    of: str = ""  # "steady state", or "run" (start-up and compile included)

    def to_json(self) -> dict[str, object]:
        return asdict(self)
