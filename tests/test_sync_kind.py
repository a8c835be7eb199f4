"""What made the host wait, and where in library code (dlpt/findings.py `_sync_kind`), on call
paths written out here: the op under the heaviest weight names the wait; the innermost library
frame below the user's line is named when it holds at least half the weight. Written for the
mutants tools/mutate.py found alive in findings.py (docs/MUTATION.md)."""

from __future__ import annotations

import numpy as np
from conftest import synthetic_profile

from dlpt.findings import _sync_kind
from dlpt.frames import Frame

USER = Frame("python", "step (train.py:7)", "/home/u/train.py", 7, "step")
OUTER_LIB = Frame("python", "wrap", "/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1500, "_call_impl")
MID_LIB = Frame("python", "mid", "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 120, "forward")
LIB = Frame("python", "helper", "/usr/lib/python3/site-packages/torch/nn/functional.py", 50, "helper")
LIB2 = Frame("python", "other", "/usr/lib/python3/site-packages/torch/optim/adam.py", 77, "step")
TENSOR = Frame("python", "item", "/usr/lib/python3/site-packages/torch/_tensor.py", 9, "item")
K = Frame("kernel", "k")


def _case(item_ns: int, nonzero_ns: int):
    prof = synthetic_profile([([USER, OUTER_LIB, MID_LIB, LIB, TENSOR, Frame("op", "aten::item"), K], 1),
                              ([USER, Frame("op", "aten::nonzero"), K], 1)])
    ops = {prof.frame_of(n).name: n for n in range(len(prof.cct.parent)) if prof.frame_of(n).kind == "op"}
    nodes = np.array([ops["aten::item"], ops["aten::nonzero"]])
    return _sync_kind(prof, nodes, np.array([float(item_ns), float(nonzero_ns)]))


def test_the_heaviest_sync_names_the_wait_and_its_library_frame() -> None:
    what, where = _case(3, 1)
    assert ".item()" in what
    # the innermost library frame that is not torch's own tensor or cuda module
    assert where == "nn/functional.py:50 helper"


def test_a_library_frame_under_less_than_half_the_weight_is_not_named() -> None:
    what, where = _case(3, 4)
    assert "nonzero" in what and where == ""
    _, where = _case(4, 4)  # exactly half: named
    assert where == "nn/functional.py:50 helper"


def _sync_of(paths_weights):
    """(what, where) of call paths ending in a kernel, each weighted (its op node's weight)."""
    prof = synthetic_profile([(p + [K], 1) for p, _ in paths_weights])
    nodes = []
    for p, _ in paths_weights:
        n = 0
        for f in p:
            n = next(c for c in prof.cct.children(n) if prof.frame_of(int(c)) == f)
        nodes.append(int(n))
    return _sync_kind(prof, np.array(nodes), np.array([float(w) for _, w in paths_weights]))


def test_the_innermost_op_names_the_wait() -> None:
    what, _ = _sync_of([([USER, Frame("op", "aten::outer_thing"), Frame("op", "aten::item")], 1)])
    assert ".item()" in what


def test_the_heaviest_of_two_library_places_is_named() -> None:
    item, nonzero = Frame("op", "aten::item"), Frame("op", "aten::nonzero")
    _, where = _sync_of([([USER, LIB, item], 3), ([USER, LIB2, nonzero], 1)])
    assert where == "nn/functional.py:50 helper"


def test_library_code_above_the_users_line_is_not_where_it_waits() -> None:
    outer_user = Frame("python", "main (main.py:2)", "/home/u/main.py", 2, "main")
    _, where = _sync_of([([outer_user, OUTER_LIB, USER, Frame("op", "aten::item")], 1)])
    assert where == ""


def test_a_path_of_library_code_only_names_its_innermost_library_frame() -> None:
    # No user frame on the path (a sync inside a library's own loop): every frame is below "the
    # user's line", so LIB, the only library frame, is where it waited (all of the weight).
    _, where = _sync_of([([LIB, Frame("op", "aten::item")], 1)])
    assert where == "nn/functional.py:50 helper"
