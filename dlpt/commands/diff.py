"""`dlpt diff A B`: what got slower and what got faster between two profiles."""

from __future__ import annotations

import argparse

from dlpt.commands.common import (
    add_as_ranks,
    add_compile,
    add_library,
    add_metric,
    add_rank,
    choose_metric,
    positive_int,
)
from dlpt.output import write_json, write_output
from dlpt.scope import Scope

EPILOG = """\
examples:
  dlpt diff before.dlpt after.dlpt                        lines whose GPU time changed most
  dlpt diff before.dlpt after.dlpt --by kernel --top 10
  dlpt diff a.pt.trace.json.gz b.pt.trace.json.gz --by op --metric cpu_time
  dlpt diff before.dlpt after.dlpt --format json -o diff.json
  dlpt diff before.dlpt after.dlpt -f html -o diff.html   a page to share
  dlpt diff before/ after/ --rank 1                rank 1 of two directories of rank profiles

Rows are matched across the runs by file and line, then (when code moved) by the text of the
line within its function, then by file and function; the 'matched by' column says which.
"""


def register(sub: argparse._SubParsersAction) -> None:
    from dlpt.views import GROUPINGS

    p = sub.add_parser("diff", help="compare two profiles: what got slower, what got faster",
                       description="Compare two profiles (.dlpt files or Kineto traces): the change "
                       "of a metric per line, function, file, kernel or op, largest first.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", metavar="A", help="the first (baseline) profile, or a directory of "
                   "its ranks' profiles (merged)")
    p.add_argument("after", metavar="B", help="the second profile, or a directory of its ranks' profiles")
    add_rank(p)
    add_as_ranks(p)
    p.add_argument("--by", "-b", default="line", choices=GROUPINGS, help="what to compare (default: line)")
    add_metric(p)
    p.add_argument("--top", "-n", type=positive_int, default=20, help="rows to show; 0 for all (default: 20)")
    add_library(p)
    add_compile(p)
    p.add_argument("--format", "-f", default="text", choices=("text", "json", "html"),
                   help="text, json, or html: one self-contained page, rows coloured by sign")
    p.add_argument("--output", "-o", default=None, help="write to this file instead of stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dlpt.diff import diff_profiles
    from dlpt.loader import open_profiles
    from dlpt.viewers.diff import diff_json, render_text

    a = open_profiles([args.before], args.rank, as_ranks=args.as_ranks)
    b = open_profiles([args.after], args.rank, as_ranks=args.as_ranks)
    d = diff_profiles(a, b, by=args.by, metric=choose_metric(args.metric, a, b),
                      scope=Scope(args.include_library, args.include_compile))
    if args.format == "html":
        from dlpt.viewers.exporters.html import diff_page_data, render_page

        page = render_page(diff_page_data(diff_json(d, args.top), f"dlpt diff · {args.before} → {args.after}"))
        write_output(args.output, lambda f: f.write(page))
    elif args.format == "json":
        doc = diff_json(d, args.top)
        write_output(args.output, lambda f: write_json(f, doc))
    else:
        text = render_text(d, args.top)
        write_output(args.output, lambda f: f.write(text))
    return 0
