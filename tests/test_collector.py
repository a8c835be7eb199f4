"""dlpt's own collector on the CPU build of torch: real programs under `dlpt record`.

What the collector must get right on any machine: ops on the line that is running when they
are entered (Python operators and module-level code included), a thread's work on the
thread's own lines, backward ops on the forward line that created them, an op-bound loop
recorded without a crash, snapshots that survive `kill -9`, bounded memory, and a program that
runs torch.profiler itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import dlpt  # noqa: E402
from dlpt.metrics import COL  # noqa: E402

CPU = COL["cpu_time"]


def run_record(tmp: Path, script: str, *extra: str, name: str = "prog.py", timeout: float = 600,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    (tmp / name).write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", *extra, name],
                          cwd=tmp, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def marked_lines(tmp: Path, name: str = "prog.py") -> dict[str, int]:
    """`# LINE:name` markers → line numbers."""
    out = {}
    for i, text in enumerate((tmp / name).read_text().splitlines(), 1):
        if "# LINE:" in text:
            out[text.split("# LINE:")[1].split()[0]] = i
    return out


def line_owners(prof: dlpt.Profile, file_name: str) -> dict[int, int]:
    """cpu_time each line of `file_name` owns (flat by line: innermost source line of a path)."""
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    fv = flat(hide_library_unless(prof, False), "line")
    return {fr.line: int(fv.exclusive[g, CPU]) for g, fr in enumerate(fv.frame)
            if fr.kind == "python" and os.path.basename(fr.file) == file_name}


def recorded(tmp: Path, script: str) -> tuple[dlpt.Profile, dict[str, int], dict[int, int]]:
    """Record `script` as prog.py (it must succeed): the profile, its `# LINE:` markers, and the
    cpu_time each line of prog.py owns."""
    r = run_record(tmp, script)
    assert r.returncode == 0, r.stderr
    prof = dlpt.load(str(tmp / "run.dlpt"))
    return prof, marked_lines(tmp), line_owners(prof, "prog.py")


OPERATORS = """\
import torch

a = torch.randn(64, 64, requires_grad=True)
b = torch.randn(64, 64)


def f(x, y):
    z = x @ y  # LINE:matmul
    w = z + y  # LINE:add
    return w * torch.sigmoid(w)  # LINE:silu


for _ in range(3):
    out = f(a, b)  # LINE:call
    out.sum().backward()  # LINE:backward
c = a.detach() * 3 + b  # LINE:module
d = c[1:5] @ b  # LINE:module_matmul
"""


@pytest.fixture(scope="module")
def operators(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dlpt.Profile]:
    tmp = tmp_path_factory.mktemp("operators")
    r = run_record(tmp, OPERATORS)
    assert r.returncode == 0, r.stderr
    return tmp, dlpt.load(str(tmp / "run.dlpt"))


def test_operators_land_on_their_own_lines(operators) -> None:
    tmp, prof = operators
    lines = marked_lines(tmp)
    owned = line_owners(prof, "prog.py")
    for m in ("matmul", "add", "silu", "module", "module_matmul"):
        assert owned.get(lines[m], 0) > 0, (m, owned)
    # Nothing on the def line or on line 0: every op sits on the line that ran it.
    def_line = next(i for i, t in enumerate((tmp / "prog.py").read_text().splitlines(), 1) if t.startswith("def f"))
    assert owned.get(def_line, 0) == 0 and owned.get(0, 0) == 0, owned
    total = int(prof.cct.exclusive[:, CPU].sum())
    assert sum(owned.values()) == total  # every op's time on a line of the program


def test_backward_ops_under_the_forward_line(operators) -> None:
    tmp, prof = operators
    lines = marked_lines(tmp)
    seen = {}
    for i in range(len(prof.cct)):
        if prof.frame_of(i).kind != "backward":
            continue
        path = prof.call_path(i)
        src = [p.line for p in path if p.kind == "python" and p.file.endswith("prog.py")]
        kids = {prof.frame_of(j).name for j in prof.cct.children(i)}
        seen.setdefault(src[-1] if src else None, set()).update(kids)
    assert "MmBackward0" in seen.get(lines["matmul"], set()), seen
    assert "SigmoidBackward0" in seen.get(lines["silu"], set()), seen
    assert "AddBackward0" in seen.get(lines["add"], set()), seen


def test_conservation_and_invariants(operators) -> None:
    _, prof = operators
    cct = prof.cct
    for i in range(len(cct)):
        kids = cct.children(i)
        assert (cct.inclusive[i] == cct.exclusive[i] + cct.inclusive[kids].sum(axis=0)).all()
    assert (cct.exclusive >= 0).all()


THREADS = """\
import threading
import torch

x = torch.randn(128, 128)


def worker(n):
    for _ in range(n):
        y = x @ x  # LINE:thread_matmul
        y.relu_()  # LINE:thread_relu


ts = [threading.Thread(target=worker, args=(20,), name=f"w{k}") for k in range(2)]
for t in ts:
    t.start()  # LINE:start
x.sum()  # LINE:main
for t in ts:
    t.join()  # LINE:join
"""


def test_threads_work_on_their_own_lines(tmp_path: Path) -> None:
    prof, lines, owned = recorded(tmp_path, THREADS)
    assert owned.get(lines["thread_matmul"], 0) > 0 and owned.get(lines["thread_relu"], 0) > 0, owned
    assert owned.get(lines["join"], 0) == 0, "thread work must not land on join()"
    threads = set()
    for i in range(len(prof.cct)):
        fr = prof.frame_of(i)
        if fr.kind == "thread":
            threads.add(fr.name)
            path = prof.call_path(i)
            assert any(p.kind == "python" and p.line == lines["start"] for p in path), path
    assert threads == {"[thread w0]", "[thread w1]"}, threads


OPLOOP = """\
import torch
import torch.nn as nn
torch.manual_seed(0)
blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()) for _ in range(8)])
opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3)
x = torch.randn(16, 64)
for step in range({steps}):
    loss = blocks(x).square().mean()  # LINE:forward
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", step)
"""


def test_op_bound_loop_records_without_a_crash(tmp_path: Path) -> None:
    """The loop that made the torch.profiler recorder abort ("corrupted size vs. prev_size")."""
    r = run_record(tmp_path, OPLOOP.format(steps=320))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done 319" in r.stdout
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert prof.meta["steps_seen"] == 320
    owned = line_owners(prof, "prog.py")
    assert owned.get(marked_lines(tmp_path)["forward"], 0) > 0
    linears = [i for i in range(len(prof.cct)) if prof.frame_of(i).name == "aten::linear"]
    assert linears, "the forward's ops are in the tree"


SLOW = """\
import sys, time, torch
x = torch.ones(64)
print("ready", flush=True)
t0 = time.time()
while True:
    x = x * 1.0001  # LINE:loop
    time.sleep(0.001)
"""


def test_kill_9_keeps_the_last_snapshot(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(SLOW)
    p = subprocess.Popen([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", "--snapshot-seconds", "0.5",
                          "prog.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        snap = tmp_path / "run.dlpt"
        deadline = time.time() + 60
        while not snap.exists() and time.time() < deadline:
            time.sleep(0.1)
        with open(snap, "rb") as f:  # the first snapshot, kept (each one replaces the file whole)
            first_ino = os.fstat(f.fileno()).st_ino
            (tmp_path / "first.dlpt").write_bytes(f.read())
        # A later snapshot, with more of the loop in it: wait until another file replaces it.
        while os.stat(snap).st_ino == first_ino and time.time() < deadline:
            time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    first, prof = dlpt.load(str(tmp_path / "first.dlpt")), dlpt.load(str(snap))
    assert prof.meta["partial"] is True and prof.meta["snapshots"] > first.meta["snapshots"]
    loop = marked_lines(tmp_path)["loop"]
    owned = line_owners(prof, "prog.py")
    assert owned.get(loop, 0) > line_owners(first, "prog.py").get(loop, 0), owned
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_snapshots_take_a_bounded_share_of_the_program(tmp_path: Path) -> None:
    """Snapshots are built on a Python thread that shares the GIL with the program: asked for
    every 10 ms, they would take most of its time (each costs tens of ms here). The wait after
    one is stretched to 25 times its CPU cost, so all but the last take at most 4% of the wall."""
    script = """\
    import time, torch
    fns = [eval(f"lambda x: x * {i}") for i in range(300)]  # many lines' worth of nodes
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 3.0:
        for f in fns:
            f(torch.ones(4))
    print("wall", time.perf_counter() - t0)
    """
    r = run_record(tmp_path, script, "--snapshot-seconds", "0.01")
    assert r.returncode == 0, r.stderr
    wall = float(r.stdout.split("wall")[1])
    m = dlpt.load(str(tmp_path / "run.dlpt")).meta
    n, cpu = m["snapshots"], m["snapshot_cpu_s"]
    assert n >= 1, m  # at least one was written while the loop ran
    # The last snapshot's cost is not yet paid back by a wait. Every other one is, by a wait 25
    # times its cost, inside the recording: the loop's wall and what ran outside it (the program's
    # start, the end before the final save; 0.25 s allowed). The costliest snapshot (its wait / 25)
    # stands in for the last: the mean did once, under the suite's load on 2 cores, and the
    # bound failed by 1.5% (19 snapshots, 0.129 s CPU, 3.003 s wall). Without the stretch: 40-80%
    # of the wall (n in the tens).
    assert cpu - m["snapshot_wait_max_s"] / 25 <= (wall + 0.25) / 25, (n, cpu, wall)
    assert m["snapshot_wait_max_s"] >= 25 * cpu / n - 0.002, m  # each wait is 25 times its snapshot's cost


def test_memory_stays_bounded_over_many_steps(tmp_path: Path) -> None:
    """20k steps of a small loop: the tree stops growing after the first step, and so does
    dlpt's memory (the issue's bound is 50 MB over 100k steps; bench/ measures that one)."""
    script = """\
    import resource, sys, torch
    x = torch.ones(8)
    def step():
        return (x * 2 + 1).sum()  # LINE:step
    for i in range(2000):
        step()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(20000):
        step()
    r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("grew_kb", r1 - r0)
    """
    r = run_record(tmp_path, script)
    assert r.returncode == 0, r.stderr
    grew = int(r.stdout.split("grew_kb")[1].split()[0])
    assert grew < 10 * 1024, f"{grew} kB over 20k steps"
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert len(prof.cct) < 100


def test_program_that_runs_torch_profiler_itself(tmp_path: Path) -> None:
    script = """\
    import torch
    from torch.profiler import profile, ProfilerActivity
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        y = x @ x  # LINE:inside
    print("events", len(p.events()) > 0)
    z = x + 1  # LINE:after
    """
    r = run_record(tmp_path, script)
    assert r.returncode == 0, r.stderr
    assert "events True" in r.stdout
    owned = line_owners(dlpt.load(str(tmp_path / "run.dlpt")), "prog.py")
    lines = marked_lines(tmp_path)
    assert owned.get(lines["inside"], 0) > 0 and owned.get(lines["after"], 0) > 0, owned


def test_syntax_error_is_said_once_and_nothing_is_saved(tmp_path: Path) -> None:
    r = run_record(tmp_path, "import torch\nx = (1,\n")
    assert r.returncode == 1
    assert "SyntaxError" in r.stderr and "dlpt: prog.py does not compile; nothing recorded" in r.stderr
    assert "profile saved" not in r.stderr and not (tmp_path / "run.dlpt").exists()


def test_trace_directory_is_not_a_program(tmp_path: Path) -> None:
    logs = tmp_path / "tb_logs"
    logs.mkdir()
    (logs / "host.123.pt.trace.json").write_text("{}")
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "tb_logs"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("dlpt: ") and len(r.stderr.strip().splitlines()) == 1
    assert "dlpt import" in r.stderr and "dlpt report" in r.stderr
    assert not list(tmp_path.glob("*.dlpt"))


def test_program_without_ops_writes_no_profile(tmp_path: Path) -> None:
    # Nothing recorded is an error of the recording (status 2), though the program ran: a script
    # that reads the profile next must not take it as written.
    r = run_record(tmp_path, "print('hello')\n")
    assert r.returncode == 2 and "hello" in r.stdout
    assert "nothing recorded" in r.stderr and "profile saved" not in r.stderr
    assert not (tmp_path / "run.dlpt").exists()


FUNCTION = """\
import torch


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.matmul(x)  # LINE:fwd_body
        return y * 2  # LINE:fwd_scale

    @staticmethod
    def backward(ctx, g):
        return g * 2  # LINE:bwd_body


x = torch.randn(64, 64, requires_grad=True)
for _ in range(3):
    out = Double.apply(x)  # LINE:apply
    out.sum().backward()
"""


def test_custom_function_forward_on_its_own_lines_backward_on_apply(tmp_path: Path) -> None:
    """A custom Function's forward is Python called from inside an op: its ops belong to its
    own lines; its backward (matched by sequence number) to the line that applied it."""
    prof, lines, owned = recorded(tmp_path, FUNCTION)
    assert owned.get(lines["fwd_body"], 0) > 0 and owned.get(lines["fwd_scale"], 0) > 0, owned
    bwd = [i for i in range(len(prof.cct)) if prof.frame_of(i).name == "DoubleBackward"]
    assert bwd, "the custom backward is recorded"
    for i in bwd:
        src = [p.line for p in prof.call_path(i) if p.kind == "python" and p.file.endswith("prog.py")]
        assert src[-1] == lines["apply"], src


def test_python_api_names_each_ranks_file(tmp_path: Path) -> None:
    """`dlpt.profile("run.dlpt")` under torchrun (RANK/WORLD_SIZE set) writes run.rank<R>.dlpt."""
    (tmp_path / "api.py").write_text(textwrap.dedent("""\
        import dlpt, torch
        with dlpt.profile("run.dlpt", quiet=True):
            torch.ones(4).sum()
    """))
    r = subprocess.run([sys.executable, "api.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "run.dlpt").exists()
    prof = dlpt.load(str(tmp_path / "run.rank1.dlpt"))
    assert prof.meta["rank"] == 1 and prof.meta["world_size"] == 2


def test_no_compiler_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Without a C++ compiler the collector cannot be built: say what to install, run nothing."""
    (tmp_path / "prog.py").write_text("open('ran', 'w').write('x')\n")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-c++"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", "prog.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "building the native collector" not in ln]
    assert len(errors) == 1 and errors[0].startswith("dlpt: recording needs a C++ compiler"), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run.dlpt").exists()


def test_backward_without_record_function_switches_back_and_spares_torch_profiler(tmp_path: Path) -> None:
    """With CUPTI on, backward() runs with RecordFunction off and its work is placed at each
    launch (collectors/native/autograd.h). DLPT_DIAG=bwoff does that here, without a GPU: nothing
    launches, so that backward leaves no backward ops; RecordFunction is back on after it (the
    next lines are recorded), and stays on for a backward that torch.profiler watches."""
    script = """\
    import torch
    from torch.profiler import profile, ProfilerActivity
    a = torch.randn(64, 64, requires_grad=True)
    for _ in range(2):
        y = (a @ a).sum()  # LINE:fwd
        y.backward()
    b = a.detach() - 1  # LINE:between
    with profile(activities=[ProfilerActivity.CPU]) as p:
        z = (a * 2).sum()  # LINE:prof_fwd
        z.backward()
    print("profiler saw backward", any("MulBackward0" in e.name for e in p.events()))
    w = a.detach() + 1  # LINE:after
    """
    r = run_record(tmp_path, script, env={"DLPT_DIAG": "bwoff"})
    assert r.returncode == 0, r.stderr
    assert "profiler saw backward True" in r.stdout
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    lines = marked_lines(tmp_path)
    owned = line_owners(prof, "prog.py")
    for m in ("fwd", "between", "prof_fwd", "after"):
        assert owned.get(lines[m], 0) > 0, (m, owned)
    under: dict[int, set[str]] = {}
    for i in range(len(prof.cct)):
        if prof.frame_of(i).kind == "backward":
            src = [p.line for p in prof.call_path(i) if p.kind == "python" and p.file.endswith("prog.py")]
            under.setdefault(src[-1], set()).update(prof.frame_of(j).name for j in prof.cct.children(i))
    assert "MulBackward0" in under.get(lines["prof_fwd"], set()), under
    assert not any("MmBackward0" in s for s in under.values()), under
