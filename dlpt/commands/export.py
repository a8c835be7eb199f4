"""`dlpt export PROFILE -f FORMAT -o FILE`: hotspots JSON and the interchange formats."""

from __future__ import annotations

import argparse

from dlpt.commands.common import (
    add_compile,
    add_inputs,
    add_library,
    add_metric,
    add_phase,
    choose_metric,
    positive_int,
)
from dlpt.output import write_output

EPILOG = """\
examples:
  dlpt export run.dlpt -o hot.json                 hotspots (the default format)
  dlpt export run.dlpt -f hotspots --top 50 --metric htod_time -o copies.json
  dlpt export run.dlpt -f folded | flamegraph.pl > flame.svg     to standard output
"""


def register(sub: argparse._SubParsersAction) -> None:
    from dlpt.viewers.exporters import EXPORTERS, formats

    names = formats()
    lines = "\n".join(f"  {n:<11} {EXPORTERS[n].description}" for n in names)
    p = sub.add_parser("export", help="export hotspots JSON and other formats",
                       description="Write a profile in another format.\n\nformats:\n" + lines,
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_inputs(p)
    p.add_argument("-f", "--format", default="hotspots", choices=names, metavar="FORMAT",
                   help="one of: " + ", ".join(names) + " (default: hotspots)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="output file (written whole or not at all); - or no -o: standard output")
    p.add_argument("--top", "-n", type=positive_int, default=20, help="hotspots to list (default: 20)")
    add_metric(p)
    add_phase(p)
    add_library(p)
    add_compile(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dlpt.loader import open_profiles
    from dlpt.phases import phase_name
    from dlpt.viewers.exporters import ExportOptions, get_exporter

    exporter = get_exporter(args.format)
    prof = open_profiles(args.profile, args.rank, as_ranks=args.as_ranks)
    opts = ExportOptions(metric=choose_metric(args.metric, prof), top=args.top, include_library=args.include_library,
                         include_compile=args.include_compile, phase=phase_name(args.phase))
    write_output(args.output, lambda f: exporter.export(prof, f, opts))
    return 0
