"""Importer for Kineto traces (torch.profiler `export_chrome_trace`, `tensorboard_trace_handler`)."""

from __future__ import annotations

import gc
import os

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.kineto import gunzip
from dlpt.collectors.kineto.columns import Columns, StructBatch, unknown_device_events
from dlpt.collectors.kineto.decode import Trace, Unsplittable, as_int, decode, decode_chunks, skeleton_meta, trace_files
from dlpt.collectors.kineto.link import link_columns
from dlpt.collectors.kineto.memory import add_meta
from dlpt.collectors.kineto.scan import Declined, scan_into
from dlpt.frames import Frame, FrameTable
from dlpt.header import Header, Window
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
    merged.meta.traces = files
    return merged


def _import_one(f: str, progress: Progress | None, k: int, n: int) -> Profile:
    frames = FrameTable()
    builder = TreeBuilder(frames.intern(Frame("root", os.path.basename(f))))
    out = ActivityColumns()
    meta = Header(source="kineto", dlpt_version=__version__, command="", traces=[f])
    if progress:
        progress(f"reading {os.path.basename(f)}", k, n)
    notes: dict[str, int] = {}
    trace, cols = _read(f, notes)
    # NaN and Infinity read as missing (nonfinite.py): how many, and where the first was
    meta.nonfinite, meta.nonfinite_at = notes.get("nonfinite"), notes.get("nonfinite_at")
    rank = trace.distributedInfo.rank if trace.distributedInfo is not None else None
    if isinstance(rank, int) and not isinstance(rank, bool):
        meta.rank = rank
    # The host process: two traces of one process are not two ranks (dlpt/runs.py).
    pids = sorted({pid for pid, _ in cols.thread_ids if as_int(pid) >= 0})
    if pids:
        meta.host_pids = pids
    unknown = unknown_device_events(cols)
    if unknown:
        meta.unknown_device_events = unknown
    window = _wall_window(as_int(trace.baseTimeNanoseconds, 0), cols)
    if window is not None:
        meta.wall_window = window
    link_columns(trace, cols, builder, frames, 0, out, meta)
    add_meta(meta, cols.memory)  # memory and its timeline, from `[memory]` events
    del cols
    if isinstance(trace.deviceProperties, list):
        devices = [d for d in trace.deviceProperties if isinstance(d, dict)]
        if devices:
            meta.devices = devices
    meta.cuda_runtime_version = trace.cuda_runtime_version
    meta.cuda_driver_version = trace.cuda_driver_version
    meta.cupti_version = trace.cupti_version
    if trace.distributedInfo is not None and isinstance(trace.distributedInfo.world_size, int):
        meta.world_size = trace.distributedInfo.world_size
    if progress:
        progress("linking", k + 1, n)
    meta.skipped_events = out.skipped
    return build_profile(builder, frames, out, meta)


# Wall-clock times from before this are no wall clock: a trace with no `baseTimeNanoseconds`
# whose timestamps count from some other origin (a synthetic one, an old tool's).
_EPOCH_2001_NS = 10**18


def _wall_window(base: int, cols: Columns) -> Window | None:
    """{start, end}: when the trace's first event began and its last ended, in ns since the Unix
    epoch. Kineto writes times relative to `baseTimeNanoseconds` (the wall clock floored to a
    quarter year, the same on every rank), and wrote them absolute before it had one."""
    if cols.first is None or cols.last is None or base + cols.first < _EPOCH_2001_NS:
        return None
    return {"start": base + cols.first, "end": base + cols.last}


# Compressed bytes above which a gzip trace is decompressed beside the scan: about the 2 MB of
# JSON at which decode.py reads in slices, at Kineto's usual ratio of 10-15.
GZIP_MIN_BYTES = 200_000


def _read(path: str, notes: dict[str, int]) -> tuple[Trace, Columns]:
    """The trace's metadata and its events sorted into the linker's columns. A large file is
    scanned in C (scan.py) where that is built and reads it; else decoded a slice at a time
    (decode.py), so that the decoded events of only one slice are alive at once."""
    if os.path.getsize(path) > GZIP_MIN_BYTES and gunzip.is_gzip(path):
        # A large gzip trace: decompressed on a thread while the scan reads it (gunzip.py).
        with open(path, "rb") as f:
            raw = f.read()
        cols = Columns()
        try:
            return gunzip.read(raw, cols.add), cols
        except Declined:
            pass  # read below, as any trace is
        del raw, cols
    sliced = decode_chunks(path, notes=notes)
    if sliced is not None:
        cols = Columns()
        try:
            end = scan_into(cols.add, sliced.data, sliced.lo, sliced.hi)
            meta = sliced.meta
            if end != sliced.hi:
                # The events array ended before the bracket decode.py took for its end: the
                # metadata is read again around the true end (the array form has none, and
                # nothing may follow its bracket).
                is_object = sliced.data[:sliced.lo].lstrip()[:1] == b"{"
                found = skeleton_meta(sliced.data, sliced.lo, end) if is_object else None
                if found is None:
                    raise Declined("the events array ended before the file's last bracket")
                meta = found
            return meta, cols
        except Declined:
            pass  # the Python reader reads it
        cols = Columns()
        try:
            for events in sliced.slices:
                cols.add(StructBatch(events))
            return sliced.meta, cols
        except Unsplittable:
            notes.clear()  # read again, whole
    trace = decode(path, notes)
    cols = Columns()
    cols.add(StructBatch(trace.traceEvents))
    trace.traceEvents = []  # the columns hold what linking needs
    return trace, cols
