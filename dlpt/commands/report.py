"""`dlpt report PROFILE`: the top-down, bottom-up and flat views as text or JSON."""

from __future__ import annotations

import argparse

from dlpt.commands.common import (
    add_compile,
    add_inputs,
    add_library,
    add_metric,
    add_phase,
    choose_metric,
    percent,
    positive_int,
)
from dlpt.loader import open_profiles
from dlpt.output import write_json, write_output
from dlpt.phases import phase_name
from dlpt.scope import Scope
from dlpt.views import GROUPINGS, VIEWS

EPILOG = """\
examples:
  dlpt report run.dlpt                                   top-down tree of GPU time
  dlpt report run.dlpt --view flat --by line --top 20    the 20 costliest lines
  dlpt report trace.pt.trace.json.gz --view flat --by kernel
  dlpt report run.dlpt --view bottom-up --metric htod_time
  dlpt report run.dlpt --phase steady                    the steps only: start-up and compiling left out
  dlpt report run.dlpt --format json > report.json
  dlpt report run.rank*.dlpt --view flat          ranks merged: per-rank spread, straggler
  dlpt report profiles/ --rank 1                  one rank of a directory of rank profiles
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="print a view of a profile as text",
                       description="Print the top-down, bottom-up or flat view of a profile "
                       "(a .dlpt file, a Kineto trace, or a directory of traces).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_inputs(p)
    p.add_argument("--view", "-v", default="top-down", choices=VIEWS, metavar="VIEW",
                   help="top-down (the calling-context tree, the default), bottom-up (each frame's self time, "
                   "then the callers that led to it) or flat (one row per --by group)")
    p.add_argument("--by", "-b", default="line", choices=GROUPINGS, metavar="GROUP",
                   help="what one row of the flat view is: " + ", ".join(GROUPINGS[:-1]) + " or " + GROUPINGS[-1]
                   + " (default: line)")
    add_metric(p)
    p.add_argument("--depth", "-d", type=positive_int, default=None, metavar="N", help="tree levels to show")
    p.add_argument("--top", "-n", type=positive_int, default=None, metavar="N",
                   help="flat view: the N biggest rows (default: 20); trees: the N biggest nodes at every "
                   "level, the first included (default: all); 0: all")
    p.add_argument("--min-percent", type=percent, default=None, metavar="P",
                   help="hide rows under P%% of the total (default: 0.5 for trees, 0 for flat)")
    add_phase(p)
    add_library(p)
    add_compile(p)
    p.add_argument("--full-names", action="store_true", help="show kernel names whole")
    p.add_argument("--format", "-f", default="text", choices=("text", "json"),
                   help="text (the default) or json: the same view as data, every value in its metric's unit")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="write to this file instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dlpt.viewers.report import ReportOptions, render, render_json

    # torch.compile's work: apart from the flat ranking unless asked for; trees keep it in place.
    scope = Scope(args.include_library, args.include_compile, phase_name(args.phase))
    opened = open_profiles(args.profile, args.rank, as_ranks=args.as_ranks)
    prof = (scope if args.view == "flat" else scope.for_trees()).apply(opened)
    metric = choose_metric(args.metric, prof)
    top = args.top if args.top is not None else (20 if args.view == "flat" else None)
    minp = args.min_percent if args.min_percent is not None else (0.0 if args.view == "flat" else 0.5)
    opts = ReportOptions(view=args.view, by=args.by, metric=metric, depth=args.depth, top=top,
                         min_percent=minp, full_names=args.full_names)
    if args.format == "json":
        doc = render_json(prof, opts)
        write_output(args.output, lambda f: write_json(f, doc))
    else:
        text = render(prof, opts)
        write_output(args.output, lambda f: f.write(text))
    return 0
