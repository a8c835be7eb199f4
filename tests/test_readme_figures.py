"""The README's sample outputs hold together as figures, checked from their text alone (issue #35):
a regenerated sample (docs/readme_samples.py) can never hide a figure that stopped adding up.
Each check is arithmetic a reader can redo by hand on the printed numbers, within their printed
rounding: GPU time is kernels + copies + memsets, busy + idle is 100% of the wall, the idle's
parts are 100% of it, the phases fit in the wall, host op time fits in the wall where one thread
records, and each flat row's % is its self over the metric's total."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
TIME = r"([0-9][0-9,.]*) (ns|us|ms|s)\b"


def samples() -> list[tuple[str, list[str]]]:
    """(the sample's command, its output lines) for every `<!-- sample: ... -->` block."""
    text = README.read_text().splitlines()
    out = []
    for i, line in enumerate(text):
        m = re.match(r"<!-- sample: (.*) -->", line)
        if not m:
            continue
        assert text[i + 1].startswith("```"), line
        end = next(j for j in range(i + 2, len(text)) if text[j].startswith("```"))
        out.append((m.group(1), text[i + 2:end]))
    return out


def seconds(value: str, unit: str) -> float:
    return float(value.replace(",", "")) * UNITS[unit]


def half_unit(value: str, unit: str) -> float:
    """Half the last printed digit: the rounding a printed figure may carry."""
    decimals = len(value.split(".")[1]) if "." in value else 0
    return 0.5 * 10 ** -decimals * UNITS[unit]


def line_with(lines: list[str], prefix: str) -> str | None:
    return next((ln for ln in lines if ln.startswith(prefix)), None)


SAMPLES = [s for s in samples() if s[0].startswith("dlpt report")]


def test_the_readme_has_report_samples() -> None:
    assert len(SAMPLES) >= 5, [c for c, _ in SAMPLES]


@pytest.mark.parametrize("command,lines", SAMPLES, ids=[c[:60] for c, _ in SAMPLES])
def test_the_headers_figures_add_up(command: str, lines: list[str]) -> None:
    checked = 0
    gpu = line_with(lines, "GPU time ")
    if gpu and ":" in gpu:
        total_s, parts_s = gpu[len("GPU time "):].split(":", 1)
        (tv, tu), = re.findall(TIME, total_s)
        parts = re.findall(TIME, parts_s)
        assert parts, gpu
        err = half_unit(tv, tu) + sum(half_unit(v, u) for v, u in parts)
        assert abs(seconds(tv, tu) - sum(seconds(v, u) for v, u in parts)) <= err + 1e-12, gpu
        checked += 1
    wall = line_with(lines, "wall ")
    if wall and "GPU busy" in wall:
        busy = float(re.search(r"GPU busy ([0-9.]+)%", wall).group(1))
        idle = float(re.search(r"idle ([0-9.]+)%", wall).group(1))
        assert abs(busy + idle - 100) <= 0.1, wall
        inner = re.search(r"idle [0-9.]+% \(([^)]*)\)", wall)
        if inner:
            shares = [float(x) for x in re.findall(r"([0-9.]+)%", inner.group(1))]
            assert abs(sum(shares) - 100) <= 0.05 * len(shares) + 0.05, wall
        checked += 1
    if wall:
        (wv, wu), = re.findall(TIME, wall.split("·")[0])
        w = seconds(wv, wu) + half_unit(wv, wu)
        phases = line_with(lines, "phases: ")
        if phases:
            spans = re.findall(TIME, phases.split(";")[0].split("(")[0])
            assert sum(seconds(v, u) for v, u in spans) <= w + sum(half_unit(v, u) for v, u in spans), phases
            checked += 1
        host_op = line_with(lines, "host op time ")
        if host_op and "[thread" not in "\n".join(lines) and "every thread" not in "\n".join(lines):
            (hv, hu), = re.findall(TIME, host_op)
            assert seconds(hv, hu) <= w, (host_op, wall)
            checked += 1
    assert checked or "; from " in command, command  # a sample cut below its header holds none


ROW = re.compile(r"^\s*([0-9.]+)% \S*\s+(?:" + TIME + r"|(0))\s+(?:" + TIME + r"|(0))\s")


def flat_samples() -> list[tuple[str, list[str], int, str, str]]:
    """Flat views whose metric's total the same sample prints: (command, lines, the title's index,
    the total's value and unit). gpu_time's is the `GPU time` line, host_time's the `wall` line's
    `host time`; other metrics print no total in the header."""
    out = []
    for command, lines in SAMPLES:
        title = next((i for i, ln in enumerate(lines) if ln.startswith("flat view by ")), None)
        if title is None:
            continue
        metric = lines[title].split(",")[1].split("(")[0].strip()
        head = line_with(lines, "GPU time ") if metric == "gpu_time" else None
        if metric == "host_time":
            wall = line_with(lines, "wall ")
            head = wall.split("host time", 1)[1] if wall and "host time" in wall else None
        if head:
            (tv, tu), = re.findall(TIME, head.split(":")[0])
            out.append((command, lines, title, tv, tu))
    return out


FLAT = flat_samples()


def test_flat_samples_with_totals_exist() -> None:
    assert len(FLAT) >= 4, [c for c, *_ in FLAT]


@pytest.mark.parametrize("command,lines,title,tv,tu", FLAT, ids=[c[:60] for c, *_ in FLAT])
def test_flat_rows_are_their_share_of_the_total(command: str, lines: list[str], title: int, tv: str, tu: str) -> None:
    total = seconds(tv, tu)
    rows = [m for ln in lines[title + 2:] if (m := ROW.match(ln))]
    assert rows, lines[title:]
    shown = 0.0
    for m in rows:
        pct = float(m.group(1))
        self_s = seconds(m.group(2), m.group(3)) if m.group(2) else 0.0
        tot_s = seconds(m.group(5), m.group(6)) if m.group(5) else 0.0
        assert self_s <= tot_s + half_unit(m.group(5) or "0", m.group(6) or "s"), m.group(0)
        # The % is of the total, to one decimal; self is printed to 3-4 digits, the total too.
        want = 100 * self_s / total
        assert abs(pct - want) <= 0.05 + 0.01 * want + 100 * half_unit(tv, tu) / total, (m.group(0), want)
        shown += pct
    assert shown <= 100.0 + 0.05 * len(rows), shown
