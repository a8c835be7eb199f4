"""A gzip trace decompressed on a thread into a buffer of its final size, which the native scan
(scan.py) reads a piece at a time as it fills: decompressing (0.35 s for an 84 MB trace on the
2-core development machine, a third of `dlpt report`'s time on it) runs beside the scan instead
of before it. zlib lets the GIL go while it inflates.

Only the plain case: one gzip member whose trailer states its size, holding a JSON object with
`"traceEvents": [` in its first megabyte. Anything else (several members, a size the trailer
does not give, a byte-order mark, the array form) is left to the reader that decompresses first
(decode.py), which also says what is wrong with a damaged file."""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable, Iterator

import dlpt.collectors.kineto.scan as scan_mod
from dlpt.collectors.kineto.decode import _EVENTS_KEY, Trace, skeleton_meta
from dlpt.collectors.kineto.scan import _BETWEEN, Declined, ScanBatch, scan_into

IN_STEP = 1 << 20  # compressed bytes handed to zlib at a time
OUT_STEP = 4 << 20  # at most this much output per step, so pieces become readable early
HEAD_BYTES = 1 << 20  # where `"traceEvents": [` must be
_OBJECT = re.compile(rb"\s*\{")


class Gunzip:
    """`buf` fills from the start on a thread; `wait_for(n)` blocks until n bytes are in (or all
    are), and raises `Declined` where the data is not one member of the size its trailer gives."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw
        self.size = int.from_bytes(raw[-4:], "little")  # ISIZE: the size mod 2**32
        self.buf = bytearray(self.size)
        self.avail = 0
        self.done = False
        self.error = ""
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="dlpt-gunzip", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        error = ""
        try:
            d = zlib.decompressobj(31)  # gzip
            pos, raw, buf = 0, self._raw, self.buf
            for i in range(0, len(raw), IN_STEP):
                if self._stopped:
                    raise ValueError("stopped")
                data = raw[i:i + IN_STEP]
                while data:
                    out = d.decompress(data, OUT_STEP)
                    data = d.unconsumed_tail
                    if pos + len(out) > len(buf):
                        raise ValueError("more data than the gzip trailer states")
                    buf[pos:pos + len(out)] = out
                    pos += len(out)
                    with self._cond:
                        self.avail = pos
                        self._cond.notify_all()
                    if d.eof:
                        break
            if not d.eof or d.unused_data or pos != len(buf):
                raise ValueError("not one gzip member of the size its trailer states")
        except (zlib.error, ValueError) as e:
            error = str(e) or "damaged gzip data"
        with self._cond:
            self.error, self.done = error, True
            self._cond.notify_all()

    def wait_for(self, n: int) -> int:
        """The bytes available once at least `n` are, or all are; `Declined` on an error."""
        with self._cond:
            while self.avail < n and not self.done:
                self._cond.wait()
            if self.error:
                raise Declined(f"gzip: {self.error}")
            return self.avail

    def stop(self) -> None:
        """Stop decompressing (where the scan gave up) and wait for the thread."""
        self._stopped = True
        self._thread.join()


def _pieces(g: Gunzip, lo: int) -> Iterator[tuple[int, int]]:
    """The events array's pieces (from `lo`) as the buffer fills: cut between two events about
    every scan.PIECE_BYTES, the last one running to the end of the data (the scan stops at the
    array's closing bracket)."""
    cur, size = lo, scan_mod.PIECE_BYTES
    while True:
        avail = g.wait_for(cur + size + (1 << 16))
        m = _BETWEEN.search(g.buf, cur + size, avail) if avail > cur + size else None
        if m is not None:
            yield cur, m.start() + 1
            cur = m.end() - 1
        elif g.done:
            yield cur, avail
            return
        else:
            g.wait_for(avail + size)  # no cut in what came: wait for more


def is_gzip(path: str) -> bool:
    """Does the file start as gzip does? (Asked before the whole file is read.)"""
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read(raw: bytes, add: Callable[[ScanBatch], None]) -> Trace:
    """Decompress `raw` (a gzip file's bytes) on a thread while the scan reads its events; each
    batch goes to `add` (Columns.add) and is closed. The trace's metadata back; `Declined` where
    the file is not the plain case or the scan does not read it (nothing of it then counts: the
    caller starts again with the Python reader)."""
    if len(raw) < 18 or raw[:2] != b"\x1f\x8b":
        raise Declined("not gzip")
    g = Gunzip(raw)
    try:
        head = g.wait_for(HEAD_BYTES)
        m = _EVENTS_KEY.search(g.buf, 0, head)
        if m is None or not _OBJECT.match(g.buf):
            raise Declined("no events array at the start")
        lo = m.end()
        end = scan_into(add, g.buf, lo, g.size, _pieces(g, lo))
        g.wait_for(g.size)
        meta = skeleton_meta(g.buf, lo, end)
        if meta is None:
            raise Declined("the document around the events array does not decode")
        return meta
    finally:
        g.stop()
