"""A large trace's first pass in two processes (collectors/kineto/parallel.py): the columns of the
two halves merged (Columns.merge) are the columns of one pass over all the events, at any cut;
the profile read with a forked child is the profile read in one process; and a child that fails,
dies or meets a half it cannot decode never changes the answer."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import sys

import msgspec
import numpy as np
import pytest
from conftest import FIXTURES, trace_path
from test_kineto_slices import _same

from dlpt.collectors.kineto import import_traces
from dlpt.collectors.kineto.columns import Columns
from dlpt.collectors.kineto.decode import decode

decode_mod = sys.modules["dlpt.collectors.kineto.decode"]
parallel = sys.modules["dlpt.collectors.kineto.parallel"]


def _state(c: Columns) -> dict:
    """Everything a pass leaves for the linker, in the order it left it."""
    g = c.gpu_rows()
    out = {
        "arrays": [a.tolist() for a in c.arrays()],
        "names": c.name,
        "name_first": np.concatenate(c.name_first).tolist() if c.name_first else [],
        "one_object_per_name": [id(x) for x in c.name] == [id(c.name[j]) for j in
                                                              (np.concatenate(c.name_first).tolist() if c.name_first else [])],
        "gpu": [list(getattr(g, k)) for k in g.__dataclass_fields__],
        "gpu_name_objects": len({id(x) for x in c.gpu_name}) == len(set(c.gpu_name)),
        "mem": [c.memory.ts, c.memory.key, c.memory.device, c.memory.addr, c.memory.nbytes, c.memory.total,
                c.memory.reserved, c.memory.other, c.memory.damaged],
    }
    for k in ("n", "skipped", "first", "last", "gpu_pids"):
        out[k] = getattr(c, k)
    for k in ("launch_of_corr", "flow_s", "flow_f", "thread_ids", "thread_names", "labels", "unknown"):
        out[k] = list(getattr(c, k).items())  # in order: the linker numbers by it
    return out


def _one_pass(events: list, chunk: int) -> Columns:
    c = Columns()
    for i in range(0, len(events), chunk):
        c.add(events[i:i + chunk])
    return c


def _with_repeats(events: list) -> list:
    """The events, then again the first 150 launches, flows, ops and kernels each, 1 s later:
    correlations and flow ids that recur after any cut (the first launch of a correlation is the
    one linked, the last flow of an id the one kept)."""
    again = []
    for cat in ("cuda_runtime", "fwdbwd", "cpu_op", "kernel"):
        again += [msgspec.structs.replace(e, ts=e.ts + 1e6) for e in events if e.cat == cat and e.ts is not None][:150]
    return events + again


@pytest.mark.parametrize("name", ["gpt_train", "threaded", "cudagraph_mlp", "compiled_mlp", "loader_bound",
                                  "gpt_train+repeats", "hta_memory_rank1"])
def test_merged_halves_are_one_pass_at_any_cut(name):
    path = FIXTURES / "hta_memory_rank1.json.gz" if name == "hta_memory_rank1" else trace_path(name.split("+")[0])
    events = decode(str(path), {}).traceEvents
    cuts = {len(events), len(events) + 75}  # the repeats' start, and inside their launches
    if name.endswith("+repeats"):
        events = _with_repeats(events)
    whole = _state(_one_pass(events, 997))
    assert whole["one_object_per_name"] and whole["gpu_name_objects"] and whole["n"] > 0
    if name == "hta_memory_rank1":
        assert len(whole["mem"][0]) > 100  # [memory] events on both sides of every cut below
    n = len(events)
    for cut in sorted({1, 2, n // 7, n // 3, n // 2, n - 3, n - 1} | (cuts if name.endswith("+repeats") else set())):
        # The second half as the parent gets it from the child: pickled, its strings new objects.
        first, second = _one_pass(events[:cut], 997), pickle.loads(pickle.dumps(_one_pass(events[cut:], 997)))
        first.merge(second)
        got = _state(first)
        for k in whole:
            assert got[k] == whole[k], (name, cut, k)


def _big_trace(tmp_path, nan_in_second_half: bool = False):
    """gpt_train's events as plain JSON (several slices of 2 kB each), optionally a NaN late in it."""
    with gzip.open(trace_path("gpt_train"), "rt") as f:
        doc = json.load(f)
    text = json.dumps(doc)
    if nan_in_second_half:
        evs = doc["traceEvents"]
        j = next(i for i in range(len(evs) * 3 // 4, len(evs)) if "dur" in evs[i])
        evs[j]["dur"] = "NAN_HERE"
        text = json.dumps(doc).replace('"NAN_HERE"', "NaN")
    p = tmp_path / "t.json"
    p.write_text(text)
    return p


def _read(p, monkeypatch, procs: str):
    monkeypatch.setattr(decode_mod, "CHUNK_BYTES", 2000)
    monkeypatch.setenv("DLPT_READ_PROCS", procs)
    return import_traces(str(p))


@pytest.fixture
def forks(monkeypatch):
    """Counts the children forked to read a half (the test process may hold threads of its own,
    pytest's, so `wanted` is told yes rather than asked)."""
    seen = []
    real = parallel._Child.__init__

    def counting(self, read, part):
        seen.append(part)
        real(self, read, part)

    monkeypatch.setattr(parallel._Child, "__init__", counting)
    monkeypatch.setattr(parallel, "wanted", lambda: os.environ.get("DLPT_READ_PROCS") != "1")
    return seen


def test_a_forked_half_gives_the_same_profile(tmp_path, monkeypatch, forks):
    p = _big_trace(tmp_path)
    one = _read(p, monkeypatch, "1")
    assert not forks
    two = _read(p, monkeypatch, "2")
    assert len(forks) == 1
    _same(one, two)
    assert one.meta["wall_window"] == two.meta["wall_window"]


def test_nonfinite_values_in_the_childs_half_are_counted(tmp_path, monkeypatch, forks):
    p = _big_trace(tmp_path, nan_in_second_half=True)
    one = _read(p, monkeypatch, "1")
    two = _read(p, monkeypatch, "2")
    assert len(forks) == 1 and one.meta["nonfinite"] == two.meta["nonfinite"] == 1
    assert one.meta["nonfinite_at"] == two.meta["nonfinite_at"]
    _same(one, two)


@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_child_that_fails_leaves_its_half_to_the_parent(tmp_path, monkeypatch, forks, how):
    """The child raises (its error is not the caller's to see) or dies at once: the parent reads the
    second half itself, and the profile is the same."""
    p = _big_trace(tmp_path)
    one = _read(p, monkeypatch, "1")
    parent = os.getpid()
    real = Columns.add

    def add(self, events):
        if os.getpid() != parent:
            if how == "dies":
                os._exit(7)
            raise RuntimeError("a child's own failure")
        real(self, events)

    monkeypatch.setattr(Columns, "add", add)
    two = _read(p, monkeypatch, "2")
    assert len(forks) == 1
    _same(one, two)


def test_a_second_half_that_cannot_be_sliced_reads_the_file_whole(tmp_path, monkeypatch, forks):
    """A name holding `}, {` late in the file: the child's slices fail to decode, and the file is
    read whole, as in one process."""
    with gzip.open(trace_path("gpt_train"), "rt") as f:
        doc = json.load(f)
    evs = doc["traceEvents"]
    for i in range(len(evs) * 3 // 4, len(evs)):
        if i % 5 == 0 and "name" in evs[i]:
            evs[i]["name"] += '}, {"ph": "X", "cat": "kernel"}'
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    one = _read(p, monkeypatch, "1")
    two = _read(p, monkeypatch, "2")
    assert len(forks) == 1
    _same(one, two)
