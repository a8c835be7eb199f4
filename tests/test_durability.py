"""Durability of `dlpt record` (docs/ROBUSTNESS.md): real `dlpt record` processes on tiny torch
programs, real signals, real filesystems (tmpfs mounts where we may mount), no mocks.

A recording that is interrupted, terminated, killed or cannot be saved must leave either a
complete profile or none at all — never a half-written file, never a stray temporary file after
the next run — and end the way the program would have ended.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import dlpt  # noqa: E402
from dlpt.errors import DlptError  # noqa: E402
from dlpt.store import MIN_FREE_BYTES  # noqa: E402

# Generous: a loaded 2-core machine needs several seconds just to import torch.
START = 240
ROOT = os.geteuid() == 0

# Sleeps between iterations keep the profiler's event buffer small however long a test waits
# (a tight loop with no optimizer step grows it without bound).
LOOP = """\
import sys, time, torch
lin = torch.nn.Linear(8, 8)
x = torch.randn(4, 8)
i = 0
try:
    while True:
        y = lin(x).relu().sum()  # LOOP_LINE
        time.sleep(0.005)
        i += 1
        if i == 5:
            print("IN_LOOP", flush=True)
finally:
    open("finally_ran", "w").write("x")
"""


def big_program(n: int = 6000, loop: bool = True, status: int = 0) -> str:
    """n distinct functions, each calling an op: a profile of many nodes and a large source
    snapshot, so that building and saving it takes long enough to be caught in the act."""
    lines = ["import sys, time, torch", "x = torch.ones(4)"]
    lines += [f"def f{i}(): return torch.add(x, {i})" for i in range(n)]
    lines += [f"for i in range({n}): globals()['f%d' % i]()", "print('IN_LOOP', flush=True)"]
    lines += ["while True: time.sleep(0.01)"] if loop else [f"sys.exit({status})"]
    return "\n".join(lines) + "\n"


def as_at_a_terminal(then=None):
    """preexec_fn: SIGINT and SIGTERM at their defaults, as for a program started from a shell
    prompt; a test run started in the background inherits SIGINT ignored, which dlpt (like
    python) keeps ignored."""

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if then is not None:
            then()

    return preexec


class Rec:
    """A `dlpt record` subprocess: stdout is a pipe (markers), stderr goes to a file."""

    def __init__(self, tmp: Path, script: str, *extra: str, out: str = "run.dlpt", name: str = "prog.py",
                 preexec=None) -> None:
        (tmp / name).write_text(textwrap.dedent(script))
        self.tmp = tmp
        self.err_path = tmp / f"stderr.{time.monotonic_ns()}.txt"
        self.err_file = open(self.err_path, "w")
        self.p = subprocess.Popen([sys.executable, "-m", "dlpt", "record", "-o", out, *extra, name],
                                  cwd=tmp, stdout=subprocess.PIPE, stderr=self.err_file, text=True,
                                  preexec_fn=as_at_a_terminal(preexec))
        self.stdout = ""

    def wait_stdout(self, marker: str, timeout: float = START) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.stdout:
            left = deadline - time.monotonic()
            assert left > 0 and self.p.poll() is None, (marker, self.stdout, self.stderr)
            ready, _, _ = select.select([self.p.stdout], [], [], min(left, 1.0))
            if ready:
                self.stdout += self.p.stdout.readline()

    def wait_stderr(self, marker: str, timeout: float = START) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.stderr:
            assert time.monotonic() < deadline and self.p.poll() is None, (marker, self.stderr)
            time.sleep(0.002)

    def signal(self, sig: int) -> None:
        self.p.send_signal(sig)

    def finish(self, timeout: float = START) -> int:
        rest, _ = self.p.communicate(timeout=timeout)
        self.stdout += rest or ""
        self.err_file.close()
        return self.p.returncode

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()  # written by the child; our handle is never written to


def temps(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(".dlpt-") and n.endswith(".tmp"))


def run_dlpt(*args: str, cwd: Path, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlpt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=START, preexec_fn=as_at_a_terminal(preexec))


def one_dlpt_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("dlpt: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@contextlib.contextmanager
def tmpfs(path: Path, size: str, ro: bool = False) -> Iterator[Path | None]:
    """A real small (or read-only) filesystem at `path`, or None where we may not mount one."""
    path.mkdir()
    opts = f"size={size},mode=0777" + (",ro" if ro else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# ----- signals -----

def test_sigint_saves_then_ends_as_python_would(tmp_path: Path) -> None:
    r = Rec(tmp_path, LOOP)
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGINT)
    rc = r.finish()
    err = r.stderr
    # Python dies by SIGINT after an unhandled KeyboardInterrupt (the shell shows 130); so does dlpt.
    assert rc == -signal.SIGINT, err
    assert "Traceback (most recent call last):" in err and "\nKeyboardInterrupt\n" in err
    assert 'prog.py", line' in err and "dlpt/" not in err.split("KeyboardInterrupt")[0], err
    assert (tmp_path / "finally_ran").exists(), "the program's finally block runs, as under python"
    assert "profile saved to run.dlpt" in err
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert prof.meta["exit_status"] == 130 and prof.meta["ended_by"] == "interrupted (SIGINT)"
    assert prof.cct.inclusive[0, dlpt.metrics.COL["cpu_time"]] > 0
    assert temps(tmp_path) == []


def test_sigterm_saves_then_dies_by_sigterm_like_the_program(tmp_path: Path) -> None:
    r = Rec(tmp_path, LOOP)
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGTERM)
    rc = r.finish()
    assert rc == -signal.SIGTERM, r.stderr
    assert "SIGTERM: saving what was recorded to run.dlpt" in r.stderr and "profile saved" in r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert prof.meta["exit_status"] == 143 and prof.meta["ended_by"] == "SIGTERM"
    assert temps(tmp_path) == []
    # As under plain python, an unhandled SIGTERM runs no finally block: the same here.
    assert not (tmp_path / "finally_ran").exists()
    plain = subprocess.Popen([sys.executable, "prog.py"], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                             preexec_fn=as_at_a_terminal())
    assert "IN_LOOP" in plain.stdout.readline()
    plain.send_signal(signal.SIGTERM)
    assert plain.wait(timeout=START) == rc


def test_the_programs_own_sigterm_handler_is_respected(tmp_path: Path) -> None:
    script = LOOP.replace("import sys, time, torch\n", "import signal, sys, time, torch\n"
                          "def bye(*a):\n    print('HANDLED', flush=True)\n    sys.exit(7)\n"
                          "signal.signal(signal.SIGTERM, bye)\n")
    r = Rec(tmp_path, script)
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGTERM)
    rc = r.finish()
    assert rc == 7 and "HANDLED" in r.stdout, r.stderr
    assert (tmp_path / "finally_ran").exists()
    assert dlpt.load(str(tmp_path / "run.dlpt")).meta["exit_status"] == 7


def test_an_ignored_sigint_stays_ignored(tmp_path: Path) -> None:
    """Under nohup or a batch system SIGINT is ignored; python keeps it so, and so does dlpt."""
    r = Rec(tmp_path, LOOP, preexec=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGINT)
    time.sleep(1.0)  # a non-event has no marker: give the signal time to do harm, then look
    assert r.p.poll() is None, r.stderr  # still running
    r.signal(signal.SIGTERM)
    assert r.finish() == -signal.SIGTERM, r.stderr
    assert "KeyboardInterrupt" not in r.stderr
    assert dlpt.load(str(tmp_path / "run.dlpt")).meta["ended_by"] == "SIGTERM"


def test_second_ctrl_c_while_saving_abandons_and_keeps_the_old_file(tmp_path: Path) -> None:
    (tmp_path / "run.dlpt").write_text("old profile")
    r = Rec(tmp_path, big_program(), "--force")
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGINT)
    r.wait_stderr("Ctrl-C again to abandon it")
    r.signal(signal.SIGINT)
    rc = r.finish()
    err = r.stderr
    assert rc == -signal.SIGINT, err
    assert "interrupted (SIGINT) while saving: the profile was not saved; run.dlpt keeps its previous contents" in err
    assert err.count("Traceback") == 1, err  # the program's, none of dlpt's
    assert (tmp_path / "run.dlpt").read_text() == "old profile"
    assert temps(tmp_path) == []


def test_kill_9_before_the_first_snapshot_leaves_nothing(tmp_path: Path) -> None:
    r = Rec(tmp_path, LOOP)
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGKILL)
    assert r.finish() == -signal.SIGKILL
    assert not (tmp_path / "run.dlpt").exists() and temps(tmp_path) == []


def test_kill_9_while_saving_keeps_the_old_file_and_the_next_run_cleans_up(tmp_path: Path) -> None:
    (tmp_path / "run.dlpt").write_text("old profile")
    r = Rec(tmp_path, big_program(), "--force")
    r.wait_stdout("IN_LOOP")
    r.signal(signal.SIGINT)
    prefix = f".dlpt-{r.p.pid}-"
    deadline = time.monotonic() + START
    # Kill the moment the temporary profile appears: mid-write.
    while not any(n.startswith(prefix) for n in temps(tmp_path)):
        assert time.monotonic() < deadline and r.p.poll() is None, r.stderr
    r.signal(signal.SIGKILL)
    assert r.finish() == -signal.SIGKILL
    left = temps(tmp_path)
    assert left and all(n.startswith(prefix) for n in left), left  # caught in the act
    assert (tmp_path / "run.dlpt").read_text() == "old profile"
    # The next recording in the directory removes what the dead process left.
    again = run_dlpt("record", "-o", "next.dlpt", "prog2.py", cwd=tmp_path) if (
        (tmp_path / "prog2.py").write_text("import torch\ntorch.ones(2).sum()\n")) else None
    assert again is not None and again.returncode == 0, again.stderr
    assert temps(tmp_path) == []
    dlpt.load(str(tmp_path / "next.dlpt"))


# ----- where the profile goes -----

def test_unwritable_directory_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    """chmod does not stop root: as root, a read-only tmpfs (or sysfs, where nobody may create
    files); otherwise a chmod 555 directory. Every branch asserts the same."""
    script = "open('ran', 'w').write('x')\n"
    (tmp_path / "prog.py").write_text(script)
    with tmpfs(tmp_path / "ro", "1m", ro=True) as ro:
        if ro is not None:
            where = ro
        elif ROOT:
            where = Path("/sys")
        else:
            where = tmp_path / "ro"
            where.chmod(0o555)
        r = run_dlpt("record", "-o", str(where / "run.dlpt"), "prog.py", cwd=tmp_path)
        line = one_dlpt_line(r.stderr)
        assert r.returncode == 2 and f"cannot write in {where}" in line and "-o" in line, line
        assert not (tmp_path / "ran").exists(), "the program ran although its profile could not be written"
        assert not (where / "run.dlpt").exists()
    # A path under a regular file, and a missing directory: the same, said differently.
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo")  # not a regular file (never /dev/null: a bug would replace it)
    for out, says in ((tmp_path / "afile" / "run.dlpt", "is a file, not a directory"),
                      (tmp_path / "no" / "run.dlpt", "no such directory"),
                      (tmp_path, "is a directory"),
                      (tmp_path / "fifo", "not a regular file")):
        r = run_dlpt("record", "--force", "-o", str(out), "prog.py", cwd=tmp_path)
        assert r.returncode == 2 and says in one_dlpt_line(r.stderr), (out, r.stderr)
        assert not (tmp_path / "ran").exists()


def test_nearly_full_disk_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("open('ran', 'w').write('x')\n")
    with tmpfs(tmp_path / "small", "64k") as small:
        if small is None:
            pytest.skip("needs a small real filesystem: mounting a tmpfs is not allowed here")
        r = run_dlpt("record", "-o", str(small / "run.dlpt"), "prog.py", cwd=tmp_path)
        line = one_dlpt_line(r.stderr)
        assert r.returncode == 2 and "only 64 KiB free" in line and "1.0 MiB" in line, line
        assert not (tmp_path / "ran").exists() and os.listdir(small) == []


def _fsize_limit() -> None:
    # Where no tmpfs can be mounted: the kernel's per-process file size limit makes a real write
    # fail (EFBIG) the same way a full disk does (ENOSPC), with no mock in between.
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 * MIN_FREE_BYTES, 2 * MIN_FREE_BYTES))


@pytest.mark.parametrize("status", [0, 3])
def test_disk_full_while_saving(tmp_path: Path, status: int) -> None:
    """Enough space to start (the 1 MiB minimum), too little for the profile (several MiB): one
    dlpt line, no partial file, the old file kept; a failed program keeps its status, a
    successful one gives 2."""
    with tmpfs(tmp_path / "small", "1536k") as small:
        where, preexec, says = (small, None, "no space left on the device") if small is not None else (
            tmp_path, _fsize_limit, "File too large")
        (where / "run.dlpt").write_text("old profile")
        r = Rec(tmp_path, big_program(loop=False, status=status), "--force", out=str(where / "run.dlpt"),
                preexec=preexec)
        rc = r.finish()
        err = r.stderr
        line = next((ln for ln in err.splitlines() if "could not be saved" in ln), "")
        assert line.startswith("dlpt: the profile could not be saved: cannot write "), err
        assert says in line and "keeps its previous contents" in line, line
        assert "Traceback" not in err
        assert rc == (status or 2), err
        assert (where / "run.dlpt").read_text() == "old profile"
        assert temps(where) == []


# ----- the Python API and the store -----

def test_api_checks_before_the_block_and_saves_on_sigterm(tmp_path: Path) -> None:
    ran = []
    with pytest.raises(DlptError, match="no such directory"):
        with dlpt.profile(str(tmp_path / "no" / "x.dlpt"), quiet=True):
            ran.append(1)
    assert ran == []
    with pytest.raises(DlptError, match="force=True"):
        (tmp_path / "old.dlpt").write_text("x")
        with dlpt.profile(str(tmp_path / "old.dlpt"), force=False, quiet=True):
            ran.append(1)
    assert ran == []
    script = LOOP.replace("try:\n    while True:", "import dlpt\nwith dlpt.profile('api.dlpt', quiet=True):\n"
                          "  while True:").replace("finally:\n    open", "if 0:\n    open")
    (tmp_path / "api.py").write_text(script)
    p = subprocess.Popen([sys.executable, "api.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=as_at_a_terminal())
    assert "IN_LOOP" in p.stdout.readline()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=START)
    assert p.returncode == -signal.SIGTERM and "SIGTERM: profile saved to api.dlpt" in err, err
    assert dlpt.load(str(tmp_path / "api.dlpt")).cct.inclusive[0].sum() > 0
