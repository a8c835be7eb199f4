"""`dlpt record [-o OUT] [--steps A:B] [--force] [--] (SCRIPT | -m MODULE) [ARGS...]`: run a
program as `python SCRIPT ARGS` would, under dlpt's collector, and save its profile."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import traceback
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dlpt.errors import DlptError, notice
from dlpt.layout import OWN_ROOTS

if TYPE_CHECKING:
    from dlpt.collectors.record.recording import Recording
    from dlpt.profile import Profile

EPILOG = """\
examples:
  dlpt record -o run.dlpt train.py --epochs 1
  dlpt record -o run.dlpt -- python train.py --epochs 1
  dlpt record -m mypkg.train --lr 0.1
  dlpt record -- python -u -X dev train.py     python's own flags apply to the program
  dlpt record --steps 10:15 train.py          record optimizer steps 10 to 14 only
  dlpt record --cuda-graph-trace node generate.py --compile
                                              every kernel of every CUDA-graph replay (costs each replay)
  dlpt record --pc-samples --steps 10:12 train.py
                                              GPU PC samples and stall reasons, steps 10 and 11
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
                   "crash or kill -9 keeps it; longer where a snapshot costs more than 4%% of the time "
                   "between them (default: 5; 0: only at the end)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--html", action="store_true",
                   help="also write the profile's HTML view beside it (OUT with .html for .dlpt)")
    p.add_argument("--cuda-graph-trace", choices=("node", "graph"), default=None,
                   help="how CUDA-graph replays are traced: graph (the default) records each replay as one "
                   "span and splits it over its kernels as the graph's first replay ran them (later replays "
                   "then run about 5%% longer on the GPU); node records "
                   "every kernel of every replay, which costs each replay 1-2 us per kernel on the host "
                   "(the default with --steps; Nsight Systems' --cuda-graph-trace alike)")
    p.add_argument("--pc-samples", nargs="?", const="default", default=None, metavar="PERIOD",
                   help="also sample the GPU's program counters with their stall reasons (CUPTI PC sampling), "
                   "on the line that launched each kernel and on the kernel's own source lines where it has "
                   "line information (Triton, Inductor); kernels then run one at a time, so the run is slower. "
                   "PERIOD: 2^PERIOD cycles between samples (5-31; default: CUPTI's for the GPU)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no start line, and no notices about what the recorder chose")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                   help="run a library module as a script, like python -m")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT ARGS",
                   help="the program and its arguments ('--' and a leading 'python' with its flags are accepted)")
    p.set_defaults(func=run)


# python's own flags (`python -u -X dev script.py`): letters that stand alone, and the two that
# take a value (attached, -Xdev, or the next word).
_FLAGS = frozenset("bBdEIOPqsSuvRx")
_FLAGS_WITH_VALUE = frozenset("XW")


def python_flags(program: list[str]) -> tuple[list[str], list[str]]:
    """(python's flags, the words after them) for a remainder that starts with `python`; no
    flags when it does not."""
    prog = list(program)
    if prog and prog[0] == "--":
        prog = prog[1:]
    if not (prog and _PYTHON.match(os.path.basename(prog[0]))):
        return [], prog
    prog = prog[1:]
    flags: list[str] = []
    while prog and prog[0].startswith("-") and not prog[0].startswith(("--", "-m", "-c")) and prog[0] != "-":
        word, used = prog[0], 1
        for k, letter in enumerate(word[1:]):
            if letter in _FLAGS_WITH_VALUE:
                used = 2 if k == len(word) - 2 else 1  # the value is the next word, or attached
                break
            if letter not in _FLAGS:
                raise DlptError(f"python option -{letter} is not supported by dlpt record; "
                                "give python's flags that change how the program runs (-u, -X, -W, -O, ...)")
        if len(prog) < used:
            raise DlptError(f"python option {word} needs a value")
        flags += prog[:used]
        prog = prog[used:]
    return flags, prog


def parse_program(module: list[str] | None, program: list[str]) -> tuple[str, str, list[str]]:
    """('script' | 'module', target, args) from the command's remainder (python's own flags
    are skipped: `python_flags` reads them)."""
    if module:
        return "module", module[0], module[1:]
    prog = list(program)
    if prog and prog[0] == "--":
        prog = prog[1:]
    if prog and _PYTHON.match(os.path.basename(prog[0])):
        prog = python_flags(prog)[1]
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
    from dlpt.collectors.record.pcsamples import ENV as PC_ENV
    from dlpt.collectors.record.recording import Recording, output_path, parse_steps
    from dlpt.collectors.record.signals import Abandon, die_by_signal

    mode, target, prog_args = parse_program(args.module, args.program)
    if args.cuda_graph_trace == "graph" and args.steps:
        # Untried: graphs replayed before the window, with CUPTI detached, then replayed under
        # graph-level records (CUPTI 13.0 crashes the replay after switching to graph-level
        # records for a graph replayed per kernel: collectors/native/device.h).
        raise DlptError("--cuda-graph-trace graph is not supported with --steps yet; record the whole run, "
                        "or trace graphs per kernel (the default)")
    # Per graph by default: per-kernel records of replayed nodes cost a graphed decode loop
    # 1.5-2.2x (docs/BENCHMARKS.md, "CUDA-graph replays"), and the per-graph split agrees with
    # them to 0.5 points of GPU time per kernel. Per kernel for a `--steps` window: graphs
    # replayed before the window would be switched to graph-level records after per-kernel ones,
    # which CUPTI 13.0 crashes on (collectors/native/device.h). Read by the collector when CUPTI
    # starts; the environment also carries it into a re-executed interpreter (python's own flags)
    # and torchrun's ranks.
    os.environ["DLPT_GRAPH_TRACE"] = args.cuda_graph_trace or ("node" if args.steps else "graph")
    if args.pc_samples is not None:
        if args.pc_samples != "default" and not (args.pc_samples.isdigit() and 5 <= int(args.pc_samples) <= 31):
            raise DlptError(f"--pc-samples takes a period from 5 to 31 (2^N cycles), not {args.pc_samples!r}")
        # Read by the collector when CUPTI starts (collectors/native/pcsampling.h), and by the
        # recorder when it builds the profile; carried into a re-executed interpreter and ranks.
        os.environ[PC_ENV] = "1" if args.pc_samples == "default" else args.pc_samples
    flags = [] if args.module else python_flags(args.program)[0]
    steps = parse_steps(args.steps)
    if not args.snapshot_seconds >= 0:
        raise DlptError("--snapshot-seconds must be 0 (off) or more")
    if mode == "script":
        _check_script(target)
    if flags:
        _run_with_python_flags(flags, args.program, mode, target, prog_args)
    name = os.path.splitext(os.path.basename(target.rstrip("/")))[0] if mode == "script" else target
    # Under torchrun every rank runs this same command line: each writes its own file.
    out = output_path(args.output, name)
    assert out is not None
    # Everything that would make the save fail is checked before the program runs: an existing
    # OUT without --force, a missing or unwritable directory, a nearly full disk.
    shown = shlex.join(["python", *(["-m", target] if mode == "module" else [target]), *prog_args])
    command = " ".join(["dlpt", "record", *(["-m", target] if mode == "module" else [target]), *prog_args])
    rec = Recording(out, command=command, name=" ".join([target, *prog_args]), owns_process=True, steps=steps,
                    force=args.force, quiet=args.quiet, snapshot_seconds=args.snapshot_seconds,
                    start_line=None if args.quiet else f"recording {shown} → {out}; Ctrl-C stops and saves",
                    drop_files=(sys.argv[0],) if sys.argv and sys.argv[0] else ())
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DlptError("recording needs PyTorch; install it (pip install torch) or dlpt[record]") from None
    if mode == "script":
        status = _syntax_error(target)
        if status is not None:
            return status
    try:
        status, signum = _run_program(rec, mode, target, prog_args)
        status = rec.finish(status, signum)
    except Abandon as a:  # after the program ended, before the save began
        rec.abandoned(a.signum)
        status = 128 + a.signum
    finally:
        rec.finishing.__exit__()
    if args.html and rec.result is not None and os.path.exists(out):
        _write_html(rec.result, out, args.quiet)
    signum = rec.abandoned_by or signum
    if signum is not None:
        # The program ended by the signal (or we were told to stop while saving): end as python
        # ends on an unhandled KeyboardInterrupt — exit handlers first, then die by the signal.
        import atexit

        atexit._run_exitfuncs()
        die_by_signal(signum)
    return status


def _write_html(prof: Profile, out: str, quiet: bool) -> None:
    """`--html`: the page `dlpt export OUT -f html` would write, beside OUT."""
    from dlpt.output import write_output
    from dlpt.viewers.exporters import ExportOptions, get_exporter

    path = (out[:-5] if out.endswith(".dlpt") else out) + ".html"
    write_output(path, lambda f: get_exporter("html").export(prof, f, ExportOptions()))
    if not quiet:
        notice(f"HTML view → {path}")


def _run_with_python_flags(flags: list[str], program: list[str], mode: str, target: str,
                           prog_args: list[str]) -> None:
    """`dlpt record -- python -u -X dev train.py`: run dlpt itself under those flags (they
    change the interpreter, which is this process), with the same command line less them."""
    head = sys.argv[1:len(sys.argv) - len(program)]
    tail = ["-m", target] if mode == "module" else ["--", target]
    argv = [sys.executable, *flags, "-m", "dlpt", *head, *tail, *prog_args]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        os.execv(sys.executable, argv)
    except OSError as e:
        raise DlptError(f"could not run {sys.executable} with {' '.join(flags)} ({e.strerror})") from None


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


# The program's globals stay alive until dlpt exits, as `python SCRIPT` keeps __main__'s. Freeing
# them the moment the program returns, recording still on, deadlocked DDP programs under torchrun
# (seen with dlpt's torch.profiler-based recorder): the Reducer's ProcessGroupGloo destructor joins
# gloo's worker thread while holding the GIL, and that thread needs the GIL to free a finished
# collective's thread-local state, which held a Python object.
_NAMESPACES: list[dict[str, Any]] = []


def _run_program(rec: Recording, mode: str, target: str, prog_args: list[str]) -> tuple[int, int | None]:
    """Run the program as python would: (exit status, signal that ended it or None)."""
    import runpy
    import signal

    from dlpt.collectors.record.signals import Abandon

    rec.start()  # before the program's path and argv: the recorder is dlpt's
    saved_argv, saved_path0 = sys.argv[:], (sys.path[0] if sys.path else None)
    if mode == "script":
        sys.argv = [target, *prog_args]
        # python puts the script's directory first on the path (the real one, links resolved).
        sys.path[0:1] = [os.path.dirname(os.path.realpath(target))]
    else:
        sys.path[0:1] = [os.getcwd()]
        sys.argv = [_module_file(target), *prog_args]
    try:
        try:
            if mode == "script":
                _NAMESPACES.append(runpy.run_path(target, run_name="__main__"))
            else:
                # alter_sys=False: with True, torch 2.13's profiler names the module's file
                # "site-packages" and the program's lines are lost; argv[0] is set above instead.
                _NAMESPACES.append(runpy.run_module(target, run_name="__main__", alter_sys=False))
        finally:
            rec.program_ended()
        return 0, None
    except SystemExit as e:
        return _exit_status(e.code), None
    except KeyboardInterrupt as e:
        _print_program_traceback(e)
        return 130, signal.SIGINT
    except BaseException as e:  # noqa: BLE001 - the program's failure is reported as python would
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


def _print_program_traceback(e: BaseException) -> None:
    """The traceback python would print: the program's frames only, not dlpt's or runpy's
    (neither runpy's at the top nor dlpt's SIGINT handler at the bottom)."""
    import runpy

    tb: TracebackType | None = e.__traceback__
    skip = (os.path.abspath(runpy.__file__), *OWN_ROOTS)
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
                              or os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(skip)):
        tb = tb.tb_next
    te = traceback.TracebackException(type(e), e, tb)
    while len(te.stack) > 1 and os.path.abspath(te.stack[-1].filename).startswith(OWN_ROOTS):
        te.stack.pop()
    sys.stdout.flush()
    print("".join(te.format()), end="", file=sys.stderr)
    sys.stderr.flush()
