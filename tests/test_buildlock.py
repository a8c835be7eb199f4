"""The collector build's own lock, with real processes: a live holder is waited for and named
(its pid, what it builds, again while the wait lasts; a long wait even with quiet), a dead one's
lock is taken at once, and torch's lock file left by an interrupted build goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from dlpt.collectors.record.buildlock import LOCK_NAME, QUIET_SAY_AFTER_S, build_lock

HOLD = """\
import sys, time
from dlpt.collectors.record.buildlock import build_lock
with build_lock(sys.argv[1], lambda m: None) as held:
    if sys.argv[2:] == ["build"]:
        held.building("a test build")
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(d: str, *how: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, d, *how], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _wait_behind(p: subprocess.Popen, d: str, hold_s: float, **how: Any) -> tuple[list[str], float]:
    """Take the lock behind holder `p`, which is ended after `hold_s`: what was said, how long it took."""
    said: list[str] = []

    def release() -> None:
        time.sleep(hold_s)
        p.send_signal(signal.SIGTERM)

    t = threading.Thread(target=release)
    t.start()
    t0 = time.monotonic()
    try:
        with build_lock(d, said.append, poll_s=0.05, **how):
            waited = time.monotonic() - t0
    finally:
        t.join()
        p.kill()
        p.wait()
    return said, waited


def test_a_build_under_way_is_said_at_once_naming_its_pid_and_again_while_it_lasts(tmp_path) -> None:
    d = str(tmp_path)
    p = _holder(d, "build")
    said, waited = _wait_behind(p, d, 1.2, say_every_s=0.3)
    assert waited >= 1.0
    first = f"waiting for the collector build by pid {p.pid} (`-c {d} build`; a test build; started "
    assert said[0].startswith(first) and said[0].endswith(" s ago)…"), said
    again = [m for m in said[1:-1] if m.startswith(f"still waiting for the collector build by pid {p.pid}: ") and m.endswith(" s so far…")]
    assert len(again) >= 2 and len(again) == len(said) - 2, said
    assert said[-1].startswith(f"done waiting for pid {p.pid} ("), said


def test_a_holder_that_only_loads_is_not_announced_unless_it_lasts(tmp_path) -> None:
    """A holder loading a finished build holds the lock for a moment: no notice for that; a
    wait that lasts is said, naming the pid, also with quiet (later)."""
    d = str(tmp_path)
    said, _ = _wait_behind(_holder(d), d, 0.1, say_after_s=2.0)
    assert said == []
    p = _holder(d)
    said, waited = _wait_behind(p, d, 1.5, quiet=True)
    assert waited >= 1.4 and said == []  # quiet: under QUIET_SAY_AFTER_S
    p = _holder(d)
    said, waited = _wait_behind(p, d, QUIET_SAY_AFTER_S + 1.0, quiet=True)
    assert said[0] == f"waiting for pid {p.pid}, which holds the build lock (`-c {d}`)…", said
    assert said[-1].startswith(f"done waiting for pid {p.pid} ("), said


def test_a_dead_holders_lock_is_taken_at_once_and_torchs_lock_goes(tmp_path) -> None:
    d = str(tmp_path)
    p = _holder(d)
    with open(os.path.join(d, "lock"), "w"):  # torch's lock, as an interrupted build leaves it
        pass
    p.kill()  # kill -9 mid-build: no cleanup of its own
    p.wait()
    said: list[str] = []
    t0 = time.monotonic()
    with build_lock(d, said.append):
        assert time.monotonic() - t0 < 1.0
        assert not os.path.exists(os.path.join(d, "lock"))
        assert open(os.path.join(d, LOCK_NAME)).read().split()[0] == str(os.getpid())
    assert not any(m.startswith("waiting") for m in said)
    assert any("removed the lock of an interrupted build" in m for m in said)


def test_an_interrupted_build_cleans_up_and_says_so(tmp_path) -> None:
    d = str(tmp_path)
    said: list[str] = []
    try:
        with build_lock(d, said.append):
            open(os.path.join(d, "lock"), "w").close()  # the build under way takes torch's lock
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert not os.path.exists(os.path.join(d, "lock"))
    assert said[-1] == "the collector build was interrupted; the next recording builds it again"


def test_a_waiter_whose_folder_is_removed_starts_over(tmp_path) -> None:
    """The builds clean-up removes an old build's folder, lock file included, while holding its
    lock: whoever waited on that lock takes a new one in a new folder, not the removed file."""
    import shutil

    from dlpt.collectors.record.buildlock import try_build_lock

    d = str(tmp_path / "build")
    os.makedirs(d)
    seen: list[bool] = []

    def wait() -> None:
        with build_lock(d, lambda m: None, poll_s=0.05):
            seen.append(os.path.exists(os.path.join(d, LOCK_NAME)))

    with try_build_lock(d) as held:
        assert held
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.3)
        assert seen == []  # waiting
        shutil.rmtree(d)
    t.join(10)
    assert seen == [True]
