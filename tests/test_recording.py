"""The recording lifecycle seen from outside: the start line, python's own flags before the
script, a Ctrl-C traceback with none of dlpt's frames, and `dlpt.profile` keeping an existing
file unless told otherwise (the CPU build of torch, real programs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import dlpt  # noqa: E402
from dlpt.errors import DlptError  # noqa: E402

PROG = """\
import sys
import torch
x = torch.ones(8) + 1
print("dev_mode", sys.flags.dev_mode, "dont_write_bytecode", sys.flags.dont_write_bytecode, flush=True)
"""


def run(tmp: Path, *args: str, script: str = PROG, name: str = "prog.py", **kw) -> subprocess.CompletedProcess:
    (tmp / name).write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "dlpt", "record", *args], cwd=tmp, capture_output=True,
                          text=True, timeout=300, **kw)


def sigint_at_its_default() -> None:
    """preexec_fn: SIGINT at its default, as for a program started from a shell prompt. A test
    run started in the background (`pytest … &`, nohup) inherits SIGINT ignored, which python,
    and dlpt with it, keeps ignored: the program's own Ctrl-C would then do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_start_line_on_stderr_and_quiet_silences_it(tmp_path: Path) -> None:
    r = run(tmp_path, "-o", "run.dlpt", "prog.py", "--lr", "1")
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0]
    assert first == "dlpt: recording python prog.py --lr 1 → run.dlpt; Ctrl-C stops and saves"
    q = run(tmp_path, "-o", "run2.dlpt", "--quiet", "prog.py")
    assert q.returncode == 0, q.stderr
    assert "recording python" not in q.stderr and "profile saved to run2.dlpt" in q.stderr


def test_python_flags_before_the_script_apply_to_the_program(tmp_path: Path) -> None:
    # -B, not -O: under -O every module of torch is compiled from source again (its optimized
    # bytecode is not installed), 8-10 s of the suite for a flag that travels the same way.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # -B alone sets it
    r = run(tmp_path, "-o", "run.dlpt", "--", "python", "-X", "dev", "-u", "-B", "prog.py", env=env)
    assert r.returncode == 0, r.stderr
    assert "dev_mode True dont_write_bytecode 1" in r.stdout
    prof = dlpt.load(str(tmp_path / "run.dlpt"))
    assert any(f.kind == "op" for f in prof.frames)
    assert any(f.file.endswith("prog.py") for f in prof.frames if f.kind == "python")
    # The module form, with an attached -X value.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(PROG)
    m = run(tmp_path, "-o", "mod.dlpt", "python", "-Xdev", "-m", "pkg.train", env=env)
    assert m.returncode == 0, m.stderr
    assert "dev_mode True dont_write_bytecode 0" in m.stdout
    assert (tmp_path / "mod.dlpt").exists()


def test_unknown_python_flag_is_one_line(tmp_path: Path) -> None:
    r = run(tmp_path, "--", "python", "-i", "prog.py")
    assert r.returncode == 2 and r.stderr.startswith("dlpt: ") and len(r.stderr.splitlines()) == 1, r.stderr


INTERRUPTED = """\
import os
import signal
import time
import torch
import dlpt

def train():
    x = torch.ones(8) + 1
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)

{body}
"""


@pytest.mark.parametrize("how", ["api", "cli"])
def test_ctrl_c_traceback_shows_only_the_programs_frames(tmp_path: Path, how: str) -> None:
    if how == "api":
        body = "with dlpt.profile('api.dlpt', quiet=True):\n    train()"
        (tmp_path / "prog.py").write_text(INTERRUPTED.format(body=body))
        r = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           preexec_fn=sigint_at_its_default)
    else:
        r = run(tmp_path, "-o", "cli.dlpt", "prog.py", script=INTERRUPTED.format(body="train()"),
                preexec_fn=sigint_at_its_default)
    assert "KeyboardInterrupt" in r.stderr, r.stderr
    frames = [ln for ln in r.stderr.splitlines() if ln.strip().startswith('File "')]
    assert frames and all("prog.py" in ln for ln in frames), r.stderr
    assert (tmp_path / f"{how}.dlpt").exists()


def test_python_api_keeps_an_existing_file_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "run.dlpt"
    out.write_text("keep me")
    with pytest.raises(DlptError, match="force=True"):
        with dlpt.profile(str(out), quiet=True):
            torch.ones(4).sum()
    assert out.read_text() == "keep me"
    with dlpt.profile(str(out), force=True, quiet=True) as p:
        torch.ones(4).sum()
    assert p.result is not None and dlpt.load(str(out)).meta["source"] == "record"
