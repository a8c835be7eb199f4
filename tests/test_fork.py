"""Programs that fork while `dlpt record` records them: DataLoader workers, fork pools, a bare
os.fork. The child has one thread, the one that forked; a collector mutex another thread held
at that moment stays locked there for good. The child records nothing, never waits on such a
lock, neither stops nor saves the recording, and ends with the status it would have had
without dlpt; the profile is the parent's (collectors/native/collector.cpp after_fork_in_child,
collectors/record/recording.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_record import line_of, lines_with_time  # noqa: E402

import dlpt  # noqa: E402

# Each program's parent waits for its child so: a child that hangs is killed and said to have.
REPORT_CHILD = """\
import os, time


def report_child(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child", os.waitstatus_to_exitcode(status), flush=True)
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung", flush=True)


"""


def program(script: str) -> str:
    return REPORT_CHILD + textwrap.dedent(script)


def record(tmp: Path, script: str, *extra: str, env: dict[str, str] | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess:
    (tmp / "prog.py").write_text(program(script))
    return subprocess.run([sys.executable, "-m", "dlpt", "record", *extra, "-o", "run.dlpt", "prog.py"], cwd=tmp,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def saves(stderr: str) -> int:
    return sum(1 for ln in stderr.splitlines() if ln.startswith("dlpt: profile saved to"))


def test_a_child_forked_while_another_thread_holds_the_collectors_locks_runs_on(tmp_path: Path) -> None:
    """The sampler and CUPTI's activity thread hold the trie's and the leaves' mutexes for short
    stretches; the collector's `hold_locks` holds them from a thread of its own while the program
    forks. Without the fork handler the child's first op, which interns its new frames, waits on
    the trie's mutex forever (measured: the child hung until killed). No snapshot thread and no
    sampler: each may wait for one of the held mutexes while it holds the GIL, and the fork would
    then come only after the hold; the script says when it forked, and the test fails unless that
    was inside the hold. The child also finds dlpt's op callback gone from torch's registry (its
    ops pay no RecordFunction machinery for the parent's recording), the parent still has it."""
    r = record(tmp_path, """\
        import os, sys, time, torch
        from dlpt.collectors.record import session

        def child_work():
            x = torch.ones(8, requires_grad=True)
            x.mul(2).sum().backward()  # the backward hook's calls into the collector too
            return float(x.grad.sum())  # CHILD

        def parent_work():
            y = torch.ones(8)
            for _ in range(50):
                y = y.mul(1.0)  # PARENT
            return y

        parent_work()
        mod = session._ACTIVE.mod
        mod.hold_locks(5.0)  # returns once they are held
        t0 = time.monotonic()
        pid = os.fork()
        if pid:
            print("forked after", round(time.monotonic() - t0, 3), flush=True)
        if pid == 0:
            child_work()
            # torch's own registry: the op callback was taken out in the child alone
            os._exit(7 if not mod.has_global_callbacks() else 8)
        print("parent callbacks", mod.has_global_callbacks(), flush=True)
        report_child(pid, 8)
        parent_work()
    """, "--snapshot-seconds", "0", env={"DLPT_SAMPLE_US": "0"})
    assert r.returncode == 0, r.stderr
    forked = [float(x.split()[-1]) for x in r.stdout.splitlines() if x.startswith("forked after")]
    assert forked and forked[0] < 4.0, r.stdout  # inside the 5 s hold, or the test proves nothing
    assert "child 7" in r.stdout, r.stdout + r.stderr  # 8: the child's ops still ran torch's callbacks
    assert "parent callbacks True" in r.stdout, r.stdout
    assert saves(r.stderr) == 1, r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    lines = lines_with_time(prof, "prog.py")
    assert lines.get(line_of(tmp_path, "prog.py", "# PARENT"), 0) > 0, lines


def test_a_child_that_ends_as_a_script_does_ends_as_without_dlpt_and_leaves_the_profile_to_its_parent(
        tmp_path: Path) -> None:
    """A child that leaves by sys.exit (or the end of the script) returns through `dlpt record`'s
    own frames. Before: it stopped the parent's collector (joining a sampler thread the child does
    not have: the child died by SIGSEGV, status -11 where the program's own is 5) and saved a
    profile of its own to the parent's path, which the parent then overwrote, or the reverse when
    the child ended last. Two children: one the parent waits for (its status), one that ends
    after the parent has saved (a save of its own would replace the parent's)."""
    script = """\
        import os, sys, time, torch

        x = torch.ones(16)
        for _ in range(100):
            x = x.mul(1.0)  # BEFORE
        pid = os.fork()
        if pid == 0:
            torch.ones(4).mul(3).sum()  # CHILD
            sys.exit(5)
        report_child(pid, 30)
        if os.environ.get("LATE_CHILD") and os.fork() == 0:
            torch.ones(4).sum()  # CHILD
            time.sleep(0.5)
            sys.exit(0)
        for _ in range(100):
            x = x.add(1.0)  # AFTER
    """
    (tmp_path / "plain.py").write_text(program(script))
    plain = subprocess.run([sys.executable, "plain.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plain.stdout.strip() == "child 5", plain.stdout + plain.stderr
    (tmp_path / "prog.py").write_text(program(script))
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-o", "run.dlpt", "prog.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "LATE_CHILD": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == plain.stdout.strip(), r.stdout + r.stderr
    assert saves(r.stderr) == 1 and "Traceback" not in r.stderr, r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    lines = lines_with_time(prof, "prog.py")
    assert lines.get(line_of(tmp_path, "prog.py", "# AFTER"), 0) > 0, lines
    assert line_of(tmp_path, "prog.py", "# CHILD") not in lines, lines


def test_dataloader_workers_forked_while_recording(tmp_path: Path) -> None:
    """A DataLoader with fork-started workers, torch ops in the workers' `__getitem__`, three
    times: every batch arrives, the parent saves once, and its hooks keep working past the
    forks. (The workers' ops cannot reach the parent's profile in any case: they run in other
    processes.)"""
    r = record(tmp_path, """\
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Items(Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                return torch.full((16,), float(i)).sin()  # WORKER

        if __name__ == "__main__":
            total = 0.0
            for epoch in range(3):  # new workers each epoch: three forks of two
                loader = DataLoader(Items(), batch_size=8, num_workers=2, multiprocessing_context="fork")
                for batch in loader:
                    total += float(batch.cos().sum())  # STEP
            print("batches done", round(total, 3), flush=True)
    """)
    assert r.returncode == 0, r.stderr
    assert "batches done" in r.stdout, r.stdout + r.stderr
    assert saves(r.stderr) == 1, r.stderr
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    lines = lines_with_time(prof, "prog.py")
    assert lines.get(line_of(tmp_path, "prog.py", "# STEP"), 0) > 0, lines
    # The parent's DataLoader hook outlives its workers' forks (a child takes out only its own
    # copy of the hooks): all three loaders are in the parent's profile.
    assert len(prof.meta.dataloaders) == 3 and {d["num_workers"] for d in prof.meta.dataloaders} == {2}
