"""A CPU backward placed by sequence number (collectors/kineto/link.py `_backward_links`), a bug
the mutation testing of issue #35 found and 55748c5 fixed: on CPU the autograd engine runs the
backward ops on the thread that called backward, a Python thread, and the op of the autograd
node inside its `evaluate_function` carries the node's sequence number too. Without a fwdbwd
flow, the fallback took the last op on a Python thread that carries the number and is no
`evaluate_function` as the forward op: MulBackward0 itself, inside the `evaluate_function` it
is asked for, so the link looped and was dropped, and the backward op landed under
`_engine_run_backward`, without `[backward]`. The forward op is the last to carry the number
that started before the backward op. (On a GPU's autograd thread, which has no Python frames,
the same ops are passed over: test_kineto_link.py::test_backward_links_and_thread_anchors_at_the_edges.)"""

from __future__ import annotations

import pytest
from test_kineto_link import HOW, PID, Events, kernel_paths


@pytest.mark.parametrize("how", HOW)
def test_cpu_backward_with_a_numbered_op_inside_links_to_the_forward_op(tmp_path, monkeypatch, how):
    """Thread 1 runs aten::mul (number 3) at 10 µs, then backward: `_engine_run_backward` [100,
    700), MulBackward0's `evaluate_function` (number 3) [200, 250) with the node's own op
    MulBackward0 (number 3) [205, 245) inside it, which launches k_mulb. No flow: by the number,
    the forward op is aten::mul, so the kernel's place is aten::mul > [backward] > ..."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::mul", 1, 10, 10, seq=3)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    t.op("autograd::engine::evaluate_function: MulBackward0", 1, 200, 50, seq=3)
    t.op("MulBackward0", 1, 205, 40, seq=3)
    t.launch("k_mulb", 1, 210, 2000)
    p = t.load(tmp_path, how, monkeypatch)
    ev = "autograd::engine::evaluate_function: MulBackward0"
    assert kernel_paths(p) == {"k_mulb": f"train.py:10 main > aten::mul > [backward] > {ev} > MulBackward0 > k_mulb"}


@pytest.mark.parametrize("how", HOW)
def test_a_number_no_forward_op_carries_does_not_stop_the_others(tmp_path, monkeypatch, how):
    """Two backward ops without flows on autograd's thread: the first carries a number no forward
    op has (99: it stays where it ran), the second number 3, which aten::mul carries. The first
    finding nothing must not end the search for the second."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::mul", 1, 10, 10, seq=3)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    t.op("autograd::engine::evaluate_function: ExpBackward0", 2, 150, 40, seq=99)
    t.launch("k_expb", 2, 160, 2000)
    t.op("autograd::engine::evaluate_function: MulBackward0", 2, 200, 50, seq=3)
    t.launch("k_mulb", 2, 210, 2010)
    p = t.load(tmp_path, how, monkeypatch)
    ev = "autograd::engine::evaluate_function:"
    run = "train.py:10 main > autograd/graph.py:768 _engine_run_backward > [backward]"
    assert kernel_paths(p) == {"k_expb": f"{run} > {ev} ExpBackward0 > k_expb",
                               "k_mulb": f"train.py:10 main > aten::mul > [backward] > {ev} MulBackward0 > k_mulb"}


@pytest.mark.parametrize("how", HOW)
def test_forward_ops_of_one_number_on_two_python_threads_by_their_start(tmp_path, monkeypatch, how):
    """Sequence numbers are per thread, so two Python threads' forward ops can carry the same one.
    Thread 1 runs aten::mul (3) at 50 µs, thread 3 (a Python thread too) aten::add (3) at 10 µs;
    the backward op with number 3 at 300 µs goes to the last of them to start before it,
    aten::mul, whichever thread comes first in the trace."""
    t = Events()
    t.ev.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": 3, "args": {"name": "python3"}})
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::mul", 1, 50, 10, seq=3)
    t.py("train.py(20): other", 3, 0, 200)
    t.op("aten::add", 3, 10, 10, seq=3)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    t.op("autograd::engine::evaluate_function: MulBackward0", 2, 300, 50, seq=3)
    t.launch("k_mulb", 2, 310, 2000)
    p = t.load(tmp_path, how, monkeypatch)
    ev = "autograd::engine::evaluate_function:"
    assert kernel_paths(p) == {"k_mulb": f"train.py:10 main > aten::mul > [backward] > {ev} MulBackward0 > k_mulb"}


@pytest.mark.parametrize("how", HOW)
def test_only_forward_ops_on_python_threads_are_candidates(tmp_path, monkeypatch, how):
    """Between the forward op (aten::mul, number 3, Python thread 1, at 10 µs) and the backward
    op (number 3, at 300 µs) other spans carry 3 too and must not be taken: an op on a thread with
    no Python frames (thread 4, at 150 µs), and an earlier `evaluate_function` of the same number
    on the Python thread itself (a CPU backward, at 200 µs, which a flow links). Neither is the
    op that made the node."""
    t = Events()
    t.py("train.py(10): main", 1, 0, 1000)
    t.op("aten::mul", 1, 10, 10, seq=3)
    t.op("aten::neg", 1, 30, 10, seq=4)
    t.op("aten::add", 4, 150, 10, seq=3)
    t.py("torch/autograd/graph.py(768): _engine_run_backward", 1, 100, 600)
    t.op("autograd::engine::evaluate_function: NegBackward0", 1, 200, 50, seq=3)
    t.flow(1, 1, 30, 1, 200)
    t.op("autograd::engine::evaluate_function: MulBackward0", 2, 300, 50, seq=3)
    t.launch("k_mulb", 2, 310, 2000)
    p = t.load(tmp_path, how, monkeypatch)
    ev = "autograd::engine::evaluate_function:"
    assert kernel_paths(p)["k_mulb"] == f"train.py:10 main > aten::mul > [backward] > {ev} MulBackward0 > k_mulb"
