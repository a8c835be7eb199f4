"""Reading a large trace a slice of events at a time (decode.decode_chunks) gives the same profile
as reading it whole; cuts that do not fall between events, and damaged slices, are handled."""

from __future__ import annotations

import gzip
import json
import sys

import pytest
from conftest import assert_same_profile, raw_events, trace_path

from dlpt.collectors.kineto import import_traces

decode_mod = sys.modules["dlpt.collectors.kineto.decode"]


def _import(path, chunk_bytes: int, monkeypatch):
    monkeypatch.setattr(decode_mod, "CHUNK_BYTES", chunk_bytes)
    return import_traces(str(path))


def _sliced(path, chunk_bytes: int) -> int:
    """How many slices the file is read in (0: it is read whole)."""
    got = decode_mod.decode_chunks(str(path), chunk_bytes)
    if got is None:
        return 0
    try:
        return sum(1 for _ in got.slices)
    except decode_mod.Unsplittable:
        return 0


def test_slices_give_the_same_profile(trace_name, monkeypatch):
    p = trace_path(trace_name)
    assert _sliced(p, 2000) > 1
    assert_same_profile(_import(p, 1 << 30, monkeypatch), _import(p, 2000, monkeypatch))


def test_cut_inside_a_string_reads_the_file_whole(tmp_path, monkeypatch):
    evs = raw_events("gpt_train")
    for i, e in enumerate(evs):
        if i % 7 == 0 and "name" in e:
            e["name"] += '}, {"ph": "X", "cat": "kernel"}'
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    assert _sliced(p, 2000) == 0
    assert_same_profile(_import(p, 1 << 30, monkeypatch), _import(p, 2000, monkeypatch))


@pytest.mark.parametrize("damage", ["string ts", "null dur", "args not an object", "list pid"])
def test_damaged_slices_are_read_leniently(tmp_path, monkeypatch, damage):
    with gzip.open(trace_path("gpt_train"), "rt") as f:
        doc = json.load(f)
    for i, e in enumerate(doc["traceEvents"]):
        if i % 301:
            continue
        if damage == "string ts" and "ts" in e:
            e["ts"] = str(e["ts"])
        elif damage == "null dur" and "dur" in e:
            e["dur"] = None
        elif damage == "args not an object":
            e["args"] = "x"
        elif damage == "list pid":
            e["pid"] = [1]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    assert _sliced(p, 2000) > 1
    whole, sliced = _import(p, 1 << 30, monkeypatch), _import(p, 2000, monkeypatch)
    assert_same_profile(whole, sliced)
    if damage in ("string ts", "list pid"):
        assert sliced.meta["skipped_events"] > 0
