"""The .dlpt SQLite file: round trip, queryable tables, atomic writes, version checks."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import trace_path

import dlpt
from dlpt.errors import DlptError
from dlpt.metrics import COL
from dlpt.output import remove_temp_files
from dlpt.store import SCHEMA_VERSION, load, save


@pytest.fixture(scope="module")
def gpt():
    return dlpt.load(str(trace_path("gpt_train")))


def test_round_trip_is_exact(gpt, tmp_path):
    out = tmp_path / "run.dlpt"
    save(gpt, str(out))
    back = load(str(out))
    assert back.frames == gpt.frames
    for a in ("parent", "frame", "exclusive"):
        assert np.array_equal(getattr(back.cct, a), getattr(gpt.cct, a))
    for c in ("node", "kind", "name", "device", "stream", "start", "duration", "bytes"):
        assert np.array_equal(getattr(back.activities, c), getattr(gpt.activities, c))
    assert back.meta["source"] == "kineto"
    assert back.meta["devices"][0]["name"] == "NVIDIA H200"


def test_tables_answer_plain_sql(gpt, tmp_path):
    out = tmp_path / "run.dlpt"
    save(gpt, str(out))
    con = sqlite3.connect(out)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    total = con.execute("SELECT sum(duration) FROM activities").fetchone()[0]
    assert total == gpt.cct.exclusive[:, COL["gpu_time"]].sum()
    assert con.execute("SELECT sum(gpu_time) FROM nodes").fetchone()[0] == total
    kinds = {k for (k,) in con.execute("SELECT DISTINCT kind FROM activities")}
    assert {"kernel", "memset", "memcpy_htod", "memcpy_dtod"} <= kinds
    top = con.execute("SELECT name, sum(duration) d FROM activities GROUP BY name ORDER BY d DESC LIMIT 1").fetchone()
    assert "gemm" in top[0] or "Kernel" in top[0]


def test_existing_file_needs_force(gpt, tmp_path):
    out = tmp_path / "run.dlpt"
    out.write_text("keep me")
    with pytest.raises(DlptError, match="--force"):
        save(gpt, str(out), force=False)
    assert out.read_text() == "keep me"
    save(gpt, str(out), force=True)
    assert load(str(out)).cct.exclusive.sum() == gpt.cct.exclusive.sum()


def test_no_temporary_files_are_left(gpt, tmp_path):
    save(gpt, str(tmp_path / "a.dlpt"))
    assert sorted(os.listdir(tmp_path)) == ["a.dlpt"]


def test_newer_schema_and_foreign_databases_are_refused(gpt, tmp_path):
    out = tmp_path / "run.dlpt"
    save(gpt, str(out))
    con = sqlite3.connect(out)
    con.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    with pytest.raises(DlptError, match="newer dlpt"):
        load(str(out))
    foreign = tmp_path / "other.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(DlptError, match="not a dlpt profile"):
        load(str(foreign))
    junk = tmp_path / "junk.dlpt"
    junk.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(DlptError):
        dlpt.load(str(junk))


# Moved from test_durability.py, whose module needs torch to record: these two need only the store.
def temps(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(".dlpt-") and n.endswith(".tmp"))


def test_stale_temp_files_of_dead_processes_only(tmp_path: Path) -> None:
    from dlpt.output import _host_tag

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = _host_tag()
    names = {"dead": f".dlpt-{dead.pid}-{host}-abc123.tmp", "live": f".dlpt-1-{host}-abc123.tmp",
             "other_host": f".dlpt-{dead.pid}-00000000-abc123.tmp", "not_ours": ".dlpt-abcdefgh.tmp"}
    if host == "00000000":
        del names["other_host"]
    for n in names.values():
        (tmp_path / n).write_text("x")
    assert remove_temp_files(str(tmp_path)) == [names["dead"]]
    assert sorted(os.listdir(tmp_path)) == sorted(v for k, v in names.items() if k != "dead")


def test_saved_profile_follows_the_umask(tmp_path: Path) -> None:
    prof = dlpt.load(str(Path(__file__).parent / "data" / "gpu_truth.dlpt"))
    old = os.umask(0o027)
    try:
        dlpt.store.save(prof, str(tmp_path / "p.dlpt"))
    finally:
        os.umask(old)
    assert (tmp_path / "p.dlpt").stat().st_mode & 0o777 == 0o640
    assert temps(tmp_path) == []


def test_a_flipped_bit_in_the_numbers_is_refused(gpt, tmp_path):
    """SQLite checks its pages' structure, not the values in them: a bit flipped inside the
    metrics array (written back through SQLite, so the database stays well formed) must not load
    as a wrong figure. The loader says the file is damaged, in one line."""
    path = str(tmp_path / "p.dlpt")
    save(gpt, path)
    con = sqlite3.connect(path)
    (data,) = con.execute("SELECT data FROM arrays WHERE name = 'exclusive'").fetchone()
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x10
    con.execute("UPDATE arrays SET data = ? WHERE name = 'exclusive'", (bytes(flipped),))
    con.commit()
    con.close()
    with pytest.raises(DlptError, match="the array exclusive does not match its checksum"):
        load(path)
    # The untouched file loads, and its meta carries no checksums back to the caller.
    save(gpt, path, force=True)
    back = load(path)
    assert "checksums" not in back.meta
    np.testing.assert_array_equal(back.cct.exclusive, gpt.cct.exclusive)
