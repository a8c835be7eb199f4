"""`dlpt view PROFILE`: explore a profile in the terminal (textual TUI)."""

from __future__ import annotations

import argparse

from dlpt.commands.common import add_inputs, add_library, add_metric, add_phase

EPILOG = """\
examples:
  dlpt view run.dlpt
  dlpt view trace.pt.trace.json.gz
  dlpt view traces/ --metric htod_time --include-library
  dlpt view run.rank0.dlpt run.rank1.dlpt        ranks merged; --rank 1 for one of them

keys: 1 top-down · 2 bottom-up · 3 flat (g: grouping) · enter expand · e hottest path ·
      b back · / search · m pick metric (s: next) · l library frames · x export hotspots ·
      ? help · q quit
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="explore a profile in the terminal",
                       description="Explore a profile (a .dlpt file, a Kineto trace, or a directory of "
                       "traces) in an interactive terminal UI.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_inputs(p)
    add_metric(p)
    add_phase(p)
    add_library(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from dlpt.errors import DlptError

    # A full-screen app with no terminal (a pipe, CI, `ssh host cmd`) writes escape codes and
    # waits for keys that never come: refuse, and name the command that prints the same views.
    from dlpt.loader import Inputs, input_files

    for path in args.profile:
        input_files(path)  # a missing input is said as such first
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise DlptError("dlpt view needs a terminal (stdin and stdout are not one); "
                        f"for text use: dlpt report {' '.join(args.profile)}")
    # textual is imported only when the TUI runs, so the other commands start fast.
    from dlpt.phases import phase_name
    from dlpt.viewers.tui import run_app

    return run_app(Inputs(list(args.profile), args.rank, args.as_ranks), include_library=args.include_library,
                   metric=args.metric, phase=phase_name(args.phase))
