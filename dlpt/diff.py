"""Differential profiles: what got slower and what got faster between two runs.

Both profiles are reduced to the same flat view (by line, function, file, kernel or op); the
rows are then matched across the runs by their frames, in stages, each row saying how it was
matched. Source lines shift between runs when code is edited, so `--by line` matches by file
and line first (unless both runs stored the source and the two lines' code differs), then by file, function and the text of the line, then by file and function
(pairing leftovers in line order). A row found in one run only is `added` or `removed`.
Every row is the group's flat exclusive value, so the rows of each run sum to its total and the
deltas sum to the difference of the totals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dlpt.frames import Frame, short_kernel_name, short_path
from dlpt.metrics import COL, metric_column
from dlpt.profile import Profile, default_metric
from dlpt.scope import Scope
from dlpt.views import GROUPINGS, check_view, flat


@dataclass
class Entry:
    """One row of one run's flat view."""

    label: str
    frame: Frame
    values: np.ndarray  # exclusive metrics of the group, len(METRICS)
    code: str = ""


@dataclass
class DiffRow:
    a: Entry | None
    b: Entry | None
    match: str  # how the row was matched: a stage name, `added` or `removed`
    before: int = 0
    after: int = 0

    @property
    def delta(self) -> int:
        return self.after - self.before

    @property
    def percent(self) -> float | None:
        """Change relative to the first run; None when the row is new."""
        return 100.0 * self.delta / self.before if self.before else None

    @property
    def entry(self) -> Entry:
        e = self.b if self.b is not None else self.a
        assert e is not None
        return e


@dataclass
class Diff:
    by: str
    metric: str
    a_total: np.ndarray
    b_total: np.ndarray
    a_name: str
    b_name: str
    rows: list[DiffRow] = field(default_factory=list)

    @property
    def delta(self) -> int:
        col = COL[self.metric]
        return int(self.b_total[col]) - int(self.a_total[col])


def entries(profile: Profile, by: str) -> list[Entry]:
    """The flat view's rows, the `<no ...>` row included (it keeps the totals whole)."""
    fv = flat(profile, by)
    out = []
    for g, (lbl, fr) in enumerate(zip(fv.labels, fv.frame)):
        code = profile.source_line(fr.file, fr.line) if by == "line" and fr.has_source else ""
        out.append(Entry(lbl, fr, fv.exclusive[g], code))
    return out


# Matching stages per grouping: (name, key function, pair leftovers in line order). A key of None
# means the entry takes no part in that stage.
KeyFn = Callable[[Entry], "tuple | None"]


def _stages(by: str) -> list[tuple[str, KeyFn, bool]]:
    def exact(e: Entry) -> tuple:
        f = e.frame
        if e.frame.kind == "unattributed":
            return ("<none>",)
        if by == "line":
            return (f.file, f.line)
        if by == "function":
            return (f.file, f.function or f.name)
        if by == "file":
            return (f.file,)
        if by == "kernel":
            return (f.kind, f.name)
        return (f.name,)

    stages: list[tuple[str, KeyFn, bool]] = [(by, exact, False)]
    if by == "line":
        stages += [
            ("code", lambda e: (e.frame.file, e.frame.function, e.code) if e.code else None, False),
            ("function", lambda e: (e.frame.file, e.frame.function) if e.frame.file else None, True),
        ]
    elif by == "function":
        # The file moved (another checkout, another machine): same trailing path and function.
        stages.append(("moved", lambda e: (short_path(e.frame.file), e.frame.function or e.frame.name), False))
    elif by == "file":
        stages.append(("moved", lambda e: (short_path(e.frame.file),), False))
    elif by == "kernel":
        # Same kernel, other template arguments or parameter list.
        stages.append(("short name", lambda e: (e.frame.kind, short_kernel_name(e.frame.name, 10**6)), False))
    return stages


def _pair(a_list: list[int], b_list: list[int], ea: list[Entry], eb: list[Entry],
          by_order: bool) -> list[tuple[int, int]]:
    if len(a_list) == 1 and len(b_list) == 1:
        return [(a_list[0], b_list[0])]
    if not by_order:
        return []
    # Several lines of one function moved: the same number on both sides means an edit shifted
    # them, so pair them in line order; otherwise pair nearest lines first.
    sa = sorted(a_list, key=lambda i: ea[i].frame.line)
    sb = sorted(b_list, key=lambda i: eb[i].frame.line)
    if len(sa) == len(sb):
        return list(zip(sa, sb))
    cand = sorted((abs(ea[i].frame.line - eb[j].frame.line), i, j) for i in sa for j in sb)
    used_a: set[int] = set()
    used_b: set[int] = set()
    out = []
    for _, i, j in cand:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            out.append((i, j))
    return out


def match(ea: list[Entry], eb: list[Entry], by: str) -> list[tuple[int | None, int | None, str]]:
    """(index in a, index in b, stage) for every entry of both runs."""
    free_a = set(range(len(ea)))
    free_b = set(range(len(eb)))
    out: list[tuple[int | None, int | None, str]] = []
    for name, key, by_order in _stages(by):
        ka: dict[tuple, list[int]] = {}
        kb: dict[tuple, list[int]] = {}
        for i in sorted(free_a):
            k = key(ea[i])
            if k is not None:
                ka.setdefault(k, []).append(i)
        for j in sorted(free_b):
            k = key(eb[j])
            if k is not None:
                kb.setdefault(k, []).append(j)
        for k, al in ka.items():
            bl = kb.get(k)
            if not bl:
                continue
            if name == by and (len(al) > 1 or len(bl) > 1):
                # Exact keys are unique within a flat view, except for the catch-all row.
                pairs = list(zip(al, bl))
            else:
                pairs = _pair(al, bl, ea, eb, by_order)
            for i, j in pairs:
                if name == "line" and ea[i].code and eb[j].code and ea[i].code != eb[j].code:
                    # Same line number, other code: the code moved; later stages pair it.
                    continue
                free_a.discard(i)
                free_b.discard(j)
                out.append((i, j, name))
    out += [(i, None, "removed") for i in sorted(free_a)]
    out += [(None, j, "added") for j in sorted(free_b)]
    return out


def _name(p: Profile) -> str:
    return str(p.path or p.meta.command or p.frame_of(0).name)


def diff_profiles(a: Profile, b: Profile, by: str = "line", metric: str | None = None,
                  scope: Scope = Scope()) -> Diff:
    """Match the flat views of `a` (before) and `b` (after) and compute the deltas of `metric`;
    rows sorted by absolute delta, largest first (ties: larger value first, then label)."""
    check_view("flat", by)
    metric = metric or default_metric(a, b)
    col = metric_column(metric)
    # torch.compile's one-off work differs run to run (a warm cache): ignored unless the scope
    # asks for it.
    pa, pb = scope.apply(a), scope.apply(b)
    ea, eb = entries(pa, by), entries(pb, by)
    rows = []
    for i, j, how in match(ea, eb, by):
        ra = ea[i] if i is not None else None
        rb = eb[j] if j is not None else None
        before = int(ra.values[col]) if ra is not None else 0
        after = int(rb.values[col]) if rb is not None else 0
        rows.append(DiffRow(ra, rb, how, before, after))
    rows.sort(key=lambda r: (-abs(r.delta), -max(r.before, r.after), r.entry.label))
    return Diff(by, metric, pa.cct.exclusive.sum(axis=0), pb.cct.exclusive.sum(axis=0),
                _name(a), _name(b), rows)


def row_label(row: DiffRow, by: str) -> str:
    """The row's name; a line that moved reads `file:42→44 function`."""
    e = row.entry
    if by == "line" and row.a is not None and row.b is not None and e.frame.has_source:
        la, lb = row.a.frame.line, row.b.frame.line
        if la != lb or row.a.frame.file != row.b.frame.file:
            return f"{short_path(e.frame.file)}:{la}→{lb} {e.frame.function}"
    return e.label


__all__ = ["GROUPINGS", "Diff", "DiffRow", "diff_profiles", "row_label"]
