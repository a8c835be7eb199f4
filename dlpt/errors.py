"""The one error type dlpt shows to users: the CLI prints it as a single `dlpt: ` line, exit 2."""


class DlptError(Exception):
    """A problem with the user's input or environment, worded for the user.

    The message says what is wrong and, where it can, what to do about it.
    """

    exit_status = 2
