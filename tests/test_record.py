"""`dlpt record` and `dlpt.profile` on the CPU build of torch: real programs, real profiler.

Each recorded script is tiny; what is checked is where host op time (cpu_time) lands — the
same attribution GPU time takes — exit statuses, and how the program is run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlpt  # noqa: E402
from dlpt.metrics import COL  # noqa: E402

CPU = COL["cpu_time"]


def record(tmp: Path, script: str, *args: str, out: str | None = "run.dlpt", name: str = "prog.py",
           extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (tmp / name).write_text(textwrap.dedent(script))
    cmd = [sys.executable, "-m", "dlpt", "record", *extra]
    if out:
        cmd += ["-o", out]
    cmd += [name, *args]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)


def line_of(tmp: Path, name: str, marker: str) -> int:
    for i, text in enumerate((tmp / name).read_text().splitlines(), 1):
        if marker in text:
            return i
    raise AssertionError(marker)


def lines_with_time(prof: dlpt.Profile, file_name: str) -> dict[int, int]:
    """Inclusive cpu_time of each source line of `file_name`, innermost frame on each path."""
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    fv = flat(hide_library_unless(prof, False), "line")
    return {fr.line: int(fv.exclusive[g, CPU]) for g, fr in enumerate(fv.frame)
            if fr.kind == "python" and os.path.basename(fr.file) == file_name}


MODEL = """\
import os
import sys
import threading
import torch

def work():
    a = torch.randn(32, 32)
    return torch.mm(a, a)  # THREAD_OP

def main():
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16, requires_grad=True)  # RANDN
    y = lin(x)  # LINEAR
    loss = torch.relu(y).sum()  # RELU
    loss.backward()  # BACKWARD
    t = threading.Thread(target=work)
    t.start()  # START
    t.join()
    print("args", sys.argv[1:], __name__, sys.path[0] == os.path.dirname(os.path.abspath(__file__)))

main()
"""


@pytest.fixture(scope="module")
def model_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, dlpt.Profile]:
    tmp = tmp_path_factory.mktemp("model")
    r = record(tmp, MODEL, "--lr", "0.1", "-o", "x", out=None)
    outs = list(tmp.glob("dlpt-prog.*.dlpt"))
    assert len(outs) == 1, (r.stderr, list(tmp.iterdir()))
    return tmp, r, dlpt.load(str(outs[0]))


def test_runs_like_python_and_default_output(model_run) -> None:
    tmp, r, prof = model_run
    assert r.returncode == 0, r.stderr
    # The program's own flags, -o included, pass through; __main__ and sys.path[0] as python sets them.
    assert "args ['--lr', '0.1', '-o', 'x'] __main__ True" in r.stdout
    assert "no GPU seen; recording host time (host_time) and host op time (cpu_time) only" in r.stderr
    assert "dlpt view dlpt-prog." in r.stderr
    assert prof.meta["source"] == "record" and prof.meta["torch_version"] == torch.__version__
    assert prof.meta["exit_status"] == 0


def test_ops_land_on_their_call_site_lines(model_run) -> None:
    tmp, _, prof = model_run
    got = lines_with_time(prof, "prog.py")
    for marker in ("RANDN", "LINEAR", "RELU"):
        assert got.get(line_of(tmp, "prog.py", marker), 0) > 0, (marker, got)
    # The code of the line is stored with the profile.
    src = next(f for f in prof.sources if f.endswith("prog.py"))
    assert prof.source_line(src, line_of(tmp, "prog.py", "LINEAR")) == "y = lin(x)  # LINEAR"
    # Nothing of torch's own files is stored.
    assert not any("site-packages" in f for f in prof.sources)


def test_backward_under_the_forward_line(model_run) -> None:
    tmp, _, prof = model_run
    linear = line_of(tmp, "prog.py", "LINEAR")
    found = 0
    sub: list[str] = []
    for i in range(len(prof.cct)):
        fr = prof.frame_of(i)
        if fr.kind == "backward":
            path = prof.call_path(i)
            if any(p.kind == "python" and p.line == linear and p.file.endswith("prog.py") for p in path):
                sub += [prof.frame_of(j).name for j in prof.cct.children(i)]
                found += int(prof.cct.inclusive[i, CPU])
    assert any("AddmmBackward0" in n for n in sub), sub
    assert found > 0
    # The backward() line itself keeps only its own bookkeeping (the engine's `evaluate_function`
    # wrappers, AccumulateGrad of the leaves), not the gradient math: no backward node's op
    # (`AddmmBackward0`, `ReluBackward0`, ...) beneath it; those are all under forward lines.
    line = line_of(tmp, "prog.py", "BACKWARD")
    nodes = [i for i in range(len(prof.cct)) if prof.frame_of(i).kind == "python"
             and prof.frame_of(i).line == line and prof.frame_of(i).file.endswith("prog.py")]
    assert nodes and int(prof.cct.inclusive[nodes, CPU].sum()) > 0
    beneath = {prof.frame_of(j).name for i in nodes for j in range(i, int(prof.cct.end[i]))}
    assert any(n.startswith("autograd::engine::evaluate_function: AddmmBackward0") for n in beneath), beneath
    assert not [n for n in beneath if re.fullmatch(r"\w+Backward\d+", n)], beneath


def test_thread_work_on_its_own_lines_under_the_start_line(model_run) -> None:
    tmp, _, prof = model_run
    start = line_of(tmp, "prog.py", "START")
    hits = []
    for i in range(len(prof.cct)):
        if prof.frame_of(i).name == "aten::mm":
            path = prof.call_path(i)
            kinds = [(p.kind, p.line, p.function) for p in path]
            if any(k == "thread" for k, _, _ in kinds):
                hits.append((kinds, int(prof.cct.inclusive[i, CPU])))
    assert hits, "the thread's mm was not recorded"
    kinds, t = hits[0]
    assert ("python", start, "main") in kinds
    # The thread's own line, not its target's def line.
    assert ("python", line_of(tmp, "prog.py", "THREAD_OP"), "work") in kinds
    assert t > 0


def test_conservation_and_tree_invariants(model_run) -> None:
    _, _, prof = model_run
    cct = prof.cct
    inc, exc = cct.inclusive, cct.exclusive
    for i in range(len(cct)):
        kids = cct.children(i)
        assert (inc[i] == exc[i] + inc[kids].sum(axis=0)).all()
    assert np.all(exc[:, CPU] >= 0)


def test_exit_status_sys_exit(tmp_path: Path) -> None:
    r = record(tmp_path, "import sys, torch\ntorch.ones(2).sum()\nsys.exit(3)\n")
    assert r.returncode == 3, r.stderr
    assert dlpt.load(str(tmp_path / "run.dlpt")).meta["exit_status"] == 3


def test_exception_prints_traceback_and_saves(tmp_path: Path) -> None:
    r = record(tmp_path, "import torch\n\ndef f():\n    torch.ones(2).sum()\n    raise ValueError('boom')\n\nf()\n")
    assert r.returncode == 1
    assert "Traceback (most recent call last):" in r.stderr and "ValueError: boom" in r.stderr
    assert 'prog.py", line 5, in f' in r.stderr
    # As python prints it: the program's frames, not dlpt's or runpy's.
    assert "dlpt/cli.py" not in r.stderr and "runpy" not in r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert prof.meta["exit_status"] == 1 and prof.cct.inclusive[0, CPU] > 0


def test_force_and_existing_output(tmp_path: Path) -> None:
    (tmp_path / "run.dlpt").write_text("keep me")
    r = record(tmp_path, "open('ran', 'w').write('x')\n")
    assert r.returncode == 2
    assert r.stderr.startswith("dlpt: ") and "--force" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (tmp_path / "run.dlpt").read_text() == "keep me"
    assert not (tmp_path / "ran").exists(), "the program ran although the output was refused"
    r = record(tmp_path, "import torch\nopen('ran', 'w').write('x')\ntorch.ones(2).sum()\n", extra=("--force",))
    assert r.returncode == 0, r.stderr
    assert dlpt.load(str(tmp_path / "run.dlpt")).meta["source"] == "record"


# One `-m` recording for the three module-mode tests: a module whose body runs ops at its top
# level, defines a function and imports another module of its own while recording.
MODULE_TRAIN = """\
import sys, torch
x = torch.ones(4).sum()  # SUM

def f():
    return torch.ones(4).sum()  # F

import mypkg.helper
f()
x = torch.full((2,), 1.0).sum()  # TOP
print('mod', __name__, sys.argv[1:])
"""


@pytest.fixture(scope="module")
def module_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, dlpt.Profile]:
    tmp = tmp_path_factory.mktemp("module")
    pkg = tmp / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("import torch\nH = torch.zeros(3).sum()  # HELPER\n")
    (pkg / "train.py").write_text(MODULE_TRAIN)
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "m.dlpt", "-m", "mypkg.train", "--epochs", "1"],
                       cwd=tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return pkg, r, dlpt.load(str(tmp / "m.dlpt"))


def test_module_mode(module_run) -> None:
    _, r, prof = module_run
    assert "mod __main__ ['--epochs', '1']" in r.stdout
    names = {prof.frame_of(i).name for i in range(len(prof.cct))}
    assert "aten::ones" in names and prof.cct.inclusive[0, CPU] > 0


def test_module_mode_lines(module_run) -> None:
    pkg, _, prof = module_run
    assert lines_with_time(prof, "train.py").get(line_of(pkg, "train.py", "SUM"), 0) > 0


def test_module_mode_lines_repeat(module_run) -> None:
    """The module's file names survive also where the module defines functions and imports more
    modules of its own while recording (their code objects are freed too)."""
    pkg, _, prof = module_run
    f, top = line_of(pkg, "train.py", "# F"), line_of(pkg, "train.py", "TOP")
    got = lines_with_time(prof, "train.py")
    assert got.get(f, 0) > 0 and got.get(top, 0) > 0, got
    assert lines_with_time(prof, "helper.py").get(2, 0) > 0
    # Module bodies keep their name: "<module>", not whatever reused the freed string's memory.
    funcs = {(os.path.basename(fr.file), fr.line): fr.function for fr in prof.frames if fr.kind == "python"}
    assert funcs.get(("helper.py", 2)) == "<module>" and funcs.get(("train.py", top)) == "<module>", funcs
    assert not any("site-packages" in f and f.endswith("train.py") for f in prof.sources)


STEPS = """\
import torch
w = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([w], lr=0.1)
def s0(): return (w * 1).sum()
def s1(): return (w * 2).sum()
def s2(): return (w * 3).sum()
def s3(): return (w * 4).sum()
for f in (s0, s1, s2, s3):
    loss = f()
    loss.backward()
    opt.step()
"""


def test_steps_records_only_the_range(tmp_path: Path) -> None:
    r = record(tmp_path, STEPS, extra=("--steps", "1:3"))
    assert r.returncode == 0, r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    funcs = {prof.frame_of(i).function for i in range(len(prof.cct))
             if prof.frame_of(i).kind == "python" and prof.frame_of(i).file.endswith("prog.py")}
    assert {"s1", "s2"} <= funcs and not ({"s0", "s3"} & funcs), funcs
    assert prof.meta["steps"] == [1, 3]


def test_python_api_profile_and_step(tmp_path: Path) -> None:
    out = tmp_path / "api.dlpt"

    def one(k: int) -> None:
        torch.full((8,), float(k)).sum()  # API_LINE

    with dlpt.profile(str(out), steps="1:2", quiet=True) as p:
        for k in range(3):
            one(k)
            dlpt.step()
    assert p.result is not None
    prof = dlpt.load(str(out))
    assert prof.meta["source"] == "record" and prof.meta["steps_seen"] == 3
    names = {prof.frame_of(i).name for i in range(len(prof.cct))}
    assert "aten::full" in names
    # Only step 1 was recorded: one call of `one`, one full.
    full = [i for i in range(len(prof.cct)) if prof.frame_of(i).name == "aten::full"]
    assert len(full) == 1
    dlpt.step()  # outside a recording: nothing happens


def test_python_api_window_never_reached_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The API hands back what it holds, but a window the program never reached is said, as
    # `dlpt record` says it (there with status 2).
    with dlpt.profile(str(tmp_path / "api.dlpt"), steps="5:6", quiet=True) as p:
        for k in range(3):
            torch.full((8,), float(k)).sum()
            dlpt.step()
    assert p.result is not None
    err = capsys.readouterr().err
    assert "dlpt: nothing recorded: --steps 5:6 starts at step 5, but the program made only 3 steps" in err, err


def test_profiler_log_lines_stay_off_the_programs_stderr(tmp_path: Path) -> None:
    # libkineto prints `USDT:... profiler_start` / `profiler_stop` to fd 2 on every window; the
    # program's own stderr must come through untouched, in order.
    r = record(tmp_path, """
        import sys, torch
        print("before", file=sys.stderr, flush=True)
        torch.ones(4).sum()
        print("after", file=sys.stderr, flush=True)
    """)
    assert r.returncode == 0, r.stderr
    assert "USDT:" not in r.stderr and "profiler_start" not in r.stderr
    assert r.stderr.index("before") < r.stderr.index("after") < r.stderr.index("profile saved")


def test_calls_without_ops_leave_no_nodes(tmp_path: Path) -> None:
    # Python work with no torch op beneath (imports, pure-Python helpers) adds nothing to the tree
    # but the host time the sampler found there: the op callback makes no node for it, and a
    # 5 ms stretch is sampled or not by chance (the GIL changes hands every 5 ms).
    r = record(tmp_path, """
        import json, torch

        def busy(n):
            return sum(len(json.dumps({"k": i})) for i in range(n))

        busy(2000)
        x = torch.ones(8) * 2  # the one op line
    """)
    assert r.returncode == 0, r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert prof.cct.inclusive.any(axis=1).all()
    sampled = [COL["host_time"], COL["gpu_idle_time"]]
    others = np.delete(prof.cct.inclusive, sampled, axis=1)
    for i in range(len(prof.cct)):
        if prof.frames[prof.cct.frame[i]].function in ("busy", "dumps", "<genexpr>"):
            assert not others[i].any(), (prof.frames[prof.cct.frame[i]], others[i])
    assert any(f.has_source and f.line == line_of(tmp_path, "prog.py", "the one op line") for f in prof.frames)


CHECKPOINT = """\
import torch
from torch.utils.checkpoint import checkpoint

lin = [torch.nn.Linear(64, 64) for _ in range(3)]

def first(h):
    return lin[0](h)  # REENTRANT

def second(h):
    return lin[1](h)  # NONREENTRANT

x = torch.randn(32, 64, requires_grad=True)
for _ in range(3):
    h = checkpoint(first, x, use_reentrant=True)
    h = checkpoint(second, h, use_reentrant=False)
    h.square().mean().backward()
    (g,) = torch.autograd.grad(lin[2](x).sum(), x, create_graph=True)  # GRAD
    g.square().sum().backward()
"""


def test_checkpoint_recompute_and_double_backward_under_forward_lines(tmp_path: Path) -> None:
    # A reentrant checkpoint runs a backward() inside a backward node; a create_graph backward
    # makes nodes whose own backward runs later. Each lands under the line of its forward op.
    r = record(tmp_path, CHECKPOINT)
    assert r.returncode == 0, r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    lines = {m: line_of(tmp_path, "prog.py", m) for m in ("REENTRANT", "NONREENTRANT", "GRAD")}
    under: dict[str, int] = {m: 0 for m in lines}
    second_order = 0
    for i in range(len(prof.cct)):
        if prof.frame_of(i).name != "AddmmBackward0" and "MmBackward" not in prof.frame_of(i).name:
            continue
        path = prof.call_path(i)
        at = {p.line for p in path if p.kind == "python" and p.file.endswith("prog.py")}
        for m, ln in lines.items():
            if ln in at:
                under[m] += int(prof.cct.inclusive[i, CPU])
        if lines["GRAD"] in at and sum(p.kind == "backward" for p in path) >= 2:
            second_order += int(prof.cct.inclusive[i, CPU])
    assert all(v > 0 for v in under.values()), under
    assert second_order > 0


def test_cuda_graph_trace_reaches_the_collector_and_the_header(tmp_path: Path) -> None:
    """`--cuda-graph-trace` (graph unless --steps) is read by the collector from the environment
    when CUPTI starts (device.h); the program sees the same environment. A profile recorded so says in its header
    how its kernel times inside replays were made; one recorded per kernel says nothing."""
    from dataclasses import replace

    from dlpt.viewers.report import header

    show = "import os, torch\nx = torch.ones(64, 64) @ torch.ones(64, 64)\nprint(os.environ.get('DLPT_GRAPH_TRACE'))\n"
    # Per graph by default; per kernel when asked, and by default for a --steps window.
    for extra, mode in ((("--cuda-graph-trace", "node", "--force"), "node"), (("--steps", "0:1", "--force"), "node"),
                        (("--force",), "graph")):
        r = record(tmp_path, show, extra=extra)
        assert r.returncode in (0, 2) and r.stdout.strip() == mode, (extra, r.stdout, r.stderr)
    r = record(tmp_path, show, extra=("--cuda-graph-trace", "graph", "--force"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "graph"
    bad = record(tmp_path, "print(1)\n", extra=("--cuda-graph-trace", "kernels", "--force"))
    assert bad.returncode == 2 and bad.stderr.startswith("dlpt: ") and bad.stderr.count("\n") == 1, bad.stderr
    # Not with --steps (untried there): one line, before the program runs.
    windowed = record(tmp_path, "print('ran')\n", extra=("--cuda-graph-trace", "graph", "--steps", "1:2", "--force"))
    assert windowed.returncode == 2 and "ran" not in windowed.stdout, windowed.stderr
    assert windowed.stderr.startswith("dlpt: --cuda-graph-trace graph is not supported with --steps"), windowed.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert not any(ln.startswith("CUDA graphs:") for ln in header(prof, "cpu_time"))
    graphed = replace(prof, meta={**prof.meta, "collector": {**prof.meta.get("collector", {}), "graph_trace": "graph",
                                                             "graph_replays_per_graph": 1234,
                                                             "graph_replays_per_kernel": 2}})
    line = [ln for ln in header(graphed, "cpu_time") if ln.startswith("CUDA graphs:")]
    assert line == ["CUDA graphs: 1,234 replays traced as one span each, split over their kernels as each "
                    "graph's first replay ran them (2 replays traced per kernel; --cuda-graph-trace node traces all)"]
    # A program that replayed no CUDA graph (eager nanoGPT's recording) has no such line.
    none = replace(graphed, meta={**graphed.meta, "collector": {**graphed.meta["collector"], "graph_replays_per_graph": 0,
                                                                "graph_replays_per_kernel": 0}})
    assert not any(ln.startswith("CUDA graphs:") for ln in header(none, "cpu_time"))
    # One of each reads in the singular, as gpt-fast's recordings have it (one graph, one traced replay).
    one = replace(graphed, meta={**graphed.meta, "collector": {**graphed.meta["collector"], "graph_replays_per_graph": 1,
                                                               "graph_replays_per_kernel": 1}})
    line = [ln for ln in header(one, "cpu_time") if ln.startswith("CUDA graphs:")]
    assert line == ["CUDA graphs: 1 replay traced as one span, split over their kernels as each "
                    "graph's first replay ran them (1 replay traced per kernel; --cuda-graph-trace node traces all)"]
