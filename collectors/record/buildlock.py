"""One collector build at a time, and never a silent wait for a dead one, or a long one.

torch's extension builder guards a build with a `lock` file that an interrupted build (Ctrl-C,
SIGTERM during dlpt's first recording) leaves behind; every later build then waits for it without
a word, up to its stale-lock limit. dlpt takes a lock of its own first: an `flock` on a file in the
build directory, which the kernel releases when its holder dies, holding the holder's pid, host
and what it is doing for the messages. Holding it, dlpt knows no other dlpt is building, so a
torch `lock` file still there is an interrupted build's and goes at once.

A wait says whose lock it waits for (pid, and host when another) and what that process is doing,
and says it again while it lasts: at once when the holder is building, after `SAY_AFTER_S` when
it only checks and loads a finished build (that takes well under a second, and a notice for it
would be noise), and with `quiet` only once it has lasted `QUIET_SAY_AFTER_S` — a recording
that sits still for seconds says why even when asked to be quiet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator

LOCK_NAME = "dlpt-build.lock"
SAY_AFTER_S = 1.0
QUIET_SAY_AFTER_S = 3.0
SAY_EVERY_S = 10.0


class Holder:
    """The held lock: `building` tells waiters that a build (tens of seconds) is under way."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._write("checking", "")

    def building(self, what: str) -> None:
        self._write("building", what)

    def _write(self, state: str, what: str) -> None:
        # One line each: who, what it does, since when (wall clock: a waiter may be on another
        # host sharing the cache folder), what it builds, and its command, for the waiter to name.
        text = (f"{os.getpid()} {socket.gethostname()}\n{state} {time.time():.0f}\n{what}\n"
                f"{' '.join(sys.argv)[:120]}\n")
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, text.encode(), 0)


class _Owner:
    """What the lock file says about its holder (blank fields when it is being rewritten)."""

    def __init__(self, path: str) -> None:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        lines += [""] * (4 - len(lines))
        pid, _, host = lines[0].strip().partition(" ")
        state, _, since = lines[1].strip().partition(" ")
        self.pid = pid
        self.building = state == "building"
        self.what = lines[2].strip()
        self.command = lines[3].strip()
        try:
            self.since: float | None = float(since)
        except ValueError:
            self.since = None
        here = socket.gethostname()
        self.name = (f"pid {pid}" + (f" on {host}" if host and host != here else "")) if pid else "another process"

    def describe(self, short: bool = False) -> str:
        out = f"the collector build by {self.name}" if self.building else f"{self.name}, which holds the build lock"
        if short:
            return out
        details = [d for d in (self.command and f"`{self.command}`", self.what) if d]
        if self.building and self.since is not None:
            details.append(f"started {max(0.0, time.time() - self.since):.0f} s ago")
        return out + (f" ({'; '.join(details)})" if details else "")


def _same_file(path: str, fd: int) -> bool:
    """Whether `path` still names the file `fd` holds: a builds clean-up removes a whole build
    folder, lock file included, while holding its lock, and whoever waited on that lock must
    then start over in a new folder rather than build in a deleted one."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


@contextlib.contextmanager
def build_lock(build_dir: str, say: Callable[[str], None], poll_s: float = 0.2, quiet: bool = False,
               say_after_s: float | None = None, say_every_s: float = SAY_EVERY_S) -> Iterator[Holder]:
    """Hold dlpt's build lock in `build_dir` for the block; `say` gets each notice. A wait is
    said after `say_after_s` (default: at once for a build, SAY_AFTER_S otherwise, and
    QUIET_SAY_AFTER_S with `quiet`), then every `say_every_s` while it lasts."""
    path = os.path.join(build_dir, LOCK_NAME)
    t0 = time.monotonic()
    said = None  # when the last notice was said
    owner = None
    while True:
        os.makedirs(build_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    owner = _Owner(path)
                    now = time.monotonic()
                    after = say_after_s if say_after_s is not None else (
                        QUIET_SAY_AFTER_S if quiet else 0.0 if owner.building else SAY_AFTER_S)
                    if said is None and now - t0 >= after:
                        say(f"waiting for {owner.describe()}…")
                        said = now
                    elif said is not None and now - said >= say_every_s:
                        say(f"still waiting for {owner.describe(short=True)}: {now - t0:.0f} s so far…")
                        said = now
                    time.sleep(poll_s)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(path, fd):
            break
        os.close(fd)  # its folder was removed while we waited: start over in a new one
    try:
        if said is not None and owner is not None:
            say(f"done waiting for {owner.name} ({time.monotonic() - t0:.0f} s)")
        holder = Holder(fd)
        stale = os.path.join(build_dir, "lock")  # torch's: no live dlpt holds it now
        if os.path.exists(stale):
            with contextlib.suppress(OSError):
                os.remove(stale)
                say(f"removed the lock of an interrupted build ({stale})")
        try:
            yield holder
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                os.remove(stale)  # our own half-made build's: the next recording builds again
            say("the collector build was interrupted; the next recording builds it again")
            raise
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def try_build_lock(build_dir: str) -> Iterator[bool]:
    """The build lock of `build_dir` if no one holds it (True), else nothing (False) — for
    removing an old build, which must not pull a folder from under a process using it."""
    path = os.path.join(build_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield _same_file(path, fd)
    finally:
        os.close(fd)
