"""`dlpt import INPUT... -o OUT`: Kineto traces, per-rank `.dlpt` profiles or directories of them
into one `.dlpt` profile (several inputs merged, a `rank N` node each)."""

from __future__ import annotations

import argparse
import os

from dlpt.commands.common import add_as_ranks
from dlpt.errors import DlptError, notice

EPILOG = """\
examples:
  dlpt import trace.pt.trace.json.gz -o run.dlpt
  dlpt import ./log/ -o run.dlpt            a directory of per-rank traces (tensorboard_trace_handler)
  dlpt import run.rank*.dlpt -o run.dlpt    the ranks' profiles, gathered from the nodes, as one
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="turn Kineto traces or per-rank profiles into one .dlpt profile",
                       description="Read torch.profiler (Kineto) traces — .json, .json.gz — and "
                       ".dlpt profiles, or directories of them, and save them as one .dlpt profile; "
                       "several inputs (ranks) are merged, each under a `rank N` node.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="INPUT",
                   help="a Kineto trace (.json or .json.gz), a .dlpt profile, or a directory of them "
                   "(one per rank, as tensorboard_trace_handler or torchrun + dlpt record write them)")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="the .dlpt profile to write (written whole or not at all; see --force)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    add_as_ranks(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dlpt.loader import open_profiles
    from dlpt.progress import progress_for
    from dlpt.sources import snapshot_sources
    from dlpt.store import save

    if os.path.exists(args.output) and not args.force:
        raise DlptError(f"{args.output} exists; pass --force to overwrite it")
    with progress_for(None) as prog:
        prof = open_profiles(args.traces, progress=prog, as_ranks=args.as_ranks)
    roots = [os.path.dirname(os.path.abspath(t)) for t in args.traces] + [os.getcwd()]
    prof.sources.update(snapshot_sources(prof, roots))
    save(prof, args.output, force=args.force)
    n = len(prof.activities)
    skipped = prof.meta.skipped_events or 0
    notice(f"saved {args.output} ({n:,} GPU activities, {len(prof.cct):,} nodes)"
           + (f"; skipped {skipped:,} malformed events" if skipped else ""))
    notice(f"view it with: dlpt view {args.output}")
    return 0
