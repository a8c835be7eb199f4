"""Signals while recording (docs/ROBUSTNESS.md): while the program runs, and while its profile
is built and saved.

The handlers are installed from the main thread only (Python runs signal handlers there).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any


class Abandon(BaseException):
    """A SIGINT or SIGTERM while the profile is being built or saved: give the save up.

    A BaseException, so that nothing between the handler and the store catches it; the store
    removes its temporary file on the way out, so no half-written profile is ever left."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class ProgramSignals:
    """While the program runs under the recorder (main thread only).

    SIGINT stays the program's KeyboardInterrupt, raised where the program is by Python's own
    handler (so no frame of dlpt's shows in the program's traceback; the collector aggregates
    as the program runs, so no recorder work is ever cut in half).
    SIGTERM calls `on_terminate(signum)`, which saves the profile and ends the process as the
    unhandled signal would have. A handler the program had already set is left alone, and one
    the program sets while it runs replaces ours: the program decides.
    """

    def __init__(self, on_terminate: Callable[[int], None] | None, then: Finishing | None = None) -> None:
        self.on_terminate = on_terminate
        self.then = then  # installed the moment the program ends, so that no signal falls between
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> ProgramSignals:
        if not in_main_thread():
            return self
        if self.on_terminate is not None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.saved[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._terminate)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, old in self.saved.items():
            if signal.getsignal(signum) == self._terminate:
                signal.signal(signum, old)
        self.saved.clear()
        if self.then is not None:
            self.then.install()

    def _terminate(self, signum: int, frame: FrameType | None) -> None:
        assert self.on_terminate is not None
        self.__exit__()
        self.on_terminate(signum)


class Finishing:
    """While the profile is built and saved (main thread only): SIGINT or SIGTERM raise
    `Abandon`, so the save stops cleanly and says so. With `only_default`, handlers that the
    program set are kept (the Python API runs inside the user's program)."""

    def __init__(self, only_default: bool = False) -> None:
        self.only_default = only_default
        self.saved: dict[int, Any] = {}

    def install(self) -> None:
        if not in_main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            current = signal.getsignal(signum)
            if current is self._abandon or current == signal.SIG_IGN:
                continue  # ignored (nohup, a batch system): it stays ignored
            if self.only_default and current not in (signal.SIG_DFL, signal.default_int_handler):
                continue
            old = signal.signal(signum, self._abandon)
            self.saved.setdefault(signum, old)

    def __enter__(self) -> Finishing:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, old in self.saved.items():
            if signal.getsignal(signum) is self._abandon:
                signal.signal(signum, old)
        self.saved.clear()

    @staticmethod
    def _abandon(signum: int, frame: FrameType | None) -> None:
        raise Abandon(signum)


def signal_name(signum: int) -> str:
    return "interrupted (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


def die_by_signal(signum: int, flush: bool = True) -> None:
    """End the process as an unhandled `signum` would: the parent sees "killed by SIGTERM"
    (a shell prints 143), and a shell loop stops on a Ctrl-C (bash stops a loop only when its
    child died by SIGINT); python itself ends so after an unhandled KeyboardInterrupt.
    `flush=False` in a forked child: the default action flushes nothing, and the child's buffers
    may still hold what its parent wrote before the fork."""
    import time

    for stream in (sys.stdout, sys.stderr) if flush else ():
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(1.0)  # delivered to another thread: the process is going down
    os._exit(128 + signum)  # the signal could not end us (ignored by a debugger?): its status
