"""The collector build's own lock, with real processes: a live holder is waited for and named, a
dead one's lock is taken at once, and torch's lock file left by an interrupted build goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from dlpt.collectors.record.buildlock import LOCK_NAME, build_lock

HOLD = """\
import sys, time
from dlpt.collectors.record.buildlock import build_lock
with build_lock(sys.argv[1], lambda m: None):
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(d: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, d], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_live_holder_is_waited_for_and_named(tmp_path) -> None:
    d = str(tmp_path)
    p = _holder(d)
    said: list[str] = []
    try:
        import threading

        def release() -> None:
            time.sleep(0.6)
            p.send_signal(signal.SIGTERM)

        threading.Thread(target=release).start()
        t0 = time.monotonic()
        with build_lock(d, said.append, poll_s=0.05):
            waited = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    assert waited >= 0.5
    assert said and said[0] == f"waiting for the collector build by pid {p.pid}…"


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
