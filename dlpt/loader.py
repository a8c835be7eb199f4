"""Open whatever the user points at: a `.dlpt` profile, a Kineto trace, or a directory of them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dlpt.errors import DlptError, notice
from dlpt.profile import Profile, unknown_device_events, unknown_device_text
from dlpt.progress import Progress, progress_for
from dlpt.sources import snapshot_sources
from dlpt.store import is_profile_file, load


def open_profile(path: str, progress: Progress | None = None) -> Profile:
    if not os.path.exists(path):
        raise DlptError(f"{path}: no such file or directory")
    if os.path.isfile(path) and is_profile_file(path):
        return load(path)
    if os.path.isfile(path):
        _not_a_trace(path)
    from dlpt.collectors.kineto import import_traces

    with progress_for(progress) as prog:
        prof = import_traces(path, progress=prog)
    prof.path = path
    nonfinite = prof.meta.nonfinite or 0
    if nonfinite:
        notice(f"warning: {path}: {nonfinite:,} NaN/Infinity value{'s' if nonfinite != 1 else ''} (first at byte "
               f"{prof.meta.nonfinite_at or 0:,} of its JSON), which JSON does not allow, read as "
               "missing; an event whose time or duration was one is skipped")
    skipped = prof.meta.skipped_events or 0
    if skipped:
        # Survivable damage: say how much was left out rather than dropping it silently.
        notice(f"warning: {path}: skipped {skipped:,} malformed events")
    unknown = unknown_device_events(prof)
    if unknown:
        # A device's work in kinds dlpt does not read (another accelerator's, a newer
        # profiler's): left out of every metric, so said, once per file.
        notice(f"warning: {path}: {unknown_device_text(unknown)}")
    prof.sources.update(snapshot_sources(prof, [os.path.dirname(os.path.abspath(path)), os.getcwd()]))
    return prof


def _not_a_trace(path: str) -> None:
    """Name what a file that is no dlpt profile is, where it plainly is no trace either: an empty
    or damaged `.dlpt`, a Python file, other text. Anything that may be JSON (or gzip) goes on
    to the trace reader, which says what is wrong inside it."""
    with open(path, "rb") as f:
        head = f.read(4096)
    name = os.path.basename(path)
    if name.endswith(".dlpt"):
        if not head:
            raise DlptError(f"{path}: an empty dlpt profile (0 bytes): the recording ended before its first save; "
                            "record it again")
        raise DlptError(f"{path}: a damaged dlpt profile (its header is not a dlpt profile's); "
                        "record or import it again, or restore the file from a copy")
    if not head:
        raise DlptError(f"{path}: the file is empty; expected a dlpt profile or a Kineto trace")
    if head[:2] in (b"\x1f\x8b", b"\xff\xfe", b"\xfe\xff") or head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] in (b"{", b"["):
        return  # gzip, UTF-16 or JSON: a trace, or a damaged one the trace reader describes
    if name.endswith((".py", ".pyw")) or head.startswith(b"#!") or b"import " in head:
        raise DlptError(f"{path}: a Python file, not a profile; to profile it: dlpt record {path}")
    raise DlptError(f"{path}: neither a dlpt profile nor a Kineto trace (a trace is JSON: "
                    "torch.profiler's export_chrome_trace, or on_trace_ready=tensorboard_trace_handler)")


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


def open_profiles(paths: list[str], rank: int | None = None, progress: Progress | None = None,
                  as_ranks: bool = False) -> Profile:
    """Open one or several profiles, Kineto traces, or directories of them: several are merged
    into one profile with a `rank N` node per input (dlpt.merge); `rank` keeps only that rank.
    Inputs that are not ranks of one run (dlpt/runs.py) are refused unless `as_ranks`, which
    merges them anyway as ranks 0..N-1 in the order given."""
    from dlpt.merge import merge_profiles

    files = [f for p in paths for f in input_files(p)]
    prof = merge_profiles([open_profile(f, progress) for f in files], as_ranks=as_ranks)
    prof.path = paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"
    if rank is not None:
        from dlpt.ranks import select_rank

        prof = select_rank(prof, rank)
    return prof


@dataclass(frozen=True)
class Inputs:
    """What `dlpt view` asks the TUI to show: the paths and how to open them. The TUI opens them
    itself, in its background worker, so that its loading screen and progress come up at once;
    the loader still does the opening (`open`), and the viewer only calls it."""

    paths: list[str] = field(default_factory=list)
    rank: int | None = None
    as_ranks: bool = False

    @property
    def name(self) -> str:
        return " ".join(self.paths)

    def open(self, progress: Progress | None = None) -> Profile:
        return open_profiles(self.paths, self.rank, progress=progress, as_ranks=self.as_ranks)
