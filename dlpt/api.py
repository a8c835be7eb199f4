"""The Python recording API:

    import dlpt
    with dlpt.profile("run.dlpt"):
        train_one_epoch()            # optimizer steps are counted for `steps=`
    for batch in loader:             # loops without an optimizer mark their steps
        infer(batch); dlpt.step()

torch is imported only when a recording starts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from dlpt.errors import notice

if TYPE_CHECKING:
    from dlpt.collectors.record.session import Recorder
    from dlpt.profile import Profile


def _parse_steps(steps: str | tuple[int, int] | None) -> tuple[int, int] | None:
    from dlpt.errors import DlptError

    if steps is None:
        return None
    if isinstance(steps, str):
        a, sep, b = steps.partition(":")
        try:
            lo, hi = int(a or 0), int(b)
        except ValueError:
            raise DlptError(f"steps {steps!r}: write A:B, for example 10:15 (steps 10 to 14)") from None
        if not sep:
            raise DlptError(f"steps {steps!r}: write A:B, for example 10:15 (steps 10 to 14)")
    else:
        lo, hi = int(steps[0]), int(steps[1])
    if lo < 0 or hi <= lo:
        raise DlptError(f"steps {lo}:{hi}: need 0 <= A < B")
    return lo, hi


# ----- signals while recording (docs/ROBUSTNESS.md) -----

class Abandon(BaseException):
    """A SIGINT or SIGTERM while the profile is being built or saved: give the save up.

    A BaseException, so that nothing between the handler and the store catches it; the store
    removes its temporary file on the way out, so no half-written profile is ever left."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class ProgramSignals:
    """While the program runs under the recorder (main thread only).

    SIGINT stays the program's KeyboardInterrupt, raised where the program is, as python does
    (the collector aggregates as the program runs, so no recorder work is ever cut in half).
    SIGTERM calls `on_terminate(signum)`, which saves the profile and ends the process as the
    unhandled signal would have. Handlers the program had already set are left
    alone, and a handler the program sets while it runs replaces ours: the program decides.
    """

    def __init__(self, on_terminate: Callable[[int], None] | None, then: Finishing | None = None) -> None:
        self.on_terminate = on_terminate
        self.then = then  # installed the moment the program ends, so that no signal falls between
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> ProgramSignals:
        if not _in_main_thread():
            return self
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.saved[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)
        if self.on_terminate is not None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.saved[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._terminate)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, old in self.saved.items():
            if signal.getsignal(signum) in (self._interrupt, self._terminate):
                signal.signal(signum, old)
        self.saved.clear()
        if self.then is not None:
            self.then.install()

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

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
        if not _in_main_thread():
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


def die_by_signal(signum: int) -> None:
    """End the process as an unhandled `signum` would: the parent sees "killed by SIGTERM"
    (a shell prints 143), and a shell loop stops on a Ctrl-C (bash stops a loop only when its
    child died by SIGINT); python itself ends so after an unhandled KeyboardInterrupt."""
    import time

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    time.sleep(1.0)  # delivered to another thread: the process is going down
    os._exit(128 + signum)  # the signal could not end us (ignored by a debugger?): its status


class profile:  # noqa: N801 - reads like torch.profiler.profile on purpose
    """Record the code inside the `with` block; save to `path` (if given) when it ends.

    `steps="A:B"` records steps A..B-1 only, counting optimizer steps or `dlpt.step()` calls;
    with a `path`, the profile so far is also written there every few seconds while the block
    runs, so a crash keeps it.
    After the block, `.result` is the `Profile` (also when the block raised).
    """

    def __init__(self, path: str | None = None, *, steps: str | tuple[int, int] | None = None,
                 force: bool = True, quiet: bool = False) -> None:
        self.path = path
        self.steps = _parse_steps(steps)
        self.force = force
        self.quiet = quiet
        self.result: Profile | None = None
        self._rec: Recorder | None = None
        self._signals = ProgramSignals(None)

    def __enter__(self) -> profile:
        from dlpt.collectors.record.session import Recorder
        from dlpt.ranks import rank_info, rank_output

        if self.path is not None:
            # Under torchrun every rank records: each writes its own file (run.rank1.dlpt).
            who = rank_info()
            self.path = rank_output(self.path, who["rank"], who["world_size"])

        if self.path is not None:
            from dlpt.store import check_output

            # Before the block runs: an existing file (without force), a missing or read-only
            # directory, a full disk — not after the work is done.
            check_output(self.path, self.force, hint="pass force=True to overwrite it")
        self._rec = Recorder(command=" ".join(sys.argv), name=self.path or "dlpt.profile",
                             steps=self.steps, quiet=self.quiet, snapshot_path=self.path)
        # SIGTERM saves the profile before the process ends, when the program left SIGTERM to
        # its default (which ends the process without running any Python code).
        self._signals = ProgramSignals(self._terminate if self.path is not None else None)
        self._signals.__enter__()
        try:
            self._rec.start()
        except BaseException:
            self._signals.__exit__()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        rec, self._rec = self._rec, None
        if rec is None:
            return
        self._signals.__exit__()
        self._finish(rec)

    def _finish(self, rec: Recorder) -> None:
        # A Ctrl-C while saving gives the save up (no half-written file) and reaches the
        # program as a KeyboardInterrupt; a SIGTERM gives it up and ends the process.
        try:
            with Finishing(only_default=True):
                self.result = rec.stop()
                if self.path is not None:
                    from dlpt.store import save

                    self.result.path = self.path
                    save(self.result, self.path, force=True)
        except Abandon as a:
            if a.signum == signal.SIGTERM:
                die_by_signal(a.signum)
            raise KeyboardInterrupt from None

    def _terminate(self, signum: int) -> None:
        rec, self._rec = self._rec, None
        if rec is not None:
            try:
                self._finish(rec)
                notice(f"{signal.Signals(signum).name}: profile saved to {self.path}")
            except KeyboardInterrupt:
                pass
            except Exception as e:  # noqa: BLE001 - the process ends next; say why nothing was saved
                notice(f"{signal.Signals(signum).name}: the profile could not be saved: {e}")
        die_by_signal(signum)


def step() -> None:
    """Mark the end of a step (a training or inference iteration) for `--steps`.

    Once called, optimizer steps no longer count: the program's own marks decide. Outside a
    recording it does nothing, so it may stay in the code.
    """
    from dlpt.collectors.record.session import active

    rec = active()
    if rec is not None:
        rec.step(explicit=True)
