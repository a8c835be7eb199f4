"""`dlpt record [-o OUT] [--steps A:B] [--force] [--] (SCRIPT | -m MODULE) [ARGS...]`: run a
program as `python SCRIPT ARGS` would, under dlpt's collector, and save its profile."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from types import TracebackType
from typing import Any

from dlpt.errors import DlptError, notice

EPILOG = """\
examples:
  dlpt record -o run.dlpt train.py --epochs 1
  dlpt record -o run.dlpt -- python train.py --epochs 1
  dlpt record -m mypkg.train --lr 0.1
  dlpt record --steps 10:15 train.py          record optimizer steps 10 to 14 only
  torchrun --nproc_per_node 2 --no-python dlpt record -o run.dlpt train.py
                                              run.rank0.dlpt, run.rank1.dlpt
  torchrun --nproc_per_node 2 -m dlpt record -o 'prof/{rank}.dlpt' train.py

The program's own flags pass through untouched. dlpt exits with the program's status; the
profile is saved also when the program raises, calls sys.exit or is interrupted, and while the
program runs it is rewritten every few seconds, so a crash or kill -9 keeps what was recorded.
"""

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a PyTorch program and record where its GPU time goes",
                       description="Run SCRIPT (or -m MODULE) as python would and record a "
                       "source-mapped profile of it.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", metavar="OUT",
                   help="profile to write (default: dlpt-<name>.<pid>.dlpt); under torchrun each "
                   "rank writes OUT with .rank<R> before .dlpt, or where OUT says {rank}")
    p.add_argument("--steps", metavar="A:B",
                   help="record steps A..B-1 only; a step is an optimizer step or a dlpt.step() call")
    p.add_argument("--snapshot-seconds", type=float, default=5.0, metavar="S",
                   help="rewrite OUT with the profile so far every S seconds while the program runs, so a "
                   "crash or kill -9 keeps it (default: 5; 0: only at the end)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                   help="run a library module as a script, like python -m")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT ARGS",
                   help="the program and its arguments ('--' and a leading 'python' are accepted)")
    p.set_defaults(func=run)


def parse_program(module: list[str] | None, program: list[str]) -> tuple[str, str, list[str]]:
    """('script' | 'module', target, args) from the command's remainder."""
    if module:
        return "module", module[0], module[1:]
    prog = list(program)
    if prog and prog[0] == "--":
        prog = prog[1:]
    if prog and _PYTHON.match(os.path.basename(prog[0])):
        prog = prog[1:]
    if prog and prog[0] == "-m":
        if len(prog) < 2:
            raise DlptError("-m needs a module name, e.g. dlpt record -m mypkg.train")
        return "module", prog[1], prog[2:]
    if prog and prog[0] == "--":
        prog = prog[1:]
    if not prog:
        raise DlptError("no program to record; e.g. dlpt record -o run.dlpt train.py --epochs 1")
    if prog[0].startswith("-"):
        raise DlptError(f"unknown option {prog[0]!r} before the script (see 'dlpt record --help')")
    return "script", prog[0], prog[1:]


def run(args: argparse.Namespace) -> int:
    from dlpt.api import Abandon, Finishing, _parse_steps
    from dlpt.store import check_output

    mode, target, prog_args = parse_program(args.module, args.program)
    steps = _parse_steps(args.steps)
    if not args.snapshot_seconds >= 0:
        raise DlptError("--snapshot-seconds must be 0 (off) or more")
    if mode == "script":
        _check_script(target)
    name = os.path.splitext(os.path.basename(target.rstrip("/")))[0] if mode == "script" else target
    # Under torchrun every rank runs this same command line: each writes its own file.
    from dlpt.ranks import default_output, rank_info, rank_output

    who = rank_info()
    out = rank_output(args.output, who["rank"], who["world_size"]) if args.output else default_output(name, who)
    # Everything that would make the save fail is checked before the program runs: an existing
    # OUT without --force, a missing or unwritable directory, a nearly full disk.
    check_output(out, args.force)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DlptError("recording needs PyTorch; install it (pip install torch) or dlpt[record]") from None
    if mode == "script":
        status = _syntax_error(target)
        if status is not None:
            return status
    from dlpt.collectors.record.session import Recorder

    command = " ".join(["dlpt", "record", *(["-m", target] if mode == "module" else [target]), *prog_args])
    rec = Recorder(command=command, name=" ".join([target, *prog_args]), steps=steps,
                   drop_files=(sys.argv[0],) if sys.argv and sys.argv[0] else (), snapshot_path=out,
                   snapshot_seconds=args.snapshot_seconds)
    job = _Job(rec, out)
    # Once the program has ended, SIGINT and SIGTERM raise Abandon until dlpt is done:
    # _run_program installs job.finishing the moment the program ends.
    job.finishing = Finishing()
    try:
        status, signum = _run_program(rec, mode, target, prog_args, job.terminate, job.finishing)
        if signum is not None:
            notice(f"saving what was recorded to {out} (Ctrl-C again to abandon it)")
        status = job.save(status, signum)
    except Abandon as a:
        job.abandoned(a.signum)
        status, signum = 128 + a.signum, a.signum
    finally:
        job.finishing.__exit__()
    if signum is not None:
        # The program ended by the signal (or we were told to stop while saving): end as python
        # ends on an unhandled KeyboardInterrupt — exit handlers first, then die by the signal.
        import atexit

        from dlpt.api import die_by_signal

        atexit._run_exitfuncs()
        die_by_signal(signum)
    return status


class _Job:
    """The recording's end: build the profile, save it, and say what happened."""

    def __init__(self, rec: object, out: str) -> None:
        self.rec = rec
        self.out = out
        self.before = _identity(out)
        self.finishing: Any = None

    def save(self, status: int, signum: int | None) -> int:
        """Stop the recorder and save; the exit status dlpt should give.

        When the profile cannot be saved, a failed program keeps its own status (its failure
        is the news); a program that succeeded gives 2, so that a script relying on the
        profile does not go on as if it existed."""
        from dlpt.store import save

        failed = status if status != 0 else 2
        rec = self.rec
        try:
            prof = rec.stop()  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - a bug in dlpt must not take the program's status
            notice(f"could not build the profile ({type(e).__name__}: {e}); nothing saved. "
                   "Please report this with the command line.")
            return failed
        prof.path = self.out
        if not prof.cct.exclusive.any():
            self._discard_snapshot()
            steps = rec.steps  # type: ignore[attr-defined]
            where = f" in steps {steps[0]}:{steps[1]} (the program made {rec.step_count} steps)" if steps else ""  # type: ignore[attr-defined]
            notice(f"nothing recorded: the program ran no PyTorch ops{where}; no profile written")
            return status
        prof.meta["exit_status"] = status
        if signum is not None:
            prof.meta["ended_by"] = _signal_name(signum)
        try:
            save(prof, self.out, force=True)  # check_output ran before the program: its result is ours
        except DlptError as e:
            kept = f"; {self.out} keeps its previous contents" if self.before else ""
            notice(f"the profile could not be saved: {e}{kept}")
            return failed
        n = int(prof.activities.count.sum())  # type: ignore[union-attr]
        notice(f"profile saved to {self.out} ({n:,} GPU activities, {len(prof.cct):,} nodes; "
               f"post-processing {rec.post_seconds:.2f} s)")  # type: ignore[attr-defined]
        notice(f"view it with: dlpt view {self.out}")
        return status

    def _discard_snapshot(self) -> None:
        """Remove a snapshot this run wrote where no file was before (an empty recording)."""
        now = _identity(self.out)
        if self.before is None and now is not None:
            try:
                os.remove(self.out)
            except OSError:
                pass

    def abandoned(self, signum: int) -> None:
        from dlpt.output import remove_temp_files

        # The store removes its temporary file as the interrupt passes through it; this also
        # catches one the signal cut off between its creation and the store's cleanup.
        remove_temp_files(os.path.dirname(os.path.abspath(self.out)), pid=os.getpid())
        what = _signal_name(signum)
        now = _identity(self.out)
        if now is not None and now != self.before:
            notice(f"{what} after the profile was saved to {self.out}")
        elif self.before is not None:
            notice(f"{what} while saving: the profile was not saved; {self.out} keeps its "
                   "previous contents")
        else:
            notice(f"{what} while saving: the profile was not saved")

    def terminate(self, signum: int) -> None:
        """SIGTERM while the program runs: save, then end as the unhandled signal would have.

        Run inside the signal handler, on top of the program's frames, without unwinding them:
        with no handler of its own the program would have ended right there, running none of
        its `finally` blocks or exit handlers, and neither does it here. Dying by the signal
        (not exit 143) is what a wrapper like `time` or `timeout` passes on: the parent — a
        shell, a batch scheduler — sees "terminated by SIGTERM" as it would without dlpt."""
        from dlpt.api import Abandon, die_by_signal

        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        notice(f"{_signal_name(signum)}: saving what was recorded to {self.out}")
        self.finishing.install()
        try:
            self.save(128 + signum, signum)
        except Abandon as a:
            self.abandoned(a.signum)
        die_by_signal(signum)


def _check_script(target: str) -> None:
    """What python would refuse to run, said in one line before anything starts."""
    if not os.path.exists(target):
        raise DlptError(f"{target}: no such file")
    if os.path.isdir(target):
        if os.path.exists(os.path.join(target, "__main__.py")):
            return  # python runs a directory with a __main__.py
        from dlpt.collectors.kineto.decode import trace_files

        try:
            has_traces = bool(trace_files(target))
        except DlptError:
            has_traces = False
        if has_traces:
            raise DlptError(f"{target} is a directory of profiler traces, not a program; read it with "
                            f"'dlpt report {target}' or 'dlpt import {target} -o run.dlpt'")
        raise DlptError(f"{target} is a directory without a __main__.py; give the script to run")
    if target.endswith((".json", ".json.gz", ".dlpt")):
        raise DlptError(f"{target} is a profile or trace, not a program; read it with 'dlpt report {target}'")


def _syntax_error(target: str) -> int | None:
    """Exit status 1 after printing the error as python would, for a script that does not
    compile; None when it compiles. Nothing is recorded for it."""
    try:
        with open(target, "rb") as f:
            source = f.read()
        compile(source, target, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        print("".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        notice(f"{target} does not compile; nothing recorded")
        return 1
    except OSError as e:
        raise DlptError(f"{target}: cannot read it ({e.strerror})") from None
    return None


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _signal_name(signum: int) -> str:
    import signal

    return "interrupted (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


# The program's globals stay alive until dlpt exits, as `python SCRIPT` keeps __main__'s. Freeing
# them the moment the program returns, recording still on, deadlocked DDP programs under torchrun
# (seen with dlpt's torch.profiler-based recorder): the Reducer's ProcessGroupGloo destructor joins
# gloo's worker thread while holding the GIL, and that thread needs the GIL to free a finished
# collective's thread-local state, which held a Python object.
_NAMESPACES: list[dict[str, Any]] = []


def _run_program(rec: object, mode: str, target: str, prog_args: list[str],
                 on_terminate: object = None, then: object = None) -> tuple[int, int | None]:
    """Run the program as python would: (exit status, signal that ended it or None)."""
    import runpy
    import signal

    from dlpt.api import ProgramSignals

    saved_argv, saved_path0 = sys.argv[:], (sys.path[0] if sys.path else None)
    if mode == "script":
        sys.argv = [target, *prog_args]
        # python puts the script's directory first on the path (the real one, links resolved).
        sys.path[0:1] = [os.path.dirname(os.path.realpath(target))]
    else:
        sys.path[0:1] = [os.getcwd()]
        sys.argv = [_module_file(target), *prog_args]
    try:
        with ProgramSignals(on_terminate, then):  # type: ignore[arg-type]
            rec.start()  # type: ignore[attr-defined]
            if mode == "script":
                _NAMESPACES.append(runpy.run_path(target, run_name="__main__"))
            else:
                # alter_sys=False: with True, torch 2.13's profiler names the module's file
                # "site-packages" and the program's lines are lost; argv[0] is set above instead.
                _NAMESPACES.append(runpy.run_module(target, run_name="__main__", alter_sys=False))
        return 0, None
    except SystemExit as e:
        return _exit_status(e.code), None
    except KeyboardInterrupt as e:
        _print_program_traceback(e)
        return 130, signal.SIGINT
    except BaseException as e:  # noqa: BLE001 - the program's failure is reported as python would
        from dlpt.api import Abandon

        if isinstance(e, Abandon):
            raise
        _print_program_traceback(e)
        return 1, None
    finally:
        sys.stdout.flush()
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0:1] = [saved_path0]


def _module_file(name: str) -> str:
    """What `python -m NAME` puts in sys.argv[0]: the file that runs (a package's __main__)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(name + ".__main__")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise DlptError(f"no module named {name!r} (searched from {os.getcwd()})")
    return spec.origin


def _exit_status(code: object) -> int:
    """`sys.exit(code)` as the interpreter turns it into a status."""
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code % 256
    print(code, file=sys.stderr)
    return 1


_OWN = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


def _print_program_traceback(e: BaseException) -> None:
    """The traceback python would print: the program's frames only, not dlpt's or runpy's
    (neither runpy's at the top nor dlpt's SIGINT handler at the bottom)."""
    import runpy

    tb: TracebackType | None = e.__traceback__
    skip = (os.path.abspath(runpy.__file__), *_OWN)
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
                              or os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(skip)):
        tb = tb.tb_next
    te = traceback.TracebackException(type(e), e, tb)
    while len(te.stack) > 1 and os.path.abspath(te.stack[-1].filename).startswith(_OWN):
        te.stack.pop()
    sys.stdout.flush()
    print("".join(te.format()), end="", file=sys.stderr)
    sys.stderr.flush()
