"""The one error type dlpt shows to users: the CLI prints it as a single `dlpt: ` line, exit 2."""


class DlptError(Exception):
    """A problem with the user's input or environment, worded for the user.

    The message says what is wrong and, where it can, what to do about it.
    """

    exit_status = 2


def notice(message: str) -> None:
    """Tell the user something on stderr, as one `dlpt: ` line: what dlpt did or chose on their
    behalf (a file saved, a default metric, events skipped). Library code says such things
    here and nowhere else, and stdout stays the command's output."""
    import sys

    print(f"dlpt: {message}", file=sys.stderr, flush=True)
