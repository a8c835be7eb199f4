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
from test_kineto_link import HOW, Events, kernel_paths


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
