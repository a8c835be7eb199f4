"""The typed profile header (dlpt/header.py): the meta table read into fields and written back
as it was, older and newer files alike; dlpt's own modules read fields, not keys."""

import json
import re
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import dlpt
from dlpt.header import Header
from dlpt.metrics import METRICS
from dlpt.store import save

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "cpu_train_small.dlpt"


def _table(path: Path) -> dict[str, str]:
    con = sqlite3.connect(path)
    try:
        return {k: v for k, v in con.execute("SELECT key, value FROM meta") if k != "checksums"}
    finally:
        con.close()


def test_keys_round_trip_unknown_null_and_mistyped():
    stored = {"command": "train.py", "steps": None, "rank": "0", "from_the_future": {"x": [1, 2.5]},
              "window": {"start": 1, "end": 5}, "ranks": [{"rank": 0, "path": "a", "novel": 1}]}
    h = Header.from_dict(stored, schema=3)
    assert h.command == "train.py" and h.window == {"start": 1, "end": 5}
    assert h.rank is None and h.extra["rank"] == "0"  # not an int: kept, not trusted
    assert h.steps is None and "steps" in h  # a null key stays a null key
    assert h.ranks is not None and h.ranks[0].path == "a" and h.ranks[0].extra == {"novel": 1}
    assert h.to_dict() == stored


def test_a_file_with_keys_this_dlpt_does_not_know_keeps_them(tmp_path):
    old = tmp_path / "old.dlpt"
    shutil.copy(SAMPLE, old)
    con = sqlite3.connect(old)
    con.execute("INSERT INTO meta VALUES (?, ?)", ("from_the_future", json.dumps({"a": 1})))
    con.execute("UPDATE meta SET value = ? WHERE key = 'steps_seen'", (json.dumps("many"),))
    con.commit()
    con.close()
    prof = dlpt.load(str(old))
    assert prof.meta.steps_seen is None and prof.meta.extra["steps_seen"] == "many"
    again = tmp_path / "again.dlpt"
    save(prof, str(again))
    a, o = _table(again), _table(old)
    # Saved again, a file names the columns this dlpt writes: the old ones, then those added
    # since it was recorded (the PC-sample columns of 2026-11-28), each read back by name.
    assert json.loads(a.pop("metrics")) == list(METRICS)
    assert list(METRICS)[:len(json.loads(o["metrics"]))] == json.loads(o.pop("metrics"))
    assert a == o


def test_copies_and_the_mapping_view():
    h = Header(command="x", window={"start": 0, "end": 10})
    c = replace(h, phase="steady")
    c["note"] = 1
    assert h.phase is None and "note" not in h and c["phase"] == "steady"
    assert {**c} == {"command": "x", "window": {"start": 0, "end": 10}, "phase": "steady", "note": 1}
    c["rank"] = 2
    assert c.rank == 2
    del c["rank"]
    assert c.rank is None and c.get("rank") is None


def test_profile_meta_given_as_a_dict_is_typed():
    prof = dlpt.load(str(SAMPLE))
    prof.meta = {"source": "record", "command": "go"}  # type: ignore[assignment]
    assert isinstance(prof.meta, Header) and prof.meta.command == "go"


def test_own_modules_read_fields_not_keys():
    # `meta["x"]`, `meta.get("x")` and `{**meta}` on a profile's header: the typed fields instead.
    pattern = re.compile(r"""(?<!node\.)\bmeta(\.get\(|\[)["']|\*\*[\w.]*\bmeta\b(?!\.)""")
    found = []
    for folder in ("dlpt", "collectors", "viewers"):
        for path in (ROOT / folder).rglob("*.py"):
            # header.py defines the mapping view; inductor_hooks.py reads torch.fx nodes' own `meta`.
            if path.name in ("header.py", "inductor_hooks.py"):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                # a message naming the file's key for a user who opens it with sqlite3 is no read
                if pattern.search(code) and "the failure in meta[" not in code:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    # the store's table is a dict by design: keys are what it converts
    found = [f for f in found if not f.startswith("dlpt/store.py")]
    assert not found, "\n".join(found)
