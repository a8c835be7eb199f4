"""dlpt diff's second matching stages (dlpt/diff.py `_stages`): a function or file that moved to
another checkout, a kernel whose parameter list changed. The expected rows are worked out here
from the (call path, ns) inputs with plain Python. Written for the mutants tools/mutate.py found
alive in diff.py (docs/MUTATION.md)."""

from __future__ import annotations

import pytest
from conftest import synthetic_profile

from dlpt.diff import diff_profiles, row_label
from dlpt.errors import DlptError
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


def test_lines_of_one_function_pair_nearest_first_when_their_counts_differ() -> None:
    """No source snapshots, and an edit added a line: of a function's leftover lines, the
    nearest pair first (3 with 4, 10 with 11); the line left over is new."""
    a = profile([("m.py", 3, "fwd", 10), ("m.py", 10, "fwd", 20), ("m.py", 50, "fwd", 4)])
    b = profile([("m.py", 4, "fwd", 11), ("m.py", 11, "fwd", 25), ("m.py", 20, "fwd", 5), ("m.py", 50, "fwd", 4)])
    d = diff_profiles(a, b, by="line", metric="gpu_time")
    rows = [r for r in d.rows if r.entry.frame.kind == "python"]
    lines = [(r.a.frame.line if r.a else None, r.b.frame.line if r.b else None) for r in rows]
    assert dict(zip(lines, ((r.match, r.delta) for r in rows))) == {
        (3, 4): ("function", 1), (10, 11): ("function", 5), (None, 20): ("added", 5), (50, 50): ("line", 0)}
    # Largest change first; of two equal changes, the larger figure first (25 before 5).
    assert lines == [(10, 11), (None, 20), (3, 4), (50, 50)]
    labels = [row_label(r, "line") for r in rows]
    assert labels[0] == "m.py:10→11 fwd" and labels[2] == "m.py:3→4 fwd"
    assert labels[1] == rows[1].entry.label and labels[3] == rows[3].entry.label  # new, and unmoved: as is


def test_one_line_left_on_one_side_pairs_with_the_nearest() -> None:
    a = profile([("m.py", 20, "fwd", 10)])
    b = profile([("m.py", 3, "fwd", 50), ("m.py", 22, "fwd", 12)])
    d = diff_profiles(a, b, by="line", metric="gpu_time")
    got = {(r.a.frame.line if r.a else None, r.b.frame.line if r.b else None): r.match for r in d.rows
           if r.entry.frame.kind == "python"}
    assert got == {(20, 22): "function", (None, 3): "added"}


def test_a_line_is_paired_once() -> None:
    """Lines 3 and 5 are both nearest to the new line 4: one of them gets it, the other the next
    nearest (30); 31 is new."""
    a = profile([("m.py", 3, "fwd", 10), ("m.py", 5, "fwd", 20)])
    b = profile([("m.py", 4, "fwd", 11), ("m.py", 30, "fwd", 25), ("m.py", 31, "fwd", 5)])
    rows = [r for r in diff_profiles(a, b, by="line", metric="gpu_time").rows if r.entry.frame.kind == "python"]
    b_lines = [r.b.frame.line for r in rows if r.b is not None]
    assert sorted(b_lines) == [4, 30, 31]
    paired = {(r.a.frame.line, r.b.frame.line) for r in rows if r.a is not None and r.b is not None}
    assert paired in ({(3, 4), (5, 30)}, {(5, 4), (3, 30)})


def test_same_named_functions_of_two_files_are_two_functions() -> None:
    """Frames named by their function alone: a.py's forward is matched with a.py's, whatever
    the order of the rows (a.py's is the larger before, b.py's after)."""
    def run(**ns):
        return synthetic_profile([([Frame("python", "forward", f"/p/{f}.py", 3, "forward"), GEMM], v)
                                  for f, v in ns.items()])

    d = diff_profiles(run(a=30, b=20), run(a=15, b=25), by="function", metric="gpu_time")
    got = {(r.a.frame.file, r.b.frame.file): r.delta for r in d.rows if r.entry.frame.kind == "python"}
    assert got == {("/p/a.py", "/p/a.py"): 15 - 30, ("/p/b.py", "/p/b.py"): 25 - 20}
    # a.py's forward gone: b.py's is matched with b.py's, a.py's removed
    d = diff_profiles(run(a=30, b=20), run(b=25), by="function", metric="gpu_time")
    got = {(r.a.frame.file if r.a else None, r.b.frame.file if r.b else None): r.match for r in d.rows
           if r.entry.frame.kind == "python"}
    assert got == {("/p/b.py", "/p/b.py"): "function", ("/p/a.py", None): "removed"}


def test_an_unknown_grouping_is_a_user_error() -> None:
    a = profile(A)
    with pytest.raises(DlptError):
        diff_profiles(a, a, by="bogus")


def test_each_run_is_named_by_its_path_or_command_or_root() -> None:
    a, b = profile(A), profile(B)
    b.meta["command"] = "python train.py --fast"
    d = diff_profiles(a, b, by="file")
    assert (d.a_name, d.b_name) == ("synthetic", "python train.py --fast")  # conftest's root frame
    b.path = "/tmp/after.dlpt"
    assert diff_profiles(a, b, by="file").b_name == "/tmp/after.dlpt"


@pytest.mark.parametrize("by", ["function", "file"])
def test_a_function_whose_lines_shifted_is_matched_as_itself_without_a_lines_code(by: str) -> None:
    """An edit above fwd moved its line from 3 to 5 (the frames named as the collectors name
    them, `fwd (m.py:3)`): by function or file it is the same row, matched by the first stage
    (file and function, or file), not as moved. A function's or a file's row shows no line's
    code: both runs stored m.py, but only a line row reads its text."""
    src_a = "a = 1\nb = 2\nx = conv(x)\n"
    src_b = "a = 1\nb = 2\nnew()\nnew()\nx = conv(x)\n"
    a = synthetic_profile([([Frame("python", "fwd (m.py:3)", "m.py", 3, "fwd"), GEMM], 100)], sources={"m.py": src_a})
    b = synthetic_profile([([Frame("python", "fwd (m.py:5)", "m.py", 5, "fwd"), GEMM], 130)], sources={"m.py": src_b})
    d = diff_profiles(a, b, by=by, metric="gpu_time")
    rows = [(r.match, r.before, r.after, r.entry.code) for r in d.rows if r.entry.frame.kind == "python"]
    assert rows == [(by, 100, 130, "")]
    d = diff_profiles(a, b, by="line", metric="gpu_time")  # a line's row does show it
    rows = [(r.match, r.entry.code) for r in d.rows if r.entry.frame.kind == "python"]
    assert rows == [("code", "x = conv(x)")]
