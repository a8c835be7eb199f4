"""Are several inputs the ranks of one run? Merging two unrelated runs as ranks gives a straggler
verdict about nothing, so `dlpt.merge` asks here first and refuses inputs that are not
(`--as-ranks` merges them anyway).

What the inputs record, and how much each tells:

- the rank (torch.distributed's, torchrun's RANK, a trace's `distributedInfo`): two inputs of
  one rank are never two ranks of one run; they are two runs, or two traces of one process
  (tensorboard_trace_handler writes one per profiling cycle);
- the world size: ranks of one run agree on it, and a run has no more ranks than it;
- torchrun's run id (`TORCHELASTIC_RUN_ID`, recorded by `dlpt record`): ranks of one run
  share it, and two jobs running at the same time do not;
- the host process of a trace (its host pid): two traces of one process are not two ranks;
- when it was profiled, in the wall clock: ranks of one run are profiled over the same steps,
  which their collectives hold in step, so their profiled windows overlap; separate runs
  follow one another, seconds apart at the least (a new process imports torch and starts its
  GPU first). A trace's window is its first and last event (`baseTimeNanoseconds` + `ts`), a
  recording's its start in the wall clock (`start_time`) and its window's length (`window`,
  steady clock), or where it has no window, the time the recording started.

What is not used: the recorded command, which differs between the ranks of one run under
launchers that pass each rank its own arguments (torch.distributed.launch and DeepSpeed add
`--local_rank=N`); the host name (ranks of one run sit on several hosts); the pids of
recordings (not recorded). What is missing is no evidence either way: inputs that record
nothing are merged, as they always were.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import NamedTuple

from dlpt.header import Header
from dlpt.profile import Profile

# Ranks of one run are profiled at the same time; two nodes' clocks may differ by a little (NTP
# keeps them within milliseconds). Windows further apart than this are different runs: a run
# after another starts a new process, which takes longer than this before its first GPU work.
RUN_GAP_NS = 2 * 10**9
# A recording from before dlpt kept its wall-clock window says only when it started; ranks of
# one run start together (the launcher starts them, or its rendezvous releases them), within
# seconds, while a run after another starts after the first one's whole run.
START_GAP_NS = 60 * 10**9


class _Rank(NamedTuple):
    path: str
    group: int  # which input it came from: the ranks of an already merged input share one
    rank: int | None
    world: int | None
    run_id: str | None
    pids: frozenset[int]
    window: tuple[int, int] | None  # wall clock, ns since the epoch
    exact: bool  # the window was measured (not a start time alone)


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _window(meta: Header) -> tuple[tuple[int, int] | None, bool]:
    w = meta.wall_window
    if isinstance(w, dict):
        lo, hi = _int(w.get("start")), _int(w.get("end"))
        if lo is not None and hi is not None and hi >= lo:
            return (lo, hi), True
    start = meta.start_time
    if isinstance(start, str):
        try:
            t = _dt.datetime.fromisoformat(start)
        except ValueError:
            return None, False
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        ns = int(t.timestamp() * 1e9)
        # A recording's window (steady clock) opens at `start_time` (the wall clock, in
        # microseconds), so its length places it on the wall clock. Except with --steps: there,
        # files recorded before that took the session's start, with nothing to tell them apart,
        # so a steps window is placed by its start alone (the minute's slack).
        w = meta.window
        if (isinstance(w, dict) and _int(w.get("start")) is not None and _int(w.get("end")) is not None
                and not meta.steps):
            return (ns, ns + max(int(w["end"]) - int(w["start"]), 0)), True
        return (ns, ns), False
    return None, False


def _rank(path: str, group: int, meta: Header) -> _Rank:
    world = _int(meta.world_size)
    run_id = meta.run_id
    pids = meta.host_pids
    window, exact = _window(meta)
    return _Rank(path=path, group=group, rank=_int(meta.rank),
                 world=world if world is not None and world > 0 else None,
                 run_id=run_id if isinstance(run_id, str) and run_id else None,
                 pids=frozenset(p for p in pids if _int(p) is not None) if isinstance(pids, list) else frozenset(),
                 window=window, exact=exact)


def _ranks(profiles: Sequence[Profile], merged: Sequence[bool]) -> list[_Rank]:
    out: list[_Rank] = []
    for g, (p, m) in enumerate(zip(profiles, merged)):
        path = p.path or f"input {g + 1}"
        if m:  # an already merged input: its ranks, each named by the input and its number
            out.extend(_rank(f"{path} (rank {meta.rank})", g, meta) for meta in p.meta.ranks or [])
        else:
            out.append(_rank(path, g, p.meta))
    return out


def _when(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _span(ns: int) -> str:
    s = ns / 1e9
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= 2 * size:
            return f"{s / size:.0f} {unit}"
    return f"{s:.0f} s"


def _differs(ranks: list[_Rank], value: Callable[[_Rank], object]) -> _Rank | None:
    """A rank of another input than `ranks[0]`'s whose value differs from it, if any."""
    return next((r for r in ranks if r.group != ranks[0].group and value(r) != value(ranks[0])), None)


def run_conflict(profiles: Sequence[Profile], merged: Sequence[bool]) -> str | None:
    """Why `profiles` are not the ranks of one run, naming two of them (the module's rules, in
    that order), or None when nothing they record says so. `merged[i]`: profile i already holds
    several ranks (its `meta.ranks` describe them). Linear in the number of ranks."""
    ranks = _ranks(profiles, merged)
    n = len(ranks)
    by_rank: dict[int, _Rank] = {}
    for r in ranks:
        if r.rank is None:
            continue
        seen = by_rank.setdefault(r.rank, r)
        if seen is not r and seen.group != r.group:
            return f"{seen.path} and {r.path} are both rank {r.rank}"
    worlds = [r for r in ranks if r.world is not None]
    other = _differs(worlds, lambda r: r.world)
    if other is not None:
        return (f"{worlds[0].path} and {other.path} are from runs of different sizes "
                f"(world size {worlds[0].world} and {other.world})")
    w = worlds[0].world if worlds else None
    if w is not None and n > w:
        first = worlds[0]
        with_ = next((r for r in ranks if r.group != first.group), first)
        return (f"{first.path} is from a run of {w} rank{'s' if w != 1 else ''}, but {n} ranks are given "
                f"(with {with_.path})")
    ids = [r for r in ranks if r.run_id is not None]
    other = _differs(ids, lambda r: r.run_id)
    if other is not None:
        return f"{ids[0].path} and {other.path} have different run ids ({ids[0].run_id} and {other.run_id})"
    by_pid: dict[int, _Rank] = {}
    for r in ranks:
        if r.rank is not None:
            continue  # a recorded rank says more than a pid, which containers reuse across hosts
        for pid in r.pids:
            first = by_pid.setdefault(pid, r)
            if first.group != r.group:
                return f"{first.path} and {r.path} were traced in one process (pid {pid})"
    # When: one window per input (an already merged input spans its ranks'), in time order; an
    # input that starts too long after every earlier one has ended is another run.
    windows: dict[int, _Rank] = {}
    for r in ranks:
        if r.window is None:
            continue
        had = windows.get(r.group)
        if had is None or had.window is None:
            windows[r.group] = r
        else:
            windows[r.group] = had._replace(window=(min(had.window[0], r.window[0]), max(had.window[1], r.window[1])),
                                            exact=had.exact and r.exact)
    timed = sorted(windows.values(), key=lambda r: r.window[0] if r.window else 0)
    if timed:
        last = timed[0]  # of the inputs so far, the one whose window ends last
        for r in timed[1:]:
            assert r.window is not None and last.window is not None
            gap = r.window[0] - last.window[1]
            if gap > (RUN_GAP_NS if r.exact and last.exact else START_GAP_NS):
                return (f"{last.path} and {r.path} were profiled {_span(gap)} apart "
                        f"({_when(last.window[1])} and {_when(r.window[0])} UTC)")
            if r.window[1] > last.window[1]:
                last = r
    return None
