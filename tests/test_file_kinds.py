"""A file that is not what dlpt reads is named for what it is, in one `dlpt: ` line."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("name,content,expect", [
    ("run.dlpt", b"", "an empty dlpt profile"),
    ("run.dlpt", b"SQLite format 2\0 damaged header", "a damaged dlpt profile"),
    ("train.py", b"import torch\nprint(torch.ones(2))\n", "a Python file, not a profile; to profile it: dlpt record"),
    ("notes.txt", b"hello", "neither a dlpt profile nor a Kineto trace"),
    ("t.json", b"", "the file is empty"),
])
def test_a_file_is_named_for_what_it_is(tmp_path, name: str, content: bytes, expect: str) -> None:
    f = tmp_path / name
    f.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "dlpt", "report", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("dlpt: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert expect in r.stderr
    assert "Traceback" not in r.stderr and "re-export it from torch.profiler" not in r.stderr
