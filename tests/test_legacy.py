"""Traces from 2021 and before name their categories differently (`Kernel`, `Runtime`,
`Operator`, `Memcpy`, `Memset`, `external id`) and have no `baseTimeNanoseconds`; they must
link the same way."""

from __future__ import annotations

import gzip
import json

import numpy as np
from conftest import raw_events, trace_path

import dlpt
from dlpt.metrics import COL

LEGACY = {"kernel": "Kernel", "cuda_runtime": "Runtime", "cpu_op": "Operator", "gpu_memcpy": "Memcpy",
          "gpu_memset": "Memset"}


def legacy_copy(name: str, dst) -> None:
    events = []
    for e in raw_events(name):
        e = dict(e)
        if e.get("cat") in LEGACY:
            e["cat"] = LEGACY[e["cat"]]
        if isinstance(e.get("args"), dict) and "External id" in e["args"]:
            a = dict(e["args"])
            a["external id"] = a.pop("External id")
            e["args"] = a
        events.append(e)
    with gzip.open(dst, "wt") as f:
        json.dump({"schemaVersion": 1, "traceEvents": events}, f)


def test_legacy_categories_link_like_current_ones(tmp_path):
    dst = tmp_path / "old.pt.trace.json.gz"
    legacy_copy("copies", dst)
    old = dlpt.load(str(dst))
    new = dlpt.load(str(trace_path("copies")))
    assert (old.cct.exclusive.sum(axis=0) == new.cct.exclusive.sum(axis=0)).all()
    # The same leaves under the same paths.
    def paths(p):
        return sorted((tuple(f.label() for f in p.call_path(i)), int(p.cct.exclusive[i, COL["gpu_time"]]))
                      for i in np.flatnonzero(p.cct.exclusive[:, COL["gpu_time"]]))
    assert paths(old) == paths(new)
    # No base time: starts are the trace's own microseconds in ns.
    assert old.activities.start.min() < new.activities.start.min()
