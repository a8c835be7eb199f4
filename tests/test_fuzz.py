"""Property-based fuzzing: mutated traces and profile files. Whatever the damage, only dlpt's own
error type may escape, and what was read keeps its GPU time conserved."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import tempfile

from conftest import raw_events, trace_path
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dlpt
from dlpt.errors import DlptError
from dlpt.metrics import COL
from dlpt.store import save
from dlpt.transforms import hide_library_unless
from dlpt.viewers.hotspots import hotspots
from dlpt.viewers.report import ReportOptions, render
from dlpt.views import GROUPINGS, bottom_up, flat

BUDGET = int(os.environ.get("DLPT_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=BUDGET, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASE = {name: {"traceEvents": raw_events(name)} for name in ("copies", "cudagraph_mlp", "threaded")}
ODD_VALUES = st.sampled_from([None, "", "x", -1, 0, 2**70, -(2**70), 1.5, float("nan"), float("inf"),
                              [], {}, [1, 2], {"a": 1}, True, "\x1b[31mred\x1b[0m", "[bold]x[/]"])
KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "args")
ARG_KEYS = ("correlation", "External id", "Python id", "Python parent id", "Sequence number", "bytes",
            "device", "stream")


def check_profile(prof: dlpt.Profile) -> None:
    """Everything a user can do with a profile works, and the totals hold."""
    cct = prof.cct
    total = cct.exclusive[:, COL["gpu_time"]].sum()
    assert total == prof.activities.duration.sum()
    assert (cct.exclusive >= 0).all()
    hidden = hide_library_unless(prof, False)
    assert hidden.cct.exclusive[:, COL["gpu_time"]].sum() == total
    for by in GROUPINGS:
        assert flat(hidden, by).exclusive[:, COL["gpu_time"]].sum() == total
    assert bottom_up(hidden).cct.inclusive[0, COL["gpu_time"]] == total
    hotspots(prof, top=5)
    render(hidden, ReportOptions())


# What a refusal says is wrong, after the file's name: one of these words is in every message.
WHAT_IS_WRONG = re.compile(r"\b(damaged|not|neither|empty|cut short|malformed|invalid|missing|unknown|unsupported|no)\b")


def load_bytes(data: bytes, suffix: str = ".json"):
    """The profile read from `data`, or None where dlpt refused it with its own error: one line,
    `PATH: what is wrong`."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t" + suffix)
        with open(p, "wb") as f:
            f.write(data)
        try:
            prof = dlpt.load(p)
        except DlptError as e:
            msg = str(e)
            assert "\n" not in msg and msg.startswith(f"{p}: "), msg
            assert len(msg[len(p) + 2:].split()) >= 3 and WHAT_IS_WRONG.search(msg[len(p) + 2:]), msg
            return None
        check_profile(prof)
        return prof


def test_the_inputs_the_fuzzers_damage_load_whole():
    """The undamaged traces, plain and gzipped, and the profile file load, with all their GPU
    time: a loader that refused everything would pass the fuzzers below, not this."""
    for name, doc in BASE.items():
        gpu = sum(round(e["dur"] * 1000) for e in doc["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
        for data, suffix in ((json.dumps(doc).encode(), ".json"), (gzip.compress(json.dumps(doc).encode()), ".json.gz")):
            prof = load_bytes(data, suffix)
            assert prof is not None and gpu > 0 and prof.cct.exclusive[:, COL["gpu_time"]].sum() == gpu, name
    prof = load_bytes(profile_bytes(), ".dlpt")
    assert prof is not None and prof.cct.exclusive[:, COL["gpu_time"]].sum() > 0


@SETTINGS
@given(name=st.sampled_from(sorted(BASE)), edits=st.lists(
    st.tuples(st.integers(0, 10**6), st.sampled_from(KEYS + ARG_KEYS), ODD_VALUES, st.booleans()),
    min_size=1, max_size=25))
def test_mutated_events(name, edits):
    doc = copy.deepcopy(BASE[name])
    evs = doc["traceEvents"]
    for idx, key, value, delete in edits:
        e = evs[idx % len(evs)]
        target = e
        if key in ARG_KEYS:
            if not isinstance(e.get("args"), dict):
                continue
            target = e["args"]
        if delete:
            target.pop(key, None)
        else:
            target[key] = value
    data = json.dumps(doc, allow_nan=True).encode()
    load_bytes(data)


@SETTINGS
@given(name=st.sampled_from(sorted(BASE)), cut=st.floats(0.0, 1.0), gz=st.booleans())
@example(name="threaded", cut=1.0, gz=False)
@example(name="threaded", cut=1.0, gz=True)
def test_truncated_traces(name, cut, gz):
    data = json.dumps(BASE[name]).encode()
    if gz:
        data = gzip.compress(data)
    prof = load_bytes(data[: int(len(data) * cut)], ".json.gz" if gz else ".json")
    assert prof is not None or cut < 1.0  # the whole trace, not cut, loads


@SETTINGS
@given(name=st.sampled_from(sorted(BASE)), flips=st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 255)),
                                                         min_size=1, max_size=20))
def test_byte_flips_in_traces(name, flips):
    data = bytearray(json.dumps(BASE[name]).encode())
    for pos, val in flips:
        data[pos % len(data)] = val
    load_bytes(bytes(data))


@SETTINGS
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                            ["traceEvents", "ph", "cat", "ts", "dur", "args", "name"]), c, max_size=4),
                        max_leaves=20))
def test_arbitrary_json(doc):
    load_bytes(json.dumps(doc).encode())


_PROFILE_BYTES: dict[str, bytes] = {}


def profile_bytes() -> bytes:
    if "p" not in _PROFILE_BYTES:
        prof = dlpt.load(str(trace_path("cudagraph_mlp")))
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "p.dlpt")
            save(prof, p)
            _PROFILE_BYTES["p"] = open(p, "rb").read()
    return _PROFILE_BYTES["p"]


@SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 255)), min_size=1, max_size=30),
       cut=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_damaged_profile_files(flips, cut):
    data = bytearray(profile_bytes())
    for pos, val in flips:
        data[pos % len(data)] = val
    if cut is not None:
        data = data[: int(len(data) * cut)]
    load_bytes(bytes(data), ".dlpt")
