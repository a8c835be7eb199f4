"""The Kineto linker's rules (collectors/kineto/link.py, paths.py, walk.py) on small traces built
here event by event, each kernel's expected place and each op's host self time written out by
hand from the events: a reader checks them against the rules in link.py's docstring, not against
the linker's code. Each trace is read through paths.py (all spans at once), through walk.py's
one-at-a-time walk, and with its events written in reverse order, which must all give what the
rules say."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import dlpt
from dlpt.collectors.kineto import link
from dlpt.metrics import COL

PID = 100


class Events:
    """Events of one process (pid PID, times in µs) and one GPU (pid 0): host spans on any
    thread, launches each with its kernel, fwdbwd flows."""

    def __init__(self) -> None:
        self.ev: list[dict] = [{"name": "thread_name", "ph": "M", "pid": PID, "tid": 1, "args": {"name": "python3"}}]
        self._corr = 0

    def x(self, cat: str, name: str, tid: int, ts: float, dur: float, seq: int | None = None) -> None:
        args = {} if seq is None else {"Sequence number": seq}
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
                        "args": args})

    def py(self, name: str, tid: int, ts: float, dur: float) -> None:
        self.x("python_function", name, tid, ts, dur)

    def op(self, name: str, tid: int, ts: float, dur: float, seq: int | None = None) -> None:
        self.x("cpu_op", name, tid, ts, dur, seq)

    def launch(self, kernel: str, tid: int, ts: float, gpu_ts: float, corr: int | None = None) -> int:
        """A 2 µs cudaLaunchKernel at ts and its 3 µs kernel at gpu_ts; its correlation."""
        self._corr += 1
        c = self._corr if corr is None else corr
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": tid,
                        "ts": ts, "dur": 2, "args": {"correlation": c}})
        self.kernel(kernel, gpu_ts, c)
        return c

    def kernel(self, name: str, gpu_ts: float, corr: int | None, device: int = 0, stream: int = 7) -> None:
        """A 3 µs kernel; corr None: one without a correlation."""
        args = {"device": device, "stream": stream} | ({} if corr is None else {"correlation": corr})
        self.ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": gpu_ts, "dur": 3,
                        "args": args})

    def flow(self, fid: int, tid_s: int, ts_s: float, tid_f: int, ts_f: float) -> None:
        self.ev += [{"ph": "s", "cat": "fwdbwd", "id": fid, "pid": PID, "tid": tid_s, "ts": ts_s, "name": "fwdbwd"},
                    {"ph": "f", "cat": "fwdbwd", "id": fid, "pid": PID, "tid": tid_f, "ts": ts_f, "name": "fwdbwd",
                     "bp": "e"}]

    def load(self, tmp_path, how: str, monkeypatch, base_ns: int | None = 0) -> dlpt.Profile:
        """The trace read through paths.py (`how` "paths", which must not give it up to the
        walk), through the walk ("walk"), or as link.py chooses (anything else); "-reversed"
        writes its events in the opposite order, which must change nothing: spans nest by time,
        and the first span, thread and flow in the file are no different from the others."""
        path = tmp_path / f"t{len(list(tmp_path.iterdir()))}.pt.trace.json.gz"
        ev = self.ev[::-1] if how.endswith("-reversed") else self.ev
        with gzip.open(path, "wt") as f:
            head = {} if base_ns is None else {"baseTimeNanoseconds": base_ns}  # None: a trace without one
            json.dump({"schemaVersion": 1, **head, "traceEvents": ev}, f)
        got = []
        with monkeypatch.context() as m:
            if how.startswith("walk"):
                m.setattr(link, "span_paths", lambda *a: None)
            elif how.startswith("paths"):  # paths.py reads every trace whose links do not loop
                real = link.span_paths
                m.setattr(link, "span_paths", lambda *a: got.append(real(*a)) or got[-1])
            p = dlpt.load(str(path))
        assert not how.startswith("paths") or (len(got) == 1 and got[0] is not None)
        return p


def _path(p: dlpt.Profile, node: int) -> str:
    return " > ".join(f.label() for f in p.call_path(node))


def kernel_paths(p: dlpt.Profile) -> dict[str, str]:
    """Each kernel's place, by its name (one kernel of each name)."""
    return {p.frames[int(f)].name: _path(p, int(n)) for n, f in zip(p.activities.node, p.activities.name)}


def self_times(p: dlpt.Profile) -> dict[str, int]:
    """Host op self time (cpu_time, ns) of each node that has some, by its path."""
    col = p.cct.exclusive[:, COL["cpu_time"]]
    return {_path(p, i): int(col[i]) for i in range(len(p.cct)) if col[i]}


HOW = ["paths", "walk", "paths-reversed", "walk-reversed"]


@pytest.mark.parametrize("how", HOW)
def test_every_rule_of_the_linker_on_one_small_trace(tmp_path, monkeypatch, how):
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::linear", 1, 10, 90, seq=5)
    t.op("aten::mm", 1, 30, 50, seq=5)  # the last op to carry 5: it created MmBackward0's node
    t.launch("k_mm", 1, 40, 1040)
    t.launch("k_lin", 1, 85, 1050)
    t.op("aten::add", 1, 150, 20, seq=6)
    t.launch("k_add", 1, 155, 1060)
    t.py("train.py(20): step", 1, 200, 700)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 210, 600)
    # The autograd engine's thread (2, no Python frames).
    t.op("autograd::engine::evaluate_function: MmBackward0", 2, 300, 100, seq=5)  # no flow: by number
    t.op("aten::mm", 2, 310, 80)
    t.launch("k_mmb", 2, 320, 1100)
    t.op("autograd::engine::evaluate_function: AddBackward0", 2, 500, 100, seq=6)
    t.op("AddBackward0", 2, 505, 85, seq=6)
    t.launch("k_addb", 2, 510, 1110)
    t.flow(9, 1, 150, 2, 505)  # aten::add -> AddBackward0 (inside its evaluate_function)
    t.op("aten::zeros", 2, 700, 10)  # not linked, while run_backward waits
    t.launch("k_zero", 2, 702, 1120)
    t.op("aten::ones", 2, 950, 10)  # after run_backward: a thread node
    t.launch("k_one", 2, 952, 1130)
    # Thread 3, started from train.py:30 (named "loader").
    t.ev.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": 3, "args": {"name": "loader"}})
    t.py("threading.py(990): start", 1, 925, 5)
    t.py("train.py(35): start", 1, 937, 5)  # a function of the user's named start: no Thread.start
    t.op("aten::copy_", 3, 945, 20)
    t.launch("k_copy", 3, 950, 1140)
    t.kernel("k_orphan", 1150, 999)  # no launch has its correlation
    t.kernel("k_nocorr", 1155, None)  # no correlation at all
    t.launch("k_top2", 2, 980, 1160)  # a launch in no span: under its thread's node
    t.launch("k_top1", 1, 1005, 1170)  # on the Python thread: under the profile's base
    corr = t.launch("k_graph1", 1, 990, 1180)  # one launch, two kernels (a graph's)
    t.kernel("k_graph2", 1190, corr)
    t.py("train.py(30): spawn", 1, 920, 15)  # the first span when the events are reversed
    p = t.load(tmp_path, how, monkeypatch)
    main = "train.py:10 main"
    mmb = f"{main} > aten::linear > aten::mm > [backward] > autograd::engine::evaluate_function: MmBackward0"
    addb = f"{main} > aten::add > [backward] > autograd::engine::evaluate_function: AddBackward0"
    zeros = f"{main} > train.py:20 step > autograd/graph.py:768 _engine_run_backward > [backward] > aten::zeros"
    assert kernel_paths(p) == {
        "k_mm": f"{main} > aten::linear > aten::mm > k_mm",
        "k_lin": f"{main} > aten::linear > k_lin",
        "k_add": f"{main} > aten::add > k_add",
        "k_mmb": f"{mmb} > aten::mm > k_mmb",
        "k_addb": f"{addb} > AddBackward0 > k_addb",
        "k_zero": f"{zeros} > k_zero",
        "k_one": "thread 2 > aten::ones > k_one",
        "k_copy": f"{main} > train.py:30 spawn > loader > aten::copy_ > k_copy",
        "k_orphan": "<unattributed: no launch record> > k_orphan",
        "k_nocorr": "<unattributed: no launch record> > k_nocorr",
        "k_top2": "thread 2 > k_top2",
        "k_top1": "k_top1",
        "k_graph1": f"{main} > k_graph1",
        "k_graph2": f"{main} > k_graph2",
    }
    # Self time: the duration less the ops directly inside (launches and frames are not ops).
    assert self_times(p) == {
        f"{main} > aten::linear": (90 - 50) * 1000,
        f"{main} > aten::linear > aten::mm": 50_000,
        f"{main} > aten::add": 20_000,
        mmb: (100 - 80) * 1000,
        f"{mmb} > aten::mm": 80_000,
        addb: (100 - 85) * 1000,
        f"{addb} > AddBackward0": 85_000,
        zeros: 10_000,
        "thread 2 > aten::ones": 10_000,
        f"{main} > train.py:30 spawn > loader > aten::copy_": 20_000,
    }


@pytest.mark.parametrize("how", HOW)
def test_nesting_by_time_and_self_time_at_the_edges(tmp_path, monkeypatch, how):
    """Spans nest by time on their thread: one that overruns its parent is cut at the parent's
    end; one starting as another ends is its sibling; of two starting together the longer is
    outside, of two equal ones the Python frame (then an annotation, an op, a launch). An op's
    self time is its duration less the ops and annotations directly inside it, through Python
    frames; an annotation keeps none, and the ops inside it are subtracted from nothing."""
    t = Events()
    t.op("outer", 1, 0, 100)  # span 0, on a thread with Python frames: under the profile's base
    t.op("inner", 1, 50, 100)  # overruns outer: cut to 50..100
    t.py("train.py(5): f", 1, 10, 30)
    t.op("deep", 1, 20, 10)  # inside outer through the frame f
    t.op("a", 1, 200, 10)
    t.op("b", 1, 210, 10)  # starts as a ends: beside it, not inside
    t.launch("k_b", 1, 212, 2000)
    t.op("c", 1, 300, 50)
    t.py("train.py(7): g", 1, 300, 100)  # same start, longer: around c
    t.launch("k_c", 1, 310, 2010)
    t.op("d", 1, 500, 100)
    t.py("train.py(8): h", 1, 500, 50)  # same start, shorter: inside d
    t.launch("k_h", 1, 510, 2020)
    t.op("e", 1, 700, 100)
    t.py("train.py(9): same", 1, 700, 100)  # same span as e: the frame is outside
    t.launch("k_e", 1, 710, 2030, corr=0)  # correlation 0 is a correlation
    t.op("CompiledFunction", 1, 900, 100)
    t.x("user_annotation", "## Call ##", 1, 910, 50)
    t.op("aten::mm", 1, 920, 20)
    t.launch("k_mm", 1, 925, 2040)
    t.op("full", 1, 1200, 10)  # filled by its two ops: no self time
    t.op("half", 1, 1200, 5)
    t.op("half", 1, 1205, 5)
    t.op("x", 1, 1100, 50)
    t.py("train.py(12): inner", 1, 1105, 40)
    t.op("y", 1, 1110, 5)  # inside x through two frames
    t.py("train.py(11): outer", 1, 1102, 45)  # the first span when the events are reversed
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {
        "k_b": "b > k_b",
        "k_c": "train.py:7 g > c > k_c",
        "k_h": "d > train.py:8 h > k_h",
        "k_e": "train.py:9 same > e > k_e",
        "k_mm": "CompiledFunction > ## Call ## > aten::mm > k_mm",
    }
    assert self_times(p) == {
        "outer": (100 - 50 - 10) * 1000,
        "outer > inner": 50_000,
        "outer > train.py:5 f > deep": 10_000,
        "a": 10_000, "b": 10_000, "train.py:7 g > c": 50_000, "d": 100_000,
        "train.py:9 same > e": 100_000,
        "CompiledFunction": (100 - 50) * 1000,
        "CompiledFunction > ## Call ## > aten::mm": 20_000,
        "full > half": 2 * 5000,
        "x": (50 - 5) * 1000,
        "x > train.py:11 outer > train.py:12 inner > y": 5000,
    }


@pytest.mark.parametrize("how", HOW)
def test_backward_links_and_thread_anchors_at_the_edges(tmp_path, monkeypatch, how):
    """A backward op links through a fwdbwd flow (each end the first op at the flow's thread and
    time, the end climbing to the `evaluate_function` around it, else the op itself), else
    through its sequence number to the last op on a Python thread that carries it, 0 included;
    a flow missing its start or ending where no op starts links nothing. Autograd's thread's
    other spans go under the `run_backward` call waiting when they start (its start included,
    its end not), else under a thread node; a started thread under the frame around the last
    `Thread.start` before its first event."""
    t = Events()
    t.flow(4, 1, 5, 2, 200)  # only its end is kept below: a flow without a start
    t.ev = [e for e in t.ev if not (e.get("id") == 4 and e["ph"] == "s")]
    t.py("train.py(10): main", 1, 0, 2000)
    t.op("aten::mul", 1, 10, 10, seq=0)
    t.op("aten::div", 1, 30, 10, seq=7)
    t.op("aten::sub", 1, 50, 10, seq=8)
    t.op("aten::neg", 1, 70, 10, seq=9)
    t.op("aten::exp", 1, 80, 5)
    t.op("aten::empty", 2, 100, 5)  # starts as run_backward does
    t.launch("k_empty", 2, 101, 3000)
    t.op("autograd::engine::evaluate_function: MulBackward0", 2, 200, 50, seq=0)
    t.op("aten::mul", 2, 210, 10, seq=0)  # carries 0 too, on no Python thread: not a forward op
    t.launch("k_mulb", 2, 212, 3010)
    t.op("autograd::engine::evaluate_function: DivBackward0", 2, 300, 50)  # no number: by its flow only
    t.op("DivBackward0", 2, 305, 40)
    t.launch("k_divb", 2, 310, 3020)
    t.flow(1, 1, 30, 2, 305)
    t.op("autograd::engine::evaluate_function: SubBackward0", 2, 450, 50, seq=8)
    t.op("SubBackward0", 2, 460, 30)
    t.launch("k_subb", 2, 465, 3030)
    t.flow(2, 1, 50, 2, 455)  # no op starts at 455: linked by number instead
    t.op("AccumulateGrad", 2, 620, 10)  # in no evaluate_function: the flow links the op itself
    t.launch("k_acc", 2, 622, 3040)
    t.flow(3, 1, 70, 2, 620)
    t.op("AccumulateGrad", 1, 650, 10)  # on the waiting thread itself (as on CPU), in run_backward
    t.launch("k_acc1", 1, 651, 3045)
    t.flow(6, 1, 80, 1, 650)
    t.op("aten::fill_", 2, 700, 5)  # starts as run_backward ends
    t.launch("k_fill", 2, 701, 3050)
    t.ev.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": 3, "args": {"name": "worker"}})
    t.py("train.py(41): spawn_a", 1, 800, 40)
    t.py("threading.py(990): start", 1, 810, 5)
    t.py("train.py(42): spawn_b", 1, 850, 40)
    t.py("threading.py(990): start", 1, 860, 5)
    t.op("aten::copy_", 3, 820, 10)  # after the first start, before the second
    t.launch("k_w3", 3, 821, 3060)
    t.op("aten::add", 4, 870, 10)  # after the second; thread 4 has no name
    t.launch("k_w4", 4, 871, 3070)
    t.flow(5, 1, 10, 4, 5000)  # ends after every op of the last thread: links nothing
    # the first span when the events are reversed
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    p = t.load(tmp_path, how, monkeypatch)
    main = "train.py:10 main"
    ev = "autograd::engine::evaluate_function:"
    assert kernel_paths(p) == {
        "k_empty": f"{main} > autograd/graph.py:768 _engine_run_backward > [backward] > aten::empty > k_empty",
        "k_mulb": f"{main} > aten::mul > [backward] > {ev} MulBackward0 > aten::mul > k_mulb",
        "k_divb": f"{main} > aten::div > [backward] > {ev} DivBackward0 > DivBackward0 > k_divb",
        "k_subb": f"{main} > aten::sub > [backward] > {ev} SubBackward0 > SubBackward0 > k_subb",
        "k_acc": f"{main} > aten::neg > [backward] > AccumulateGrad > k_acc",
        "k_acc1": f"{main} > aten::exp > [backward] > AccumulateGrad > k_acc1",
        "k_fill": "thread 2 > aten::fill_ > k_fill",
        "k_w3": f"{main} > train.py:41 spawn_a > worker > aten::copy_ > k_w3",
        "k_w4": f"{main} > train.py:42 spawn_b > thread 4 > aten::add > k_w4",
    }


@pytest.mark.parametrize("how", HOW)
def test_a_flow_end_is_looked_up_on_its_own_thread(tmp_path, monkeypatch, how):
    """A flow's end is the first op at its time *on its thread*: the backward op on thread 2
    starts at 15 µs, the second of all the times here, and thread 1's last op at 900 µs, the
    last of them, must not be taken for it, however the (thread, time) pairs are encoded."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::mul", 1, 10, 3)
    for k in range(1, 9):
        t.op("aten::relu", 1, 100 * k, 5)
    t.launch("k_last", 1, 801, 2000)
    t.op("autograd::engine::evaluate_function: MulBackward0", 2, 15, 20)
    t.launch("k_mulb", 2, 16, 2010)
    t.flow(1, 1, 10, 2, 15)
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {
        "k_last": "train.py:10 main > aten::relu > k_last",
        "k_mulb": "train.py:10 main > aten::mul > [backward] > autograd::engine::evaluate_function: MulBackward0 "
                  "> k_mulb",
    }


@pytest.mark.parametrize("how", HOW)
def test_a_flow_ending_inside_an_evaluate_function_links_it(tmp_path, monkeypatch, how):
    """The flow ends at the backward node's op, inside its `evaluate_function`: the whole
    `evaluate_function` is linked (here, reversed, the trace's first span)."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 100)
    t.op("aten::mul", 1, 10, 5)
    t.op("MulBackward0", 2, 30, 10)
    t.launch("k_mulb", 2, 31, 200)
    t.flow(1, 1, 10, 2, 30)
    t.op("autograd::engine::evaluate_function: MulBackward0", 2, 28, 20)
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {
        "k_mulb": "train.py:10 main > aten::mul > [backward] > autograd::engine::evaluate_function: MulBackward0 "
                  "> MulBackward0 > k_mulb"}


@pytest.mark.parametrize("how", HOW)
def test_flows_with_no_op_at_either_end_link_nothing(tmp_path, monkeypatch, how):
    """A trace of Python frames and launches only (its ops left out, but one on a thread without
    Python frames) whose fwdbwd flows remain: nothing to link them to, every kernel under its
    launch's frame; no `run_backward` waits, so that thread's work is under a thread node."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 100)
    t.launch("k1", 1, 10, 200)
    t.py("train.py(11): bwd", 2, 20, 30)
    t.launch("k2", 2, 25, 210)
    t.flow(1, 1, 10, 2, 20)
    t.op("aten::add", 3, 60, 10)  # a thread without Python frames, in a trace without run_backward
    t.launch("k3", 3, 61, 220)
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {"k1": "train.py:10 main > k1", "k2": "train.py:11 bwd > k2",
                               "k3": "thread 3 > aten::add > k3"}


@pytest.mark.parametrize("how", HOW)
def test_flows_in_a_trace_without_ops(tmp_path, monkeypatch, how):
    """A trace of Python frames and launches only, not one op anywhere, whose fwdbwd flow
    remains: no op at either of its ends, nothing linked; each kernel under its launch's frame."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 100)
    t.launch("k1", 1, 10, 200)
    t.py("train.py(11): bwd", 2, 20, 30)
    t.launch("k2", 2, 25, 210)
    t.flow(1, 1, 10, 2, 20)
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {"k1": "train.py:10 main > k1", "k2": "train.py:11 bwd > k2"}


@pytest.mark.parametrize("how", HOW)
def test_a_backward_op_on_the_waiting_thread_linked_by_number(tmp_path, monkeypatch, how):
    """On CPU the autograd engine runs the backward ops on the thread that called backward, a
    Python thread. Without a fwdbwd flow, MulBackward0's `evaluate_function` (number 3) links to
    the last op on a Python thread that carries 3 and is no backward op: aten::mul, not itself."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::mul", 1, 10, 10, seq=3)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    t.op("autograd::engine::evaluate_function: MulBackward0", 1, 200, 50, seq=3)
    t.launch("k_mulb", 1, 210, 2000)
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {
        "k_mulb": "train.py:10 main > aten::mul > [backward] > autograd::engine::evaluate_function: MulBackward0 > k_mulb"}


@pytest.mark.parametrize("how", HOW)
def test_the_run_backward_waiting_is_not_only_the_last_to_start(tmp_path, monkeypatch, how):
    """Thread 2 (autograd's, no Python frames) starts an op at 400. Two `run_backward` calls
    started before: thread 1's at 100, still waiting (to 800), and thread 4's at 300, over at 350.
    The op's place is under thread 1's, the one waiting at 400."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 700)
    t.py("other.py(5): work", 4, 0, 1000)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 4, 300, 50)
    t.op("aten::zeros", 2, 400, 10)
    t.launch("k_zero", 2, 402, 2000)
    p = t.load(tmp_path, how, monkeypatch)
    assert kernel_paths(p) == {
        "k_zero": "train.py:10 main > autograd/graph.py:768 _engine_run_backward > [backward] > aten::zeros > k_zero"}


@pytest.mark.parametrize("base_ns", [7_000_000_000, None])
def test_a_trace_without_host_spans(tmp_path, monkeypatch, base_ns):
    """GPU events only (a profiler that kept no host events): each under `<unattributed: no
    launch record>` with its device and stream, its start and the window on the trace's clock, baseTimeNanoseconds + ts
    (ts alone in a trace without baseTimeNanoseconds, as Kineto wrote before it had one)."""
    t = Events()
    t.kernel("k1", 100, 5)
    t.kernel("k2", 110.5, 6, device=1, stream=9)
    p = t.load(tmp_path, "paths", monkeypatch, base_ns=base_ns)
    assert kernel_paths(p) == {"k1": "<unattributed: no launch record> > k1",
                               "k2": "<unattributed: no launch record> > k2"}
    b = base_ns or 0
    a = p.activities
    assert sorted(zip(a.start.tolist(), a.duration.tolist(), a.device.tolist(), a.stream.tolist())) == [
        (b + 100_000, 3000, 0, 7), (b + 110_500, 3000, 1, 9)]
    assert p.meta["window"] == {"start": b + 100_000, "end": b + 110_500 + 3000}


def test_a_backward_link_that_loops_is_ignored(tmp_path, monkeypatch):
    """A backward op whose fwdbwd flow starts at an op inside it (a damaged trace): its context
    would be its own node. The walk (paths.py gives such traces up) drops that link; the op stays
    where it nests by time."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 100)
    t.op("autograd::engine::evaluate_function: AddBackward0", 1, 10, 50)
    t.op("aten::add", 1, 20, 5)
    t.launch("k_loop", 1, 21, 200)
    t.flow(1, 1, 20, 1, 10)
    t.op("aten::add", 1, 70, 5)
    t.launch("k_after", 1, 71, 210)
    called = []
    real = link.span_paths
    monkeypatch.setattr(link, "span_paths", lambda *a: called.append(real(*a)) or called[-1])
    p = t.load(tmp_path, "as linked", monkeypatch)
    assert called == [None]
    assert kernel_paths(p) == {
        "k_loop": "train.py:10 main > autograd::engine::evaluate_function: AddBackward0 > aten::add > k_loop",
        "k_after": "train.py:10 main > aten::add > k_after",
    }


def test_paths_are_made_once_per_parent_and_frame():
    """paths.py's hash-consing: path 0 is the base (no parent, no frame); each other path is
    one (parent path, frame code) pair, made the first time it is asked for, in the order of
    the pairs' keys, and the same path every time after."""
    from dlpt.collectors.kineto.paths import _HashCons

    h = _HashCons(10)
    got = h.children(np.array([0, 0, 0]), np.array([7, 5, 7]))
    assert got.tolist() == [2, 1, 2]  # (0, 5) before (0, 7): their keys are 5 and 7
    assert h.children(np.array([2, 0]), np.array([5, 5])).tolist() == [3, 1]
    assert (h.parent, h.code) == ([-1, 0, 0, 2], [-1, 5, 7, 5])
    assert h.children(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []
    assert (h.parent, h.code) == ([-1, 0, 0, 2], [-1, 5, 7, 5])
