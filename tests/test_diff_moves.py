"""dlpt diff's second matching stages (dlpt/diff.py `_stages`): a function or file that moved to
another checkout, a kernel whose parameter list changed. The expected rows are worked out here
from the (call path, ns) inputs with plain Python. Written for the mutants tools/mutate.py found
alive in diff.py (docs/MUTATION.md)."""

from __future__ import annotations

import pytest
from conftest import synthetic_profile

from dlpt.diff import diff_profiles
from dlpt.frames import Frame

GEMM = Frame("kernel", "gemm")

# (file, line, function, ns) per run: the checkout moved from /home/alice to /srv/ci; proj/ kept.
A = [("/home/alice/proj/model.py", 3, "forward", 100), ("/home/alice/proj/train.py", 9, "step", 50),
     ("/home/alice/proj/data.py", 5, "load", 7)]
B = [("/srv/ci/proj/model.py", 3, "forward", 130), ("/srv/ci/proj/train.py", 9, "step", 20),
     ("/srv/ci/other/data.py", 5, "load", 9)]  # another package's data.py: not the same file


def profile(rows):
    return synthetic_profile([([Frame("python", f"{fn} ({f}:{ln})", f, ln, fn), GEMM], ns) for f, ln, fn, ns in rows])


def tail(path: str) -> str:
    return "/".join(path.split("/")[-2:])


@pytest.mark.parametrize("by", ["function", "file"])
def test_a_moved_checkout_matches_by_trailing_path(by: str) -> None:
    def key(f, fn):
        return (tail(f), fn) if by == "function" else (tail(f),)

    before = {key(f, fn): ns for f, _, fn, ns in A}
    after = {key(f, fn): ns for f, _, fn, ns in B}
    d = diff_profiles(profile(A), profile(B), by=by, metric="gpu_time")
    got = {}
    rows = [r for r in d.rows if r.entry.frame.kind == "python"]  # not the catch-all row
    for r in rows:
        if r.a is None or r.b is None:
            continue
        assert key(r.a.frame.file, r.a.frame.function) == key(r.b.frame.file, r.b.frame.function)
        got[key(r.a.frame.file, r.a.frame.function)] = (r.match, r.before, r.after)
    assert got == {k: ("moved", before[k], after[k]) for k in before.keys() & after.keys()}
    lone = {(r.match, tail((r.a or r.b).frame.file)) for r in rows if r.a is None or r.b is None}
    assert lone == {("removed", "proj/data.py"), ("added", "other/data.py")}


def test_a_kernel_with_another_parameter_list_matches_by_short_name() -> None:
    line = Frame("python", "step (t.py:3)", "t.py", 3, "step")
    a = synthetic_profile([([line, Frame("kernel", "void gemm<float>(float*, int)")], 40),
                           ([line, Frame("kernel", "void relu<float>(float*)")], 5)])
    b = synthetic_profile([([line, Frame("kernel", "gemm<float>(double*)")], 70),
                           ([line, Frame("kernel", "void softmax<float>(float*)")], 3)])
    d = diff_profiles(a, b, by="kernel", metric="gpu_time")
    got = {(r.a.frame.name if r.a else None, r.b.frame.name if r.b else None): (r.match, r.delta) for r in d.rows
           if r.entry.frame.kind == "kernel"}
    assert got == {("void gemm<float>(float*, int)", "gemm<float>(double*)"): ("short name", 70 - 40),
                   ("void relu<float>(float*)", None): ("removed", -5),
                   (None, "void softmax<float>(float*)"): ("added", 3)}
