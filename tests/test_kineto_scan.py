"""The native scan (collectors/kineto/scan.c) reads a trace into the same first-pass columns as the
Python reader (msgspec's structs), or declines it; it never reads one differently. Checked on
every Kineto trace in tests/data, on traces damaged in the ways the lenient reader exists for,
and on odd but valid JSON; plus its build: cached, said once, and a reader without it."""

from __future__ import annotations

import copy
import gzip
import importlib
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import FIXTURES, raw_events, trace_path

columns = importlib.import_module("dlpt.collectors.kineto.columns")
decode_mod = importlib.import_module("dlpt.collectors.kineto.decode")
scan_mod = importlib.import_module("dlpt.collectors.kineto.scan")

KINETO = sorted(p.name for p in FIXTURES.iterdir() if p.name.endswith(".json.gz"))


def _state(cols) -> dict:
    """Everything the first pass leaves for the linker, in comparable form (orders included)."""
    g = cols.gpu_rows()
    m = cols.memory
    return {
        "spans": [a.tolist() for a in cols.arrays()], "name": cols.name,
        "name_first": np.concatenate(cols.name_first).tolist() if cols.name_first else [],
        "launch_of_corr": list(cols.launch_of_corr.items()),
        "gpu": [g.kind.tolist(), g.start.tolist(), g.dur.tolist(), [int(c) for c in g.corr], g.device.tolist(),
                g.stream.tolist(), g.nbytes.tolist(), g.name],
        "flow_s": list(cols.flow_s.items()), "flow_f": list(cols.flow_f.items()),
        "thread_ids": list(cols.thread_ids.items()), "thread_names": cols.thread_names, "labels": cols.labels,
        "skipped": cols.skipped, "unknown": sorted(cols.unknown.items(), key=repr), "gpu_pids": sorted(cols.gpu_pids, key=repr),
        "window": (cols.first, cols.last),
        "memory": [m.ts, m.key, m.device, m.addr, m.nbytes, m.total, m.reserved, m.other, m.damaged],
    }


def _python(data: bytes) -> dict:
    """The Python reader's columns of a trace's bytes: decoded whole (strictly, else leniently)."""
    trace = decode_mod._decode_bytes(data)
    cols = columns.Columns()
    cols.add(columns.StructBatch(trace.traceEvents))
    return _state(cols)


def _bounds(data: bytes) -> tuple[int, int]:
    """Where the events array's contents begin, and the file's last bracket (the scan stops at
    the array's own, where a later value's comes after it)."""
    m = decode_mod._EVENTS_KEY.search(data)  # as decode_chunks finds it
    if m is None:
        raise ValueError("no events array")
    return m.end(), data.rindex(b"]")


def _native(data: bytes) -> dict | None:
    """The native scan's columns, or None where it declines."""
    lo, hi = _bounds(data)
    try:
        cols = columns.Columns()
        scanned = scan_mod.Scan(data, lo, hi)
        for b in scanned:
            cols.add(b)
            b.close()
    except scan_mod.Declined:
        return None
    # As the importer does (collectors/kineto/__init__.py): an array that ended before the file's
    # last bracket must leave a document around it.
    if scanned.end != hi and decode_mod.skeleton_meta(data, lo, scanned.end) is None:
        return None
    return _state(cols)


def _bytes(name: str) -> bytes:
    return decode_mod.read_bytes(str(FIXTURES / name))


@pytest.fixture(scope="module", autouse=True)
def _built():
    if scan_mod.library() is None:
        pytest.fail("the native scan did not build here: CI has a C compiler, so this is a failure")


@pytest.mark.parametrize("name", KINETO)
def test_every_real_trace_reads_the_same_natively(name):
    data = _bytes(name)
    got = _native(data)
    assert got is not None, "a real trace was declined"
    want = _python(data)
    for k in want:
        assert got[k] == want[k], k


@pytest.mark.parametrize("cut_in_a_string", [False, True])
def test_pieces_read_as_one(monkeypatch, cut_in_a_string):
    """A large trace is scanned a piece at a time, one piece ahead on a second thread; where a cut
    falls inside a string, that piece declines and the Python reader reads the trace. Where the
    scan reads it, the columns are the Python reader's."""
    evs = raw_events("gpt_train")
    if cut_in_a_string:
        for e in evs:
            e["name"] = e.get("name", "") + '}, {"ph": "X"'
    data = json.dumps({"traceEvents": evs}).encode()
    monkeypatch.setattr(scan_mod, "PIECE_BYTES", 100_000)
    assert len(scan_mod._pieces(data, *_bounds(data), scan_mod.PIECE_BYTES)) > 20
    if cut_in_a_string:
        with pytest.raises(scan_mod.Declined, match="not JSON|expected|cut short"):
            for b in scan_mod.Scan(data, *_bounds(data)):
                b.close()
        return
    assert _native(data) == _python(data)


def test_a_piece_declined_midway_reads_the_whole_trace_in_python(tmp_path, monkeypatch):
    """A damaged event far into the trace: the pieces before it were scanned and added, then the
    scan declines; the import starts again in Python and gives the Python reader's profile."""
    from dlpt.collectors.kineto import import_traces

    evs = raw_events("gpt_train")
    evs[len(evs) * 3 // 4]["ts"] = "late damage"
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    monkeypatch.setattr(scan_mod, "PIECE_BYTES", 100_000)
    native = import_traces(str(p))
    monkeypatch.setenv("DLPT_NATIVE_READ", "0")
    monkeypatch.setattr(scan_mod, "_lib", None)
    python = import_traces(str(p))
    assert native.meta.skipped_events == python.meta.skipped_events == 1
    assert (native.cct.exclusive == python.cct.exclusive).all() and native.frames == python.frames


def test_an_array_after_the_events_does_not_send_the_trace_to_the_slow_reader(tmp_path, monkeypatch):
    """HTA's traces end with an `INFO` array of log lines, others with `deviceProperties`: the file's
    last bracket is theirs, not the events array's. The scan stops at the array's own bracket and
    the metadata is read around it, rather than the whole trace decoded in Python."""
    from dlpt.collectors.kineto import import_traces

    doc = {"schemaVersion": 1, "traceEvents": raw_events("gpt_train"),
           "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceName": "t",
           "INFO": ["I1128 CuptiActivityProfiler.cpp:914] done}, {", "x]"]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    data = p.read_bytes()
    lo, hi = _bounds(data)
    scanned = scan_mod.Scan(data, lo, hi)
    for b in scanned:
        b.close()
    assert scanned.end == data.index(b'], "deviceProperties"') < hi
    whole = []
    monkeypatch.setattr(decode_mod, "decode", lambda *a, **k: whole.append(a) or pytest.fail("read whole"))
    native = import_traces(str(p))
    assert not whole and native.meta.devices == [{"id": 0, "name": "NVIDIA H200"}]
    monkeypatch.undo()
    monkeypatch.setenv("DLPT_NATIVE_READ", "0")
    monkeypatch.setattr(scan_mod, "_lib", None)
    python = import_traces(str(p))
    assert (native.cct.exclusive == python.cct.exclusive).all() and native.frames == python.frames
    assert native.meta.devices == python.meta.devices


def test_the_columns_hold_the_traces_events():
    """Not a comparison with the Python reader: counts straight from the standard library's
    reading of the trace, so that both readers dropping the same events would fail here."""
    evs = raw_events("gpt_train")
    got = _native(_bytes("gpt_train.pt.trace.json.gz"))
    spans = [e for e in evs if e.get("ph") == "X" and e.get("cat") in decode_mod.HOST_CATS]
    gpu = [e for e in evs if e.get("ph") == "X" and e.get("cat") in decode_mod.GPU_CATS]
    assert len(got["spans"][0]) == len(spans) and len(got["gpu"][0]) == len(gpu) > 500
    assert got["gpu"][7] == [e["name"] for e in gpu]
    assert got["gpu"][1] == [round(e["ts"] * 1000) for e in gpu]
    assert got["gpu"][3] == [e["args"]["correlation"] for e in gpu]
    assert got["name"] == [e["name"] for e in spans]
    # Each span's name numbered by its first span; threads numbered by first appearance among
    # spans and fwdbwd flows, in event order.
    first: dict[str, int] = {}
    assert got["name_first"] == [first.setdefault(e["name"], i) for i, e in enumerate(spans)]
    order: dict[tuple, int] = {}
    span_ids = {id(e) for e in spans}
    for e in evs:
        if id(e) in span_ids or (e.get("ph") in ("s", "f") and e.get("cat") == "fwdbwd"):
            order.setdefault((e["pid"], e["tid"]), len(order))
    assert got["thread_ids"] == list(order.items()) and len(order) >= 2
    assert got["spans"][1] == [order[(e["pid"], e["tid"])] for e in spans]


def test_threads_are_numbered_by_their_first_event():
    """A thread whose first event is a flow, before another thread's first span, and whose spans
    come after and last: numbered by first events (flow or span), by both readers."""
    def ev(ph, tid, ts, **kw):
        return {"ph": ph, "cat": "fwdbwd" if ph in "sf" else "cpu_op", "name": f"op{ts}", "pid": 1, "tid": tid,
                "ts": ts, **({"dur": 0.5} if ph == "X" else {"id": ts}), **kw}

    evs = [ev("s", "B", 1), ev("X", "A", 2), ev("X", "B", 3), ev("X", "A", 4), ev("X", "B", 5), ev("f", "C", 6),
           ev("X", "C", 7)]
    data = json.dumps({"traceEvents": evs}).encode()
    for got in (_python(data), _native(data)):
        assert got["thread_ids"] == [((1, "B"), 0), ((1, "A"), 1), ((1, "C"), 2)]
        assert got["spans"][1] == [1, 0, 1, 0, 2]


# --- damage: the native scan declines, or reads exactly as the Python reader does ---

def _damage(rng: random.Random, e: dict) -> None:
    """One change to one event, of the kinds real or broken writers make."""
    kind = rng.randrange(26)
    args = e.setdefault("args", {}) if isinstance(e.get("args"), dict) or "args" not in e else None
    if kind == 0:
        e["ts"] = str(e.get("ts", 0))
    elif kind == 1:
        e["dur"] = None
    elif kind == 2:
        e["ts"] = None
    elif kind == 3:
        e["pid"] = rng.choice([1.5, True, [1], "host", -7, 2**63, 2**64 + 3])
    elif kind == 4:
        e["tid"] = rng.choice(["MainThread", 0, 2**62, -1])
    elif kind == 5:
        e["name"] = rng.choice(["naïve ∑ kernel", "quote \" and \\ slash", "tab\there", "emoji 🙂", "", "\u2028"])
    elif kind == 6 and args is not None:
        args["correlation"] = rng.choice([2**63 + 1, -5, 1.0, "7", None, 2**40])
    elif kind == 7 and args is not None:
        args["Sequence number"] = rng.choice([3, -1, 2**70, 4.5])
    elif kind == 8:
        e["ts"] = rng.choice([4.2e15, -3.0, 0, 1e-7, 123456789.123456789, 2**53 + 1, 7, 5e14])
    elif kind == 9:
        e["dur"] = rng.choice([-1, 0, 1e300, 3.999e15, 12, 0.0005])
    elif kind == 10:
        e.pop("ts", None)
    elif kind == 11:
        e.pop("dur", None)
    elif kind == 12:
        e["args"] = rng.choice(["x", [1, 2], None, {}, {"nested": {"a": [1, {"b": [2.5e10, None, True]}]}}])
    elif kind == 13:
        e["id"] = rng.choice([1, "x1", None, 2.5, [3]])
    elif kind == 14:
        e["cat"] = rng.choice(["kernel", "gpu_memcpy", "Memset", "unknown_kind", "cuda_runtime", "fwdbwd"])
    elif kind == 15:
        e["ph"] = rng.choice(["X", "s", "f", "i", "M", "B", "", "x"])
    elif kind == 16 and args is not None:
        args["device"], args["stream"] = rng.choice([(-1, -1), (3, 7), (2**63 - 1, 0)])
    elif kind == 17 and args is not None:
        args["bytes"] = rng.choice([-4, 10**6, 0])
    elif kind == 18:
        e["extra"] = rng.choice([1e999 if False else 1e308, "s", [], {"k": "v"}, -0.0, 1e-320])
    elif kind == 19 and args is not None:
        args["name"] = rng.choice(["worker", 5, None])
    elif kind == 20 and args is not None:
        args["Addr"] = rng.choice([12, "0x1", -1])
    elif kind == 21:
        e["ts"] = rng.choice([1.5, 2**60, -(2**60), 1e16])
    elif kind == 22:
        e["pid"], e["tid"] = "rank0", "stream 7"
    elif kind == 23:
        for k in rng.sample(["name", "cat", "pid", "tid", "args", "id"], 2):
            e.pop(k, None)
    elif kind == 24:
        e["name"] = rng.choice(["\x00x", "\U0001f642", "a/b", "\b\f"])  # written escaped, or raw where ASCII is off
    else:
        e.clear()


def _doc_bytes(doc: dict, rng: random.Random) -> bytes:
    """The document as JSON with varied spacing (the writer's choice, not the data's)."""
    seps = rng.choice([(",", ":"), (", ", ": "), (",\n", ":\t")])
    return json.dumps(doc, separators=seps, ensure_ascii=rng.random() < 0.5, allow_nan=False).encode()


def test_damaged_traces_read_the_same_or_are_declined():
    """80 traces, each with 1, 3 or 20 events changed: wherever the scan reads one, it reads it as
    the Python reader does (strictly or leniently); it declines the rest. Both outcomes must
    occur often, or this test would not be testing the comparison."""
    read = declined = 0
    for seed in range(80):
        rng = random.Random(seed)
        with gzip.open(trace_path("threaded"), "rt") as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        for _ in range(rng.choice([1, 3, 20])):
            _damage(rng, events[rng.randrange(len(events))])
        data = _doc_bytes(doc, rng)
        got = _native(data)
        try:
            want = _python(data)
        except Exception as e:  # the Python reader refuses it: so must the scan
            assert got is None, f"seed {seed}: the scan read what the Python reader refuses ({e})"
            continue
        if got is None:
            declined += 1
            continue
        read += 1
        for k in want:
            assert got[k] == want[k], (seed, k)
    assert read >= 15 and declined >= 15, (read, declined)


def test_bytes_cut_or_changed_anywhere_never_misread():
    """300 copies of a small trace, each cut short or with one byte changed somewhere: the scan
    (C reading untrusted bytes) declines, or reads what the Python reader reads; it never crashes
    the process (this test would die with it) or reads past its piece."""
    rng = random.Random(7)
    base = json.dumps({"traceEvents": raw_events("cudagraph_mlp")}).encode()
    read = declined = 0
    for i in range(300):
        data = bytearray(base)
        at = rng.randrange(len(data))
        if i % 3 == 0:
            del data[at:]
            data += b"]}" if i % 2 else b""
        else:
            data[at] = rng.choice(b'{}[]",:\\ 0123456789.eE-+ntfu\x00\x7f\x80\xc3\xff')
        data = bytes(data)
        try:
            lo, hi = _bounds(data)
        except ValueError:
            continue
        got = _native(data)
        if got is None:
            declined += 1
            continue
        try:
            want = _python(data)
        except Exception as e:
            pytest.fail(f"copy {i}: the scan read bytes the Python reader refuses ({e})")
        assert got == want, i
        read += 1
    assert read >= 60 and declined >= 60, (read, declined)


def test_odd_but_valid_json_reads_the_same():
    """Escapes in values, a key order no writer uses, unicode, whitespace between every token."""
    evs = copy.deepcopy(raw_events("copies"))
    escapes = " \u00e9\u4e2d\"q\"\\ /\b\f\n\r\t\x01 \U0001f642"  # every escape JSON has, and a surrogate pair
    for i, e in enumerate(evs):
        if i % 5 == 0 and "name" in e:
            e["name"] = e["name"] + escapes
        if i % 3 == 0:
            evs[i] = dict(reversed(list(e.items())))
        if i % 7 == 0:  # fields left out: each reads as its default
            for k in (["name"], ["cat", "args"], ["pid"], ["tid", "id"])[i % 4]:
                e.pop(k, None)
    doc = {"schemaVersion": 1, "traceEvents": evs, "traceName": "x"}
    for ascii_only in (True, False):
        data = json.dumps(doc, indent=1, ensure_ascii=ascii_only).encode()
        assert (b"\\ud83d\\ude42" in data) == ascii_only
        got = _native(data)
        assert got is not None
        assert got == _python(data)


@pytest.mark.parametrize("text,why", [
    (b'{"ph": "X", "ph": "X"}', "a field given twice"),
    (b'{"p\\u0068": "X"}', "a key with an escape"),
    (b'{"ts": NaN}', "a time that is not a number"),
    (b'{"pid": 1.5}', "a float where an int or string belongs"),
    (b'{"args": {"correlation": 9223372036854775808}}', "an integer past int64"),
    (b'{"name": "\\ud800"}', "a surrogate escape"),
    (b'{"name": "\\ud800\\u0041"}', "a surrogate escape"),
    (b'{"name": "\\udc00"}', "a surrogate escape"),
    (b'{"name": "\\ud800\\ue000"}', "a surrogate escape"),
    (b'{"name": "\xff"}', "bytes that are not UTF-8"),
    (b'{"ts": 01}', "a number with a leading zero"),
    (b'{"ts": 5e15}', "a time past 4e15 us"),
    (b'{"dur": null}', "a time that is not a number"),
    (b'{"ph": "X"} {"ph": "X"}', "',' expected between events"),
    (b'{"name": "\\x"}', "a bad escape"),
    (b'{"name": "a\tb"}', "a control character in a string"),
])
def test_it_declines_what_it_cannot_read_exactly(text, why):
    data = b'{"traceEvents": [' + text + b"]}"
    with pytest.raises(scan_mod.Declined, match=why):
        list(scan_mod.Scan(data, *_bounds(data)))


def test_times_as_written_read_the_same():
    """Decimal times as writers print them, some past what a double holds exactly: the scan's
    number reading (a fast path for most, strtod for the rest) gives msgspec's doubles."""
    values = ["0.5", "1.0005", "4358208933898.772", "9999999999999.999", "999999999999.9999", "3999999999999.9995",
              "123.456789012345678", "0.1", "1e3", "2.5E-4", "-3.25", "7", "0.000001", "1234567890123.4567",
              "8005000000000.001", "9007199254740.993", "1.7976931348623157", "3.999999999999999e15"]
    rows = [f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {v}, "dur": {v}, '
            f'"args": {{"correlation": {i}, "device": 0, "stream": 7}}}}' for i, v in enumerate(values)]
    data = ('{"traceEvents": [' + ", ".join(rows) + "]}").encode()
    got = _native(data)
    assert got is not None
    assert got == _python(data)
    assert got["gpu"][1][2] == 4358208933898772


def test_times_to_nanoseconds_by_the_one_rule():
    """`ns_of_parts` (the scan's times) gives what `_ns` gives one value at a time."""
    ints = [0, 1, -1, 7, 2**53 // 1000, 4611686018427387, 4611686018427388, -4611686018427388, 3999999999999999]
    floats = [0.0, 0.5, 1.0005, 2.5e-4, 0.0015, 123456789.123456, 4358208933898.772, -3.25, 3.9e15, 1e-9]
    kind = np.array([1] * len(ints) + [2] * len(floats) + [0], dtype=np.int8)
    bits = np.array(ints + [0] * len(floats) + [0], dtype=np.int64)
    bits[len(ints):len(ints) + len(floats)] = np.array(floats, dtype=np.float64).view(np.int64)
    ns, ok = columns.ns_of_parts(kind, bits)
    for v, n, k in zip([*ints, *floats, None], ns.tolist(), ok.tolist()):
        want = columns._ns(v)
        valid = want is not None and -columns._NS_LIMIT < want < columns._NS_LIMIT
        assert k == valid, v
        if valid:
            assert n == want, v


# --- the build ---

def test_built_once_said_once_and_the_same_report_without_it(tmp_path):
    big = tmp_path / "big.json"
    with gzip.open(trace_path("gpt_train"), "rb") as f:
        big.write_bytes(f.read())
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache)}

    def report(**extra: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "dlpt", "report", str(big), "--view", "flat", "--by", "line"],
                           capture_output=True, text=True, env={**os.environ, **env, **extra}, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r

    first, second = report(), report()
    assert "dlpt: building the native trace reader (once" in first.stderr
    assert second.stderr == ""
    assert len(list((cache / "dlpt").glob("kineto-scan-*.so"))) == 1
    without = report(DLPT_NATIVE_READ="0")
    assert without.stdout == first.stdout == second.stdout and without.stderr == ""


def test_no_compiler_reads_in_python_and_says_so_once(tmp_path):
    big = tmp_path / "big.json"
    with gzip.open(trace_path("gpt_train"), "rb") as f:
        big.write_bytes(f.read())
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "CC": str(tmp_path / "no-such-cc")}
    runs = [subprocess.run([sys.executable, "-m", "dlpt", "report", str(big), "--view", "flat", "--by", "line"],
                           capture_output=True, text=True, env=env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert "the native trace reader did not build" in runs[0].stderr and "reading traces in Python" in runs[0].stderr
    assert runs[1].stderr == ""  # tried again after a day, not on every run
    ok = subprocess.run([sys.executable, "-m", "dlpt", "report", str(big), "--view", "flat", "--by", "line"],
                        capture_output=True, text=True, env={**os.environ, "DLPT_NATIVE_READ": "0"})
    assert runs[0].stdout == ok.stdout
