"""One collector build at a time, and never a silent wait for a dead one.

torch's extension builder guards a build with a `lock` file that an interrupted build (Ctrl-C,
SIGTERM during dlpt's first recording) leaves behind; every later build then waits for it without
a word, up to its stale-lock limit. dlpt takes a lock of its own first: an `flock` on a file in the
build directory, which the kernel releases when its holder dies, holding the holder's pid and host
for the messages. Holding it, dlpt knows no other dlpt is building, so a torch `lock` file still
there is an interrupted build's and goes at once. Waiting on a live holder is said, and said
again while it lasts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator

LOCK_NAME = "dlpt-build.lock"
SAY_EVERY_S = 15.0


def _owner(path: str) -> str:
    try:
        with open(path) as f:
            pid, _, host = f.read().strip().partition(" ")
    except OSError:
        return "another process"
    here = socket.gethostname()
    return f"pid {pid}" + (f" on {host}" if host and host != here else "")


@contextlib.contextmanager
def build_lock(build_dir: str, say: Callable[[str], None], poll_s: float = 0.2) -> Iterator[None]:
    """Hold dlpt's build lock in `build_dir` for the block; `say` gets each notice."""
    os.makedirs(build_dir, exist_ok=True)
    path = os.path.join(build_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if waited is None or now - waited >= SAY_EVERY_S:
                    say(f"waiting for the collector build by {_owner(path)}…")
                    waited = now
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        stale = os.path.join(build_dir, "lock")  # torch's: no live dlpt holds it now
        if os.path.exists(stale):
            with contextlib.suppress(OSError):
                os.remove(stale)
                say(f"removed the lock of an interrupted build ({stale})")
        try:
            yield
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                os.remove(stale)  # our own half-made build's: the next recording builds again
            say("the collector build was interrupted; the next recording builds it again")
            raise
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing releases the flock
