"""The wait and memory figures as every view shows them: report header, hotspots summary and
report JSON agree with each other and with the profile's own totals, on real traces."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import dlpt_in_process, trace_path

import dlpt
from dlpt.metrics import COL
from dlpt.waits import memory_peak, waits


def _dlpt(*args: str) -> subprocess.CompletedProcess:
    # A reading command, in this process (conftest.dlpt_in_process): a process each was most of
    # this file's time; `python -m dlpt` itself, its exit codes and tracebacks are tested in processes
    # elsewhere (tests/test_cli.py, tests/test_bad_input.py).
    return dlpt_in_process(*args)


# The verdicts each trace gets (tests/test_findings.py::test_real_traces says why).
VERDICTS = {"gpt_train": {"launch-bound"}, "copies": {"pageable-copies", "gpu-bound"},
            "resnet_infer": {"pageable-copies"}}


@pytest.mark.parametrize("name", ["gpt_train", "copies", "resnet_infer"])
def test_hotspots_summary_holds_the_waits_and_they_add_up(name: str) -> None:
    path = str(trace_path(name))
    prof = dlpt.load(path)
    w = waits(prof)
    doc = json.loads(_dlpt("export", path, "-f", "hotspots", "-o", "-").stdout)
    s = doc["summary"]
    assert s["wall_time"] == pytest.approx(w.wall / 1000, abs=1e-3)
    assert s["gpu_busy_time"] + s["gpu_idle_time"] == pytest.approx(w.device_time / 1000, abs=1e-2)
    assert sum(s["idle"].values()) == pytest.approx(s["gpu_idle_time"], abs=1e-2)
    # The tree's idle is the summary's idle: lines plus the named start-up/unattributed rows.
    assert int(prof.cct.exclusive[:, COL["gpu_idle_time"]].sum()) == w.idle
    assert s["sync_time"] == pytest.approx(int(prof.cct.exclusive[:, COL["sync_time"]].sum()) / 1000, abs=1e-3)
    assert {f["rule"] for f in s["findings"]} == VERDICTS[name]  # never empty
    for f in s["findings"]:
        assert set(f) == {"rule", "lines", "figure", "remedy", "share", "of"}


def test_report_header_and_json_agree(tmp_path) -> None:
    path = str(trace_path("gpt_train"))
    text = _dlpt("report", path, "--top", "3").stdout
    w = waits(dlpt.load(path))
    line = next(ln for ln in text.splitlines() if ln.startswith("wall "))
    assert f"GPU busy {100.0 * w.busy / w.device_time:.1f}%" in line
    doc = json.loads(_dlpt("report", path, "--format", "json").stdout)
    assert doc["summary"]["gpu_idle_time"] == w.idle  # report JSON: integers in ns
    assert {f["rule"] for f in doc["summary"]["findings"]} == VERDICTS["gpt_train"]
    assert "\ndiagnosis\n" in text
    for f in doc["summary"]["findings"]:
        assert f"  {f['rule']} [{100 * f['share']:.0f}% of the {f['of']}]: " in text


def test_memory_headline_and_summary_from_a_profile_memory_trace() -> None:
    path = str(trace_path("gpt_train").parent / "hta_memory_rank1.json.gz")
    prof = dlpt.load(path)
    m = memory_peak(prof)
    assert m is not None and m.peak_allocated == prof.meta["memory"]["peak_allocated"]
    text = _dlpt("report", path, "--top", "2").stdout
    head = next(ln for ln in text.splitlines() if ln.startswith("GPU memory: peak "))
    assert "reserved" in head
    assert any("allocated over the run" in ln and "▲" in ln for ln in text.splitlines())
    doc = json.loads(_dlpt("export", path, "-f", "hotspots", "-o", "-", "--metric", "peak_bytes").stdout)
    assert doc["summary"]["memory"]["peak_allocated"] == m.peak_allocated
    # peak_bytes over the tree: the peak less what was allocated before the trace began, which
    # is its own named row.
    assert int(prof.cct.exclusive[:, COL["peak_bytes"]].sum()) == m.peak_allocated


def test_no_figures_for_a_profile_without_them() -> None:
    prof = dlpt.load("tests/data/cpu_train_small.dlpt")
    w = waits(prof)
    assert w.busy is None and w.idle is None
    assert memory_peak(prof) is None
    doc = json.loads(_dlpt("export", "tests/data/cpu_train_small.dlpt", "-f", "hotspots", "-o", "-").stdout)
    assert doc["summary"]["gpu_idle_time"] is None and "memory" not in doc["summary"]


def test_report_header_names_the_steps_window(tmp_path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "prog.py").write_text(
        "import torch\nw = torch.nn.Parameter(torch.ones(8))\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(5):\n    (w * 2).sum().backward()\n    opt.step()\n")
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "--steps", "1:3", "-o", "run.dlpt", "prog.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    first = _dlpt("report", str(tmp_path / "run.dlpt")).stdout.splitlines()[0]
    assert first.endswith("· steps 1–2 (--steps 1:3)"), first
    first = _dlpt("report", "tests/data/gpu_train_small.dlpt").stdout.splitlines()[0]
    assert "steps" not in first.split("(recorded)")[1]  # no window: the whole run
