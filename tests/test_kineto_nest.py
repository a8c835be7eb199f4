"""Nesting spans with whole-array steps (collectors/kineto/nest.py `nest`) gives what the stack walk
(`nest_loop`) gives: each span's parent and its end clipped to the parent's, on every shape of
input — overlaps, rounding overruns that clip (nested ones too), zero-length spans, equal starts,
several threads — and real traces, whose overruns the whole-array steps settle themselves."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from dlpt.collectors.kineto import link
from dlpt.collectors.kineto import nest as nest_mod
from dlpt.collectors.kineto.nest import nest, nest_loop

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "kineto", "*.json.gz")))


def _order(kind, thread, start, end):
    return np.lexsort((kind, -end, start, thread)) if len(kind) else np.zeros(0, dtype=np.int64)


def _check(start, end, thread, kind) -> None:
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    thread, kind = np.asarray(thread, dtype=np.int64), np.asarray(kind, dtype=np.int64)
    order = _order(kind, thread, start, end)
    got, want = nest(order, thread, start, end), nest_loop(order, thread, start, end)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def _nested(rng, n: int) -> tuple[list[int], list[int]]:
    """Spans nested by construction, some overrunning their parent by a nanosecond or two, and
    the next span often starting where the last one ended."""
    start: list[int] = []
    end: list[int] = []

    def fill(a: int, b: int, depth: int) -> None:
        x = a
        while x < b and len(start) < n:
            s = int(rng.integers(x, b + 1))
            e = int(rng.integers(s, b + 1))
            e += int(rng.integers(1, 3)) if rng.random() < 0.2 else 0
            start.append(s)
            end.append(e)
            if depth < 6 and e > s:
                fill(s, e, depth + 1)
            x = e if rng.random() < 0.5 else e + 1
    fill(0, 400, 0)
    return start, end


@pytest.mark.parametrize("seed", range(4))
def test_nest_is_the_walk(seed):
    rng = np.random.default_rng(seed)
    for trial in range(300):
        shape = trial % 4
        if shape == 0:  # nested, with overruns
            start, end = _nested(rng, int(rng.integers(1, 80)))
            n = len(start)
        else:
            n = int(rng.integers(0, 60))
            top, longest = ((30, 15), (5, 3), (1000, 300))[shape - 1]
            start = rng.integers(0, top, n).tolist()
            end = (np.asarray(start, dtype=np.int64) + rng.integers(0, longest, n)).tolist()
        _check(start, end, rng.integers(0, 3, n), rng.integers(0, 4, n))


def test_edge_cases():
    _check([], [], [], [])
    _check([5], [5], [0], [0])
    _check([0, 0, 0], [0, 0, 0], [0, 0, 0], [2, 1, 0])  # zero-length spans at one time
    _check([0, 0, 10], [20, 10, 20], [0, 0, 0], [0, 1, 2])  # touching: the end is no parent
    _check([0, 5, 9, 10], [10, 11, 12, 12], [0, 0, 0, 0], [0, 0, 0, 0])  # overruns that clip, nested


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_real_traces_need_no_walk(path, monkeypatch):
    # Real traces overrun (float rounding), and the whole-array steps settle them: the walk is
    # only the answer for what they do not settle.
    import dlpt

    calls = []
    real = nest_mod.nest_loop
    monkeypatch.setattr(nest_mod, "nest_loop", lambda *a: calls.append(1) or real(*a))
    assert link.nest is nest
    dlpt.load(path)
    assert calls == []
