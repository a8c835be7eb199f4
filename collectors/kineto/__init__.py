"""Importer for Kineto traces (torch.profiler `export_chrome_trace`, `tensorboard_trace_handler`)."""

from __future__ import annotations

import gc
import os

import numpy as np

from dlpt.cct import CCT, TreeBuilder
from dlpt.collectors.kineto.columns import Columns
from dlpt.collectors.kineto.decode import Trace, Unsplittable, decode, decode_chunks, trace_files
from dlpt.collectors.kineto.link import LinkResult, link_columns, link_trace  # noqa: F401
from dlpt.frames import Frame, FrameTable
from dlpt.metrics import COL, collective_mask, exclusive_matrix
from dlpt.profile import Activities, Profile
from dlpt.progress import Progress
from dlpt.transforms import prune_empty
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
    out = LinkResult()
    meta: dict[str, object] = {"source": "kineto", "dlpt_version": __version__,
                               "command": "", "traces": [f]}
    if progress:
        progress(f"reading {os.path.basename(f)}", k, n)
    trace, cols = _read(f)
    rank = trace.distributedInfo.rank if trace.distributedInfo is not None else None
    if isinstance(rank, int):
        meta["rank"] = rank
    link_columns(trace, cols, builder, frames, 0, out)
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
    return finish(builder, frames, out, meta)


def _read(path: str) -> tuple[Trace, Columns]:
    """The trace's metadata and its events sorted into the linker's columns; large files a slice
    at a time (decode.py), so that the decoded events of only one slice are alive at once."""
    sliced = decode_chunks(path)
    if sliced is not None:
        meta, slices = sliced
        cols = Columns()
        try:
            for events in slices:
                cols.add(events)
            return meta, cols
        except Unsplittable:
            pass
    trace = decode(path)
    cols = Columns()
    cols.add(trace.traceEvents)
    trace.traceEvents = []  # the columns hold what linking needs
    return trace, cols


def finish(builder: TreeBuilder, frames: FrameTable, out: LinkResult, meta: dict) -> Profile:
    """Renumber the tree in preorder and total the metrics of every node."""
    parent, frame, new_of_old = builder.preorder()
    i64 = np.int64
    act = Activities(
        node=new_of_old[np.asarray(out.node, dtype=i64)] if out.node else np.zeros(0, i64),
        kind=np.asarray(out.kind, dtype=i64), name=np.asarray(out.name, dtype=i64),
        device=np.asarray(out.device, dtype=i64), stream=np.asarray(out.stream, dtype=i64),
        start=np.asarray(out.start, dtype=i64), duration=np.asarray(out.duration, dtype=i64),
        bytes=np.asarray(out.nbytes, dtype=i64),
        count=np.asarray(out.count, dtype=i64) if out.count else None,
    )
    cpu_node = new_of_old[np.asarray(out.cpu_node, dtype=i64)] if out.cpu_node else np.zeros(0, i64)
    exc = exclusive_matrix(len(parent), act.node, act.kind, act.duration, act.bytes,
                           cpu_node, np.asarray(out.cpu_self, dtype=i64), act.count,
                           collective=collective_mask(frames.frames, act.name, act.kind))
    for metric, (nodes, values) in out.extra.items():
        if len(nodes):
            exc[:, COL[metric]] += np.bincount(new_of_old[np.asarray(nodes, dtype=i64)],
                                               weights=np.asarray(values, dtype=i64),
                                               minlength=len(parent)).astype(i64)
    # Nodes with nothing beneath them (a call that reached no op or GPU work) say nothing.
    return prune_empty(Profile(frames=list(frames.frames), cct=CCT(parent, frame, exc), activities=act, meta=meta))
