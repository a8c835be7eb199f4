"""Snapshots of the user's source files, stored in a profile so that it shows the code of
its lines on any machine. The recorder and the trace importer both read files here."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dlpt.frames import is_library_file

if TYPE_CHECKING:
    from dlpt.profile import Profile

MAX_SOURCE_BYTES = 4 << 20  # a generated or data file this large is not code a user reads


def read_source(path: str) -> str | None:
    """The text of a user's source file, or None for library code, a file too large to be code
    a user reads, or one that cannot be read."""
    return None if is_library_file(path) else _read(path)


def _read(path: str) -> str | None:
    try:
        if not os.path.isfile(path):
            return _in_memory(path)
        if os.path.getsize(path) > MAX_SOURCE_BYTES:
            return None
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _in_memory(path: str) -> str | None:
    """Code that exists only in this process's linecache: a notebook cell (IPython registers each
    cell's text under a made-up file name, `/tmp/ipykernel_…/….py`), an `exec` registered there."""
    import linecache

    entry = linecache.cache.get(path)
    if entry is None or len(entry) < 3 or not entry[2]:
        return None
    text = "".join(entry[2])
    return text if len(text) <= MAX_SOURCE_BYTES else None


def snapshot_sources(profile: Profile, roots: list[str]) -> dict[str, str]:
    """The text of each source file on the profile's paths that can be found on this machine
    and is not stored yet.

    Traces name files relative to their `sys.path` entry, so relative names are looked up under
    `roots` (the trace's directory, the working directory)."""
    out: dict[str, str] = {}
    for f in {fr.file for fr in profile.frames if fr.has_source}:
        if f in profile.sources or f in out or is_library_file(f):
            continue
        for c in [f] if os.path.isabs(f) else [os.path.join(r, f) for r in roots]:
            text = _read(c)
            if text is not None:
                out[f] = text
                break
    return out
