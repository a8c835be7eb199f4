"""The dlpt command end to end, as users run it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import THREE_STEPS, TRACE_NAMES, trace_path

from dlpt.commands.record import parse_program
from dlpt.errors import DlptError


def dlpt(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlpt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_report_top_down_on_every_fixture(name):
    r = dlpt("report", str(trace_path(name)))
    assert r.returncode == 0, r.stderr
    assert "GPU time" in r.stdout and "top-down view" in r.stdout
    # The program that made it: tools/capture_traces.py, or bench/workloads/loader_trace.py.
    assert ("loader_trace.py" if name == "loader_bound" else "capture_traces.py") in r.stdout


def test_flat_by_kernel_shows_shortened_names():
    r = dlpt("report", str(trace_path("gpt_train")), "--view", "flat", "--by", "kernel", "--top", "5")
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.rstrip().endswith(">") or "sm80" in ln or "fmha" in ln]
    assert len(rows) == 5
    # First-level template arguments stay (they tell cutlass kernels apart), parameters go.
    assert "cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nt_align1>" in r.stdout
    assert "(cutlass_80" not in r.stdout and "void " not in r.stdout
    full = dlpt("report", str(trace_path("gpt_train")), "--view", "flat", "--by", "kernel", "--full-names")
    assert "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nt_align1>(cutlass_80" in full.stdout


def test_bottom_up_and_json(tmp_path):
    r = dlpt("report", str(trace_path("copies")), "--view", "bottom-up", "--format", "json", "--min-percent", "0")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["view"] == "bottom-up"
    assert sum(n["inclusive"] for n in doc["roots"]) == doc["total"]


def test_import_then_export_hotspots(tmp_path):
    prof = tmp_path / "run.dlpt"
    r = dlpt("import", str(trace_path("gpt_train")), "-o", str(prof))
    assert r.returncode == 0, r.stderr
    assert "dlpt view" in r.stderr
    again = dlpt("import", str(trace_path("gpt_train")), "-o", str(prof))
    assert again.returncode == 2 and again.stderr.startswith("dlpt: ") and "--force" in again.stderr
    hot = tmp_path / "hot.json"
    r = dlpt("export", str(prof), "-f", "hotspots", "-o", str(hot), "--top", "3")
    assert r.returncode == 0, r.stderr
    doc = json.loads(hot.read_text())
    assert doc["schema"] == "dlpt.hotspots/2"
    assert doc["profile"]["source"] == "kineto"
    assert len(doc["hotspots"]) == 3
    assert doc["summary"]["backward_time"] > 0
    # The report of the saved profile and of the trace itself agree.
    a = dlpt("report", str(prof), "--view", "flat", "--format", "json")
    b = dlpt("report", str(trace_path("gpt_train")), "--view", "flat", "--format", "json")
    assert json.loads(a.stdout)["rows"] == json.loads(b.stdout)["rows"]


def test_a_directory_of_rank_traces(tmp_path):
    import shutil

    for r, name in enumerate(("copies", "threaded")):
        shutil.copy(trace_path(name), tmp_path / f"rank{r}.pt.trace.json.gz")
    # The real traces come from one process (tests/data/kineto), which dlpt tells from two ranks
    # (tests/test_rank_inputs.py): they merge as ranks when asked to.
    r = dlpt("report", str(tmp_path), "--view", "top-down", "--depth", "1", "--format", "json", "--as-ranks")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {n["kind"] for n in doc["roots"]} == {"rank"}
    assert len(doc["roots"]) == 2


@pytest.mark.parametrize("args", [
    ("report", "/nonexistent/trace.json"),
    ("report", "--view", "sideways", "x"),
    ("export", "x", "-f", "nope", "-o", "-"),
    ("report", "--top", "-3", "x"),
])
def test_bad_usage_is_one_line_and_status_2(args):
    r = dlpt(*args)
    assert r.returncode == 2
    assert r.stderr.startswith("dlpt: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr


def test_bad_files_are_one_line_and_status_2(tmp_path):
    cases = {
        "empty.json": b"",
        "fake.json.gz": b"not gzip at all",
        "cut.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel"',
        "list.json": b"[1, 2, 3]",
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        r = dlpt("report", str(p))
        assert r.returncode == 2, name
        assert r.stderr.startswith("dlpt: ") and "Traceback" not in r.stderr, (name, r.stderr)
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    r = dlpt("report", str(empty_dir))
    assert r.returncode == 2 and "no Kineto traces" in r.stderr


def test_help_shows_examples():
    r = dlpt("report", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout
    r = dlpt("--help")
    assert "dlpt record" in r.stdout


def test_without_gpu_activity_reports_host_op_time(tmp_path):
    from conftest import raw_events

    events = [e for e in raw_events("gpt_train") if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    p = tmp_path / "cpu_only.json"
    p.write_text(json.dumps({"traceEvents": events}))
    r = dlpt("report", str(p), "--view", "flat", "--format", "json")
    assert r.returncode == 0, r.stderr
    # A trace's Python events give each line its host time (collectors/kineto/waits.py).
    assert "--metric host_time" in r.stderr
    doc = json.loads(r.stdout)
    assert doc["metric"] == "host_time" and doc["rows"][0]["self"] > 0
    r = dlpt("export", str(p), "-o", "-")
    assert json.loads(r.stdout)["metric"] == "host_time"
    r = dlpt("report", str(trace_path("gpt_train")), "--format", "json")
    assert json.loads(r.stdout)["metric"] == "gpu_time" and "cpu_time" not in r.stderr


def test_output_to_a_pipe_or_device_writes_into_it(tmp_path):
    """`-o /dev/null` or a FIFO: the output goes into it; renaming a temporary file over it
    would replace the node itself."""
    import os
    import stat
    import threading

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    r = dlpt("export", str(trace_path("threaded")), "-o", str(fifo))
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["schema"] == "dlpt.hotspots/2"
    r = dlpt("report", str(trace_path("threaded")), "-o", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr


# A hotspots file a CI job stored before schema 2: the place in the ranking was called "rank".
HOTSPOTS_V1 = {
    "schema": "dlpt.hotspots/1", "unit": "us", "metric": "gpu_time",
    "profile": {"path": "run.dlpt", "source": "record", "command": "dlpt record train.py", "dlpt_version": "0.1.0"},
    "summary": {"gpu_time": 30.0, "ranks": [{"rank": 0, "gpu_time": 10.0}, {"rank": 1, "gpu_time": 20.0}]},
    "hotspots": [{"rank": 1, "file": "model.py", "line": 42, "function": "forward", "gpu_time": 20.0,
                  "per_rank": {"0": 5.0, "1": 15.0}},
                 {"rank": 2, "file": "train.py", "line": 7, "function": "step", "gpu_time": 10.0,
                  "per_rank": {"0": 5.0, "1": 5.0}}],
}


def test_hotspots_schema_2_names_the_place_position_and_reads_schema_1(tmp_path):
    from dlpt.viewers.hotspots import read_hotspots

    hot = tmp_path / "hot.json"
    r = dlpt("export", str(trace_path("gpt_train")), "-f", "hotspots", "-o", str(hot), "--top", "3")
    assert r.returncode == 0, r.stderr
    doc = json.loads(hot.read_text())
    assert doc["schema"] == "dlpt.hotspots/2"
    assert [h["position"] for h in doc["hotspots"]] == [1, 2, 3]
    assert not any("rank" in h for h in doc["hotspots"])  # "rank" is a process rank, nothing else
    assert read_hotspots(hot) == read_hotspots(doc) == doc
    # /1 reads as /2: the same entries, the place under its new name, process ranks untouched.
    old = tmp_path / "old.json"
    old.write_text(json.dumps(HOTSPOTS_V1))
    got = read_hotspots(old)
    assert got["schema"] == "dlpt.hotspots/2"
    assert [(h["position"], h["line"], h["per_rank"]) for h in got["hotspots"]] == \
        [(1, 42, {"0": 5.0, "1": 15.0}), (2, 7, {"0": 5.0, "1": 5.0})]
    assert not any("rank" in h for h in got["hotspots"])
    assert got["summary"] == HOTSPOTS_V1["summary"]
    for bad, said in (({"schema": "dlpt.hotspots/9"}, "dlpt.hotspots/9"), ({"schema": "dlpt.report/1"}, "report"),
                      ([1, 2], "None")):
        with pytest.raises(DlptError, match=said):
            read_hotspots(bad)  # type: ignore[arg-type]
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(DlptError, match="not JSON"):
        read_hotspots(tmp_path / "junk.json")


def test_directory_prefers_profiler_trace_files(tmp_path):
    import shutil

    shutil.copy(trace_path("threaded"), tmp_path / "host_1.123.pt.trace.json.gz")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    r = dlpt("report", str(tmp_path), "--format", "json", "--view", "flat", "--by", "kernel")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["summary"]["gpu_time"] > 0


# Moved from test_record.py, whose module needs torch: parsing the command line needs none.
def test_parse_program_forms() -> None:
    assert parse_program(None, ["--", "python", "t.py", "-m", "z"]) == ("script", "t.py", ["-m", "z"])
    assert parse_program(None, ["python3", "-m", "pkg.mod", "--x"]) == ("module", "pkg.mod", ["--x"])
    assert parse_program(["pkg.mod", "--lr", "1"], []) == ("module", "pkg.mod", ["--lr", "1"])
    assert parse_program(None, ["t.py"]) == ("script", "t.py", [])
    with pytest.raises(DlptError):
        parse_program(None, [])
    with pytest.raises(DlptError):
        parse_program(None, ["python"])


# ---- first-hour problems (issue #34): --steps that never opened, help, mistyped options ----------

STEPS_PROGRAM = THREE_STEPS + """\
if sys.argv[1:] == ["fail"]:
    sys.exit(5)
"""


def test_a_steps_window_the_program_never_reaches_fails_and_says_why(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "prog.py").write_text(STEPS_PROGRAM)
    for extra, status in (((), 2), (("fail",), 5)):
        r = dlpt("record", "-q", "-o", "run.dlpt", "--steps", "10:15", "prog.py", *extra, cwd=tmp_path)
        # A failed program keeps its own status; one that succeeded gives 2: no profile was written.
        assert r.returncode == status, r.stderr
        assert "Traceback" not in r.stderr
        said = [ln for ln in r.stderr.splitlines() if "nothing recorded" in ln]
        assert len(said) == 1 and said[0].startswith("dlpt: "), r.stderr
        assert "--steps 10:15 starts at step 10" in said[0] and "made only 3 steps" in said[0], said
        assert not (tmp_path / "run.dlpt").exists()
    r = dlpt("record", "-q", "-o", "run.dlpt", "--steps", "1:2", "prog.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "nothing recorded" not in r.stderr
    import dlpt as api

    assert len(api.load(str(tmp_path / "run.dlpt")).cct) > 1
    # Nothing recorded at all (no --steps, no PyTorch op) is no success either.
    (tmp_path / "hello.py").write_text("print('hello')\n")
    r = dlpt("record", "-q", "-o", "hello.dlpt", "hello.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "hello\n", r.stderr
    assert "dlpt: nothing recorded, no profile written: the program ran no PyTorch ops\n" in r.stderr
    assert not (tmp_path / "hello.dlpt").exists()


def test_every_option_of_every_command_has_help():
    import argparse

    from dlpt.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    bare = [(name, a.option_strings or a.dest) for name, p in [("dlpt", parser), *sub.choices.items()]
            for a in p._actions if not a.help]
    assert not bare


@pytest.mark.parametrize("args,command,meant", [
    (("report", "x", "--veiw", "flat"), "report", "--view"),
    (("export", "x", "--tpo", "3"), "export", "--top"),
    (("diff", "a", "b", "--bye", "line"), "diff", "--by"),
    (("view", "x", "--metrc", "gpu_time"), "view", "--metric"),
    (("import", "x", "-o", "y.dlpt", "--forse"), "import", "--force"),
    (("record", "--stpes", "1:2", "prog.py"), "record", "--steps"),
    (("--verison",), None, "--version"),
])
def test_a_mistyped_option_points_to_its_commands_help(args, command, meant, capsys):
    from dlpt.cli import main

    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpt: unrecognized arguments: ") and err.count("\n") == 1, err
    assert f"did you mean {meant}?" in err
    assert f"(see '{'dlpt ' + command if command else 'dlpt'} --help')" in err
