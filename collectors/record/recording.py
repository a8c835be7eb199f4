"""One recording from the first check to the saved file, for `dlpt.profile` and `dlpt record`
alike (as memray's `run` drives `Tracker`): pre-flight checks, the recorder, signals, stop,
save and what the user is told.

    rec = Recording(out, command=..., name=..., owns_process=True)   # checks OUT now
    rec.start()          # the collector on, SIGTERM saves
    ...the program runs...
    rec.program_ended()  # signals back; a signal now abandons the save
    status = rec.finish(status, signum)

`owns_process`: dlpt record runs the program inside dlpt (signals are dlpt's to take, the exit
status is reported, an empty recording writes nothing); `dlpt.profile` runs inside the user's
program (only default handlers are replaced, and the profile is always kept in `.result`).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

import numpy as np

from dlpt.collectors.record.signals import Abandon, Finishing, ProgramSignals, die_by_signal, signal_name
from dlpt.errors import DlptError, notice
from dlpt.metrics import COL

if TYPE_CHECKING:
    from dlpt.collectors.record.session import Recorder
    from dlpt.profile import Profile


def parse_steps(steps: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """`"A:B"` (or `(A, B)`) → the steps to record, A..B-1; None records everything."""
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


def output_path(out: str | None, default_name: str | None = None) -> str | None:
    """Where this process writes: under torchrun each rank its own file (run.rank1.dlpt), and
    with no OUT the default name when one is given (dlpt-<name>.<pid>.dlpt)."""
    from dlpt.collectors.record.rank_env import default_output, rank_info, rank_output

    who = rank_info()
    if out:
        return rank_output(out, who["rank"], who["world_size"])
    return default_output(default_name, who) if default_name else None


class Recording:
    """A recording's lifecycle; see the module's docstring."""

    def __init__(self, out: str | None, *, command: str, name: str, owns_process: bool,
                 steps: tuple[int, int] | None = None, force: bool = False, quiet: bool = False,
                 drop_files: tuple[str, ...] = (), snapshot_seconds: float | None = None,
                 hint: str = "use --force to overwrite it", start_line: str | None = None) -> None:
        self.out = out
        self.command = command
        self.name = name
        self.owns_process = owns_process
        self.steps = steps
        self.quiet = quiet
        self.drop_files = drop_files
        self.snapshot_seconds = snapshot_seconds
        self.start_line = start_line  # said once the collector is built, as recording begins
        self.recorder: Recorder | None = None
        self.abandoned_by: int | None = None  # the signal that gave the save up
        self.result: Profile | None = None
        if out is not None:
            from dlpt.store import check_output

            # Before the program runs: an existing file (without force), a missing or read-only
            # directory, a nearly full disk — not after the work is done.
            check_output(out, force, hint=hint)
        self.before = _identity(out) if out is not None else None
        self.finishing = Finishing(only_default=not owns_process)
        self.signals = ProgramSignals(None)
        self.started: Recorder | None = None  # kept after the save, unlike `recorder`: who started it

    # ----- while the program runs -----

    def start(self) -> None:
        """Build the recorder (the native collector, once per torch), then switch it on. SIGTERM
        then saves the profile before the process ends, when the program left SIGTERM to its
        default (which ends the process without running any Python code)."""
        from dlpt.collectors.record.session import SNAPSHOT_SECONDS, Recorder

        seconds = SNAPSHOT_SECONDS if self.snapshot_seconds is None else self.snapshot_seconds
        self.recorder = self.started = Recorder(command=self.command, name=self.name, steps=self.steps,
                                                quiet=self.quiet, drop_files=self.drop_files,
                                                snapshot_path=self.out, snapshot_seconds=seconds)
        # dlpt record takes over SIGINT/SIGTERM the moment the program ends, so that no signal
        # falls between; the Python API only when the block is done.
        self.signals = ProgramSignals(self._terminate if self.out is not None else None,
                                      self.finishing if self.owns_process else None)
        if self.start_line:
            notice(self.start_line)
        self.signals.__enter__()
        try:
            self.recorder.start()
        except BaseException:
            self.signals.__exit__()
            raise

    def program_ended(self) -> None:
        self.signals.__exit__()

    # ----- the end -----

    def in_forked_child(self) -> bool:
        """Whether this is a child the program forked while recording (a DataLoader worker, a
        fork pool's process, a bare os.fork): the recording and its profile are the parent's,
        so the child neither stops, saves nor says anything (collectors/native/collector.cpp
        `after_fork_in_child` switched its collector off)."""
        return self.started is not None and self.started.in_forked_child()

    def finish(self, status: int = 0, signum: int | None = None) -> int:
        """Stop, build and save; the exit status dlpt should give. A signal while saving gives
        the save up (no half-written file): dlpt record says so and ends by it; inside the
        user's program a Ctrl-C reaches the program as a KeyboardInterrupt and a SIGTERM ends
        the process."""
        if self.in_forked_child():
            self.recorder = None
            return status
        try:
            with self.finishing:
                if signum is not None and self.owns_process:
                    notice(f"saving what was recorded to {self.out} (Ctrl-C again to abandon it)")
                return self._save(status, signum)
        except Abandon as a:
            if self.owns_process:
                self.abandoned(a.signum)
                return 128 + a.signum
            if a.signum == signal.SIGTERM:
                die_by_signal(a.signum)
            raise KeyboardInterrupt from None

    def _save(self, status: int, signum: int | None) -> int:
        """When the profile cannot be saved, or there is none (nothing recorded), a failed
        program keeps its own status (its failure is the news); a program that succeeded gives
        2, so that a script relying on the profile does not go on as if it existed."""
        from dlpt.store import save

        rec, self.recorder = self.recorder, None
        if rec is None or self.in_forked_child():
            return status  # a child the program forked: the profile is its parent's to save
        if not self.owns_process:
            self.result = rec.stop()
            # The Python API hands the profile back whatever it holds (the caller may look at an
            # empty one), but a window the program never reached is said, as dlpt record says it.
            if rec.steps is not None and rec.step_count < rec.steps[0]:
                notice(f"nothing recorded: {_why_empty(rec.steps, rec.step_count)}")
            if self.out is not None:
                self.result.path = self.out
                save(self.result, self.out, force=True)
            return status
        failed = status if status != 0 else 2
        try:
            prof = rec.stop()
        except Exception as e:  # noqa: BLE001 - a bug in dlpt must not take the program's status
            notice(f"could not build the profile ({type(e).__name__}: {e}); nothing saved. "
                   "Please report this with the command line.")
            return failed
        assert self.out is not None  # dlpt record always has its OUT
        self.result = prof
        prof.path = self.out
        # The sampler's host time alone (an import, a print caught by a sample) is not a recording
        # of PyTorch work: without any op, GPU activity or wait, no profile is written. Nor when
        # the --steps window never opened (the collector was never on). Either is a failure like
        # a failed save: a script that goes on to read the profile must not think it exists.
        never_opened = rec.steps is not None and rec.step_count < rec.steps[0]
        if never_opened or not np.delete(prof.cct.exclusive, [COL["host_time"]], axis=1).any():
            self._discard_snapshot()
            notice(f"nothing recorded, no profile written: {_why_empty(rec.steps, rec.step_count)}")
            return failed
        prof.meta.exit_status = status
        if signum is not None:
            prof.meta.ended_by = signal_name(signum)
        try:
            save(prof, self.out, force=True)  # the pre-flight check ran before the program: its result is ours
        except DlptError as e:
            kept = f"; {self.out} keeps its previous contents" if self.before else ""
            notice(f"the profile could not be saved: {e}{kept}")
            return failed
        n = int(prof.activities.count.sum()) if prof.activities.count is not None else len(prof.activities.node)
        notice(f"profile saved to {self.out} ({n:,} GPU activities, {len(prof.cct):,} nodes; "
               f"post-processing {rec.post_seconds:.2f} s)")
        notice(f"view it with: dlpt view {self.out}")
        return status

    def _discard_snapshot(self) -> None:
        """Remove a snapshot this run wrote where no file was before (an empty recording)."""
        if self.out is not None and self.before is None and _identity(self.out) is not None:
            try:
                os.remove(self.out)
            except OSError:
                pass

    def abandoned(self, signum: int) -> None:
        from dlpt.output import remove_temp_files

        assert self.out is not None
        self.abandoned_by = signum
        # The store removes its temporary file as the interrupt passes through it; this also
        # catches one the signal cut off between its creation and the store's cleanup.
        remove_temp_files(os.path.dirname(os.path.abspath(self.out)), pid=os.getpid())
        what = signal_name(signum)
        now = _identity(self.out)
        if now is not None and now != self.before:
            notice(f"{what} after the profile was saved to {self.out}")
        elif self.before is not None:
            notice(f"{what} while saving: the profile was not saved; {self.out} keeps its previous contents")
        else:
            notice(f"{what} while saving: the profile was not saved")

    def _terminate(self, signum: int) -> None:
        """SIGTERM while the program runs: save, then end as the unhandled signal would have.

        Run inside the signal handler, on top of the program's frames, without unwinding them:
        with no handler of its own the program would have ended right there, running none of
        its `finally` blocks or exit handlers, and neither does it here. Dying by the signal
        (not exit 143) is what a wrapper like `time` or `timeout` passes on: the parent — a
        shell, a batch scheduler — sees "terminated by SIGTERM" as it would without dlpt."""
        if self.in_forked_child():
            die_by_signal(signum, flush=False)  # a child the program forked (a fork pool's process ended by its parent)
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        if self.owns_process:
            notice(f"{signal_name(signum)}: saving what was recorded to {self.out}")
            self.finishing.install()
            try:
                self._save(128 + signum, signum)
            except Abandon as a:
                self.abandoned(a.signum)
            die_by_signal(signum)
        try:
            self.finish()
            notice(f"{signal.Signals(signum).name}: profile saved to {self.out}")
        except KeyboardInterrupt:
            pass
        except Exception as e:  # noqa: BLE001 - the process ends next; say why nothing was saved
            notice(f"{signal.Signals(signum).name}: the profile could not be saved: {e}")
        die_by_signal(signum)


def _why_empty(steps: tuple[int, int] | None, made: int) -> str:
    """Why a recording holds nothing, for the `nothing recorded` line: the --steps window
    that never opened (the steps the program made, and where the window starts), or no op."""
    if steps is None:
        return "the program ran no PyTorch ops"
    a, b = steps
    if made >= a:
        return f"the program ran no PyTorch ops in steps {a}:{b} (it made {made} steps)"
    if made == 0:
        return (f"--steps {a}:{b} starts at step {a}, but the program made no steps (no optimizer "
                "step and no dlpt.step() call); record without --steps, or mark its steps with dlpt.step()")
    return (f"--steps {a}:{b} starts at step {a}, but the program made only {made} step{'s' if made != 1 else ''} "
            f"(optimizer steps or dlpt.step() calls); to record its last step: --steps {made - 1}:{made}")


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size
