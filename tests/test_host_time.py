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


# How far each stretch's host time may be from the program's own timer: (relative, absolute in s),
# the larger of the two. The errors measured on a loaded 2-core machine (1 ms ticks, 27 runs of
# PROGRAM, 6 of them with DLPT_DIAG=samplergil) are sampling errors, a few ticks that came late
# or fell on the line beside: sleep -2.6..+7.0 ms (3.5%); prep -26..+5 ms (8.3%); thread_sleep
# -24..-4 ms (9.3%: a new thread is found by a scan every 16 ticks); matmul -8.6..-0.7 ms, which
# is 15% of its shortest run (its 200 matmuls took 30 ms to 1.5 s as the machine's load went),
# under 3.3% of any run over 0.1 s. So matmul gets 20 ms or 5%, not a share alone.
TOLERANCE = {"sleep": (0.08, 0.0), "prep": (0.15, 0.0), "matmul": (0.05, 0.02), "thread_sleep": (0.1, 0.0)}


def test_host_time_on_the_lines_that_spent_it(recorded: tuple[dlpt.Profile, dict, Path]) -> None:
    prof, truth, tmp = recorded
    text = (tmp / "prog.py").read_text()
    got = _by_line(prof)
    for marker, key in (("# SLEEP", "sleep"), ("# PREP", "prep"), ("# MATMUL", "matmul"),
                        ("# THREAD_SLEEP", "thread_sleep")):
        line = _line(text, marker)
        # The pure-Python loop hands the GIL to the sampler at its loop head or its calls: its
        # time may sit on the `while` line above the marker, so the function's lines count.
        lines = {line, line - 1} if key == "prep" else {line}
        have = sum(got.get(n, 0) for n in lines) / 1e9
        rel, abs_ = TOLERANCE[key]
        assert have == pytest.approx(truth[key], rel=rel, abs=abs_), (key, have, truth[key], got)


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
    # Two threads: the main thread's, which holds the window (test_oracles: 99-100% of it), and
    # the loader's, which only sleeps. Measured in 27 runs (see TOLERANCE): 97.6-99.8% of the
    # window plus the loader's sleep, the missing part the loader's (found up to 16 ticks late).
    both = wall + truth["thread_sleep"] * 1e9
    assert 0.95 * both <= inc[0] <= 1.02 * both, (inc[0], wall, truth)


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
    # Reads with the GIL: other threads' (a pytest-xdist worker has its execnet thread, read every
    # 4 ticks), the scans (every 16) and ticks that found no op since the last (a main thread
    # descheduled for a whole tick: the others are read then). Measured: 0.064 of the peeks outside
    # pytest (the scans alone; 3 runs), about 0.31 expected in an xdist worker, 0.38 and 0.59 there
    # beside a mutation run (the earlier bound, a third, failed twice); reading the main thread
    # with the GIL would make them one a tick or more.
    assert snap["samples"] < snap["peek_samples"], (snap["peek_samples"], snap["samples"])
    lines = _by_line(prof, os.path.basename(__file__))
    line = loop.__code__.co_firstlineno + 3  # the `x.add_(1)` line
    on_loop = lines.get(line, 0) + lines.get(line - 1, 0)  # the `while` line takes its checks' samples
    assert on_loop / 1e9 == pytest.approx(wall, rel=0.15), (lines, wall)


def _record(tmp: Path, program: str) -> tuple[dlpt.Profile, dict, str]:
    (tmp / "prog.py").write_text(textwrap.dedent(program))
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "--force", "-o", "run.dlpt", "prog.py",
                        "truth.json"], cwd=tmp, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dlpt.load(str(tmp / "run.dlpt")), json.loads((tmp / "truth.json").read_text()), (tmp / "prog.py").read_text()


# A matmul and two small lines, each timed by the program: a top-level op entered once a sample
# was due took the whole period before it (the op callback's own sample, before peek.h), which
# put most of the matmul's time on the `w =` line after it.
MATMUL_LOOP = """\
import json, sys, time
import torch
torch.set_num_threads(1)
x = torch.randn(200, 200)
pc, t = time.perf_counter, [0.0, 0.0, 0.0]
for _ in range(5000):
    a = pc()
    y = x @ x  # MATMUL
    b = pc()
    w = x[0, 0] * 2  # W
    c = pc()
    z = y[0, 0] * 3  # Z
    d = pc()
    t[0] += b - a; t[1] += c - b; t[2] += d - c
json.dump(t, open(sys.argv[1], "w"))
"""


def test_a_matmul_loop_puts_host_time_on_the_matmul_line(tmp_path: Path) -> None:
    prof, truth, text = _record(tmp_path, MATMUL_LOOP)
    got = _by_line(prof)
    have = [got.get(_line(text, m), 0) for m in ("# MATMUL", "# W", "# Z")]
    share, true_share = have[0] / sum(have), truth[0] / sum(truth)
    # The program's own timers put 82-87% of the three lines' time on the matmul under recording on
    # a 2-core machine (89% unprofiled: the recorder's per-op cost falls on the two small lines);
    # dlpt's share differed from them by -1.6 to +0.7 points in 10 runs (the sampler before peek.h:
    # 3-13% on the matmul, 76-94% on `w =`). So: 85% where the truth allows it, and within 5 points
    # of the truth.
    assert share >= min(0.85, true_share - 0.05), (share, true_share, have)
    assert abs(share - true_share) <= 0.05, (share, true_share, have)


# Short stretches between torch ops, each shorter than the switch interval (5 ms) and repeated:
# a sleep, pure Python (holds the GIL throughout), tiny ops. A read with the GIL saw the pure
# Python only once it let go of the GIL, at the next line's first op, so its time went there.
SHORT_STRETCHES = """\
import json, sys, time
import torch
x = torch.zeros(8)
pc, t = time.perf_counter, {"sleep": 0.0, "busy": 0.0, "ops": 0.0}
for _ in range(20):
    t0 = pc()
    time.sleep(0.004)  # SLEEP
    t1 = pc()
    while pc() - t1 < 0.002: pass  # BUSY
    t2 = pc()
    for _ in range(300): x.add_(1)  # OPS
    t3 = pc()
    t["sleep"] += t1 - t0; t["busy"] += t2 - t1; t["ops"] += t3 - t2
json.dump(t, open(sys.argv[1], "w"))
"""


@pytest.mark.machine_alone  # ticks come late with another recording beside it (it skipped in 4 of 6 runs)
def test_short_stretches_get_their_own_time(tmp_path: Path) -> None:
    prof, truth, text = _record(tmp_path, SHORT_STRETCHES)
    # Ticks more than half a period late: this machine's cores were busy (another recording beside
    # this one) and the sampler waited for one; starved through a 2 ms stretch, it misses it
    # whatever it reads (measured: 3-10% of ticks late, pure Python -20..-95%). Once more, else
    # skip. Not where the main thread was read with the GIL: there a tick waits for the GIL, and
    # what it then reads is the fault this test is for.
    for attempt in range(2):
        sampler, window = prof.meta["host_sampler"], prof.meta["window"]
        if sampler.get("main_thread", "gil") == "gil" or \
                sampler["late"] <= 0.01 * (window["end"] - window["start"]) / sampler["period_ns"]:
            break
        if attempt == 1:
            pytest.skip(f"the sampler's ticks came late ({sampler}): this machine's cores are busy")
        prof, truth, text = _record(tmp_path, SHORT_STRETCHES)
    # The error measured in 12 runs on 2 cores at 1 ms (about 40 ticks on each line: a sampling
    # error): sleep -4.3..+2.9%, busy -5.2..+5.5%, ops -6.4..+7.5%; the sampler before peek.h:
    # sleep -12..-15%, busy -100%, ops +92..+216% (the pure Python's time on the ops line). The ops
    # line comes right after the pure Python: its bound is also "no more than its own time".
    # The sleep's bound is three times its largest quiet error (4.3%): under CI's load it read
    # +10.2% and +10.6% (two CI runs) with too few late ticks to skip, where 9% failed; the busy
    # line read +13.5% once (2026-11-28, the suite alone on this machine's 2 cores). So a
    # recording with a line out of bounds is made once more, as the next test does: a sampler
    # that misplaces time (the faults above: -100%, +92% and more) does so in both.
    bounds = (("sleep", "# SLEEP", 0.13), ("busy", "# BUSY", 0.12), ("ops", "# OPS", 0.15))
    for attempt in range(2):
        got = _by_line(prof)
        checks = [(key, got.get(_line(text, marker), 0) / 1e9, tol) for key, marker, tol in bounds]
        if attempt == 1 or all(have == pytest.approx(truth[key], rel=tol) for key, have, tol in checks):
            break
        prof, truth, text = _record(tmp_path, SHORT_STRETCHES)
    for key, have, tol in checks:
        assert have == pytest.approx(truth[key], rel=tol), (key, have, truth[key], got)


def test_the_sampler_reading_every_thread_with_the_gil_puts_time_on_the_same_lines(tmp_path: Path) -> None:
    # DLPT_DIAG=samplergil: the sampler reads the main thread with the GIL too, at every tick (the
    # comparison); long stretches' lines get the same time within the tolerances above.
    # Recorded once more when a line is out of bounds: in 2 of 5 CI runs on the 2-core machine
    # (2026-11-28) the sleep read +13.0% and +22.7% once, a tick waiting for the GIL through the
    # load of the moment; a sampler that misplaces time does so in both recordings.
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "DLPT_DIAG": "samplergil"}
    for attempt in range(2):
        r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "--force", "-o", "run.dlpt", "prog.py",
                            "truth.json"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        prof, truth = dlpt.load(str(tmp_path / "run.dlpt")), json.loads((tmp_path / "truth.json").read_text())
        got, text = _by_line(prof), (tmp_path / "prog.py").read_text()
        checks = [(key, got.get(_line(text, marker), 0) / 1e9, *TOLERANCE[key])
                  for marker, key in (("# SLEEP", "sleep"), ("# MATMUL", "matmul"))]
        if attempt == 1 or all(v == pytest.approx(truth[k], rel=rel, abs=abs_) for k, v, rel, abs_ in checks):
            break
    for key, v, rel, abs_ in checks:
        assert v == pytest.approx(truth[key], rel=rel, abs=abs_), (key, got)
