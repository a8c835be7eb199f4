"""Where dlpt's own code lives: the repository's three folders and the import packages they
are (pyproject.toml maps them), and from that the one test of "is this file dlpt's own?"."""

from __future__ import annotations

import os

# folder → import package
PACKAGES = {"dlpt": "dlpt", "collectors": "dlpt.collectors", "viewers": "dlpt.viewers"}

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# dlpt's own folders, each with a trailing separator, as Python names its files (the path it
# imported from) and with links resolved (what a symlinked checkout's frames may carry).
OWN_ROOTS = tuple(dict.fromkeys(os.path.join(root, folder) + os.sep
                                for root in (_ROOT, os.path.realpath(_ROOT)) for folder in PACKAGES))


def is_own_file(path: str) -> bool:
    """True for a file of this dlpt installation (absolute path)."""
    return path.startswith(OWN_ROOTS)
