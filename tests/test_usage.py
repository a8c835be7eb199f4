"""What a new user meets first, end to end through the command line: the default metric of a
profile without a GPU, what `--top` and `--min-percent` leave out and say they left out, the
units of the JSON report, paths in every grouping, file modes, and the options' names."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from conftest import DATA, dlpt_in_process, trace_path

import dlpt
from dlpt.metrics import COL

CPU = str(DATA / "cpu_train_small.dlpt")  # `dlpt record examples/transformer_train.py`, CPU torch
GPU = str(DATA / "gpu_train_small.dlpt")


def dlpt_cli(*args: str, umask: int | None = None, cwd=None) -> subprocess.CompletedProcess:
    """`dlpt ARGS`: in this process (conftest.dlpt_in_process), or a process of its own where the
    test sets the umask or the directory it runs in."""
    if umask is None and cwd is None:
        return dlpt_in_process(*args)

    def pre() -> None:
        if umask is not None:
            os.umask(umask)

    return subprocess.run([sys.executable, "-m", "dlpt", *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=pre, cwd=cwd)


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr, r.stderr


# ---- one default metric ---------------------------------------------------------------------

def test_cpu_profile_has_host_time_and_no_gpu_time() -> None:
    prof = dlpt.load(CPU)
    tot = prof.cct.exclusive.sum(axis=0)
    assert tot[COL["gpu_time"]] == 0 and tot[COL["host_time"]] > 0 and tot[COL["cpu_time"]] > 0


def without_host_time(tmp_path) -> str:
    """The CPU profile as a recording without the sampler has it (older recordings, Kineto
    traces): host op time, no host_time."""
    from dataclasses import replace

    from dlpt.cct import CCT
    from dlpt.store import save

    prof = dlpt.load(CPU)
    exc = prof.cct.exclusive.copy()
    exc[:, COL["host_time"]] = 0
    out = tmp_path / "ops_only.dlpt"
    save(replace(prof, cct=CCT(prof.cct.parent, prof.cct.frame, exc)), str(out))
    return str(out)


@pytest.mark.parametrize("sampled", [True, False])
def test_every_command_ranks_a_cpu_profile_by_host_time(tmp_path, sampled: bool) -> None:
    # A recording's sampler gives host_time, the time on each line; without it, host op time.
    path, metric, said = (CPU, "host_time", "the host's time on each line") if sampled else \
        (without_host_time(tmp_path), "cpu_time", "showing host op time")
    r = dlpt_cli("report", path, "--view", "flat", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metric"] == metric
    assert said in r.stderr
    r = dlpt_cli("export", path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["metric"] == metric and doc["hotspots"][0]["percent"] > 0
    r = dlpt_cli("diff", path, path, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metric"] == metric
    # A GPU profile keeps gpu_time, and says nothing about it.
    r = dlpt_cli("report", GPU, "--format", "json")
    assert json.loads(r.stdout)["metric"] == "gpu_time" and r.stderr == ""


def test_diff_of_two_cpu_runs_sees_the_change(tmp_path) -> None:
    # The run against a copy with its costliest line's host time doubled: the diff shows that line.
    from dataclasses import replace

    from dlpt.cct import CCT
    from dlpt.store import save
    from dlpt.views import flat

    prof = dlpt.load(CPU)
    fv = flat(prof, "line")
    g = int(fv.exclusive[:, COL["host_time"]].argmax())
    owned = fv.owner == g  # the line's nodes and the ops beneath it that hold its time
    assert prof.cct.exclusive[owned, COL["host_time"]].sum() > 0
    exc = prof.cct.exclusive.copy()
    exc[owned, COL["host_time"]] *= 2
    b = tmp_path / "b.dlpt"
    save(replace(prof, cct=CCT(prof.cct.parent, prof.cct.frame, exc)), str(b))
    r = dlpt_cli("diff", CPU, str(b), "--format", "json", "--include-library")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["metric"] == "host_time" and doc["delta"] > 0
    assert doc["rows"][0]["label"] == fv.labels[g] and doc["rows"][0]["delta"] == doc["delta"]


def test_graphframe_default_metric_follows_the_profile() -> None:
    pytest.importorskip("hatchet")
    gf = dlpt.load(CPU).to_graphframe()
    assert gf.default_metric == "host_time (inc)"
    assert gf.dataframe[gf.default_metric].max() > 0
    assert dlpt.load(GPU).to_graphframe().default_metric == "gpu_time (inc)"


# ---- report: --top, --min-percent and what the note says ------------------------------------

def _lines(*args: str) -> list[str]:
    r = dlpt_cli("report", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_top_limits_every_level_of_the_bottom_up_view() -> None:
    trace = str(trace_path("gpt_train"))
    doc = json.loads(dlpt_cli("report", trace, "--view", "bottom-up", "--top", "3", "--format", "json").stdout)

    def widths(nodes: list[dict]) -> list[int]:
        return [len(nodes)] + [w for n in nodes for w in widths(n.get("children", []))]

    assert max(widths(doc["roots"])) == 3
    full = json.loads(dlpt_cli("report", trace, "--view", "bottom-up", "--top", "0", "--format", "json").stdout)
    assert len(full["roots"]) > 3 and full["hidden"]["by_top"] == 0
    top3 = _lines(trace, "--view", "bottom-up", "--top", "3")
    every = _lines(trace, "--view", "bottom-up")
    assert len(top3) < len(every) / 2


def _caller_flows(path: str, metric: str, include_library: bool) -> dict[tuple, int]:
    """What a bottom-up view must show, from the top-down tree one node at a time: for every
    path (a frame that spent time, then its caller, its caller's caller, ...) the time spent
    in that frame on that path."""
    from collections import Counter

    from dlpt.transforms import hide_library_unless

    prof = hide_library_unless(dlpt.load(path), include_library)
    cct, col = prof.cct, COL[metric]
    parent, frame = cct.parent.tolist(), cct.frame.tolist()
    flow: Counter = Counter()
    for n in range(1, len(cct)):
        spent = int(cct.exclusive[n, col])
        key: tuple = ()
        m = n
        while spent and m > 0:
            f = prof.frames[frame[m]]
            key += ((f.kind, f.name, f.file, f.line, f.function),)
            flow[key] += spent
            m = parent[m]
    return {k: v for k, v in flow.items() if v}


# The CPU recording with library frames hidden: with them its import chains make the reference
# computation below take 9 s (a key per frame per ancestor); the trace shows them.
@pytest.mark.parametrize(("path", "include_library"), [(str(trace_path("gpt_train")), True), (CPU, False)])
def test_bottom_up_self_time_only_on_the_frames_that_spent_it(path: str, include_library: bool) -> None:
    """Bottom-up, as pyinstrument's inverted view and speedscope's callers read: the level-one
    rows are the frames that spent time, their self time summing to the total; below them their
    callers, each row's value the time flowing through that chain of callers, and no self time
    on a caller row — the outermost caller (`<module>`) spent none of it."""
    lib = ["--include-library"] if include_library else []
    doc = json.loads(dlpt_cli("report", path, "--view", "bottom-up", "--format", "json", "--top", "0",
                              "--min-percent", "0", *lib).stdout)
    flow = _caller_flows(path, doc["metric"], include_library)
    seen = 0

    def walk(nodes: list[dict], above: tuple) -> None:
        nonlocal seen
        for n in nodes:
            key = above + ((n["kind"], n["name"], n["file"], n["line"], n["function"]),)
            assert n["inclusive"] == flow[key], key
            assert n["exclusive"] == (n["inclusive"] if not above else 0), key
            seen += 1
            walk(n["children"], key)

    walk(doc["roots"], ())
    assert seen == len(flow)  # every chain of callers, none made up
    assert sum(n["exclusive"] for n in doc["roots"]) == sum(n["inclusive"] for n in doc["roots"]) == doc["total"]
    # The text: a caller row's self column is blank; a frame's row gives its self time.
    lines = _lines(path, "--view", "bottom-up", "--top", "0", "--min-percent", "0", *lib)
    head = next(i for i, ln in enumerate(lines) if ln.split()[:3] == ["%", "incl", "self"])
    at = lines[head].index("self") + len("self")  # the self column's right edge
    rows = [ln for ln in lines[head + 1:] if ln[6:7] == "%"]
    assert len(rows) == seen
    for ln in rows:
        incl, own, name = ln[at - 21:at - 11].strip(), ln[at - 10:at].strip(), ln[at + 2:]
        assert own == ("" if name.startswith(" ") else incl), ln
    # The TUI and the DataFrame show the same self column.
    from dlpt.transforms import hide_library_unless
    from dlpt.viewers.tui.rows import bottom_up_rows
    from dlpt.views import bottom_up, bottom_up_self

    prof = dlpt.load(path)
    rows_ = bottom_up_rows(hide_library_unless(prof, include_library))
    keys = np.arange(1, len(rows_))
    want = bottom_up_self(rows_.cct)[keys, COL[doc["metric"]]]
    assert np.array_equal(rows_.secondary(keys, COL[doc["metric"]]), want)
    assert not want[rows_.cct.parent[keys] != 0].any() and want.sum() == doc["total"]
    df = prof.to_dataframe(view="bottom-up", include_library=include_library)
    tree = bottom_up(hide_library_unless(prof, include_library)).cct
    assert np.array_equal(df[doc["metric"]].to_numpy(), bottom_up_self(tree)[:, COL[doc["metric"]]])


def _view(*args: str) -> list[str]:
    """The report's lines down to the view's end: the diagnosis, if any, follows a blank line."""
    out = _lines(*args)
    return out[:out.index("diagnosis") - 1] if "diagnosis" in out else out


def test_hidden_note_names_top_when_top_hid_the_rows() -> None:
    trace = str(trace_path("gpt_train"))
    out = _view(trace, "--view", "flat", "--top", "3", "--min-percent", "0")
    assert out[-1].startswith("(") and "beyond --top 3" in out[-1] and "--min-percent" not in out[-1]
    assert out[-1].endswith("--top 0 shows them)")
    head = next(i for i, ln in enumerate(out) if ln.strip().startswith("%"))
    assert len(out) - head - 2 == 3  # three rows between the column header and the note
    out = _view(trace, "--view", "top-down", "--min-percent", "5")
    assert "under --min-percent 5" in out[-1] and "--top" not in out[-1]
    out = _view(trace, "--view", "top-down", "--top", "1", "--min-percent", "0")
    assert "beyond --top 1" in out[-1] and "under --min-percent" not in out[-1]
    out = _view(trace, "--view", "top-down", "--top", "0", "--min-percent", "0")
    assert "hidden" not in out[-1]


def test_hidden_counts_add_up_to_the_full_tree() -> None:
    trace = str(trace_path("copies"))
    full = json.loads(dlpt_cli("report", trace, "--min-percent", "0", "--format", "json").stdout)
    part = json.loads(dlpt_cli("report", trace, "--top", "1", "--min-percent", "0", "--format", "json").stdout)

    def count(nodes: list[dict]) -> int:
        return sum(1 + count(n.get("children", [])) for n in nodes)

    def nonzero(nodes: list[dict]) -> int:
        return sum((n["inclusive"] > 0) + nonzero(n.get("children", [])) for n in nodes)

    # Every node with time is either shown or counted as hidden (hidden ones' subtrees aside).
    assert count(part["roots"]) + part["hidden"]["by_top"] <= nonzero(full["roots"])
    assert part["hidden"]["by_top"] > 0 and part["hidden"]["by_min_percent"] == 0


def test_json_report_is_in_one_unit_throughout() -> None:
    r = dlpt_cli("report", str(trace_path("copies")), "--view", "flat", "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["unit"] == "ns" and doc["units"]["htod_bytes"] == "bytes" and doc["units"]["kernel_count"] == "count"
    s = doc["summary"]
    for v in (s["gpu_time"], s["kernel_time"], s["attributed_to_source"], *s["memcpy_time"].values()):
        assert isinstance(v, int)
    # The summary and the rows are in the same unit: the rows add up to the summary's total.
    assert sum(r["self"] for r in doc["rows"]) == s["gpu_time"]
    hot = json.loads(dlpt_cli("export", str(trace_path("copies"))).stdout)
    assert hot["unit"] == "us" and hot["summary"]["gpu_time"] == pytest.approx(s["gpu_time"] / 1000, abs=1e-3)


@pytest.mark.parametrize("by", ["line", "function", "file"])
def test_groupings_show_no_absolute_paths(by: str) -> None:
    out = _lines(GPU, "--view", "flat", "--by", by, "--min-percent", "0", "--top", "0")
    body = out[out.index(next(ln for ln in out if ln.strip().startswith("%"))) + 1:]
    assert body and not [ln for ln in body if "/work/" in ln or " /" in ln.split("  ")[-1]]
    assert any("examples/transformer_train.py" in ln for ln in body)


# ---- files follow the umask -----------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_written_files_follow_the_umask(tmp_path, mask: int) -> None:
    src = str(trace_path("copies"))
    outputs = {
        "export": ("export", src, "-o", str(tmp_path / "hot.json")),
        "export folded": ("export", src, "-f", "folded", "-o", str(tmp_path / "x.folded")),
        "report": ("report", src, "-o", str(tmp_path / "r.txt")),
        "diff": ("diff", src, src, "-o", str(tmp_path / "d.txt")),
        "import": ("import", src, "-o", str(tmp_path / "p.dlpt")),
    }
    for what, args in outputs.items():
        r = dlpt_cli(*args, umask=mask)
        assert r.returncode == 0, (what, r.stderr)
        mode = stat.S_IMODE(os.stat(args[-1]).st_mode)
        assert mode == 0o666 & ~mask, (what, oct(mode))


# ---- option names and help ------------------------------------------------------------------

@pytest.mark.parametrize("command", ["report", "export", "diff", "view"])
def test_metric_has_one_spelling(command: str) -> None:
    r = dlpt_cli(command, "--help")
    assert "--metric M" in r.stdout and "-m M" not in r.stdout and "-m," not in r.stdout
    args = [command, str(trace_path("copies"))] + ([str(trace_path("copies"))] if command == "diff" else [])
    r = dlpt_cli(*args, "-m", "kernel_time")
    assert r.returncode == 2 and r.stderr.startswith("dlpt: ") and len(r.stderr.splitlines()) == 1
    no_traceback(r)


def test_record_keeps_dash_m_for_modules() -> None:
    r = dlpt_cli("record", "--help")
    assert "-m MODULE" in r.stdout


def test_import_help_documents_its_input_and_output() -> None:
    r = dlpt_cli("import", "--help")
    assert r.returncode == 0
    out = " ".join(r.stdout.split())
    assert "-o OUT, --output OUT" in out and ".dlpt" in out
    assert "INPUT" in out and "directory" in out and "rank" in out


def test_export_without_output_writes_to_stdout(tmp_path) -> None:
    for args in ((), ("-o", "-")):
        r = dlpt_cli("export", str(trace_path("copies")), "-f", "folded", *args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines and all(ln.rsplit(" ", 1)[1].isdigit() for ln in lines)
    assert os.listdir(tmp_path) == []
