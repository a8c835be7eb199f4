"""The first pass over a large trace in two processes: this one reads the first half of the events
into columns while a forked child reads the second, which it hands back pickled; Columns.merge
then appends it as if one pass had read both.

Why: decoding the JSON (msgspec) and sorting events into columns is half of `dlpt report`'s time
on a large trace, a few Python steps per event that one process cannot do faster
(docs/BENCHMARKS.md, "Reading Kineto traces"); the halves need nothing of each other until the
merge. A fork shares the file's bytes already read, with no copy, and nothing is imported again.

Never at the cost of an answer: where forking is unsafe (other threads running: a child would
inherit their locks held), impossible (no `os.fork`), unwanted (`DLPT_READ_PROCS=1`, one core)
or fails in any way (cannot be forked, dies, cannot pickle, is killed), the second half is read
here, as before. A child that finds the file cannot be read in slices says so, and the caller reads it
whole, as it would have itself.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

from dlpt.collectors.kineto.decode import Sliced, Unsplittable

_OK, _UNSPLITTABLE, _FAILED = "ok", "unsplittable", "failed"


def wanted() -> bool:
    """Whether a second process may read half of a trace."""
    # macOS: a forked child of a process that loaded its system libraries (Accelerate, behind
    # numpy) may crash, which is why Python spawns there by default.
    if os.environ.get("DLPT_READ_PROCS", "") == "1" or not hasattr(os, "fork") or sys.platform != "linux":
        return False
    if threading.active_count() > 1:  # a forked child inherits other threads' locks, held
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores >= 2


class _Child:
    """A forked process computing `read(part)`, its result pickled into a pipe."""

    def __init__(self, read: Callable[[Sliced], Any], part: Sliced) -> None:
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: compute, hand back, and leave without running the parent's exit code
            os.close(r)
            status = 1
            try:
                gc.disable()  # its objects live until it exits; collections would only touch the parent's pages
                try:
                    out: tuple[str, Any] = (_OK, (read(part), part.notes))
                except Unsplittable:
                    out = (_UNSPLITTABLE, None)
                with os.fdopen(w, "wb") as f:
                    pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            finally:
                os._exit(status)
        os.close(w)
        self.r = r

    def result(self) -> tuple[str, Any]:
        """(status, (its result, its notes)); (_FAILED, None) where the child ended without
        handing them back."""
        try:
            with os.fdopen(self.r, "rb") as f:
                out = pickle.load(f)
        except Exception:  # noqa: BLE001 - a child that died mid-way: the caller reads its half itself
            out = (_FAILED, None)
        finally:
            self.reap()
        return out

    def reap(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass

    def stop(self) -> None:
        """The parent is leaving early (an error, Ctrl-C): end the child and reap it."""
        try:
            os.close(self.r)
        except OSError:
            pass
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass
        self.reap()


def read_halves(events: Sliced, read: Callable[[Sliced], Any], merge: Callable[[Any, Any], None]) -> Any:
    """`read(events)`, the second half read by a forked child where `wanted()` and the range is
    large enough to cut (Sliced.halves), then `merge(first, second)`; raises Unsplittable where
    either half is (the caller reads the file whole)."""
    notes: dict[str, int] = {}
    halves = events.halves(notes) if wanted() else None
    if halves is None:
        return read(events)
    first, second = halves
    try:
        child = _Child(read, second)
    except OSError:  # no process to be had (a limit on processes or memory): one process, as before
        return read(events)
    try:
        mine = read(first)
    except BaseException:
        child.stop()
        raise
    status, got = child.result()
    if status == _UNSPLITTABLE:
        raise Unsplittable()
    if status == _OK:
        theirs, child_notes = got
        notes.update(child_notes or {})
    else:
        theirs = read(second)  # raises what the child met, here
    merge(mine, theirs)
    if events.notes is not None and notes:  # NaN/Infinity found in the second half (nonfinite.py)
        events.notes.setdefault("nonfinite_at", notes["nonfinite_at"])
        events.notes["nonfinite"] = events.notes.get("nonfinite", 0) + notes.get("nonfinite", 0)
    return mine
