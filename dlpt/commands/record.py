"""`dlpt record [-o OUT] [--steps A:B] [--force] [--] (SCRIPT | -m MODULE) [ARGS...]`: run a
program as `python SCRIPT ARGS` would, under the torch recorder, and save its profile."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from types import TracebackType

from dlpt.errors import DlptError

EPILOG = """\
examples:
  dlpt record -o run.dlpt train.py --epochs 1
  dlpt record -o run.dlpt -- python train.py --epochs 1
  dlpt record -m mypkg.train --lr 0.1
  dlpt record --steps 10:15 train.py          record optimizer steps 10 to 14 only

The program's own flags pass through untouched. dlpt exits with the program's status; the
profile is saved also when the program raises, calls sys.exit or is interrupted.
"""

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?(\.exe)?$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a PyTorch program and record where its GPU time goes",
                       description="Run SCRIPT (or -m MODULE) as python would and record a "
                       "source-mapped profile of it.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", metavar="OUT",
                   help="profile to write (default: dlpt-<name>.<pid>.dlpt)")
    p.add_argument("--steps", metavar="A:B",
                   help="record steps A..B-1 only; a step is an optimizer step or a dlpt.step() call")
    p.add_argument("--window", type=int, default=20, metavar="N",
                   help="restart the profiler every N steps, folding each window into the profile, "
                   "so memory stays bounded on long runs (default: 20; 0: one window)")
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
    from dlpt.api import _parse_steps

    mode, target, prog_args = parse_program(args.module, args.program)
    steps = _parse_steps(args.steps)
    if mode == "script" and not os.path.exists(target):
        raise DlptError(f"{target}: no such file")
    name = os.path.splitext(os.path.basename(target.rstrip("/")))[0] if mode == "script" else target
    out = args.output or f"dlpt-{name}.{os.getpid()}.dlpt"
    if os.path.exists(out) and not args.force:
        raise DlptError(f"{out} exists; pass --force to overwrite it")
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise DlptError(f"{out_dir}: no such directory for the profile")
    if args.window is not None and args.window < 0:
        raise DlptError("--window must not be negative")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DlptError("recording needs PyTorch; install it (pip install torch) or dlpt[record]") from None
    from dlpt.collectors.torch_recorder import Recorder
    from dlpt.store import save

    command = " ".join(["dlpt", "record", *(["-m", target] if mode == "module" else [target]), *prog_args])
    rec = Recorder(command=command, name=" ".join([target, *prog_args]), steps=steps, window=args.window,
                   drop_files=(sys.argv[0],) if sys.argv and sys.argv[0] else ())
    status = _run_program(rec, mode, target, prog_args)
    try:
        prof = rec.stop()
    except KeyboardInterrupt:
        print("dlpt: interrupted while finishing the profile; nothing saved", file=sys.stderr)
        return 130
    prof.path = out
    prof.meta["exit_status"] = status
    save(prof, out, force=True)  # the check above ran before the program: its result is ours
    n = len(prof.activities)
    print(f"dlpt: profile saved to {out} ({n:,} GPU activities, {len(prof.cct):,} nodes; "
          f"post-processing {rec.post_seconds:.2f} s)", file=sys.stderr)
    print(f"dlpt: view it with: dlpt view {out}", file=sys.stderr)
    return status


def _run_program(rec: object, mode: str, target: str, prog_args: list[str]) -> int:
    """Run the program as python would, returning its exit status."""
    import runpy

    saved_argv, saved_path0 = sys.argv[:], (sys.path[0] if sys.path else None)
    if mode == "script":
        sys.argv = [target, *prog_args]
        # python puts the script's directory first on the path (the real one, links resolved).
        sys.path[0:1] = [os.path.dirname(os.path.realpath(target))]
    else:
        sys.path[0:1] = [os.getcwd()]
        sys.argv = [_module_file(target), *prog_args]
    try:
        rec.start()  # type: ignore[attr-defined]
        if mode == "script":
            runpy.run_path(target, run_name="__main__")
        else:
            # alter_sys=False: with True, torch 2.13's profiler names the module's file
            # "site-packages" and the program's lines are lost; argv[0] is set above instead.
            runpy.run_module(target, run_name="__main__", alter_sys=False)
        return 0
    except SystemExit as e:
        return _exit_status(e.code)
    except KeyboardInterrupt as e:
        _print_program_traceback(e)
        return 130
    except BaseException as e:  # noqa: BLE001 - the program's failure is reported as python would
        _print_program_traceback(e)
        return 1
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
    """The traceback python would print: the program's frames only, not dlpt's or runpy's."""
    import runpy

    tb: TracebackType | None = e.__traceback__
    skip = (os.path.abspath(runpy.__file__), *_OWN)
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
                              or os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(skip)):
        tb = tb.tb_next
    sys.stdout.flush()
    traceback.print_exception(type(e), e, tb, file=sys.stderr)
    sys.stderr.flush()
