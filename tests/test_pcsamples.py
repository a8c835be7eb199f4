"""`dlpt record --pc-samples`: the stall rule, the conversion of the collector's samples, and a
profile recorded on an H200 (bench/workloads/pc_triton.py under `dlpt record --pc-samples`,
docs/BENCHMARKS.md "PC samples") whose truth is that run's own: the source lines of the kernel's
memory loop and math loop as the program itself reported them (tests/data/gpu_pc_triton.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlpt
from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns
from dlpt.collectors.record.pcsamples import ENV, add_pc_samples
from dlpt.frames import Frame, FrameTable
from dlpt.header import Header
from dlpt.metrics import COL, PC_METRICS, PC_PARTS
from dlpt.stalls import LIMITERS, limiter, stall_metric

DATA = Path(__file__).parent / "data"
TRITON = DATA / "gpu_pc_triton.dlpt"
TRUTH = json.loads((DATA / "gpu_pc_triton.json").read_text())
PREFIX = "smsp__pcsamp_warps_issue_stalled_"


@pytest.fixture(scope="module")
def prof() -> dlpt.Profile:
    return dlpt.load(str(TRITON))


def mixed_samples(prof: dlpt.Profile) -> int:
    """The samples of kernel `mixed`: its leaves' inclusive count, its own lines' included."""
    return sum(int(prof.cct.inclusive[i, COL["pc_samples"]]) for i in range(len(prof.cct))
               if prof.frame_of(i).kind == "kernel" and prof.frame_of(i).name == "mixed")


def line_samples(prof: dlpt.Profile) -> dict[int, int]:
    """Samples on each of `mixed`'s own source lines, over every line that launched it."""
    out: dict[int, int] = {}
    for i in range(len(prof.cct)):
        f = prof.frame_of(i)
        if f.kind == "python" and f.function == "mixed" and f.file.endswith("pc_triton.py"):
            out[f.line] = out.get(f.line, 0) + int(prof.cct.exclusive[i, COL["pc_samples"]])
    return out


def test_the_loops_samples_split_as_their_time(prof: dlpt.Profile) -> None:
    """The issue's judge: the two loops' samples against their share of the kernel's time, the
    truth from the GPU's own timer read in the kernel around each loop, in the very launches that
    were sampled (each block's time in each loop, summed: the program's `timer_math_share`).
    One wave of blocks, one warp per SM sub-partition: H200 13.20% of samples against 12.91% of
    time (1.02x). Across several waves the two part (1.55x, docs/BENCHMARKS.md): a sample is one
    sub-partition's cycle, shared among however many warps it holds then."""
    by = line_samples(prof)
    mem = by[TRUTH["mem_line"] - 1] + by[TRUTH["mem_line"]]  # the loop's `for` line and its body
    math = by[TRUTH["math_line"] - 1] + by[TRUTH["math_line"]]
    share = math / (mem + math)
    assert abs(share / TRUTH["timer_math_share"] - 1) < 0.10, (share, TRUTH["timer_math_share"])


def test_stall_reasons_by_hand() -> None:
    assert stall_metric(PREFIX + "long_scoreboard") == "stall_long_scoreboard"
    assert stall_metric(PREFIX + "math_pipe_throttle") == "stall_math_pipe"
    assert stall_metric(PREFIX + "selected") == "pc_issued"  # issuing: not a stall
    assert stall_metric(PREFIX + "not_selected") == "stall_not_selected"
    assert stall_metric(PREFIX + "membar") == "stall_barrier"
    assert stall_metric(PREFIX + "warpgroup_arrive") == "stall_other"  # Hopper's, not named apart
    assert stall_metric(PREFIX + "wait_not_issued") == "stall_other"  # never collected; not `wait`
    assert stall_metric("smsp__pcsamp_sample_count") == "stall_other"


def test_every_reason_the_gpu_named_has_its_column(prof: dlpt.Profile) -> None:
    """The H200's own list (40 names): each base stall reason counts in one PC part."""
    reasons = [r for r in prof.meta.pc_sampling["reasons"] if "stalled_" in r and "not_issued" not in r]
    assert len(reasons) == 19
    assert {stall_metric(r) for r in reasons} <= set(PC_PARTS)
    named = {r[len(PREFIX):] for r in reasons if stall_metric(r) != "stall_other"}
    assert named == {"selected", "long_scoreboard", "lg_throttle", "short_scoreboard", "mio_throttle",
                     "math_pipe_throttle", "wait", "barrier", "membar", "branch_resolving", "no_instructions",
                     "not_selected"}


def test_parts_add_up_on_every_node(prof: dlpt.Profile) -> None:
    for m in (prof.cct.exclusive, prof.cct.inclusive):
        parts = m[:, [COL[p] for p in PC_PARTS]].sum(axis=1)
        assert np.array_equal(parts, m[:, COL["pc_samples"]])
    assert int(prof.cct.exclusive[:, COL["pc_samples"]].sum()) == prof.meta.pc_sampling["samples"] > 1_000_000


def test_samples_only_on_kernels_and_their_own_lines(prof: dlpt.Profile) -> None:
    exc = prof.cct.exclusive[:, COL["pc_samples"]]
    on_lines = 0
    for i in np.flatnonzero(exc).tolist():
        f = prof.frame_of(i)
        if f.kind == "python":  # an instruction's line: beneath the kernel it belongs to, named for it
            parent = prof.frame_of(int(prof.cct.parent[i]))
            assert parent.kind == "kernel" and parent.name == f.function, (f, parent)
            on_lines += int(exc[i])
        else:
            assert f.kind == "kernel", f
    assert on_lines == prof.meta.pc_sampling["with_line"]


def test_the_kernels_lines_hold_its_loops(prof: dlpt.Profile) -> None:
    """The truth is the program's: its memory loop's and math loop's lines (inspect, on the GPU)."""
    exc, col = prof.cct.exclusive, COL
    by_line: dict[int, np.ndarray] = {}
    launch_lines = set()
    for i in range(len(prof.cct)):
        f = prof.frame_of(i)
        if f.kind == "python" and f.function == "mixed" and f.file.endswith("pc_triton.py"):
            by_line[f.line] = by_line.get(f.line, 0) + exc[i]
            up = int(prof.cct.parent[int(prof.cct.parent[i])])  # above the kernel: Triton's launcher, then ours
            while not prof.frame_of(up).file.endswith("pc_triton.py"):
                up = int(prof.cct.parent[up])
            launch_lines.add((prof.frame_of(up).function, prof.frame_of(up).line))
    ranked = sorted(by_line, key=lambda ln: -int(by_line[ln][col["pc_samples"]]))
    assert ranked[:2] == [TRUTH["mem_line"], TRUTH["math_line"]]
    mem, math = by_line[TRUTH["mem_line"]], by_line[TRUTH["math_line"]]
    stalls = [p for p in PC_PARTS if p.startswith("stall_")]
    assert max(stalls, key=lambda p: mem[col[p]]) == "stall_long_scoreboard"
    assert max(PC_PARTS, key=lambda p: math[col[p]]) == "pc_issued"  # its warps issue (FMA chains)
    # Outside: every sample of the kernel sits beneath the one line that launched it.
    assert launch_lines == {("run", TRUTH["launch_line"])}


def test_limiter_by_hand() -> None:
    row = np.zeros(len(COL), dtype=np.int64)
    for m, v in {"pc_issued": 25, "stall_long_scoreboard": 50, "stall_lg_throttle": 10, "stall_math_pipe": 15}.items():
        row[COL[m]] = v
    row[COL["pc_samples"]] = 100
    group, share = limiter(row)
    assert (group.name, share) == ("memory-bound", 0.6)
    row[COL["stall_math_pipe"]] = 70  # now 70 against 60
    row[COL["pc_samples"]] = 155
    assert limiter(row)[0].name == "math-bound"
    issued = np.zeros(len(COL), dtype=np.int64)
    issued[COL["pc_issued"]] = issued[COL["pc_samples"]] = 9
    assert limiter(issued) is None  # nothing stalled: nothing limits
    assert all(set(g.parts) <= set(PC_PARTS) for g in LIMITERS)


def _raw(rows: list[tuple[int, int, int, int, int, int]], reasons: list[str]) -> dict:
    cols = list(zip(*rows)) if rows else [()] * 6
    raw = {k: np.asarray(c, dtype=np.int64).tobytes() for k, c in
           zip(("node", "name", "file", "line", "reason", "samples"), cols)}
    raw.update(reasons=reasons, error="", period_exponent=11, total=99, dropped=2, non_user=3, buffer_full=0,
               cubins=1, cubin_bytes=10)
    return raw


def test_conversion_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two trie nodes launch kernel `k`; node 1's samples have lines, node 2's do not."""
    monkeypatch.setenv(ENV, "1")
    frames = FrameTable()
    b = TreeBuilder(frames.intern(Frame("root", "r")))
    a1 = b.child(0, frames.intern(Frame("python", "f (x.py:1)", "x.py", 1, "f")))
    a2 = b.child(0, frames.intern(Frame("python", "g (x.py:2)", "x.py", 2, "g")))
    nmap = np.array([0, a1, a2])
    names = ["k", "/gen/k.py"]
    reasons = [PREFIX + "selected", PREFIX + "long_scoreboard", PREFIX + "tex_throttle"]
    rows = [(1, 0, 1, 7, 0, 5), (1, 0, 1, 7, 1, 30), (1, 0, 1, 9, 2, 4), (2, 0, -1, 0, 1, 11)]
    out, meta = ActivityColumns(), Header()
    add_pc_samples(_raw(rows, reasons), nmap, names, b, frames, out, meta)
    leaf1 = b.child(a1, frames.intern(Frame("kernel", "k")))
    line7 = b.child(leaf1, frames.intern(Frame("python", "k (/gen/k.py:7)", "/gen/k.py", 7, "k")))
    line9 = b.child(leaf1, frames.intern(Frame("python", "k (/gen/k.py:9)", "/gen/k.py", 9, "k")))
    leaf2 = b.child(a2, frames.intern(Frame("kernel", "k")))

    def total(metric: str) -> dict[int, int]:
        nodes, values = out.extra.get(metric, ([], []))
        got: dict[int, int] = {}
        for n, v in zip(np.asarray(nodes).tolist(), np.asarray(values).tolist()):
            got[n] = got.get(n, 0) + v
        return got

    assert total("pc_samples") == {line7: 35, line9: 4, leaf2: 11}
    assert total("pc_issued") == {line7: 5}
    assert total("stall_long_scoreboard") == {line7: 30, leaf2: 11}
    assert total("stall_other") == {line9: 4}
    assert set(out.extra) <= set(PC_METRICS)
    assert meta.pc_sampling["samples"] == 50 and meta.pc_sampling["with_line"] == 39
    assert meta.pc_sampling["period_cycles"] == 2048 and meta.pc_sampling["dropped"] == 2


def test_report_tells_the_limiter(prof: dlpt.Profile) -> None:
    r = subprocess.run([sys.executable, "-m", "dlpt", "report", str(TRITON), "--metric", "pc_samples", "--view", "flat"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    n = int(prof.cct.exclusive[:, COL["pc_samples"]].sum())
    assert f"PC samples: {n:,}, one per 2,048 cycles" in r.stdout
    assert f"mixed: {mixed_samples(prof):,} samples, memory-bound" in r.stdout
    mem = next(ln for ln in r.stdout.splitlines() if f"pc_triton.py:{TRUTH['mem_line']} mixed" in ln)
    assert "tl.load" in mem  # the kernel's own source, from the profile's snapshot


def test_a_bad_period_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("print('ran')\n")
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "--pc-samples", "3", "p.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "ran" not in r.stdout
    assert r.stderr.startswith("dlpt: ") and "5 to 31" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.environ.get("DLPT_TEST_GPU") == "1", reason="the CPU build's answer")
def test_without_cupti_the_profile_says_why(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("import torch\nprint(torch.ones(3).sum().item())\n")
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "--pc-samples", "-o", "p.dlpt", "p.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    p = dlpt.load(str(tmp_path / "p.dlpt"))
    assert p.meta.pc_sampling == {"samples": 0, "error": "this collector has no CUPTI (torch without CUDA)"}


def test_compiled_kernel_samples_on_the_model_lines() -> None:
    """torch.compile'd code (bench/workloads/pc_inductor.py, recorded on the H200 with the codegen
    map): one fused Triton kernel of a heavy line, a light line, a return and a view. Its samples
    go to the model lines; the view line gets none; every part still adds up."""
    from dlpt.transforms import hide_library_unless
    from dlpt.views import flat

    p = dlpt.load(str(DATA / "gpu_pc_inductor.dlpt"))
    (src,) = [t for f, t in p.sources.items() if f.endswith("pc_inductor.py")]
    marker = {m: next(i for i, t in enumerate(src.splitlines(), 1) if m in t)
              for m in ("# VIEW LINE", "# HEAVY LINE", "# LIGHT LINE")}
    exc = p.cct.exclusive
    assert np.array_equal(exc[:, [COL[x] for x in PC_PARTS]].sum(axis=1), exc[:, COL["pc_samples"]])
    fv = flat(hide_library_unless(p, False), "line")
    by = {fr.line: int(fv.exclusive[g, COL["pc_samples"]]) for g, fr in enumerate(fv.frame)
          if fr.kind == "python" and fr.file.endswith("pc_inductor.py")}
    assert by.get(marker["# VIEW LINE"], 0) == 0
    assert max(marker.values(), key=lambda ln: by.get(ln, 0)) == marker["# HEAVY LINE"]
    assert by[marker["# LIGHT LINE"]] > 0


# Which model line each post-grad FX node of pc_inductor.py's kernel comes from, read off the
# model's code by hand (aten's names for `torch.sin(y) ** 7 * torch.cos(y * 1.3) ** 5 +
# torch.tanh(y).exp()`, then `heavy + 1.0`, then `light * 0.5`), not from dlpt's provenance.
FX_LINE = {"sin": "# HEAVY LINE", "pow_1": "# HEAVY LINE", "mul": "# HEAVY LINE", "cos": "# HEAVY LINE",
           "pow_2": "# HEAVY LINE", "mul_1": "# HEAVY LINE", "tanh": "# HEAVY LINE", "exp": "# HEAVY LINE",
           "add": "# HEAVY LINE", "add_1": "# LIGHT LINE", "mul_2": "# RETURN LINE"}


def test_compiled_kernel_samples_follow_the_lines_they_sampled() -> None:
    """The codegen map on the H200 recording (torch 2.11): each sampled line of the fused kernel
    was tagged with the FX node whose op wrote it, and its samples go to that node's model line
    alone (FX_LINE, by hand); a line no op wrote (the index and mask arithmetic) keeps the work
    shares, heavy : light : return = 10 : 1 : 1 by the bytes each line's nodes move. So the samples
    read heavy 96.7%, where the work shares alone said 83.3%. This holds what the recorder produced
    on the GPU (tags, provenance, the split at record end) against the model's code read by hand."""
    _samples_follow_the_lines_they_sampled(dlpt.load(str(DATA / "gpu_pc_inductor.dlpt")))


def test_compiled_kernel_samples_split_again_from_the_raw_recording() -> None:
    """The same H200 run's tree as recorded, before the model's pure transformation
    (`DLPT_RECORDED_OUT`: the raw tree with its provenance, FX tags included), split again here
    by `attribute_compiled`: the result holds against the model's code read by hand, as the
    recorder's own did, and puts the same samples on the same model lines as the recorder did at
    record end (tests/data/gpu_pc_inductor.dlpt, the same process). So a change to the split
    (dlpt/compiled/) is judged on real GPU samples, not only on hand-built profiles
    (tests/test_sample_lines.py)."""
    from dlpt.compiled.fused import attribute_compiled
    from dlpt.compiled.provenance import Provenance

    raw = dlpt.load(str(DATA / "gpu_pc_inductor_raw.dlpt"))
    assert raw.meta.provenance and raw.meta.compiled_provenance is None  # not yet attributed
    out = attribute_compiled(raw, Provenance.from_dict(raw.meta.provenance))
    mine = _samples_follow_the_lines_they_sampled(out)
    recorded = _samples_follow_the_lines_they_sampled(dlpt.load(str(DATA / "gpu_pc_inductor.dlpt")))
    assert mine == recorded
    # the transformation moves samples, it makes none
    col = COL["pc_samples"]
    assert out.cct.exclusive[:, col].sum() == raw.cct.exclusive[:, col].sum()


def _samples_follow_the_lines_they_sampled(p: dlpt.Profile) -> dict[int, int]:
    """The checks of the two tests above on one profile; its samples per model line."""
    (src,) = [t for f, t in p.sources.items() if f.endswith("pc_inductor.py")]
    line_of = {m: next(i for i, t in enumerate(src.splitlines(), 1) if m in t) for m in set(FX_LINE.values())}
    ((kfile, tags),) = p.meta.pc_sampling["fx_lines"].items()
    assert len(tags) >= 10 and all(len(names) == 1 for names in tags.values())  # one op each
    exc, par = p.cct.exclusive, p.cct.parent
    # kernel line -> {model line above it: samples}, over the kernel's lines beneath the model's lines
    got: dict[int, dict[int, int]] = {}
    for i in range(len(p.cct)):
        f = p.frame_of(i)
        if f.kind != "python" or f.file != kfile or not exc[i, COL["pc_samples"]]:
            continue
        j = par[i]
        while j >= 0 and not (p.frame_of(j).kind == "python" and p.frame_of(j).file.endswith("pc_inductor.py")):
            j = par[j]
        if j >= 0 and p.frame_of(j).function == "forward":  # not the compile's own benchmark launches
            got.setdefault(f.line, {})
            got[f.line][p.frame_of(j).line] = got[f.line].get(p.frame_of(j).line, 0) + int(exc[i, COL["pc_samples"]])
    tagged = {k: v for k, v in got.items() if str(k) in tags}
    assert len(tagged) >= 10
    for k, per in tagged.items():
        (name,) = tags[str(k)]
        assert set(per) == {line_of[FX_LINE[name]]}, (k, name, per)
    untagged = {k: v for k, v in got.items() if str(k) not in tags}
    heavy, light, ret = (line_of[m] for m in ("# HEAVY LINE", "# LIGHT LINE", "# RETURN LINE"))
    for k, per in untagged.items():
        n = sum(per.values())
        for line, w in ((heavy, 10), (light, 1), (ret, 1)):
            assert abs(per.get(line, 0) - n * w / 12) <= 1, (k, per)
    by_line = {}
    for per in got.values():
        for line, n in per.items():
            by_line[line] = by_line.get(line, 0) + n
    total = sum(by_line.values())
    assert set(by_line) == {heavy, light, ret}  # the view line: none
    assert by_line[heavy] / total > 0.95 and by_line[light] / total < 0.01
    return by_line


def test_shares_keep_the_parts_adding_up() -> None:
    """A fused kernel's samples split between its lines (dlpt/compiled/shares.py): each part
    rounded on its own made a line's parts miss its total by one or two (the first H200 recording
    of pc_inductor.py: 29 nodes); mended, by hand: 3 samples, 2 of one part and 1 of another,
    shared 1:1."""
    from dlpt.compiled.shares import keep_families, split_int

    v = np.zeros(len(COL), dtype=np.int64)
    v[COL["pc_samples"]], v[COL["stall_wait"]], v[COL["pc_issued"]] = 3, 2, 1
    s = keep_families(split_int(v, [1, 1]), v, [1, 1])
    # The total rounds to (2, 1); wait (1, 1); issued's one unit must then go to the first share.
    assert s[:, COL["pc_samples"]].tolist() == [2, 1]
    assert s[:, COL["stall_wait"]].tolist() == [1, 1] and s[:, COL["pc_issued"]].tolist() == [1, 0]
    rng = np.random.default_rng(7)
    for _ in range(300):
        parts = rng.integers(0, 40, size=len(PC_PARTS))
        v = np.zeros(len(COL), dtype=np.int64)
        v[[COL[p] for p in PC_PARTS]] = parts
        v[COL["pc_samples"]] = parts.sum()
        w = [int(x) for x in rng.integers(1, 9, size=int(rng.integers(1, 5)))]
        s = keep_families(split_int(v, w), v, w)
        assert np.array_equal(s.sum(axis=0), v) and (s >= 0).all()
        assert np.array_equal(s[:, [COL[p] for p in PC_PARTS]].sum(axis=1), s[:, COL["pc_samples"]])


def test_the_detail_pane_shows_a_lines_stalls(prof: dlpt.Profile) -> None:
    """`dlpt view`, the memory loop's line inside the kernel selected: its samples split by
    reason, largest first, and what they say (the shares by hand from its node's columns)."""
    from conftest import detail_text

    text, row = detail_text(prof, lambda f: f.kind == "python" and f.line == TRUTH["mem_line"] and f.function == "mixed",
                            metric="pc_samples", size=(120, 40))
    n = int(row[COL["pc_samples"]])
    ls = round(100 * int(row[COL["stall_long_scoreboard"]]) / n)
    wait = round(100 * int(row[COL["stall_wait"]]) / n)
    # Largest first: on the H200, 88% waiting on global memory, then 6% fixed-latency waits.
    assert f"PC samples (incl) {n:,}: stalled, global memory {ls}% · stalled, fixed latency {wait}%" in text
    assert "→ memory-bound" in text


def test_hotspots_carry_each_lines_stalls(tmp_path: Path, prof: dlpt.Profile) -> None:
    """`dlpt export -f hotspots --metric pc_samples`: the schema stays /2 with a `pc_sampling`
    object per hotspot, its figures the line's own columns (flat by line, by hand here)."""
    out = tmp_path / "hot.json"
    r = subprocess.run([sys.executable, "-m", "dlpt", "export", str(TRITON), "-f", "hotspots", "--metric",
                        "pc_samples", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "dlpt.hotspots/2"
    first = doc["hotspots"][0]
    assert (first["line"], first["function"]) == (TRUTH["mem_line"], "mixed")
    mem = [i for i in range(len(prof.cct)) if prof.frame_of(i).kind == "python"
           and prof.frame_of(i).function == "mixed" and prof.frame_of(i).line == TRUTH["mem_line"]]
    own = prof.cct.exclusive[mem].sum(axis=0)
    pc = first["pc_sampling"]
    assert first["pc_samples"] == pc["samples"]  # the ranked metric's own field stays a number
    assert pc["samples"] == int(own[COL["pc_samples"]]) == pc["issued"] + sum(pc["stalls"].values())
    assert pc["stalls"]["long_scoreboard"] == int(own[COL["stall_long_scoreboard"]])
    assert pc["limiter"] == "memory-bound"


def test_the_diagnosis_names_the_hot_kernels_limiter(prof: dlpt.Profile) -> None:
    from dlpt.findings import findings

    (f,) = [f for f in findings(prof) if f.rule == "kernel-stalls"]
    assert f.lines[0].endswith(f"pc_triton.py:{TRUTH['mem_line']}")  # its own line, the costliest
    n = mixed_samples(prof)
    kern = [i for i in range(len(prof.cct)) if prof.frame_of(i).kind == "kernel" and prof.frame_of(i).name == "mixed"]
    mem = sum(int(prof.cct.inclusive[i, COL[m]]) for i in kern for m in ("stall_long_scoreboard", "stall_lg_throttle"))
    assert f.figure.startswith(f"mixed: memory-bound, {mem / n:.0%} of its {n:,} PC samples (long scoreboard")
    assert "fuse" in f.remedy
    # Of the steady state's device time: 19.4 ms of kernels in the steady window (1.35% on the H200).
    assert f.share is not None and 0.005 < f.share < 0.05
    other = dlpt.load(str(DATA / "gpu_nanogpt_b8.dlpt"))
    assert not [f for f in findings(other) if f.rule == "kernel-stalls"]  # no samples, no verdict


def test_the_fused_nodes_detail_says_samples_follow_the_lines_they_hit() -> None:
    """`dlpt view`'s detail pane of a `[fused K]` node in the H200 recording with the codegen map:
    time by work shares, and PC samples by the generated lines they hit, with how many."""
    from dlpt.viewers.tui.detail import fused_note

    p = dlpt.load(str(DATA / "gpu_pc_inductor.dlpt"))
    split = int(p.meta.compiled_provenance["pc_sample_lines_split_by_line"])
    fused = [i for i in range(len(p.cct)) if p.frame_of(i).name.startswith("[fused ")]
    # every sampled line that carried a tag was split by it: the tags the recording kept
    assert split == sum(len(v) for v in p.meta.pc_sampling["fx_lines"].values()) > 0 and fused
    note = fused_note(p, fused[0], "pc_samples")
    assert f"PC samples: split by the generated lines they hit, each to the FX node of the op that wrote it ({split} " \
           "sampled lines in this recording)" in note.replace("\n", " "), note
