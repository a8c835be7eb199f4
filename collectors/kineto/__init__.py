"""Importer for Kineto traces (torch.profiler `export_chrome_trace`, `tensorboard_trace_handler`)."""

from __future__ import annotations

import gc
import os

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.kineto.columns import Columns, unknown_device_events
from dlpt.collectors.kineto.decode import Trace, Unsplittable, decode, decode_chunks, trace_files
from dlpt.collectors.kineto.link import link_columns
from dlpt.collectors.kineto.memory import add_meta
from dlpt.frames import Frame, FrameTable
from dlpt.profile import Profile
from dlpt.progress import Progress
from dlpt.version import __version__


def import_traces(paths: list[str] | str, progress: Progress | None = None) -> Profile:
    """Read Kineto trace files (or directories of per-rank files) into one profile.

    One file gives one tree; several (ranks) give one subtree per file under a `rank N` node.
    """
    # The importer allocates millions of small objects (columns, tuples, dict entries) and frees
    # them at the end; none form cycles, so the cyclic collector only re-walks the ones still
    # alive, again and again: on a 500k-event trace that was a third of the run.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _import_traces(paths, progress)
    finally:
        if was_enabled:
            gc.enable()


def _import_traces(paths: list[str] | str, progress: Progress | None) -> Profile:
    if isinstance(paths, str):
        paths = [paths]
    files = [f for p in paths for f in trace_files(p)]
    if len(files) == 1:
        return _import_one(files[0], progress, 0, 1)
    from dlpt.merge import merge_profiles

    # Several traces (ranks): each is read alone, then merged the one way dlpt merges profiles.
    parts = []
    for k, f in enumerate(files):
        part = _import_one(f, progress, k, len(files))
        part.path = f
        parts.append(part)
    merged = merge_profiles(parts)
    merged.meta["traces"] = files
    return merged


def _import_one(f: str, progress: Progress | None, k: int, n: int) -> Profile:
    frames = FrameTable()
    builder = TreeBuilder(frames.intern(Frame("root", os.path.basename(f))))
    out = ActivityColumns()
    meta: dict[str, object] = {"source": "kineto", "dlpt_version": __version__,
                               "command": "", "traces": [f]}
    if progress:
        progress(f"reading {os.path.basename(f)}", k, n)
    notes: dict[str, int] = {}
    trace, cols = _read(f, notes)
    meta.update(notes)  # NaN and Infinity read as missing (nonfinite.py): how many, and where
    rank = trace.distributedInfo.rank if trace.distributedInfo is not None else None
    if isinstance(rank, int):
        meta["rank"] = rank
    unknown = unknown_device_events(cols)
    if unknown:
        meta["unknown_device_events"] = unknown
    link_columns(trace, cols, builder, frames, 0, out, meta)
    add_meta(meta, cols.memory)  # memory and its timeline, from `[memory]` events
    del cols
    if isinstance(trace.deviceProperties, list):
        devices = [d for d in trace.deviceProperties if isinstance(d, dict)]
        if devices:
            meta["devices"] = devices
    for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version"):
        v = getattr(trace, key)
        if v is not None:
            meta.setdefault(key, v)
    if trace.distributedInfo is not None and isinstance(trace.distributedInfo.world_size, int):
        meta["world_size"] = trace.distributedInfo.world_size
    if progress:
        progress("linking", k + 1, n)
    meta["skipped_events"] = out.skipped
    return build_profile(builder, frames, out, meta)


def _read(path: str, notes: dict[str, int]) -> tuple[Trace, Columns]:
    """The trace's metadata and its events sorted into the linker's columns; large files a slice
    at a time (decode.py), so that the decoded events of only one slice are alive at once."""
    sliced = decode_chunks(path, notes=notes)
    if sliced is not None:
        meta, slices = sliced
        cols = Columns()
        try:
            for events in slices:
                cols.add(events)
            return meta, cols
        except Unsplittable:
            notes.clear()  # read again, whole
    trace = decode(path, notes)
    cols = Columns()
    cols.add(trace.traceEvents)
    trace.traceEvents = []  # the columns hold what linking needs
    return trace, cols
