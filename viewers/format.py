"""Human units and names, shared by the text report and the TUI."""

from __future__ import annotations

import re

from dlpt.metrics import BYTE_METRICS, TIME_METRICS


def fmt_time(ns: float) -> str:
    ns = float(ns)
    a = abs(ns)
    if a == 0:
        return "0"
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.1f} us"
    if a < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def fmt_metric(metric: str, v: float) -> str:
    if metric in TIME_METRICS:
        return fmt_time(v)
    if metric in BYTE_METRICS:
        return fmt_bytes(v)
    return f"{int(v):,}"


def fmt_bandwidth(nbytes: float, ns: float) -> str:
    if ns <= 0 or nbytes <= 0:
        return ""
    return f"{nbytes / ns:.1f} GB/s"


_ARGS = re.compile(r"\((?:[^()]|\([^()]*\))*\)\s*(const)?\s*$")


def short_kernel_name(name: str, width: int = 60) -> str:
    """`void at::native::elementwise_kernel<128, 2, ...>(int, ...)` → `at::native::elementwise_kernel<128, 2, …>`.

    The parameter list and nested template arguments make names hundreds of characters long,
    while what people recognise is the qualified name and its first template arguments (for
    `cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nt_align1>` they are the whole story)."""
    s = name.strip().replace("(anonymous namespace)", "{anonymous}")
    if s.startswith("void "):
        s = s[5:]
    depth = 0
    out = []
    for ch in s:
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<")
            elif depth == 2:
                out.append("…")
        elif ch == ">":
            depth = max(depth - 1, 0)
            if depth == 0:
                out.append(">")
        elif depth == 0 and ch == "(":
            break  # the parameter list
        elif depth <= 1:
            out.append(ch)
    short = ("".join(out).strip() or s).replace("{anonymous}", "(anonymous)")
    if len(short) > width:
        short = short[: width - 1] + "…"
    return short


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
