"""A metric is defined once: one record in dlpt/metrics.py's REGISTRY. A copy of the package whose
REGISTRY gains a toy metric, and nothing else, stores it, and shows it in the report, hotspots
JSON, the HTML page and the TUI (its picker, the `s` cycle, the table's totals)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dlpt
import dlpt.collectors
import dlpt.viewers

TOY = '    Metric("toy_count", "count", "toy things counted", True),\n'

SCRIPT = r'''
import asyncio, contextlib, io, json, sys
import numpy as np
import dlpt
assert dlpt.__file__.startswith(sys.argv[1]), dlpt.__file__  # the copy, not the installed package
from dlpt.cct import CCT, TreeBuilder
from dlpt.cli import main
from dlpt.frames import Frame, FrameTable, source_frame
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.store import save

ft = FrameTable([Frame("root", "toy")])
b = TreeBuilder(0)
a = b.path([ft.intern(source_frame("toy.py", 1, "<module>"))])
c = b.path([ft.intern(source_frame("toy.py", 2, "<module>"))])
parent, frame, new_of_old = b.preorder()
exc = np.zeros((len(parent), len(METRICS)), dtype=np.int64)
exc[new_of_old[a], COL["toy_count"]] = 7
exc[new_of_old[c], COL["toy_count"]] = 3
save(Profile(ft.frames, CCT(parent, frame, exc), meta={"source": "record"},
             sources={"toy.py": "build_toys()\nbreak_toys()\n"}), "toy.dlpt")
out = {}


def cli(*args):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(args))
    assert rc == 0, (args, rc)
    return buf.getvalue()


out["report"] = cli("report", "toy.dlpt", "--metric", "toy_count", "--view", "flat")
out["hotspots"] = json.loads(cli("export", "toy.dlpt", "-f", "hotspots", "--metric", "toy_count", "-o", "-"))
cli("export", "toy.dlpt", "-f", "html", "-o", "toy.html")
out["html"] = open("toy.html").read()


async def tui():
    from dlpt.store import load
    from dlpt.viewers.tui.app import DlptApp

    app = DlptApp(profile=load("toy.dlpt"))
    async with app.run_test(size=(100, 30)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        out["tui_first"] = app.metric  # the only metric with values: the one shown
        await pilot.press("m")
        await pilot.pause()
        out["picker"] = list(app.screen.metrics)
        await pilot.press("escape")
        await pilot.pause()
        out["tui_total"] = int(app.table.total)

asyncio.run(tui())
print(json.dumps(out))
'''


def copy_with_toy(tmp: Path) -> Path:
    """The package as a tree of links, its metrics.py a copy with one record added to REGISTRY."""
    src = Path(dlpt.__file__).parent
    pkg = tmp / "dlpt"
    pkg.mkdir()
    for entry in src.iterdir():
        if entry.name not in ("metrics.py", "__pycache__", "collectors", "viewers"):
            (pkg / entry.name).symlink_to(entry)
    (pkg / "collectors").symlink_to(Path(dlpt.collectors.__file__).parent)
    (pkg / "viewers").symlink_to(Path(dlpt.viewers.__file__).parent)
    text = (src / "metrics.py").read_text()
    head = "REGISTRY = (\n"
    assert text.count(head) == 1
    (pkg / "metrics.py").write_text(text.replace(head, head + TOY))
    return pkg


def test_a_metric_added_to_the_registry_alone_reaches_every_view(tmp_path: Path) -> None:
    pkg = copy_with_toy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONSAFEPATH": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(pkg)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    # The report ranks by it: 7 and 3 toys, 70% and 30%, on their lines.
    rows = [ln for ln in out["report"].splitlines() if "toy.py:" in ln]
    assert len(rows) == 2 and "70.0%" in rows[0] and "toy.py:1" in rows[0] and "30.0%" in rows[1], out["report"]
    # Hotspots: the metric named, each line's value, a count (not microseconds).
    doc = out["hotspots"]
    assert doc["metric"] == "toy_count"
    assert [(h["line"], h["toy_count"], h["percent"]) for h in doc["hotspots"]] == [(1, 7.0, 70.0), (2, 3.0, 30.0)]
    # The HTML page offers it, with its unit and description.
    assert '"name": "toy_count", "unit": "count", "about": "toy things counted"' in out["html"].replace(
        '":"', '": "').replace('","', '", "'), out["html"][:2000]
    # The TUI shows it: the only metric with values, offered by the picker, totalled in the table.
    assert out["tui_first"] == "toy_count" and out["picker"] == ["toy_count"] and out["tui_total"] == 10
