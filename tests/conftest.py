"""Shared fixtures: the real H200 traces in tests/data/kineto, shipped with the repository so
that a fresh clone tests itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

# A training loop of three optimizer steps on the CPU, for tests that record a real program.
THREE_STEPS = """\
import sys

import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def _bytecode_for_children() -> None:
    """The suite starts a few hundred Python processes (`dlpt record`, `dlpt report`, torchrun's
    ranks). Where PYTHONDONTWRITEBYTECODE is set (this machine's shells set it), each of them
    compiled dlpt's modules from source again, as no installed package does (pip compiles its
    bytecode): two of the suite's ten minutes of CPU on 2026-11-28. So the tests' processes write
    and read bytecode as Python does by default, into `__pycache__` folders beside the sources
    (git ignores them). Set at import, before xdist starts its workers, so that they and every
    process they start inherit it. (Not PYTHONPYCACHEPREFIX: a cache there is read instead of the
    installed packages' own, and every module of torch would be compiled again once.)"""
    import os

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


_bytecode_for_children()


def pytest_sessionstart(session) -> None:
    """Set up once per test process. The native trace reader (collectors/kineto/scan.py) is built
    before any test runs a command: its one-time "building" line would otherwise land in
    whichever test's stderr came first."""
    import importlib

    importlib.import_module("dlpt.collectors.kineto.scan").library()
    # Textual's Pilot waits for the app to go idle in 20 ms sleeps (textual._wait: idle once a
    # sleep passes with under 1/20 of it in CPU time, counting every thread); the TUI tests press
    # keys by the thousand, and a quarter of their time was those sleeps. 5 ms sleeps with the
    # same 1/20 rule: the same question asked four times as often.
    wait = importlib.import_module("textual._wait")
    wait.SLEEP_GRANULARITY = 0.005
    wait.SLEEP_IDLE = wait.SLEEP_GRANULARITY / 20.0


# The suite's longest files, longest first (seconds of setup and calls with `--durations=0`,
# 2026-11-28, this 2-core machine: 42 … 6): collected first, so that `-n 2 --dist loadfile
# --no-loadscope-reorder` (pyproject.toml) hands them out first and the short files fill in at
# the end, rather than a long file starting last on one worker while the other idles. Only the
# order changes; a file missing here runs after these, in its own order.
LONGEST_FIRST = ["test_record.py", "test_collector.py", "test_cost_guard.py", "test_compiled_shares.py",
                 "test_durability.py", "test_cli.py", "test_tui_screen.py", "test_native_build.py", "test_html.py",
                 "test_compiled.py", "test_torchrun.py", "test_recording.py", "test_export.py", "test_fork.py",
                 "test_host_time.py", "test_tui.py", "test_bench.py", "test_tui_nav.py", "test_commwait.py",
                 "test_phases.py", "test_bad_input.py", "test_kineto_scan.py", "test_buildlock.py", "test_usage.py",
                 "test_engine.py", "test_fx_lines_per_op.py", "test_wait_views.py", "test_notebook.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "machine_alone: run with no other test running beside it (conftest.pytest_runtest_protocol)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Every test, with the fixtures its setup makes (a module's recording), holds the run's
    machine lock shared; a test marked `machine_alone` holds it alone, so that the other
    worker's tests wait for it, and it for theirs: for a test whose truth is timing that another
    recording beside it on two cores disturbs (the host sampler's ticks come late)."""
    import fcntl

    factory = getattr(item.config, "_tmp_path_factory", None)  # the tmp_path_factory fixture's object
    if factory is None:  # pytest's tmpdir plugin switched off: no run-wide folder, no lock
        yield
        return
    alone = item.get_closest_marker("machine_alone") is not None
    with open(shared_tmp(factory) / "machine.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
        fcntl.flock(lock, fcntl.LOCK_UN)


def shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this run sees (the run's base temp folder), for what one
    worker makes once and the others reuse; the base folder itself under `-n 0`."""
    import os

    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def inductor_isa_probed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TORCHINDUCTOR_CACHE_DIR that holds Inductor's probes of the vector ISAs alone (which of
    AVX2, AVX-512, ... the C++ compiler builds and the machine loads: ten small compiles, 10-15 s
    on this machine) and nothing compiled from a program: made once for the whole run (under a
    lock, the workers share it). A test that compiles in a cache folder of its own copies it
    there first, as a machine that compiled anything before has them; the compile it checks
    still starts from an empty FX-graph cache. The probes' results are the same either way."""
    import fcntl
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    root = shared_tmp(tmp_path_factory)
    d = root / "inductor-isa-probed"
    with open(root / "inductor-isa-probed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / "probed").exists():
            d.mkdir(exist_ok=True)
            r = subprocess.run([sys.executable, "-c", "from torch._inductor import cpu_vec_isa as c\n"
                                "print(c.valid_vec_isa_list())"],
                               env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(d)}, capture_output=True,
                               text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-3000:]
            (d / "probed").write_text(r.stdout)
    return d


def copy_isa_probes(probed: Path, cache_dir: Path) -> Path:
    """`cache_dir`, a new Inductor cache folder holding a copy of `probed`'s ISA probes alone."""
    import shutil

    shutil.copytree(probed, cache_dir, ignore=shutil.ignore_patterns("probed", "locks"))
    return cache_dir


FIXTURES = DATA / "kineto"
# The program that made the traces: they name its lines, so its text shows their source.
TRACE_SOURCES = DATA / "tools"
TRACE_NAMES = ("copies", "gpt_train", "resnet_infer", "compiled_mlp", "cudagraph_mlp", "threaded", "loader_bound")


def trace_path(name: str) -> Path:
    return FIXTURES / f"{name}.pt.trace.json.gz"


def raw_events(name: str) -> list[dict]:
    """The trace decoded by the standard library, independently of dlpt's decoder."""
    with gzip.open(trace_path(name), "rt") as f:
        return json.load(f)["traceEvents"]


def assert_same_profile(a, b) -> None:
    """Two readings of one trace made the same profile: frames, tree, activity columns and the
    header, field by field."""
    import numpy as np

    assert a.frames == b.frames
    for x, y in ((a.cct.parent, b.cct.parent), (a.cct.frame, b.cct.frame), (a.cct.exclusive, b.cct.exclusive)):
        assert np.array_equal(x, y)
    for k in a.activities.__dataclass_fields__:
        assert np.array_equal(getattr(a.activities, k), getattr(b.activities, k))
    assert a.meta.to_dict() == b.meta.to_dict()


@pytest.fixture(params=TRACE_NAMES)
def trace_name(request) -> str:
    return request.param


def synthetic_profile(paths, source: str = "record", sources: dict[str, str] | None = None):
    """A profile from (call path, kernel ns) pairs, each path ending in a kernel frame: for
    cases no real trace shows (moved lines, recursion, hostile names)."""
    import numpy as np

    from dlpt.cct import CCT, TreeBuilder
    from dlpt.frames import Frame, FrameTable
    from dlpt.metrics import COL, METRICS
    from dlpt.profile import Profile

    ft = FrameTable([Frame("root", "synthetic")])
    b = TreeBuilder(0)
    leaves = [(b.path([ft.intern(f) for f in frames]), ns) for frames, ns in paths]
    parent, frame, new_of_old = b.preorder()
    exc = np.zeros((len(parent), len(METRICS)), dtype=np.int64)
    for node, ns in leaves:
        exc[new_of_old[node], COL["gpu_time"]] += ns
        exc[new_of_old[node], COL["kernel_time"]] += ns
        exc[new_of_old[node], COL["kernel_count"]] += 1
    return Profile(ft.frames, CCT(parent, frame, exc), meta={"source": source}, sources=sources or {})


def by_hand(nodes):
    """A profile from (parent, frame, {metric: own value}) rows given in preorder, node 0 the
    root: no pruning, no renumbering, so each node is where the test put it."""
    import numpy as np

    from dlpt.cct import CCT
    from dlpt.metrics import COL, METRICS
    from dlpt.profile import Profile

    frames = list(dict.fromkeys(f for _, f, _ in nodes))
    exc = np.zeros((len(nodes), len(METRICS)), dtype=np.int64)
    for i, (_, _, own) in enumerate(nodes):
        for m, v in own.items():
            exc[i, COL[m]] = v
    return Profile(frames, CCT([p for p, _, _ in nodes], [frames.index(f) for _, f, _ in nodes], exc),
                   meta={"source": "record"})


def dlpt_in_process(*args: str):
    """`dlpt ARGS` run in this process (dlpt.cli.main, the function `python -m dlpt` calls) with
    its stdout, stderr and exit status captured, as subprocess.run would give them: for corpora
    of many small reading commands, where a process each (0.3-0.5 s of start-up here) was most of
    the time. What only a process shows (the interpreter's own traceback, signals, exit codes
    through the shell) is tested with real processes elsewhere; an exception escaping main()
    fails the test here, as a traceback would there."""
    import contextlib
    import io
    import subprocess

    from dlpt.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse's usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["dlpt", *args], rc, out.getvalue(), err.getvalue())


def detail_text(profile, pick, metric: str | None = None, size: tuple[int, int] = (100, 40)):
    """`dlpt view` on `profile` (metric `metric`), the detail pane of the first row whose frame
    `pick(frame)` accepts, rendered as text: (text, the row's inclusive metrics in the tree the
    view shows, library frames hidden)."""
    import asyncio

    from rich.console import Console

    from dlpt.viewers.tui import DlptApp
    from dlpt.viewers.tui.detail import build_detail, render_detail

    async def run():
        app = DlptApp(profile=profile, metric=metric)
        async with app.run_test(size=size) as pilot:
            for _ in range(100):
                await pilot.pause()
                if app.outline is not None and app.variant is not None and not app.busy:
                    break
            src = app.outline.rows
            tree = app.variant.profile.cct
            key = next(k for k in range(len(tree)) if pick(src.frame(k)))
            d = build_detail(app.variant, src, key, app.view, app.metric)
            con = Console(width=200, record=True, no_color=True)
            con.print(render_detail(d))
            return con.export_text(), tree.inclusive[key]

    return asyncio.run(run())
