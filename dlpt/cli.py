"""The `dlpt` command line. Each subcommand lives in `dlpt/commands/<name>.py`, listed in
`COMMANDS`, and registers its options; this module only dispatches and turns user errors into one `dlpt: ` line, exit 2."""

from __future__ import annotations

import argparse
import sys

from dlpt.commands import diff, export, import_, record, report, view
from dlpt.errors import DlptError, notice
from dlpt.version import __version__

# In the order `dlpt --help` lists them.
COMMANDS = (record, import_, view, report, export, diff)

DESCRIPTION = """\
dlpt — which line of your PyTorch program spends the GPU's time.

  dlpt record -o run.dlpt -- python train.py     profile an unmodified script
  dlpt view run.dlpt                             explore it in the terminal
  dlpt report run.dlpt --view flat --by line     the hottest lines as text
  dlpt export run.dlpt -f hotspots -o hot.json   hotspots for CI and dashboards
  dlpt report trace.pt.trace.json.gz             any torch.profiler (Kineto) trace works too
"""


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one `dlpt: ` line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise DlptError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dlpt", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dlpt {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser,
                           help="one of these; dlpt COMMAND --help shows its options")
    for command in COMMANDS:
        command.register(sub)
    return p


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, with an unknown option blamed on the subcommand it was given to.

    argparse hands a subcommand's unknown words back to the top-level parser, whose error would
    point at 'dlpt --help', where that subcommand's options are not listed."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        command = getattr(args, "command", None)
        owner = subs[0].choices[command] if subs and command in subs[0].choices else parser
        owner.error(f"unrecognized arguments: {' '.join(extra)}{_did_you_mean(owner, extra)}")
    return args


def _did_you_mean(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """'; did you mean --view?' for a mistyped option, as git and cargo say it."""
    import difflib

    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for word in extra:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.partition("=")[0], options, n=1)
            if close:
                return f"; did you mean {close[0]}?"
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args = parse(parser, argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except DlptError as e:
        notice(str(e))
        return e.exit_status
    except KeyboardInterrupt:
        notice("interrupted")
        return 130
    except BrokenPipeError:
        # `dlpt report ... | head`: the reader went away; that is not an error. Point stdout at
        # devnull so that the interpreter's final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
