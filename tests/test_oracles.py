"""Results checked against something dlpt did not compute: the activity rows a profile stores
(every per-node activity metric, view and summary total is recomputed from them here, with plain
Python loops; the metrics no activity makes are held to the figures the recording wrote beside
them), and torch's own per-op totals of the same Kineto traces (`*.torchref.json`).

None of these needs torch: the profiles and traces were recorded on an H100/H200 and are read
as data."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from conftest import DATA, FIXTURES, TRACE_NAMES, trace_path
from kineto_builder import TraceBuilder

import dlpt
from dlpt.collectors.kineto import import_traces
from dlpt.idle import IDLE_STARTUP, IDLE_UNATTRIBUTED
from dlpt.metrics import COL, PC_METRICS, is_collective
from dlpt.transforms import hide_library_unless
from dlpt.viewers.hotspots import summary
from dlpt.views import GROUPINGS, flat

# Profiles `dlpt record` wrote on the GPU machine (H100: gpu_train_small; H200: gpu_truth from bench/workloads/truth.py and the gpu_case_* from `bench/run.py gpu-cases`).
RECORDED = ("gpu_train_small", "gpu_truth", "gpu_case_copies", "gpu_case_cudagraph", "gpu_case_threaded")

# Activity kind → its time, count and bytes columns, written out here rather than taken from
# dlpt.metrics, whose tables are what is under test.
KIND_COLUMNS = {
    0: ("kernel_time", "kernel_count", None),
    1: ("htod_time", "copy_count", "htod_bytes"),
    2: ("dtoh_time", "copy_count", "dtoh_bytes"),
    3: ("dtod_time", "copy_count", "dtod_bytes"),
    4: ("memcpy_other_time", "copy_count", None),
    5: ("memset_time", "memset_count", None),
}
# The columns a recording fills from its activity rows. Every other column comes from elsewhere
# and is held by its own books below: cpu_time (host ops), host_time (the sampler), gpu_idle_time
# (the GPU's idle gaps blamed on host lines), sync_time (blocking CUDA calls), comm_wait_time (ranks
# read together), alloc_bytes / alloc_count / peak_bytes (the caching allocator's events).
ACTIVITY_COLUMNS = ["gpu_time", "comm_time", *sorted({c for cols in KIND_COLUMNS.values() for c in cols if c})]
# The key each flat grouping (`--by`) gives a frame, or None where it gives none: written out here
# rather than taken from dlpt.views.group_key, which is under test. A function is its file and
# name (two `forward`s of two files are two functions); activities are kernels, copies, memsets.
GROUP_KEYS = {
    "line": lambda f: (f.file, f.line) if f.kind == "python" and f.file and f.line > 0 else None,
    "function": lambda f: (f.file, f.function or f.name) if f.kind == "python" else None,
    "file": lambda f: (f.file,) if f.kind == "python" and f.file else None,
    "kernel": lambda f: (f.kind, f.name) if f.kind in ("kernel", "memcpy", "memset") else None,
    "op": lambda f: (f.name,) if f.kind == "op" else None,
}
OWN_BOOKS = ["cpu_time", "host_time", "gpu_idle_time", "sync_time", "comm_wait_time",
             "alloc_bytes", "alloc_count", "peak_bytes"]


def load(name: str) -> dlpt.Profile:
    return dlpt.load(str(DATA / f"{name}.dlpt"))


def activity_rows(prof: dlpt.Profile) -> list[tuple[int, int, int, int, int, str]]:
    a = prof.activities
    names = [prof.frames[i].name for i in a.name.tolist()]
    return list(zip(a.node.tolist(), a.kind.tolist(), a.duration.tolist(), a.bytes.tolist(),
                    a.count.tolist(), names))


def ancestors(prof: dlpt.Profile, node: int) -> list[int]:
    """node, its parent, ..., the root: walked one parent at a time."""
    parent = prof.cct.parent.tolist()
    out = [node]
    while parent[out[-1]] >= 0:
        out.append(parent[out[-1]])
    return out


@pytest.mark.parametrize("name", ["gpu_train_small", "gpu_truth"])
def test_recorded_gpu_profiles(name: str) -> None:
    """Profiles `dlpt record` wrote on the GPU machine: GPU-shaped, nearly all GPU
    time at a source line, backward work seen. (Moved from test_record.py, which needs torch to
    record; its check that the stored tree's total equals the stored activities' is now the
    recomputation below.)"""
    prof = load(name)
    s = summary(prof)
    assert s["attributed_to_source"] >= 0.99 * s["gpu_time"] and s["backward_time"] > 0
    assert any(f.endswith(".py") for f in prof.sources)


def recomputed_exclusive(prof: dlpt.Profile) -> dict[str, Counter]:
    """Every GPU metric of every node, summed from the activity rows one row at a time."""
    exc: dict[str, Counter] = defaultdict(Counter)
    for node, kind, dur, nbytes, count, name in activity_rows(prof):
        time_col, count_col, bytes_col = KIND_COLUMNS[kind]
        exc["gpu_time"][node] += dur
        exc[time_col][node] += dur
        exc[count_col][node] += count
        if bytes_col:
            exc[bytes_col][node] += nbytes
        if kind == 0 and is_collective(name):
            exc["comm_time"][node] += dur
    return exc


def as_column(counter: Counter, n: int) -> np.ndarray:
    col = np.zeros(n, dtype=np.int64)
    for i, v in counter.items():
        col[i] = v
    return col


def test_every_column_is_checked_by_one_rule() -> None:
    # a new metric needs a rule here; the PC-sample family's (parts add up, only on kernels and
    # their own lines, against H200 recordings) are in tests/test_pcsamples.py
    assert sorted(ACTIVITY_COLUMNS + OWN_BOOKS + list(PC_METRICS)) == sorted(COL)
    assert tuple(GROUP_KEYS) == GROUPINGS  # and a new grouping a key


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_exclusive_metrics_are_the_activities(name: str) -> None:
    """The exclusive matrix a recording stores, every activity column of every node, against the
    activity rows stored beside it."""
    prof = load(name)
    assert prof.collector == "record" and prof.meta["gpu"] is True and len(prof.activities) > 0
    exc = recomputed_exclusive(prof)
    n = len(prof.cct)
    for m in ACTIVITY_COLUMNS:
        assert np.array_equal(prof.cct.exclusive[:, COL[m]], as_column(exc[m], n)), m


@pytest.mark.parametrize("name", [*RECORDED, "gpu_nanogpt_b8"])
def test_recorded_columns_without_activities_keep_their_own_books(name: str) -> None:
    """The columns no activity row makes, against the figures the recording wrote beside them
    (meta `window`, `gpu_idle`, `memory`: dlpt/idle.py, collectors/record/memory.py) and what
    the stored activities bound. A recording without the sampler (format 1) has none of them."""
    prof = load(name)
    exc, kinds = prof.cct.exclusive, [prof.frame_of(i).kind for i in range(len(prof.cct))]
    tot = {m: int(exc[:, COL[m]].sum()) for m in OWN_BOOKS}
    on = {m: {kinds[i] for i in np.flatnonzero(exc[:, COL[m]]).tolist()} for m in OWN_BOOKS}
    assert on["cpu_time"] == {"op"}  # host ops' self time, on the ops
    assert tot["comm_wait_time"] == 0  # estimated only when several ranks are read together
    if "gpu_idle" not in prof.meta:
        assert not any(tot[m] for m in ("host_time", "gpu_idle_time", "sync_time", "alloc_bytes", "alloc_count",
                                        "peak_bytes"))
        return
    win, idle, mem = prof.meta["window"], prof.meta["gpu_idle"], prof.meta["memory"]
    wall = win["end"] - win["start"]
    # Idle: the tree holds all of it, start-up and unattributed idle on their named rows, the
    # rest on the host lines that ran meanwhile, which the sampler saw (they hold host_time).
    assert tot["gpu_idle_time"] == idle["idle"]
    named = {prof.frame_of(i).name: int(exc[i, COL["gpu_idle_time"]]) for i in range(len(prof.cct))
             if kinds[i] == "unattributed"}
    assert named.get(f"<unattributed: {IDLE_STARTUP}>", 0) == idle["start-up"]
    assert named.get(f"<unattributed: {IDLE_UNATTRIBUTED}>", 0) == idle["unattributed"]
    on_lines = (exc[:, COL["gpu_idle_time"]] > 0) & (np.array(kinds) != "unattributed")
    assert int(exc[on_lines, COL["gpu_idle_time"]].sum()) == idle["host"] + idle["sync"]
    assert (exc[on_lines, COL["host_time"]] > 0).all()
    # Busy and idle fill each device's window; busy is the union of the activities, never more
    # than their sum.
    assert idle["busy"] + idle["idle"] == sum(d["window"] for d in idle["devices"].values())
    assert 0 < idle["busy"] <= sum(r[2] for r in activity_rows(prof))
    # Host time: the sampler adds the time since its last wake to each thread's line, from the
    # window's start (or the thread's) to its end. The main thread, outside every [thread]
    # subtree, was missed only while it had no Python frame: under 1% of the window, never more;
    # a thread of the program holds at most the window.
    assert on["host_time"] <= {"python", "root", "thread"}
    host = exc[:, COL["host_time"]]
    in_thread = np.zeros(len(prof.cct), dtype=bool)
    for i in [i for i, k in enumerate(kinds) if k == "thread"]:
        assert int(host[i:int(prof.cct.end[i])].sum()) <= wall
        in_thread[i:int(prof.cct.end[i])] = True
    assert 0.99 * wall <= int(host[~in_thread].sum()) <= wall
    # Sync time is host time spent blocked, on the op or line that blocked.
    assert 0 < tot["sync_time"] <= tot["host_time"] and on["sync_time"] <= {"op", "python"}
    # Memory: the bytes live at the peak are the recorded peak (what was allocated before the
    # recording on a named row of its own); each line held at most what it allocated, and
    # allocations are counted where their bytes are.
    assert tot["peak_bytes"] == mem["peak_allocated"]
    lines = np.array(kinds) != "unattributed"
    assert (exc[lines, COL["peak_bytes"]] <= exc[lines, COL["alloc_bytes"]]).all()
    assert np.array_equal(exc[:, COL["alloc_bytes"]] > 0, exc[:, COL["alloc_count"]] > 0)
    assert 0 < tot["alloc_count"] <= mem["events"]


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_inclusive_views_and_summary_from_activities(name: str) -> None:
    """What the model computes from the tree — inclusive metrics, the tree with library frames
    hidden, every flat grouping, the summary's totals — recomputed from the activity rows and
    the frames on each activity's path."""
    prof = load(name)
    rows = activity_rows(prof)
    total = sum(r[2] for r in rows)
    gpu = COL["gpu_time"]

    # Inclusive: each activity counts once at every node on its path.
    inc = Counter()
    for node, _, dur, *_ in rows:
        for a in ancestors(prof, node):
            inc[a] += dur
    assert np.array_equal(prof.cct.inclusive[:, gpu], as_column(inc, len(prof.cct)))

    # Summary: time on a path with a source line, under a [backward] marker, in total.
    frames_on = [[prof.frame_of(a) for a in ancestors(prof, node)] for node, *_ in rows]
    s = summary(prof, unit="ns")
    assert s["gpu_time"] == total
    assert s["attributed_to_source"] == sum(r[2] for r, fs in zip(rows, frames_on) if any(f.has_source for f in fs))
    assert s["backward_time"] == sum(r[2] for r, fs in zip(rows, frames_on) if any(f.kind == "backward" for f in fs))

    # Library frames hidden: the activities move with their nodes; the tree's metrics follow them.
    for include_library in (True, False):
        view = hide_library_unless(prof, include_library)
        vrows = activity_rows(view)
        assert sorted((r[2], r[5]) for r in vrows) == sorted((r[2], r[5]) for r in rows)
        assert np.array_equal(view.cct.exclusive[:, gpu], as_column(recomputed_exclusive(view)["gpu_time"],
                                                                     len(view.cct)))
        # Flat views: an activity belongs to the innermost frame on its path that has a key in
        # the grouping (exclusive), else to the view's last row, the one for no key; and once to
        # every key on its path (inclusive). Every frame in the tree with a key is one row.
        for by, key in GROUP_KEYS.items():
            fv = flat(view, by)
            want_keys = {key(view.frame_of(i)) for i in range(1, len(view.cct))} - {None}
            exc, incl = Counter(), Counter()
            for node, _, dur, *_ in vrows:
                on_path = [k for k in (key(view.frame_of(a)) for a in ancestors(view, node)) if k is not None]
                exc[on_path[0] if on_path else None] += dur
                for k in set(on_path):
                    incl[k] += dur
            got_keys = [key(f) for f in fv.frame]  # each row's key, from its representative frame
            assert got_keys[-1] is None and set(got_keys[:-1]) == want_keys, by
            assert len(got_keys) - 1 == len(want_keys), by  # one row per key, none merged or split
            assert {k: int(v) for k, v in zip(got_keys, fv.exclusive[:, gpu]) if v} == +exc, by
            assert {k: int(v) for k, v in zip(got_keys[:-1], fv.inclusive[:-1, gpu]) if v} == +incl, by
            assert int(fv.exclusive[:, gpu].sum()) == total, by


def test_flat_by_function_keeps_same_named_functions_of_different_files_apart(tmp_path) -> None:
    """Two `forward`s, one in a.py launching a 30 us kernel and one in b.py launching a 50 us
    one: grouped by function they are two rows, 30 and 50 us, not one of 80 us."""
    tb = TraceBuilder()
    tb.py(1, "<module>", 0.0, 400.0)
    tb.py(10, "forward", 10.0, 100.0, file="/src/a.py")
    tb.kernel(20.0, 5.0, 30.0, 30.0, name="ka")
    tb.py(20, "forward", 200.0, 100.0, file="/src/b.py")
    tb.kernel(210.0, 5.0, 220.0, 50.0, name="kb")
    fv = flat(import_traces(str(tb.write(tmp_path / "two.pt.trace.json.gz"))), "function")
    got = {(f.file, f.function): int(t) for f, t in zip(fv.frame, fv.exclusive[:, COL["gpu_time"]])
           if f.kind == "python"}
    assert got == {("/src/a.py", "forward"): 30_000, ("/src/b.py", "forward"): 50_000, ("train.py", "<module>"): 0}


# --- The Kineto importer against torch's own totals --------------------------------------------

# CUPTI's own cost (`cat: overhead` in the trace): torch's key_averages counts it as device time
# of itself and of the ops around it; it is no GPU work, and dlpt reads no overhead events.
CUPTI_OVERHEAD = "Activity Buffer Request"


def torch_ref(name: str) -> dict[str, dict]:
    with open(FIXTURES / f"{name}.torchref.json") as f:
        return {r["key"]: r for r in json.load(f)}


def gpu_annotations(name: str) -> set[str]:
    """Names of GPU-side user annotations (`record_function` spans drawn on the GPU timeline).
    For such a key torch reports the span's length on the GPU, gaps between kernels included,
    not the time of the kernels inside: no per-activity total can match it."""
    with gzip.open(trace_path(name), "rt") as f:
        return {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "gpu_user_annotation"}


def dlpt_per_key(prof: dlpt.Profile) -> tuple[Counter, Counter, Counter]:
    """(time per GPU activity name, self and total device time per op name) from an imported
    profile's activities, following torch's rules: an op's self time is that of the activities
    it launched (nearest op on the path), its total that of every activity beneath it on the
    forward side of the path (a backward op's work hangs under the forward op that created it
    and a `[backward]` marker; torch counts it under the backward op only), each op name once
    per run of directly nested ops of that name (torch's `_remove_dup_nodes` folds an op into
    its parent of the same name)."""
    leaf, self_t, total = Counter(), Counter(), Counter()
    for node, _, dur, _, _, name in activity_rows(prof):
        leaf[name] += dur
        chain: list[str] = []
        for a in ancestors(prof, node)[1:]:
            f = prof.frame_of(a)
            if f.kind == "backward":
                break
            if f.kind == "op" and not (chain and chain[-1] == f.name):
                chain.append(f.name)
        if chain:
            self_t[chain[0]] += dur
        for op in chain:
            total[op] += dur
    return leaf, self_t, total


def us(ns: int) -> float:
    return ns / 1000.0


# The traces captured with torch's own per-op totals beside them (loader_bound was not).
@pytest.mark.parametrize("name", [n for n in TRACE_NAMES if (FIXTURES / f"{n}.torchref.json").exists()])
def test_import_reproduces_torchs_per_op_totals(name: str) -> None:
    """Every kernel, copy and memset name, and every op, carries the device time torch's
    `key_averages` gives it, to the nanosecond (the trace writes microseconds with three
    decimals; dlpt keeps integer nanoseconds, torch sums floats: 1e-6 us covers the float sums'
    error and not one nanosecond). Two kinds of key differ, each for a reason stated above:
    CUPTI's overhead, and GPU user annotations."""
    ref = torch_ref(name)
    leaf, self_t, total = dlpt_per_key(import_traces(str(trace_path(name))))
    overhead = ref.get(CUPTI_OVERHEAD, {}).get("device_total_us", 0.0)
    annotations = gpu_annotations(name)
    assert CUPTI_OVERHEAD not in leaf and CUPTI_OVERHEAD not in total
    checked = 0
    for key, r in ref.items():
        if key == CUPTI_OVERHEAD or key in annotations:
            continue
        if key in leaf:  # a GPU activity name: its total time
            assert us(leaf[key]) == pytest.approx(r["device_total_us"], abs=1e-6), key
            assert r["self_device_us"] == pytest.approx(r["device_total_us"], abs=1e-6), key
        else:
            assert us(self_t[key]) == pytest.approx(r["self_device_us"], abs=1e-6), key
            # torch adds CUPTI's overhead to the ops that were running when it struck.
            gap = r["device_total_us"] - us(total[key])
            assert gap == pytest.approx(0, abs=1e-6) or gap == pytest.approx(overhead, abs=1e-6), key
        checked += 1
    assert checked >= len(ref) - 3
    # Every activity dlpt has is one torch counts, and the other way round.
    kinds = {k for k in ref if k in leaf}
    assert kinds == set(leaf)
    for key in annotations & set(ref):
        # Kernels under the annotation's host span fit within its span on the GPU.
        assert us(total[key]) <= ref[key]["device_total_us"] + 1e-6, key
