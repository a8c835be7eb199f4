"""A corpus of bad and odd inputs for every command that reads. Bad input: one `dlpt: ` line,
exit status 2, no traceback. Survivable damage: a warning that counts what was skipped.
Valid oddities: they work."""

from __future__ import annotations

import gzip
import importlib
import json
import sqlite3
import subprocess
import sys
import warnings

import pytest
from conftest import THREE_STEPS, dlpt_in_process, raw_events, trace_path

GOOD = {"traceEvents": raw_events("cudagraph_mlp")}


def _events(extra):
    return json.dumps({"traceEvents": GOOD["traceEvents"] + extra}).encode()


BAD_FILES = {
    "empty.json": b"",
    "spaces.json": b"   \n\t ",
    "not-gzip.json.gz": b"plain text, not gzip",
    "cut.json.gz": gzip.compress(json.dumps(GOOD).encode())[:500],
    "cut.json": json.dumps(GOOD).encode()[:-200],
    "list.json": b"[1, 2, 3]",
    "string.json": b'"hello"',
    "no-events.json": b'{"foo": 1}',
    "events-not-list.json": b'{"traceEvents": {"a": 1}}',
    "latin1.json": '{"traceEvents": [{"name": "caf\xe9"'.encode("latin-1") + b"\xff]}",
    "binary.json": bytes(range(256)) * 10,
    "garbage.dlpt": b"\x00\x01garbage" * 100,
    "fake-sqlite.dlpt": b"SQLite format 3\x00" + b"\x00" * 200,
    # C's spelling of NaN: not JSON of any dialect.
    "c-nan.json": _events([]).replace(b'"dur": ', b'"dur": nan, "x": ', 1),
}

NAN = float("nan")
# Python's json.dump writes NaN, Infinity and -Infinity; so do tools built on it.
NONFINITE = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": NAN, "dur": 1.0},
             {"ph": "X", "cat": "kernel", "name": "check_NaN, NaN, [inf, 1]", "pid": 0, "tid": 7, "ts": 1.0,
              "dur": float("inf")},
             {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": float("-inf"), "dur": 2.0},
             {"ph": "X", "cat": "cpu_op", "name": "NaN: [NaN, Infinity]", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0,
              "args": {"Sequence number": NAN, "correlation": float("inf")}}]

SURVIVABLE = {
    # Wrong types and missing fields in some events of a good trace.
    "wrong-types.json": _events([{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1},
                                 {"ph": "X", "cat": "cpu_op", "name": ["x"], "ts": 1.0, "dur": 2.0},
                                 {"ph": "X", "cat": "kernel", "name": "neg", "ts": 1.0, "dur": -5.0}]),
    # NaN and Infinity (not JSON): read as missing; the three events whose time is one are skipped.
    "nonfinite.json": _events(NONFINITE),
}

ODD_BUT_VALID = {
    # A kernel with no launch record, a zero-length kernel, a huge name, markup and escapes.
    "odd.json": _events([
        {"ph": "X", "cat": "kernel", "name": "orphan_kernel", "pid": 0, "tid": 7, "ts": 10.0, "dur": 3.5,
         "args": {"correlation": 987654321}},
        {"ph": "X", "cat": "kernel", "name": "zero", "pid": 0, "tid": 7, "ts": 11.0, "dur": 0.0, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "k" * 100_000, "pid": 0, "tid": 7, "ts": 12.0, "dur": 1.0},
        {"ph": "X", "cat": "kernel", "name": "\x1b[31m[bold red]evil[/bold red]\x07", "pid": 0, "tid": 7,
         "ts": 13.0, "dur": 2.0},
    ]),
    "utf16.json": json.dumps(GOOD).encode("utf-16"),
    "bom.json": b"\xef\xbb\xbf" + json.dumps(GOOD).encode(),
    # The Chrome trace format's array form: the events alone, the closing bracket optional.
    "array.json": json.dumps(GOOD["traceEvents"]).encode(),
    "array-open.json": json.dumps(GOOD["traceEvents"]).encode()[:-1] + b",\n",
    "array.json.gz": gzip.compress(json.dumps(GOOD["traceEvents"], indent=1).encode()),
}

COMMANDS = [
    ("report", "{p}"),
    ("report", "{p}", "--view", "flat", "--by", "kernel"),
    ("export", "{p}", "-f", "hotspots", "-o", "-"),
    ("import", "{p}", "-o", "{out}"),
]


def dlpt(*args):
    """The command run in this process: the corpus is ~90 commands (conftest.dlpt_in_process);
    `test_bad_input_as_a_process` runs a few as real processes."""
    return dlpt_in_process(*args)


def dlpt_process(*args):
    return subprocess.run([sys.executable, "-m", "dlpt", *args], capture_output=True, text=True, timeout=120)


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _args(cmd, p, out):
    return [a.format(p=p, out=out) for a in cmd]


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_bad_files(tmp_path, name, cmd):
    p = _write(tmp_path, name, BAD_FILES[name])
    out = tmp_path / "out.dlpt"
    r = dlpt(*_args(cmd, p, out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("dlpt: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and name in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["cut.json.gz", "garbage.dlpt", "fake-sqlite.dlpt"])
def test_bad_input_as_a_process(tmp_path, name):
    """The corpus's contract as the shell sees it: a process that exits 2 with one `dlpt: ` line."""
    p = _write(tmp_path, name, BAD_FILES[name])
    r = dlpt_process("report", str(p))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith("dlpt: ") and r.stderr.count("\n") == 1 and name in r.stderr, r.stderr


@pytest.mark.parametrize("name", sorted(SURVIVABLE))
def test_survivable_damage_is_counted(tmp_path, name):
    p = _write(tmp_path, name, SURVIVABLE[name])
    r = dlpt("report", str(p), "--format", "json", "--view", "flat", "--by", "kernel")
    assert r.returncode == 0, r.stderr
    assert "skipped 3 malformed events" in r.stderr
    doc = json.loads(r.stdout)
    good_ns = sum(round(e["dur"] * 1000) for e in GOOD["traceEvents"]
                  if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"))
    assert sum(row["self"] for row in doc["rows"]) == good_ns


# Numbers a JSON reader gives as Python ints past int64 (msgspec reads up to 2**64 - 1), and a time
# whose nanoseconds overflow a float: one extra event each beside a good trace. The kernel with a
# number past int64 keeps its time (the field reads as absent); the spans with such a time are
# skipped. Each was a traceback, or a numpy overflow warning on stderr.
BIG = 2**64 - 1
KERNEL = {"ph": "X", "cat": "kernel", "name": "k_big", "pid": 0, "tid": 7, "ts": 50.0, "dur": 2.0}
INT_TIME = {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "ts": 10**13, "args": {"name": "main"}}
PAST_INT64 = {
    "correlation": ([{**KERNEL, "args": {"correlation": BIG}}], 2000),
    "correlation-2**63": ([{**KERNEL, "args": {"correlation": 2**63}}], 2000),
    "device": ([{**KERNEL, "args": {"device": BIG}}], 2000),
    "stream": ([{**KERNEL, "args": {"stream": 2**63}}], 2000),
    "bytes": ([{**KERNEL, "cat": "gpu_memcpy", "name": "Memcpy HtoD", "args": {"bytes": BIG}}], 2000),
    "pid": ([{**KERNEL, "pid": BIG}], 2000),
    # Beside an integer time past 2**53 ns (a thread name's, on an absolute clock), the column is
    # converted one value at a time, exactly, where the overflow was a traceback.
    "span-time": ([INT_TIME, {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 1e306,
                             "dur": 5.0}], 0),
    "other-time": ([INT_TIME, {"ph": "X", "cat": "some_other", "name": "x", "pid": 1, "tid": 1, "ts": 1e306,
                              "dur": 5.0}], 0),
}


@pytest.mark.parametrize("name", sorted(PAST_INT64))
def test_numbers_past_int64_read_as_absent(tmp_path, name):
    extra, extra_ns = PAST_INT64[name]
    p = _write(tmp_path, f"{name}.json", _events(extra))
    with warnings.catch_warnings(record=True) as warned:  # numpy's overflow warning, raised in this process
        warnings.simplefilter("always")
        r = dlpt("report", str(p), "--format", "json", "--view", "flat", "--by", "kernel")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and not [w for w in warned if issubclass(w.category, RuntimeWarning)], \
        (r.stderr, [str(w.message) for w in warned])
    good_ns = sum(round(e["dur"] * 1000) for e in GOOD["traceEvents"]
                  if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"))
    assert sum(row["self"] for row in json.loads(r.stdout)["rows"]) == good_ns + extra_ns


@pytest.mark.parametrize("name", sorted(ODD_BUT_VALID))
def test_odd_but_valid_inputs_work(tmp_path, name):
    p = _write(tmp_path, name, ODD_BUT_VALID[name])
    r = dlpt("report", str(p), "--view", "flat", "--by", "kernel", "--min-percent", "0")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    if name == "odd.json":
        assert "\\x1b[31m[bold red]evil[/bold red]\\x07" in r.stdout
        r = dlpt("export", str(p), "-o", "-")
        doc = json.loads(r.stdout)
        assert doc["summary"]["unattributed"]["no launch record"] == pytest.approx(3.5 + 0 + 1 + 2)


def test_missing_paths_and_empty_directories(tmp_path):
    for args in (("report", str(tmp_path / "nope")), ("export", str(tmp_path / "nope"), "-o", "-"),
                 ("import", str(tmp_path / "nope"), "-o", str(tmp_path / "x.dlpt")),
                 ("report", str(tmp_path))):
        r = dlpt(*args)
        assert r.returncode == 2 and r.stderr.startswith("dlpt: ") and "Traceback" not in r.stderr, args


def test_foreign_and_newer_databases(tmp_path):
    foreign = tmp_path / "foreign.dlpt"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE users (name TEXT)")
    con.commit()
    con.close()
    r = dlpt("report", str(foreign))
    assert r.returncode == 2 and "not a dlpt profile" in r.stderr
    prof = tmp_path / "p.dlpt"
    assert dlpt("import", str(trace_path("threaded")), "-o", str(prof)).returncode == 0
    con = sqlite3.connect(prof)
    con.execute("PRAGMA user_version=99")
    con.commit()
    con.close()
    r = dlpt("report", str(prof))
    assert r.returncode == 2 and "newer dlpt" in r.stderr and "pip install -U dlpt" in r.stderr


def test_unwritable_output(tmp_path):
    r = dlpt("export", str(trace_path("threaded")), "-o", str(tmp_path / "no" / "such" / "dir" / "h.json"))
    assert r.returncode == 2 and r.stderr.startswith("dlpt: ") and "no such directory" in r.stderr


@pytest.mark.parametrize("name", ["array.json", "array-open.json", "array.json.gz"])
def test_the_array_form_reads_as_the_object_form(tmp_path, name):
    args = ("--format", "json", "--view", "flat", "--by", "kernel", "--top", "0")
    want = dlpt("report", str(_write(tmp_path, "object.json", json.dumps(GOOD).encode())), *args)
    got = dlpt("report", str(_write(tmp_path, name, ODD_BUT_VALID[name])), *args)
    assert got.returncode == 0 and got.stderr == "", got.stderr
    assert json.loads(got.stdout)["rows"] == json.loads(want.stdout)["rows"]


def test_the_array_form_reads_in_slices(tmp_path, monkeypatch):
    from dlpt.collectors.kineto import import_traces

    decode_mod = importlib.import_module("dlpt.collectors.kineto.decode")
    p = _write(tmp_path, "big.json", json.dumps(raw_events("gpt_train")).encode())
    whole = import_traces(str(p))
    monkeypatch.setattr(decode_mod, "CHUNK_BYTES", 20_000)
    assert decode_mod.decode_chunks(str(p)) is not None
    sliced = import_traces(str(p))
    assert (whole.cct.exclusive == sliced.cct.exclusive).all() and whole.frames == sliced.frames
    assert whole.cct.exclusive[:, 0].sum() > 0


def test_nan_and_infinity_are_read_as_missing(tmp_path, monkeypatch):
    p = _write(tmp_path, "nonfinite.json", SURVIVABLE["nonfinite.json"])
    r = dlpt("report", str(p), "--view", "flat", "--by", "op", "--metric", "cpu_time", "--top", "0")
    assert r.returncode == 0, r.stderr
    first = SURVIVABLE["nonfinite.json"].index(b'"ts": NaN') + len('"ts": ')
    assert (f"dlpt: warning: {p}: 5 NaN/Infinity values (first at byte {first:,} of its JSON), which JSON does "
            "not allow, read as missing; an event whose time or duration was one is skipped") in r.stderr
    assert "skipped 3 malformed events" in r.stderr
    assert "NaN: [NaN, Infinity]" in r.stdout  # the same letters inside a string are left alone
    # A large trace read a slice at a time says the same.
    from dlpt.collectors.kineto import import_traces

    decode_mod = importlib.import_module("dlpt.collectors.kineto.decode")
    whole = import_traces(str(p))
    monkeypatch.setattr(decode_mod, "CHUNK_BYTES", 2000)
    assert decode_mod.decode_chunks(str(p)) is not None
    sliced = import_traces(str(p))
    assert (whole.meta["nonfinite"], whole.meta["nonfinite_at"]) == (5, first)
    assert (sliced.meta["nonfinite"], sliced.meta["nonfinite_at"]) == (5, first)
    assert (whole.cct.exclusive.sum(axis=0) == sliced.cct.exclusive.sum(axis=0)).all()


def test_a_nan_dlpt_cannot_read_is_named(tmp_path):
    r = dlpt("report", str(_write(tmp_path, "c-nan.json", BAD_FILES["c-nan.json"])))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    at = BAD_FILES["c-nan.json"].index(b"nan,")
    assert f"c-nan.json: holds nan at byte {at:,} of its JSON; JSON has no NaN or Infinity" in r.stderr
    assert "re-export the trace, or replace them with null" in r.stderr


# ---- a damaged .dlpt profile: one plain line, whatever part the damage hit --------------------



@pytest.fixture(scope="module")
def recorded_profile(tmp_path_factory) -> bytes:
    """A real recording's file (dlpt record on the CPU), made once for this module."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("recorded")
    (d / "prog.py").write_text(THREE_STEPS)
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "-o", "run.dlpt", "prog.py"], cwd=d,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return (d / "run.dlpt").read_bytes()


def _zero_middle(data: bytes) -> bytes:
    q = len(data) // 4
    return data[:q] + bytes(2 * q) + data[3 * q:]


def _plainly_damaged(r: subprocess.CompletedProcess, name: str) -> None:
    import re

    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"dlpt: {name}: damaged or truncated profile (") and r.stderr.count("\n") == 1, r.stderr
    assert "record or import it again, or restore the file" in r.stderr
    # Plain words: no Python exception's name (ValueError, KeyError, DatabaseError …).
    assert "Traceback" not in r.stderr and not re.search(r"[A-Z][a-z]+(Error|Exception)\b", r.stderr), r.stderr


@pytest.mark.parametrize("damage,cut", [
    pytest.param(lambda b: b[:-1], True, id="cut-by-one-byte"),
    pytest.param(lambda b: b[: len(b) // 2], True, id="cut-in-half"),
    pytest.param(_zero_middle, False, id="middle-zeroed"),
])
def test_a_damaged_recording_is_one_plain_line(tmp_path, recorded_profile, damage, cut):
    data = damage(recorded_profile)
    p = _write(tmp_path, "run.dlpt", data)
    r = subprocess.run([sys.executable, "-m", "dlpt", "report", "run.dlpt"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    _plainly_damaged(r, "run.dlpt")
    if cut:  # said as such, whether or not SQLite would have tripped over the missing bytes
        assert f"(the file is {len(data):,} bytes; its header says {len(recorded_profile):,})" in r.stderr
    assert p.read_bytes() == data  # opened read-only: the damaged file is left as it was


# Damage inside an intact SQLite file, at each part the store reads: said by the part, not by the
# exception that decoding it raised.
INNER_DAMAGE = {
    "frames": ("UPDATE frames SET line = 'x1' WHERE id = 1", "its frames cannot be decoded"),
    "array-shape": ("UPDATE arrays SET dtype = '<i8:3,5' WHERE name = 'parent'", "its arrays cannot be decoded"),
    "array-dtype": ("UPDATE arrays SET dtype = 'nonsense:1' WHERE name = 'frame'", "its arrays cannot be decoded"),
    "array-missing": ("DELETE FROM arrays WHERE name = 'exclusive'", "the array exclusive is missing"),
    "tree-lengths": ("UPDATE arrays SET data = substr(data, 1, 8), dtype = '<i8:1' WHERE name = 'frame'",
                     "the tree's arrays differ in length"),
    "activity-lengths": ("UPDATE arrays SET data = substr(data, 1, 8), dtype = '<i8:1' WHERE name = 'activity.start'",
                         "the activity columns differ in length"),
    "metrics": ("UPDATE meta SET value = '[\"gpu_time\"]' WHERE key = 'metrics'",
                "the metric columns do not match their names"),
}


@pytest.mark.parametrize("name", sorted(INNER_DAMAGE))
def test_damage_inside_the_database_names_the_part(tmp_path, name):
    import dlpt
    from dlpt.errors import DlptError
    from dlpt.loader import open_profile
    from dlpt.store import save

    p = tmp_path / "p.dlpt"
    save(open_profile(str(trace_path("threaded"))), str(p))
    sql, said = INNER_DAMAGE[name]
    con = sqlite3.connect(p)
    con.execute(sql)
    con.commit()
    con.execute("VACUUM")  # whole pages again: the damage is inside the database, not its length
    con.close()
    with pytest.raises(DlptError) as e:
        dlpt.load(str(p))
    assert str(e.value).startswith(f"{p}: damaged or truncated profile ({said}")
    assert "Error" not in str(e.value)
