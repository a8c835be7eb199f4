"""The native fast path of the recorder (collectors/native/record_native.cpp) against the Python
path over torch's pybind wrappers: both fold the *same* profiler result, in one process, and must
give the same profile — frames, tree, every metric, every activity.

The extension is JIT-built here with torch's cpp_extension; where it cannot be built (no compiler)
these tests skip, and the recorder falls back to the Python path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dlpt.collectors import record_native  # noqa: E402
from dlpt.collectors.torch_recorder import Recorder  # noqa: E402


@pytest.fixture(scope="module")
def native():
    if not record_native.enabled():
        pytest.skip("DLPT_NATIVE=0")
    mod = record_native.load()
    if mod is None:
        pytest.skip("the native extension does not build here")
    return mod


def _work(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, x).relu()


def _nested(x: torch.Tensor) -> torch.Tensor:
    y = x + 1  # an op with no recorded call: the function's def line
    return _work(y) * 2


def _record_both(program) -> tuple:
    """Record `program()` once; fold its result with the native reader and, from the same
    result, with the Python path (a second recorder whose native reader is off)."""
    rec = Recorder(command="native-test", window=None, quiet=True, window_seconds=None, window_bytes=None)
    assert rec._native is not None
    py = Recorder(command="native-test", window=None, quiet=True, window_seconds=None, window_bytes=None)
    py._native = None  # the recorder's own fallback switch: what a failed build leaves
    fold = rec._ingest

    def both(kr) -> None:
        py._threads = rec._threads  # threads started while recording are known to the active one
        py._path_roots = rec._path_roots
        fold(kr)
        py._ingest(kr)

    rec._ingest = both
    rec.start()
    try:
        program()
    finally:
        a = rec.stop()
    b = py._finish()
    assert rec.native_used and not py.native_used
    return a, b, rec, py


def _assert_same(a, b) -> None:
    assert a.frames == b.frames
    assert np.array_equal(a.cct.parent, b.cct.parent)
    assert np.array_equal(a.cct.frame, b.cct.frame)
    assert np.array_equal(a.cct.exclusive, b.cct.exclusive)
    for col in ("node", "kind", "name", "device", "stream", "start", "duration", "bytes"):
        assert np.array_equal(getattr(a.activities, col), getattr(b.activities, col)), col


def test_same_profile_model_backward_threads(native) -> None:
    def program() -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        data = torch.randn(8, 16)
        for _ in range(3):
            loss = model(data).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        x = torch.randn(16, 16)
        for _ in range(5):
            _nested(x)
        t = threading.Thread(target=_work, args=(x,))
        t.start()
        t.join()

    a, b, rec, py = _record_both(program)
    _assert_same(a, b)
    kinds = {f.kind for f in a.frames}
    assert {"op", "module", "python", "backward", "thread"} <= kinds, kinds
    assert rec.unlinked_backward == py.unlinked_backward
    assert len(rec.out.cpu_node) == len(py.out.cpu_node) > 50


def test_same_profile_flat_loop(native) -> None:
    def program() -> None:
        x = torch.ones(64)
        for _ in range(500):
            x.add_(1.0)
            x.mul_(0.5)

    a, b, _, _ = _record_both(program)
    _assert_same(a, b)
    assert int(a.cct.exclusive.sum()) > 0


def test_event_tree_columns_match_the_pybind_tree(native) -> None:
    """Node by node, the columns hold what torch's own wrappers say."""
    from torch._C import _profiler as P
    from torch.profiler import profile

    x = torch.randn(8, 8, requires_grad=True)
    lin = torch.nn.Linear(8, 8)
    with profile(with_stack=True) as p:
        lin(_nested(x)).sum().backward()
    kr = p.profiler.kineto_results
    T = native.event_tree(kr)
    pre = []
    # A runtime call directly under an op is read without its children (its own device events).
    stack = [(n, None) for n in reversed(kr.experimental_event_tree())]
    while stack:
        n, parent = stack.pop()
        pre.append(n)
        if isinstance(n.extra_fields, P._ExtraFields_Kineto) and isinstance(parent, P._ExtraFields_TorchOp):
            continue
        stack.extend((c, n.extra_fields) for c in reversed(n.children))
    assert len(pre) == len(T["kind"]) > 20
    kinds = {P._ExtraFields_TorchOp: 0, P._ExtraFields_PyCall: 1, P._ExtraFields_PyCCall: 2, P._ExtraFields_Kineto: 3}
    seen = set()
    for i, n in enumerate(pre):
        ef = n.extra_fields
        k = kinds.get(type(ef), 4)
        seen.add(k)
        assert T["kind"][i] == k
        assert (T["start"][i], T["stop"][i], T["tid"][i]) == (n.start_time_ns, n.end_time_ns, n.start_tid)
        assert T["end"][i] == i + 1 + sum(1 for _ in _descendants(n))
        if k == 0:
            assert T["names"][T["name"][i]] == n.name
            assert T["seq"][i] == ef.sequence_number
            assert T["corr"][i] == n.correlation_id
        if k in (1, 2):
            c = ef.caller
            assert (T["strs"][T["caller_file"][i]], T["caller_line"][i], T["strs"][T["caller_func"][i]]) == \
                (c.file_name, c.line_number, c.function_name)
        if k == 1:
            cs = ef.callsite
            assert (T["strs"][T["site_file"][i]], T["site_line"][i], T["strs"][T["site_func"][i]]) == \
                (cs.file_name, cs.line_number, cs.function_name)
            assert T["module"][i] == (ef.module is not None)
            if ef.module is not None:
                assert T["names"][T["name"][i]] == n.name
    assert {0, 1, 2} <= seen
    assert sum(T["module"]) >= 1


def _descendants(n):
    for c in n.children:
        yield c
        yield from _descendants(c)


def test_device_event_columns_match_the_pybind_events(native) -> None:
    """On CPU there are no device events; with `all` the reader returns every event, and each
    column must equal what the KinetoEvent wrappers say."""
    from torch.profiler import profile

    x = torch.randn(16, 16)
    with profile() as p:
        for _ in range(5):
            _work(x)
    kr = p.profiler.kineto_results
    d = native.device_events(kr, True)
    evs = kr.events()
    assert len(evs) == len(d["name"]) > 10
    for i, e in enumerate(evs):
        assert d["names"][d["name"][i]] == e.name()
        assert d["activity_names"][d["activity"][i]] == e.activity_type()
        assert d["corr"][i] == e.correlation_id()
        assert d["linked"][i] == e.linked_correlation_id()
        assert d["device"][i] == e.device_index()
        assert d["stream"][i] == e.device_resource_id()
        assert d["start"][i] == e.start_ns()
        assert d["dur"][i] == e.duration_ns()
    # Without `all`: CPU events are neither device events nor skipped device-side ones.
    d = native.device_events(kr)
    assert d["name"] == [] and d["skipped"] == {}


def test_native_off_by_environment(tmp_path: Path) -> None:
    """DLPT_NATIVE=0: the Python path records, and nothing is said about it."""
    (tmp_path / "prog.py").write_text(textwrap.dedent("""\
        import torch
        x = torch.ones(4)
        for _ in range(10):
            x.add_(1)  # ADD
    """))
    env = {**os.environ, "DLPT_NATIVE": "0"}
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", "prog.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "native" not in r.stderr
    import dlpt

    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert any(f.kind == "op" and f.name == "aten::add_" for f in prof.frames)


def test_failed_build_falls_back_with_one_notice(tmp_path: Path) -> None:
    """A compiler that fails (here `false`, in a fresh extensions folder so no cached build is
    found): the recording still succeeds on the Python path, with one `dlpt:` line saying so."""
    (tmp_path / "prog.py").write_text("import torch\nx = torch.ones(4)\nfor _ in range(10):\n    x.add_(1)\n")
    env = {**os.environ, "CXX": "false", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    env.pop("DLPT_NATIVE", None)
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", "prog.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "native fast path" in ln]
    assert len(notes) == 1 and notes[0].startswith("dlpt: "), r.stderr
    # A fresh extensions folder: the pause of the first build is announced.
    assert "dlpt: building the native profile reader" in r.stderr
    import dlpt

    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert prof.meta["post_processing_parts_s"] and any(f.name == "aten::add_" for f in prof.frames)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_release_takes_the_windows_events(native, mode: int) -> None:
    """`release` takes a stopped window's events out of torch's result, to be freed now (timed),
    on a background thread, or never (the process is exiting); the result is left empty."""
    from torch.profiler import profile

    x = torch.randn(16, 16)
    with profile(with_stack=True) as p:
        for _ in range(20):
            _work(x)
    kr = p.profiler.kineto_results
    assert len(kr.events()) > 40 and len(kr.experimental_event_tree()) > 0
    caps = native.capabilities(kr)
    assert caps["activity_type"] and caps["trace_activity_header"]
    assert caps["trace_activities"] > 0  # Kineto's own records of the window, reached through `trace_`
    got = native.release(kr, mode)
    if mode == 0:
        assert set(got) == {"tree_s", "events_s", "trace_s"} and min(got.values()) >= 0
    else:
        assert got == {}
    native.join_released()
    assert kr.events() == [] and kr.experimental_event_tree() == []
    left = native.capabilities(kr)["trace_activities"]
    # Kineto's trace goes with them, except to a background thread (torch frees it as before).
    assert left > 0 if mode == 1 else left == -1
    p.profiler.kineto_results = None  # torch's own destructor runs on the emptied result


def test_recorder_frees_windows_in_the_background(native) -> None:
    """A recording with many windows: each is handed to `release` (the native path), the
    profile holds every window's ops, and the post-processing parts say where time went."""
    rec = Recorder(command="release-test", window=2, quiet=True, window_seconds=None, window_bytes=None)
    rec.final_free = "now"
    rec.start()
    x = torch.randn(8, 8)
    for _ in range(7):
        _work(x)
        rec.step(explicit=True)
    prof = rec.stop()
    native.join_released()
    assert rec.windows == 4 and rec.native_used
    assert {"fold", "merge", "drop", "free_tree", "free_events", "free_trace"} <= set(rec.post_parts)
    mm = [n for n in rec.out.cpu_node if rec.frames[rec.builder.frame[n]].name == "aten::mm"]
    assert len(mm) == 7  # one op row per call, from all four windows
    assert any(f.kind == "op" and f.name == "aten::mm" for f in prof.frames)
