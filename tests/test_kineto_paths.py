"""Span nodes found for all spans at once (collectors/kineto/paths.py) give the profile the
one-at-a-time walk gives (walk.py's `SpanWalk`): the same tree, numbered the same, the same
frame ids; and a trace whose links loop, which only the walk reads, still reads.

Below those, the walk's own cases on small traces (test_kineto_link.py's `Events`), each place
written out by hand from the events: a forward op that is the trace's first span (span 0), a
linked op asked for before anything inside it, an op inside a runtime call that sits under the
profile's base (node 0, the base, is that call's own node), and damaged traces whose backward
links loop — met on the way up from a kernel, inside the walk, and through a thread's anchor.
The walk reads a trace's spans in this order: each GPU activity's launch, in the file's order of
GPU events, then every op in the file's order of host spans; a span's node is made with the
nodes it depends on (its parent, or its forward op for a linked backward op, or the span that
started its thread) first. A loop is broken at the first backward link the walk follows to a
span whose node it is still making: that link is dropped and the op stays where it nests."""

from __future__ import annotations

import contextlib
import glob
import os
import signal

import numpy as np
import pytest
from kineto_builder import TraceBuilder
from test_kineto_link import HOW, Events, kernel_paths, self_times

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


EV = "autograd::engine::evaluate_function: "
MAIN = "train.py:10 main"


@contextlib.contextmanager
def _ends_within(seconds: float):
    """A walk that goes round a loop it should have broken fails here instead of hanging."""
    def stop(*_):
        raise TimeoutError(f"the trace was not read in {seconds} s: the walk goes round a loop")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _load(t: Events, tmp_path, monkeypatch, how: str) -> dlpt.Profile:
    """`Events.load`, in bounded time."""
    with _ends_within(10):
        return t.load(tmp_path, how, monkeypatch)


def _load_damaged(t: Events, tmp_path, monkeypatch) -> dlpt.Profile:
    """A trace whose links loop: paths.py must give it up, and the walk must read it."""
    called = []
    real = link.span_paths
    monkeypatch.setattr(link, "span_paths", lambda *a: called.append(real(*a)) or called[-1])
    p = _load(t, tmp_path, monkeypatch, "as linked")
    assert called == [None]
    return p


@pytest.mark.parametrize("how", HOW)
def test_a_forward_op_that_is_the_traces_first_span(tmp_path, monkeypatch, how):
    """The forward op is span 0, the first host span of the file (span numbers are the file's
    order): a link to it is a link like any other."""
    t = Events()
    t.op("aten::mul", 1, 10, 5, seq=3)  # span 0
    t.py("train.py(10): main", 1, 0, 100)
    t.op(f"{EV}MulBackward0", 2, 200, 20, seq=3)  # autograd's thread: linked by the number
    t.launch("k_mulb", 2, 205, 1000)
    p = _load(t, tmp_path, monkeypatch, how)
    mulb = f"{MAIN} > aten::mul > [backward] > {EV}MulBackward0"
    assert kernel_paths(p) == {"k_mulb": f"{mulb} > k_mulb"}
    assert self_times(p) == {f"{MAIN} > aten::mul": 5000, mulb: 20_000}


@pytest.mark.parametrize("how", HOW)
def test_a_linked_op_asked_for_before_anything_inside_it(tmp_path, monkeypatch, how):
    """An `AccumulateGrad` on the Python thread inside `run_backward` (as on the CPU), linked by
    its flow, with no launch of its own: the ops' pass asks for its node first, after the kernel
    launched in `run_backward` made the node of the frame it nests in. It goes under the forward
    op, not under that frame."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::exp", 1, 10, 5)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    t.launch("k_rb", 1, 105, 2000)
    t.op("AccumulateGrad", 1, 200, 10)
    t.flow(1, 1, 10, 1, 200)
    p = _load(t, tmp_path, monkeypatch, how)
    assert kernel_paths(p) == {"k_rb": f"{MAIN} > autograd/graph.py:768 _engine_run_backward > k_rb"}
    assert self_times(p) == {f"{MAIN} > aten::exp": 5000, f"{MAIN} > aten::exp > [backward] > AccumulateGrad": 10_000}


@pytest.mark.parametrize("how", HOW)
def test_a_forward_op_inside_a_runtime_call_under_the_base(tmp_path, monkeypatch, how):
    """A runtime call on the Python thread outside any frame adds no frame: its node is the
    profile's base, node 0. An op that starts inside it (µs timestamps of a call and the next op
    can overlap) nests in it, so its node is its frame under the base; here it is the forward
    op of a backward op whose kernel is read first."""
    t = Events()
    t.op(f"{EV}MulBackward0", 2, 300, 20, seq=4)
    t.launch("k_mulb", 2, 305, 1000)  # the first GPU activity
    t.x("cuda_runtime", "cudaDeviceSynchronize", 1, 10, 20)  # no correlation: it launched nothing
    t.op("aten::mul", 1, 15, 5, seq=4)
    t.py("train.py(10): main", 1, 100, 50)  # thread 1 is a Python thread
    p = _load(t, tmp_path, monkeypatch, how)
    mulb = f"aten::mul > [backward] > {EV}MulBackward0"
    assert kernel_paths(p) == {"k_mulb": f"{mulb} > k_mulb"}
    assert self_times(p) == {"aten::mul": 5000, mulb: 20_000}


def test_a_loop_of_two_links_met_on_the_way_up_from_a_kernel(tmp_path, monkeypatch):
    """E1 (MulBackward0's evaluate_function) is linked to F1 (aten::add), which nests in E2
    (AddBackward0's), linked to F2 (aten::mul), which nests in E1: a loop of two links. The
    first kernel is aten::relu's (its node and main's made). The second, k1, was launched in
    F2: the walk climbs from it through F2 (making F2's node) to E1, follows E1's link to F1,
    climbs to E2, and meets F2, whose node it is making: E2's link is dropped. So E2 nests in
    main, F1 in E2, E1 under F1 and `[backward]`, F2 in E1, and k1 under F2."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::relu", 1, 10, 10)  # span 1, made before the loop is met
    t.launch("k_relu", 1, 12, 1000)
    t.op(f"{EV}MulBackward0", 1, 100, 100)  # E1
    t.op("aten::mul", 1, 120, 50)  # F2
    t.launch("k1", 1, 130, 1010)
    t.op(f"{EV}AddBackward0", 1, 300, 100)  # E2
    t.op("aten::add", 1, 320, 50)  # F1
    t.flow(1, 1, 320, 1, 100)  # F1 -> E1
    t.flow(2, 1, 120, 1, 300)  # F2 -> E2
    p = _load_damaged(t, tmp_path, monkeypatch)
    e2 = f"{MAIN} > {EV}AddBackward0"
    e1 = f"{e2} > aten::add > [backward] > {EV}MulBackward0"
    assert kernel_paths(p) == {"k_relu": f"{MAIN} > aten::relu > k_relu", "k1": f"{e1} > aten::mul > k1"}
    assert self_times(p) == {f"{MAIN} > aten::relu": 10_000, e2: 50_000, f"{e2} > aten::add": 50_000,
                             e1: 50_000, f"{e1} > aten::mul": 50_000}


def test_a_loop_met_inside_the_walk_at_the_traces_first_span(tmp_path, monkeypatch):
    """An evaluate_function op E linked to aten::add, which nests in E and is the trace's first
    span (span 0). The first kernel was launched in E itself, beside aten::add: the walk starts
    at E, follows its link to aten::add, climbs back to E, whose node it is making, and drops
    E's link there. E nests in main; aten::add in E."""
    t = Events()
    t.op("aten::add", 1, 20, 5)  # span 0
    t.py("train.py(10): main", 1, 0, 100)
    t.op(f"{EV}AddBackward0", 1, 10, 50)
    t.launch("k_e", 1, 12, 1000)
    t.flow(1, 1, 20, 1, 10)
    p = _load_damaged(t, tmp_path, monkeypatch)
    e = f"{MAIN} > {EV}AddBackward0"
    assert kernel_paths(p) == {"k_e": f"{e} > k_e"}
    assert self_times(p) == {e: (50 - 5) * 1000, f"{e} > aten::add": 5000}


def test_a_loop_through_a_threads_anchor(tmp_path, monkeypatch):
    """P (MulBackward0's evaluate_function, on the Python thread) called `Thread.start`, so
    thread 3 hangs under P; P is also linked to thread 3's first op (a damaged flow), and E
    (AddBackward0's, on autograd's thread) is linked to P. E's kernel comes first: the walk
    follows E's link to P, P's to thread 3's op, whose thread node needs P's node; making it,
    the walk meets thread 3's op, whose node it is making, and drops P's link. So P nests in
    main, thread 3 under P, and E under P and `[backward]`."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op(f"{EV}MulBackward0", 1, 100, 200)  # P
    t.py("threading.py(990): start", 1, 110, 5)
    t.ev.append({"name": "thread_name", "ph": "M", "pid": 100, "tid": 3, "args": {"name": "worker"}})
    t.op("aten::copy_", 3, 200, 10)
    t.flow(1, 3, 200, 1, 100)  # thread 3's op -> P
    t.op(f"{EV}AddBackward0", 2, 400, 50)  # E
    t.launch("k_e", 2, 410, 2000)
    t.flow(2, 1, 100, 2, 400)  # P -> E
    p = _load_damaged(t, tmp_path, monkeypatch)
    pp = f"{MAIN} > {EV}MulBackward0"
    assert kernel_paths(p) == {"k_e": f"{pp} > [backward] > {EV}AddBackward0 > k_e"}
    assert self_times(p) == {pp: 200_000, f"{pp} > worker > aten::copy_": 10_000,
                             f"{pp} > [backward] > {EV}AddBackward0": 50_000}
