"""Open whatever the user points at: a `.dlpt` profile, a Kineto trace, or a directory of them."""

from __future__ import annotations

import os

from dlpt.errors import DlptError, notice
from dlpt.profile import Profile
from dlpt.progress import Progress, progress_for
from dlpt.sources import snapshot_sources
from dlpt.store import is_profile_file, load


def open_profile(path: str, progress: Progress | None = None) -> Profile:
    if not os.path.exists(path):
        raise DlptError(f"{path}: no such file or directory")
    if os.path.isfile(path) and is_profile_file(path):
        return load(path)
    from dlpt.collectors.kineto import import_traces

    with progress_for(progress) as prog:
        prof = import_traces(path, progress=prog)
    prof.path = path
    skipped = int(prof.meta.get("skipped_events", 0) or 0)
    if skipped:
        # Survivable damage: say how much was left out rather than dropping it silently.
        notice(f"warning: {path}: skipped {skipped:,} malformed events")
    prof.sources.update(snapshot_sources(prof, [os.path.dirname(os.path.abspath(path)), os.getcwd()]))
    return prof


def input_files(path: str) -> list[str]:
    """A file itself, or the `.dlpt` profiles and Kineto traces in a directory, sorted by name."""
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise DlptError(f"{path}: no such file or directory")
        return [path]
    from dlpt.collectors.kineto.decode import trace_files

    names = sorted(n for n in os.listdir(path) if not n.startswith("."))
    profiles = [os.path.join(path, n) for n in names
                if n.endswith(".dlpt") and os.path.isfile(os.path.join(path, n))]
    traces = trace_files(path) if any(n.endswith((".json", ".json.gz")) for n in names) else []
    if not profiles and not traces:
        raise DlptError(f"{path}: no .dlpt profiles and no Kineto traces (*.json, *.json.gz) in this directory")
    return profiles + traces


def open_profiles(paths: list[str], rank: int | None = None, progress: Progress | None = None) -> Profile:
    """Open one or several profiles, Kineto traces, or directories of them: several are merged
    into one profile with a `rank N` node per input (dlpt.merge); `rank` keeps only that rank."""
    from dlpt.merge import merge_profiles

    files = [f for p in paths for f in input_files(p)]
    prof = merge_profiles([open_profile(f, progress) for f in files])
    prof.path = paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"
    if rank is not None:
        from dlpt.ranks import select_rank

        prof = select_rank(prof, rank)
    return prof
