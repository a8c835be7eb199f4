"""Span nodes found for all spans at once (collectors/kineto/paths.py) give the profile the
one-at-a-time walk gives (walk.py's `SpanWalk`): the same tree, numbered the same, the same
frame ids; and a trace whose links loop, which only the walk reads, still reads."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from kineto_builder import TraceBuilder

import dlpt
from dlpt.collectors.kineto import link
from dlpt.metrics import COL

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "kineto", "*.json.gz")))


def _same(a: dlpt.Profile, b: dlpt.Profile) -> None:
    assert a.frames == b.frames
    for x, y in ((a.cct.parent, b.cct.parent), (a.cct.frame, b.cct.frame), (a.cct.exclusive, b.cct.exclusive)):
        np.testing.assert_array_equal(x, y)
    for f in ("node", "kind", "name", "start", "duration"):
        np.testing.assert_array_equal(getattr(a.activities, f), getattr(b.activities, f))
    assert a.meta == b.meta


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_paths_give_the_walks_profile(path, monkeypatch):
    fast = dlpt.load(path)
    monkeypatch.setattr(link, "span_paths", lambda *a: None)  # the one-at-a-time walk
    _same(fast, dlpt.load(path))


def test_a_looping_backward_link_reads(tmp_path, monkeypatch):
    # A backward op whose fwdbwd flow starts at an op inside it: its context would be its own.
    t = TraceBuilder()
    t.py(1, "main", 0, 100)
    t.op("autograd::engine::evaluate_function: AddBackward0", 10, 50)
    t.kernel(20, 2, 30, 5)
    t.events += [{"ph": "s", "cat": "fwdbwd", "id": 1, "pid": t.pid, "tid": 4242, "ts": 20, "name": "fwdbwd"},
                 {"ph": "f", "cat": "fwdbwd", "id": 1, "pid": t.pid, "tid": 4242, "ts": 10, "name": "fwdbwd",
                  "bp": "e"}]
    t.kernel(70, 2, 80, 5)
    path = t.write(tmp_path / "loop.pt.trace.json.gz")
    called = []
    real = link.span_paths

    def spy(*a):
        called.append(real(*a))
        return called[-1]

    monkeypatch.setattr(link, "span_paths", spy)
    p = dlpt.load(str(path))
    assert called == [None]  # the loop is left to the walk
    assert int(p.cct.exclusive[:, COL["gpu_time"]].sum()) == 10_000
