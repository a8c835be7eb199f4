"""The `.dlpt` profile file: one SQLite database (docs/ARCHITECTURE.md).

Tables users can query with sqlite3 or pandas:
  meta(key, value)             value is JSON
  frames(id, kind, name, file, line, function)
  nodes(id, parent, frame, <one column per exclusive metric>)   preorder; 0 is the root
  activity(node, kind, name, device, stream, start, duration, bytes)   name: a frames id
  activities                   a view of activity with kind and name as text
  sources(file, text)          snapshots of the user's files on the paths
and `arrays(name, dtype, data)`, the same tree as packed columns that dlpt loads in one read.

Written to a temporary file in the target directory and renamed into place, so a crash or a
`kill -9` never leaves a half-written profile. Opened read-only; nothing in it is executed.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from dlpt.cct import CCT
from dlpt.errors import DlptError
from dlpt.frames import Frame
from dlpt.header import Header
from dlpt.metrics import ACTIVITY_KIND_NAMES, COL, METRICS, METRICS_V1, collective_mask, comm_column, fmt_bytes
from dlpt.output import fsync_path, make_temp, new_file_mode, remove_temp_files, unlink_quietly
from dlpt.phases import PhaseTable, table_of
from dlpt.profile import ACTIVITY_COLUMNS, Activities, Profile

# sqlite3.SQLITE_FULL exists from Python 3.11 on; dlpt runs on 3.10 too.
_SQLITE_FULL = 13

# 2: activity rows carry `count` (a recording aggregates them); version 1 files read as count 1.
# 3: the comm_time metric column; the `metrics` meta key names the columns of `exclusive`.
# Earlier profiles still open: their columns are METRICS_V1, and comm_time comes from their
# activities. A dlpt that reads up to version 2 refuses a version-3 file with "upgrade dlpt".
SCHEMA_VERSION = 3
MAGIC = "dlpt"

_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE frames (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT NULL,
                     file TEXT NOT NULL, line INTEGER NOT NULL, function TEXT NOT NULL);
CREATE TABLE nodes (id INTEGER PRIMARY KEY, parent INTEGER NOT NULL, frame INTEGER NOT NULL,
                    {", ".join(f"{m} INTEGER NOT NULL" for m in METRICS)});
CREATE TABLE activity (node INTEGER NOT NULL, kind INTEGER NOT NULL, name INTEGER NOT NULL,
                       device INTEGER NOT NULL, stream INTEGER NOT NULL, start INTEGER NOT NULL,
                       duration INTEGER NOT NULL, bytes INTEGER NOT NULL, count INTEGER NOT NULL);
CREATE TABLE activity_kinds (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE VIEW activities AS
  SELECT a.node, k.name AS kind, f.name AS name, a.device, a.stream, a.start, a.duration, a.bytes, a.count
  FROM activity a JOIN activity_kinds k ON k.id = a.kind JOIN frames f ON f.id = a.name;
CREATE TABLE sources (file TEXT PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE arrays (name TEXT PRIMARY KEY, dtype TEXT NOT NULL, data BLOB NOT NULL);
"""


# Refuse to start a recording with less free space than this in the output directory: a nearly
# full disk is better reported before the program runs than after (docs/ROBUSTNESS.md).
MIN_FREE_BYTES = 1 << 20


def _free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def check_output(path: str, force: bool, hint: str = "pass --force to overwrite it") -> None:
    """Before a recording starts: can a profile be written at `path`? Raise DlptError if not.

    Checked for real — a file is created and removed in the directory — because permission bits
    say nothing to root, nor about a read-only mount. Stale temporary files of dead dlpt
    processes in the directory are removed first, which may free the space the check needs.
    """
    full = os.path.abspath(path)
    directory = os.path.dirname(full)
    if os.path.isdir(full):
        raise DlptError(f"{path} is a directory; give the profile a file name, e.g. -o {os.path.join(path, 'run.dlpt')}")
    if os.path.lexists(full):
        if not force:
            raise DlptError(f"{path} exists; {hint}")
        if not os.path.isfile(full):
            raise DlptError(f"{path} exists and is not a regular file; dlpt would replace it, choose another name")
    if not os.path.isdir(directory):
        up = directory
        while up and not os.path.lexists(up):
            up = os.path.dirname(up)
        if up and not os.path.isdir(up):
            raise DlptError(f"{up} is a file, not a directory; the profile {path} cannot be written under it")
        raise DlptError(f"{directory}: no such directory for the profile")
    remove_temp_files(directory)
    try:
        fd, probe = make_temp(directory)
    except OSError as e:
        raise DlptError(f"cannot write in {directory} ({e.strerror or e}); choose another place with -o") from None
    os.close(fd)
    unlink_quietly(probe)
    free = _free_bytes(directory)
    if free is not None and free < MIN_FREE_BYTES:
        raise DlptError(f"only {fmt_bytes(free)} free in {directory}; a profile needs at least "
                        f"{fmt_bytes(MIN_FREE_BYTES)}: free some space or choose another place with -o")


def save(profile: Profile, path: str, force: bool = True) -> None:
    """Write `profile` to `path` atomically. Without `force`, an existing file is an error.

    The file appears complete or not at all: it is written to a temporary file in the same
    directory, flushed to the disk, and renamed over `path`. On any failure or interrupt
    (KeyboardInterrupt included) the temporary file is removed and `path` keeps what it had.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if not force and os.path.exists(path):
        raise DlptError(f"{path} exists; pass --force to overwrite it")
    if not os.path.isdir(directory):
        raise DlptError(f"{directory}: no such directory for the profile")
    remove_temp_files(directory)
    tmp = None
    try:
        fd, tmp = make_temp(directory)
        try:
            # mkstemp makes the file private (0600); a profile is shared like any output file.
            os.fchmod(fd, new_file_mode())
        finally:
            os.close(fd)
        con = sqlite3.connect(tmp)
        try:
            _write(con, profile)
            con.commit()
        finally:
            con.close()
        fsync_path(tmp)
        os.replace(tmp, path)
        tmp = None
        try:  # the rename itself survives a crash only once the directory is on disk
            fsync_path(directory)
        except OSError:
            pass  # the profile is in place; a directory that cannot be synced is no error
    except sqlite3.Error as e:
        full = getattr(e, "sqlite_errorcode", None) == _SQLITE_FULL or "full" in str(e)
        raise DlptError(_no_space(path, directory) if full else f"cannot write {path}: {e}") from None
    except OSError as e:
        if tmp is None and not os.path.isdir(directory):
            raise DlptError(f"{directory}: no such directory for the profile") from None
        if e.errno == errno.ENOSPC:
            raise DlptError(_no_space(path, directory)) from None
        raise DlptError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:  # failed or interrupted before the rename
            unlink_quietly(tmp)


def _no_space(path: str, directory: str) -> str:
    free = _free_bytes(directory)
    left = f"; {fmt_bytes(free)} free in {directory}" if free is not None else ""
    return f"cannot write {path}: no space left on the device{left}"


def _write(con: sqlite3.Connection, profile: Profile) -> None:
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.executescript(_SCHEMA)
    con.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    arrays, table = _arrays(profile)
    # The header's keys and JSON values as they always were (dlpt/header.py): older dlpt
    # versions read the table as before.
    meta = profile.meta.to_dict()
    meta["format"] = MAGIC
    meta["metrics"] = list(METRICS)
    # A CRC-32 of every array's bytes: SQLite checks its own structure, not its values, so one
    # flipped bit in a page of numbers would otherwise load as a wrong figure (issue #35).
    meta["checksums"] = {k: zlib.crc32(np.ascontiguousarray(v).tobytes()) for k, v in arrays.items()}
    con.executemany("INSERT INTO meta VALUES (?, ?)",
                    [(k, json.dumps(v, default=str)) for k, v in meta.items()])
    con.executemany("INSERT INTO frames VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, f.kind, f.name, f.file, int(f.line), f.function) for i, f in enumerate(profile.frames)])
    cct = profile.cct
    cols = np.column_stack([np.arange(len(cct)), cct.parent, cct.frame, cct.exclusive])
    con.executemany(f"INSERT INTO nodes VALUES ({', '.join('?' * cols.shape[1])})", cols.tolist())
    a = profile.activities
    if len(a):
        rows = np.column_stack([getattr(a, c) for c in ACTIVITY_COLUMNS])
        con.executemany("INSERT INTO activity VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows.tolist())
    con.executemany("INSERT INTO activity_kinds VALUES (?, ?)", list(enumerate(ACTIVITY_KIND_NAMES)))
    con.executemany("INSERT INTO sources VALUES (?, ?)", sorted(profile.sources.items()))
    if table is not None:
        # Each phase's metrics (dlpt/phases.py), their names in meta; a reader that knows no
        # phases reads the tree as before.
        con.execute("INSERT INTO meta VALUES (?, ?)", ("phase_table", json.dumps(list(table.names))))
    con.executemany("INSERT INTO arrays VALUES (?, ?, ?)",
                    [(k, f"{v.dtype.str}:{','.join(map(str, v.shape))}", np.ascontiguousarray(v).tobytes())
                     for k, v in arrays.items()])


def _arrays(profile: Profile) -> tuple[dict[str, np.ndarray], Any]:
    """The numeric arrays a profile is stored as (the `arrays` table), and its phase table."""
    cct, a = profile.cct, profile.activities
    arrays = {"parent": cct.parent, "frame": cct.frame, "exclusive": cct.exclusive}
    arrays.update({f"activity.{c}": getattr(a, c) for c in ACTIVITY_COLUMNS})
    table = table_of(profile)
    if table is not None:
        arrays.update({"phase.node": table.node, "phase.phase": table.phase, "phase.exclusive": table.exclusive,
                       "phase.activity": table.activity_phase})
    return arrays, table


_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_profile_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == _SQLITE_MAGIC
    except OSError:
        return False


def load(path: str) -> Profile:
    """Read a `.dlpt` profile, read-only."""
    if not os.path.exists(path):
        raise DlptError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise DlptError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not head.startswith(_SQLITE_MAGIC):
        raise DlptError(f"{path}: not a dlpt profile (not an SQLite database)")
    cut = _cut_short(head, os.path.getsize(path))
    if cut:
        raise _damaged(path, cut)
    try:
        con = sqlite3.connect(f"file:{_uri_path(path)}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as e:
        raise _damaged(path, f"SQLite cannot open it: {e}") from None
    try:
        return _read(con, path)
    except DlptError:
        raise
    except sqlite3.Error as e:  # outside the parts _read names
        raise _damaged(path, f"SQLite says {e}") from None
    except _DECODING_ERRORS:
        raise _damaged(path, "its contents cannot be decoded") from None
    finally:
        con.close()


# What decoding a damaged file trips on; Python's exception says nothing to the user, the part
# of the file that could not be read does.
_DECODING_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError, MemoryError)


def _damaged(path: str, what: str) -> DlptError:
    """The one message for a `.dlpt` file that is damaged: said in plain words first, what is
    wrong after, then what to do (no exception names: the user did nothing wrong in code)."""
    return DlptError(f"{path}: damaged or truncated profile ({what}); record or import it again, "
                     "or restore the file from a copy")


def _cut_short(head: bytes, size: int) -> str | None:
    """What shows that a file of `size` bytes that starts with `head` (its first 100 bytes)
    was cut short (a copy, download or disk that stopped early), or None. SQLite itself does
    not notice: opened immutable, it reads a missing last page as zeros and hands back mangled
    rows, or none. Its header gives the page size and, where the header is current, the page
    count, so the file's length is known."""
    if len(head) < 100:
        return f"the file is {size:,} bytes, shorter than SQLite's 100-byte header"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page  # the header's way of writing 64 KiB
    if page < 512 or page & (page - 1):
        return "its header names no valid page size"
    # The page count at byte 28 is valid when the change counter at 24 matches the copy at 92
    # (SQLite 3.7.0 and later always keep them so).
    pages = int.from_bytes(head[28:32], "big")
    if head[24:28] == head[92:96] and pages and size < pages * page:
        return f"the file is {size:,} bytes; its header says {pages * page:,}"
    if size % page:
        return f"the file is {size:,} bytes, not a whole number of its {page:,}-byte pages"
    return None


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.path.abspath(path))


@contextmanager
def _reading(path: str, part: str) -> Iterator[None]:
    """Name the part of the file that damage made unreadable: SQLite's error or whatever
    decoding trips on (int() of a mangled line number, an array of the wrong size) becomes
    "PATH: damaged or truncated profile (its frames cannot be read: …)"."""
    try:
        yield
    except sqlite3.Error as e:
        # "database disk image is malformed", "file is not a database": SQLite's own words.
        raise _damaged(path, f"{part} cannot be read: SQLite says {e}") from None
    except _DECODING_ERRORS:
        raise _damaged(path, f"{part} cannot be decoded") from None


def _read(con: sqlite3.Connection, path: str) -> Profile:
    with _reading(path, "its list of tables"):
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = con.execute("PRAGMA user_version").fetchone()[0]
    if not {"meta", "frames", "arrays"} <= tables:
        raise DlptError(f"{path}: an SQLite database, but not a dlpt profile")
    if version > SCHEMA_VERSION:
        raise DlptError(f"{path}: written by a newer dlpt (profile schema {version}, this dlpt reads "
                        f"up to {SCHEMA_VERSION}); upgrade dlpt with: pip install -U dlpt")
    meta: dict[str, Any] = {}
    with _reading(path, "its meta table"):
        for k, v in con.execute("SELECT key, value FROM meta"):
            try:
                meta[k] = json.loads(v)
            except (TypeError, ValueError):
                meta[k] = v
    if meta.get("format") != MAGIC:
        raise DlptError(f"{path}: an SQLite database, but not a dlpt profile")
    with _reading(path, "its frames"):
        frames = [Frame(str(k), str(n), str(fi or ""), int(ln or 0), str(fn or ""))
                  for k, n, fi, ln, fn in con.execute(
                      "SELECT kind, name, file, line, function FROM frames ORDER BY id")]
    arrays: dict[str, np.ndarray] = {}
    crcs: dict[str, int] = {}
    with _reading(path, "its arrays"):
        for name, dtype, data in con.execute("SELECT name, dtype, data FROM arrays"):
            crcs[name] = zlib.crc32(data)
            dt, _, shape = dtype.partition(":")
            dims = tuple(int(x) for x in shape.split(",") if x)
            arrays[name] = np.frombuffer(data, dtype=np.dtype(dt)).reshape(dims)
    sums = meta.pop("checksums", None)  # profiles written before checksums have none
    missing = [n for n in ("parent", "frame", "exclusive", *(f"activity.{c}" for c in ACTIVITY_COLUMNS[:-1]))
               if n not in arrays]
    if missing:
        raise _damaged(path, f"the array {missing[0]} is missing")
    columns: list[Any] = [arrays.get(f"activity.{c}") for c in ACTIVITY_COLUMNS]  # no count: version 1
    if len({len(c) for c in columns if c is not None}) > 1:
        raise _damaged(path, "the activity columns differ in length")
    with _reading(path, "its tree"):
        act = Activities(*columns)
        metric_names = meta.pop("metrics", None) or METRICS_V1
        exc = _metric_columns(arrays["exclusive"], metric_names, frames, act, path)
        if not (arrays["parent"].ndim == arrays["frame"].ndim == 1 and len(arrays["frame"]) == len(arrays["parent"])
                == len(exc)):
            raise _damaged(path, "the tree's arrays differ in length")
        cct = CCT(arrays["parent"], arrays["frame"], exc)
    if len(cct.frame) and (cct.frame.min() < 0 or cct.frame.max() >= len(frames)):
        raise _damaged(path, "nodes refer to missing frames")
    par = cct.parent[1:]
    if len(par) and ((par < 0).any() or (par >= np.arange(1, len(cct))).any()):
        raise _damaged(path, "the tree is not in preorder")
    if len(act) and (act.node.min() < 0 or act.node.max() >= len(cct)):
        raise _damaged(path, "activities refer to missing nodes")
    with _reading(path, "its source snapshots"):
        sources = dict(con.execute("SELECT file, text FROM sources")) if "sources" in tables else {}
    names = meta.pop("phase_table", None)
    # Typed here, from the table's keys (dlpt/header.py): unknown ones kept for the next save.
    prof = Profile(frames=frames, cct=cct, activities=act, meta=Header.from_dict(meta, version), sources=sources,
                   path=path)
    if isinstance(names, list) and "phase.node" in arrays:
        with _reading(path, "its phase table"):
            node, phase = arrays["phase.node"], arrays["phase.phase"]
            pexc = _metric_columns(arrays["phase.exclusive"], metric_names, frames, Activities.empty(), path)
            act_phase = arrays.get("phase.activity", np.zeros(0, np.int64))
            if (len(node) != len(phase) or len(node) != len(pexc) or len(act_phase) != len(act)
                    or (len(node) and (node.min() < 0 or node.max() >= len(cct)))):
                raise _damaged(path, "the phase table does not match the tree")
            prof.phases = PhaseTable(tuple(str(n) for n in names), node, phase, pexc, act_phase, cct, act)
    # Last: a damage the checks above name more exactly is said as such.
    if isinstance(sums, dict):
        for name, crc in crcs.items():
            if name in sums and crc != sums[name]:
                raise _damaged(path, f"the array {name} does not match its checksum")
    return prof


def _metric_columns(stored: np.ndarray, names: list[str] | tuple[str, ...], frames: list[Frame],
                    act: Activities, path: str) -> np.ndarray:
    """The stored exclusive matrix with its columns in this dlpt's METRICS order, matched by
    name. A metric the file lacks is zero, except comm_time, which older profiles can give
    exactly: it is the time of their collective kernels, and every kernel is in `activity`."""
    names = [str(m) for m in names]
    if tuple(names) == METRICS:
        return stored
    if stored.ndim != 2 or stored.shape[1] != len(names):
        raise _damaged(path, "the metric columns do not match their names")
    out = np.zeros((stored.shape[0], len(METRICS)), dtype=np.int64)
    for j, m in enumerate(names):
        if m in COL:
            out[:, COL[m]] = stored[:, j]
    if "comm_time" not in names and len(act):
        coll = collective_mask(frames, act.name, act.kind)
        out[:, COL["comm_time"]] = comm_column(len(out), act.node, act.duration, coll)
    return out
