"""`-f speedscope`: speedscope's file format (https://www.speedscope.app/file-format-schema.json).

The first profile is `sampled`: one sample per calling context with a nonzero value of
`--metric`, weighted by that value with its unit declared (`nanoseconds` for times, `bytes`,
`none` for counts), so speedscope's totals equal the profile's. Then, when the profile has GPU
activities, one `evented` profile per (device, stream): the GPU timeline, each activity under
its call path, in nanoseconds from the first activity of the profile."""

from __future__ import annotations

from typing import Any, TextIO

import numpy as np

from dlpt.frames import Frame
from dlpt.metrics import BYTE_METRICS, TIME_METRICS, metric_column
from dlpt.output import write_json
from dlpt.profile import Profile, default_metric
from dlpt.version import __version__
from dlpt.viewers.exporters.base import ExportOptions
from dlpt.viewers.exporters.folded import weighted_stacks

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def unit_of(metric: str) -> str:
    if metric in TIME_METRICS:
        return "nanoseconds"
    if metric in BYTE_METRICS:
        return "bytes"
    return "none"


def _frame(frame: Frame) -> dict[str, Any]:
    d: dict[str, Any] = {"name": frame.label()}
    if frame.file:
        d["file"] = frame.file
        if frame.line > 0:
            d["line"] = int(frame.line)
    return d


def _stream_timelines(prof: Profile, shared_index: list[int], name: str) -> list[dict[str, Any]]:
    """One evented profile per (device, stream). Activities on a stream run one after another;
    where the trace shows a small overlap the later one is clipped to start when the earlier
    ends, so the events nest as speedscope requires. Frames shared by back-to-back activities
    stay open between them; a gap closes everything."""
    acts = prof.activities
    if not len(acts):
        return []
    cct = prof.cct
    t0 = int(acts.start.min())
    out = []
    keys = np.unique(np.stack([acts.device, acts.stream], axis=1), axis=0)
    for dev, stream in keys.tolist():
        sel = np.flatnonzero((acts.device == dev) & (acts.stream == stream))
        sel = sel[np.argsort(acts.start[sel], kind="stable")]
        events: list[dict[str, Any]] = []
        open_path: list[int] = []  # shared frame indexes currently open
        last_end = None
        for a in sel.tolist():
            start = int(acts.start[a]) - t0
            end = start + int(acts.duration[a])
            if last_end is not None:
                start = max(start, last_end)
                end = max(end, start)
            node = int(acts.node[a])
            path = [shared_index[int(cct.frame[i])] for i in cct.path(node)] or [shared_index[int(cct.frame[0])]]
            keep = 0
            if last_end is not None and start == last_end:
                while keep < min(len(path), len(open_path)) and path[keep] == open_path[keep]:
                    keep += 1
            close_at = last_end if last_end is not None else start
            for f in reversed(open_path[keep:]):
                events.append({"type": "C", "frame": f, "at": close_at})
            for f in path[keep:]:
                events.append({"type": "O", "frame": f, "at": start})
            open_path = path
            last_end = end
        for f in reversed(open_path):
            events.append({"type": "C", "frame": f, "at": last_end})
        out.append({"type": "evented", "name": f"{name} · GPU {dev} stream {stream}", "unit": "nanoseconds",
                    "startValue": 0, "endValue": last_end or 0, "events": events})
    return out


def speedscope_document(prof: Profile, metric: str | None = None) -> dict[str, Any]:
    """The speedscope document of a profile already in its command's `Scope`."""
    metric = metric or default_metric(prof)
    col = metric_column(metric)
    cct = prof.cct
    # Only frames that appear somewhere are listed; shared_index maps frame id → list index.
    used = np.unique(cct.frame).tolist()
    shared_index = [-1] * len(prof.frames)
    frames: list[dict[str, Any]] = []
    for fi in used:
        shared_index[fi] = len(frames)
        frames.append(_frame(prof.frames[fi]))
    frame = cct.frame.tolist()
    samples: list[list[int]] = []
    weights: list[int] = []
    for path, v in weighted_stacks(cct, cct.exclusive[:, col]):
        samples.append([shared_index[frame[i]] for i in path])
        weights.append(v)
    name = str(prof.meta.command or prof.path or prof.frame_of(0).name or "dlpt profile")
    profiles: list[dict[str, Any]] = [{
        "type": "sampled", "name": f"{name} · {metric}", "unit": unit_of(metric),
        "startValue": 0, "endValue": int(sum(weights)), "samples": samples, "weights": weights,
    }]
    profiles.extend(_stream_timelines(prof, shared_index, name))
    return {"$schema": SCHEMA, "shared": {"frames": frames}, "profiles": profiles, "name": name,
            "activeProfileIndex": 0, "exporter": f"dlpt {__version__}"}


class SpeedscopeExporter:
    name = "speedscope"
    suffix = ".speedscope.json"
    description = "speedscope JSON: --metric as a sampled profile (ns), plus the GPU timeline of each stream"

    def export(self, profile: Profile, out: TextIO, options: ExportOptions) -> None:
        doc = speedscope_document(options.scope.for_trees().apply(profile), options.metric_for(profile))
        write_json(out, doc, compact=True)
