"""Human units and names, shared by the text report, the diff, the exporters and the TUI.
(`fmt_time`, `fmt_bytes`, `fmt_metric` and `short_kernel_name` live in the model, which uses
them too: one way to write each unit.)"""

from __future__ import annotations

from dlpt.frames import short_kernel_name
from dlpt.metrics import fmt_bytes, fmt_metric, fmt_time


def fmt_bandwidth(nbytes: float, ns: float) -> str:
    if ns <= 0 or nbytes <= 0:
        return ""
    return f"{nbytes / ns:.1f} GB/s"


def safe_text(s: str) -> str:
    """Control characters and escape sequences shown as visible escapes, never interpreted."""
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in s)


def bar(fraction: float, width: int = 10) -> str:
    fraction = min(max(fraction, 0.0), 1.0)
    full = fraction * width
    n = int(full)
    parts = " ▏▎▍▌▋▊▉"
    rest = parts[int((full - n) * 8)] if n < width else ""
    return ("█" * n + rest).ljust(width)


__all__ = ["bar", "fmt_bandwidth", "fmt_bytes", "fmt_metric", "fmt_time", "safe_text", "short_kernel_name"]
