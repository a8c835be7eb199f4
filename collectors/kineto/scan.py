"""The first pass's native scan (scan.c): a large trace's events read into columns in one C pass,
in place of msgspec's structs and the Python that pulls fields out of them (decode.py,
columns.py's `StructBatch`). Columns.add classifies either kind of batch by the same code.

The C file is compiled on first use with the system's C compiler (`cc`, or `$CC`) into the user's
cache (`$XDG_CACHE_HOME/dlpt`, else `~/.cache/dlpt`), one build per source, compiler and
machine, and loaded with ctypes: no torch, no Python headers. Where it cannot be built, or
`DLPT_NATIVE_READ=0`, or the scan declines a trace (scan.c says when), the Python reader reads it;
both give the same columns (tests/test_kineto_scan.py). Why: on a 523k-event trace the Python
first pass took 1.8 s of `dlpt report`'s 3.2 s on the 2-core development machine, most of it per
event attribute access; docs/BENCHMARKS.md has the figures."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgspec
import numpy as np

from dlpt.collectors.kineto.columns import ARG_FIELDS, ns_of_parts, ph_cat_codes
from dlpt.errors import notice

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scan.c")
FLAGS = ["-O2", "-shared", "-fPIC", "-std=c99"]
FAILED_RETRY_S = 86400.0  # a failed build is tried again after a day (a compiler installed since)
N_ARGS = len(ARG_FIELDS)
_I8, _I32, _I64 = ctypes.POINTER(ctypes.c_int8), ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)


class _Out(ctypes.Structure):
    # scan.c's `Out`, field for field.
    _fields_ = [("ph", _I32), ("cat", _I32), ("name", _I32), ("key", _I32), ("id", _I32),
                ("ts_kind", _I8), ("dur_kind", _I8), ("ts", _I64), ("dur", _I64), ("args", _I64),
                ("off", _I64), ("end", _I64), ("cap", ctypes.c_int64), ("defaults", ctypes.c_int64 * N_ARGS)]


class Declined(Exception):
    """The native scan did not read this trace; the Python reader reads it."""


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dlpt")


def _build_name() -> str:
    """The build's name: the source, compiler, flags and machine, checksummed (zlib, not
    hashlib: hashlib's OpenSSL costs `dlpt report` 4 MB of memory)."""
    cc = os.environ.get("CC", "cc")
    with open(SOURCE, "rb") as f:
        key = f.read() + "\0".join([cc, *FLAGS, sys.platform, platform.machine()]).encode()
    return f"kineto-scan-{zlib.crc32(key):08x}{zlib.adler32(key):08x}"


_lib: Any = None  # the loaded library; False once it could not be had in this process


def library() -> Any:
    """The scan's shared library, built if need be; None where it cannot be had."""
    global _lib
    if _lib is None:
        _lib = _load() or False
    return _lib or None


def _load() -> Any:
    if os.environ.get("DLPT_NATIVE_READ", "1") == "0":
        return None
    folder = cache_dir()
    name = _build_name()
    so = os.path.join(folder, name + ".so")
    failed = os.path.join(folder, name + ".failed")
    if not os.path.exists(so):
        try:
            if time.time() - os.path.getmtime(failed) < FAILED_RETRY_S:
                return None
        except OSError:
            pass
        if not _build(folder, so, failed):
            return None
    try:
        lib = ctypes.CDLL(so)
    except OSError:
        return None
    lib.dlpt_scan_new.restype = ctypes.c_void_p
    lib.dlpt_scan_free.argtypes = [ctypes.c_void_p]
    lib.dlpt_scan.restype = ctypes.c_int64
    lib.dlpt_scan.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, _I64]
    lib.dlpt_scan_out.restype = ctypes.POINTER(_Out)
    lib.dlpt_scan_out.argtypes = [ctypes.c_void_p]
    lib.dlpt_scan_why.restype = ctypes.c_char_p
    lib.dlpt_scan_why.argtypes = [ctypes.c_void_p, _I64]
    lib.dlpt_scan_ntokens.restype = ctypes.c_int32
    lib.dlpt_scan_ntokens.argtypes = [ctypes.c_void_p]
    lib.dlpt_scan_npairs.restype = ctypes.c_int32
    lib.dlpt_scan_npairs.argtypes = [ctypes.c_void_p]
    lib.dlpt_scan_tokens.argtypes = [ctypes.c_void_p, _I64, _I32]
    lib.dlpt_scan_pairs.argtypes = [ctypes.c_void_p, _I32, _I32]
    lib.dlpt_scan_stop.restype = ctypes.c_int64
    lib.dlpt_scan_stop.argtypes = [ctypes.c_void_p]
    return lib


def _build(folder: str, so: str, failed: str) -> bool:
    """Compile scan.c to `so` (said on stderr: it is a wait, once); on failure, say why once a
    day and leave `failed` with the compiler's words."""
    cc = os.environ.get("CC", "cc")
    tmp = f"{so}.{os.getpid()}.tmp"
    try:
        os.makedirs(folder, exist_ok=True)
        notice(f"building the native trace reader (once, into {folder})")
        res = subprocess.run([cc, *FLAGS, "-o", tmp, SOURCE], capture_output=True, text=True, timeout=120)
        if res.returncode == 0:
            os.replace(tmp, so)  # whole or not at all, should another process build it too
            return True
        why = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"{cc} exited {res.returncode}"]
        reason = why[0]
    except (OSError, subprocess.SubprocessError) as e:
        reason = str(e)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    notice(f"the native trace reader did not build ({reason}); reading traces in Python, which is slower")
    try:
        with open(failed, "w") as f:
            f.write(reason + "\n")
    except OSError:
        pass
    return False


class ScanBatch:
    """Events as scan.c wrote them, read by Columns.add as it reads a `StructBatch`: per-event
    codes and times as arrays, and the fields of a subset of events on request."""

    def __init__(self, data: bytes | bytearray, cols: dict[str, np.ndarray], tokens: list[Any],
                 pairs: list[tuple[Any, Any]], free: Callable[[], None]) -> None:
        self._data = data
        self._c = cols
        self._free: Callable[[], None] | None = free
        self.stop = 0  # where its scan stopped: its piece's end, or the events array's closing bracket
        self._tok = tokens
        self._pairs = pairs
        # Each token's and pair's first equal one: equal values, equal numbers (type-aware, so
        # that 0 and "0" stay apart).
        seen: dict[tuple[type, Any], int] = {}
        self._tok_canon = np.array([seen.setdefault((type(t), t), i) for i, t in enumerate(tokens)], dtype=np.int64)
        pseen: dict[tuple[Any, ...], int] = {}
        self._pair_canon = np.array([pseen.setdefault((type(a), a, type(b), b), i) for i, (a, b) in enumerate(pairs)],
                                    dtype=np.int64)
        # Made here, from the views: copies, so they outlive close().
        self.ph, self.cat = ph_cat_codes(tokens, cols["ph"], cols["cat"])
        self.ts = ns_of_parts(cols["ts_kind"], cols["ts"])
        self.dur = ns_of_parts(cols["dur_kind"], cols["dur"])

    def __len__(self) -> int:
        return len(self.ph)

    def close(self) -> None:
        """Free scan.c's buffers; the batch answers nothing after."""
        self._c = {}
        if self._free is not None:
            self._free()
            self._free = None

    def __del__(self) -> None:
        self.close()

    def _toks(self, col: str, idx: np.ndarray) -> list[Any]:
        return list(map(self._tok.__getitem__, self._c[col][idx].tolist()))

    def names(self, idx: np.ndarray) -> list[str]:
        return self._toks("name", idx)

    def cats(self, idx: np.ndarray) -> list[str]:
        return self._toks("cat", idx)

    def ids(self, idx: np.ndarray) -> list[Any]:
        return self._toks("id", idx)

    def keys(self, idx: np.ndarray) -> list[tuple[Any, Any]]:
        return list(map(self._pairs.__getitem__, self._c["key"][idx].tolist()))

    def name_ids(self, idx: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        """As StructBatch.name_ids, from the tokens: a token spelt two ways (escapes) is one name."""
        return self._tok_canon[self._c["name"][idx]], self._tok

    def key_ids(self, idx: np.ndarray) -> tuple[np.ndarray, list[tuple[Any, Any]]]:
        return self._pair_canon[self._c["key"][idx]], self._pairs

    def pids(self, idx: np.ndarray) -> list[Any]:
        return [k[0] for k in self.keys(idx)]

    def tids(self, idx: np.ndarray) -> list[Any]:
        return [k[1] for k in self.keys(idx)]

    def arg(self, field: str, idx: np.ndarray, bad: int | None) -> np.ndarray:
        # scan.c declines an int past int64, so `bad` (what one reads as) never applies here.
        return self._c["args"][idx, ARG_FIELDS.index(field)]

    def events(self, idx: np.ndarray) -> list[Any]:
        """The events themselves, decoded from their bytes (the rare kinds: metadata, instants)."""
        if not len(idx):
            return []
        from dlpt.collectors.kineto.decode import _events_decoder

        data, off, end = self._data, self._c["off"][idx].tolist(), self._c["end"][idx].tolist()
        try:
            return _events_decoder.decode(b"[" + b",".join(data[a:b] for a, b in zip(off, end)) + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError) as e:  # scan.c checked their types
            raise Declined(f"events it passed did not decode ({e})") from None


# The scan goes a piece of this many bytes at a time, ahead of Columns.add on other threads
# (ctypes lets the GIL go for the call): the scan's columns of only a few pieces are alive at
# once, and the C pass runs beside the Python one. 4 MB is about 14,000 events: against 16 MB
# pieces, as fast and 10 MB less at its peak on a 523k-event trace (docs/BENCHMARKS.md).
PIECE_BYTES = 4 << 20
_BETWEEN = re.compile(rb"\}\s*,\s*\{")


def _pieces(data: bytes | bytearray, lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """data[lo:hi] cut between two events about every `size` bytes. A cut that falls inside a
    string leaves a piece that is not JSON, which the scan declines: never a misreading."""
    out = []
    cur = lo
    while hi - cur > size:
        m = _BETWEEN.search(data, cur + size, hi)
        if m is None:
            break
        out.append((cur, m.start() + 1))
        cur = m.end() - 1
    out.append((cur, hi))
    return out


class Scan:
    """The events of data[lo:hi] (a JSON array's contents) as batches, in order: iterate,
    Columns.add each, then close it. Iterating raises `Declined` (at the start, or at any piece)
    where the native scan is not built or does not read them; the Python reader then reads the
    trace from the start.

    `hi` may run past the array's end (decode.py's guess at its closing bracket can be a later
    value's: HTA's traces end with an `INFO` array, others with `deviceProperties`): the scan
    stops at the array's true closing bracket, and `end` says where that was. `pieces`, when
    given, yields the pieces instead, as the bytes arrive (gunzip.py: a buffer still filling)."""

    def __init__(self, data: bytes | bytearray, lo: int, hi: int,
                 pieces: Iterator[tuple[int, int]] | None = None) -> None:
        self.data, self.lo, self.hi = data, lo, hi
        self.end = hi
        self._stream = pieces

    def __iter__(self) -> Iterator[ScanBatch]:
        lib = library()
        if lib is None:
            raise Declined("not built")
        data = self.data
        if self._stream is not None:
            pieces, threads = self._stream, True
        else:
            listed = _pieces(data, self.lo, self.hi, PIECE_BYTES)
            pieces, threads = iter(listed), len(listed) > 1
        # Two scanning threads, two pieces ahead: the scan is the slower half (about 0.5 s of C
        # against 0.25 s of Columns.add on a 523k-event trace), so on two cores both threads scan
        # while the main thread adds; three pieces' columns are alive at once.
        pool = ThreadPoolExecutor(2, thread_name_prefix="dlpt-scan") if threads and (os.cpu_count() or 1) > 1 else None
        ahead: list[tuple[tuple[int, int], Future[ScanBatch] | None]] = []

        def more() -> None:
            p = next(pieces, None)
            if p is not None:
                ahead.append((p, pool.submit(_scan_one, lib, data, *p) if pool is not None else None))

        try:
            for _ in range(2 if pool is not None else 1):
                more()
            while ahead:
                (a, b), f = ahead.pop(0)
                more()
                batch = f.result() if f is not None else _scan_one(lib, data, a, b)
                yield batch
                if batch.stop < b:
                    # The array ended inside this piece: what the later pieces hold is not events.
                    self.end = batch.stop
                    return
                self.end = b
        finally:
            # Stopped early (the array's end, a piece declined, or the caller gave up): the pieces
            # still scanning are waited for and their buffers freed; none is left running.
            for _, f in ahead:
                if f is not None and not f.cancel():
                    try:
                        f.result().close()
                    except Declined:
                        pass
            if pool is not None:
                pool.shutdown(wait=True)


def scan_into(add: Callable[[ScanBatch], None], data: bytes | bytearray, lo: int, hi: int,
              pieces: Iterator[tuple[int, int]] | None = None) -> int:
    """Scan the events of data[lo:hi] (`Scan`), each batch given to `add` (Columns.add) and then
    closed; where the events array ended. `Declined` as `Scan` raises it."""
    scanned = Scan(data, lo, hi, pieces)
    for b in scanned:
        try:
            add(b)
        finally:
            b.close()
    return scanned.end


def _address(data: bytes | bytearray) -> tuple[int, Any]:
    """The address of `data`'s bytes, and what keeps it valid (a bytearray's export also keeps it
    from being resized meanwhile)."""
    if isinstance(data, bytearray):
        view = (ctypes.c_char * len(data)).from_buffer(data)
        return ctypes.addressof(view), view
    ptr = ctypes.c_char_p(data)  # bytes: its own buffer, not a copy
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0, ptr


def _scan_one(lib: Any, data: bytes | bytearray, lo: int, hi: int) -> ScanBatch:
    from dlpt.collectors.kineto.decode import Args

    h = lib.dlpt_scan_new()
    if not h:
        raise Declined("out of memory")
    try:
        defaults = np.array([getattr(Args(), f) for f in ARG_FIELDS], dtype=np.int64)
        address, keep = _address(data)
        n = lib.dlpt_scan(h, address, lo, hi, defaults.ctypes.data_as(_I64))
        del keep
        if n < 0:
            at = ctypes.c_int64(0)
            why = lib.dlpt_scan_why(h, ctypes.byref(at)).decode()
            raise Declined(f"{why} at byte {at.value}")
        nt, npairs = lib.dlpt_scan_ntokens(h), lib.dlpt_scan_npairs(h)
        toff, tlen = np.empty(nt, dtype=np.int64), np.empty(nt, dtype=np.int32)
        lib.dlpt_scan_tokens(h, toff.ctypes.data_as(_I64), tlen.ctypes.data_as(_I32))
        ppid, ptid = np.empty(npairs, dtype=np.int32), np.empty(npairs, dtype=np.int32)
        lib.dlpt_scan_pairs(h, ppid.ctypes.data_as(_I32), ptid.ctypes.data_as(_I32))
        # Tokens 0-2 are a missing field's "", 0 and null (scan.c); the rest are decoded by
        # msgspec, as the Python reader decodes them.
        raw = [data[o:o + ln] for o, ln in zip(toff[3:].tolist(), tlen[3:].tolist())]
        try:
            tokens = ["", 0, None, *msgspec.json.decode(b"[" + b",".join(raw) + b"]")]
        except msgspec.DecodeError as e:
            raise Declined(f"a token did not decode ({e})") from None
        pairs = list(zip(map(tokens.__getitem__, ppid.tolist()), map(tokens.__getitem__, ptid.tolist())))
        out = lib.dlpt_scan_out(h).contents
        stop = lib.dlpt_scan_stop(h)
    except BaseException:
        lib.dlpt_scan_free(h)
        raise
    # The columns are views of scan.c's buffers, not copies (the copy was a third of the scan's
    # memory): the batch frees them when closed, and nothing it hands out is a view of them.
    cols = {k: np.ctypeslib.as_array(getattr(out, k), shape=(n,)) if n else np.zeros(0, dtype=t)
            for k, t in (("ph", np.int32), ("cat", np.int32), ("name", np.int32), ("key", np.int32),
                         ("id", np.int32), ("ts_kind", np.int8), ("dur_kind", np.int8), ("ts", np.int64),
                         ("dur", np.int64), ("off", np.int64), ("end", np.int64))}
    cols["args"] = np.ctypeslib.as_array(out.args, shape=(n, N_ARGS)) if n else np.zeros((0, N_ARGS), dtype=np.int64)
    batch = ScanBatch(data, cols, tokens, pairs, lambda: lib.dlpt_scan_free(h))
    batch.stop = stop
    return batch
