"""host_time on the CPU build of torch: the sampler puts the program's wall-clock time on its
lines — pure Python, sleeps and ops alike — checked against the program's own timers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

import dlpt  # noqa: E402
from dlpt.metrics import COL  # noqa: E402
from dlpt.transforms import hide_library_unless  # noqa: E402
from dlpt.views import flat  # noqa: E402

PROGRAM = """\
import json, sys, threading, time
import torch

def preprocess(n):
    t0 = time.perf_counter()
    out = []
    while time.perf_counter() - t0 < 0.3:
        out.append(sum(range(50)))  # PREP
    return out, time.perf_counter() - t0

def worker(box):
    t0 = time.perf_counter()
    time.sleep(0.25)  # THREAD_SLEEP
    box.append(time.perf_counter() - t0)

x = torch.randn(256, 256)
truth = {}
box = []
th = threading.Thread(target=worker, args=(box,), name="loader")
th.start()
_, truth["prep"] = preprocess(10)
t0 = time.perf_counter()
time.sleep(0.2)  # SLEEP
truth["sleep"] = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(200):
    y = x @ x  # MATMUL
truth["matmul"] = time.perf_counter() - t0
th.join()
truth["thread_sleep"] = box[0]
json.dump(truth, open(sys.argv[1], "w"))
"""


def _line(text: str, marker: str) -> int:
    return next(i for i, t in enumerate(text.splitlines(), 1) if marker in t)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dlpt.Profile, dict, Path]:
    tmp = tmp_path_factory.mktemp("host")
    (tmp / "prog.py").write_text(textwrap.dedent(PROGRAM))
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", "prog.py", "truth.json"],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dlpt.load(str(tmp / "run.dlpt")), json.loads((tmp / "truth.json").read_text()), tmp


def _by_line(prof: dlpt.Profile, name: str = "prog.py") -> dict[int, int]:
    fv = flat(hide_library_unless(prof, False), "line")
    return {fr.line: int(fv.exclusive[g, COL["host_time"]]) for g, fr in enumerate(fv.frame)
            if fr.kind == "python" and os.path.basename(fr.file) == name}


def test_host_time_on_the_lines_that_spent_it(recorded: tuple[dlpt.Profile, dict, Path]) -> None:
    prof, truth, tmp = recorded
    text = (tmp / "prog.py").read_text()
    got = _by_line(prof)
    for marker, key, tol in (("# SLEEP", "sleep", 0.1), ("# PREP", "prep", 0.15), ("# MATMUL", "matmul", 0.25),
                             ("# THREAD_SLEEP", "thread_sleep", 0.1)):
        line = _line(text, marker)
        # The pure-Python loop hands the GIL to the sampler at its loop head or its calls: its
        # time may sit on the `while` line above the marker, so the function's lines count.
        lines = {line, line - 1} if key == "prep" else {line}
        have = sum(got.get(n, 0) for n in lines) / 1e9
        assert have == pytest.approx(truth[key], rel=tol), (key, have, truth[key], got)


def test_thread_host_time_sits_under_its_thread(recorded: tuple[dlpt.Profile, dict, Path]) -> None:
    prof, _, tmp = recorded
    line = _line((tmp / "prog.py").read_text(), "# THREAD_SLEEP")
    col = prof.cct.exclusive[:, COL["host_time"]]
    nodes = [i for i in range(len(prof.cct)) if prof.frames[prof.cct.frame[i]].line == line
             and prof.frames[prof.cct.frame[i]].file.endswith("prog.py") and col[i] > 0]
    assert nodes
    for i in nodes:
        kinds = [prof.frames[prof.cct.frame[p]].name for p in prof.cct.path(i)]
        assert any(k.startswith("[thread loader") for k in kinds), kinds


def test_host_time_is_conserved_and_bounded_by_the_window(recorded: tuple[dlpt.Profile, dict, Path]) -> None:
    prof, truth, _ = recorded
    inc = prof.cct.inclusive[:, COL["host_time"]]
    exc = prof.cct.exclusive[:, COL["host_time"]]
    assert inc[0] == exc.sum()  # inclusive at the root = every node's own
    for i in range(len(prof.cct)):  # inclusive = exclusive + children, everywhere
        kids = prof.cct.children(i)
        assert inc[i] == exc[i] + sum(int(inc[k]) for k in kids)
    win = prof.meta["window"]
    wall = win["end"] - win["start"]
    main_thread = sum(truth[k] for k in ("prep", "sleep", "matmul")) * 1e9
    assert wall >= main_thread
    # Two threads: the main thread's time plus the loader's sleep, no more than both windows.
    assert main_thread * 0.9 <= inc[0] <= 2 * wall


def test_the_main_thread_is_read_without_the_gil() -> None:
    # The sampler reads the main thread's frames without the GIL at every tick (host.h, peek.h):
    # nearly a sample a period, hardly any read with the GIL (a scan for new threads every 16
    # ticks), and the time lands on the line that ran.
    import time

    import torch

    from dlpt.collectors.record.session import Recorder

    def loop() -> float:
        x, t0 = torch.ones(8), time.perf_counter()
        while time.perf_counter() - t0 < 0.4:
            x.add_(1)  # LOOP
        return time.perf_counter() - t0

    rec = Recorder(command="test", quiet=True)
    rec.start()
    try:
        wall = loop()
        snap = rec.mod.host_snapshot()
    finally:
        prof = rec.stop()
    period = prof.meta["host_sampler"]["period_ns"]
    assert snap["peek_samples"] >= 0.25 * wall * 1e9 / period, (snap["peek_samples"], snap["samples"])
    assert snap["samples"] < snap["peek_samples"] / 4, (snap["peek_samples"], snap["samples"])
    lines = _by_line(prof, os.path.basename(__file__))
    line = loop.__code__.co_firstlineno + 3  # the `x.add_(1)` line
    on_loop = lines.get(line, 0) + lines.get(line - 1, 0)  # the `while` line takes its checks' samples
    assert on_loop / 1e9 == pytest.approx(wall, rel=0.15), (lines, wall)


def test_the_sampler_reading_every_thread_with_the_gil_puts_time_on_the_same_lines(tmp_path: Path) -> None:
    # DLPT_DIAG=samplergil: the sampler reads the main thread too, as before self-sampling; the
    # same program's lines get the same time within the tolerances above.
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "DLPT_DIAG": "samplergil"}
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "-o", "run.dlpt", "prog.py", "truth.json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    prof, truth = dlpt.load(str(tmp_path / "run.dlpt")), json.loads((tmp_path / "truth.json").read_text())
    got, text = _by_line(prof), (tmp_path / "prog.py").read_text()
    for marker, key, tol in (("# SLEEP", "sleep", 0.1), ("# MATMUL", "matmul", 0.25)):
        assert got.get(_line(text, marker), 0) / 1e9 == pytest.approx(truth[key], rel=tol), (key, got)
