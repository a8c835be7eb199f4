"""What the TUI shows, as pure data over the model: the rows of a view (top-down, bottom-up or
flat), their metrics, and the visible-row list of an outline with lazy expansion.

Nothing here touches textual, so the logic is tested and benchmarked without a terminal. A
profile of a million nodes must open in well under a second, so this module never builds the
full inclusive matrix (`CCT.inclusive`, 14 columns): it keeps one prefix sum per metric column
that is actually shown and reads inclusive values of the rows it needs from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlpt.frames import Frame
from dlpt.metrics import ACTIVITY_KIND_INFO, COUNT_METRICS, KIND_BREAKDOWN, MEMCPY_OTHER, REGISTRY
from dlpt.profile import Profile
from dlpt.viewers.format import safe_text, short_kernel_name
from dlpt.viewers.tui.labels import frame_label
from dlpt.views import FlatView, bottom_up, flat

# The metrics `s` cycles through, in order.
METRIC_CYCLE = tuple(m.name for m in REGISTRY if m.cycled)

# Per-kind columns of the table: (header, metric). Columns whose profile total is zero are left
# out so that narrow terminals keep room for names.
KIND_COLUMNS = (*((k.short, k.time) for k in KIND_BREAKDOWN if k is not ACTIVITY_KIND_INFO[MEMCPY_OTHER]),
                *zip(("#kern", "#copy"), COUNT_METRICS))

# A tree opens on its hot path while the next step holds at least this share of the total:
# deeper than that the children are each small and the user picks among them.
OPEN_SHARE = 0.05


class Rows:
    """One view's rows: keys are CCT nodes (trees) or groups (flat). `primary` is what the bar
    and the sort use (inclusive in trees, self in flat); `secondary` the other of the two."""

    is_tree = True
    primary_name = "incl"
    secondary_name = "self"

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._labels: dict[int, str] = {}
        self._code: dict[tuple[str, int], str] = {}
        self._lines: dict[str, list[str]] = {}

    def code(self, key: int) -> str:
        """The source line of a row whose frame is a line of code ('' otherwise or unknown)."""
        return self.frame_code(self.frame(key))

    def frame_code(self, fr: Frame) -> str:
        """The source line of a frame, as the table's code column shows it (search reads it too)."""
        if not fr.has_source:
            return ""
        k = (fr.file, fr.line)
        s = self._code.get(k)
        if s is None:
            lines = self._lines.get(fr.file)
            if lines is None:
                lines = self._lines[fr.file] = (self.profile.sources.get(fr.file) or "").splitlines()
            s = self._code[k] = safe_text(lines[fr.line - 1].strip()) if fr.line <= len(lines) else ""
        return s

    def __len__(self) -> int:
        raise NotImplementedError

    def frame(self, key: int) -> Frame:
        raise NotImplementedError

    def label(self, key: int) -> str:
        raise NotImplementedError

    def primary(self, keys: np.ndarray, col: int) -> np.ndarray:
        raise NotImplementedError

    def secondary(self, keys: np.ndarray, col: int) -> np.ndarray:
        raise NotImplementedError

    def kind_values(self, keys: np.ndarray, col: int) -> np.ndarray:
        return self.primary(keys, col)

    def holds(self, keys: np.ndarray, col: int) -> np.ndarray:
        """Which of `keys` hold something of a metric, in either column (a flat group can own
        nothing and still have time beneath it): the rows an outline shows (Outline)."""
        return (self.primary(keys, col) > 0) | (self.secondary(keys, col) > 0)

    def holding(self, col: int) -> np.ndarray:
        """`holds` over every key: a mask, as search filters are."""
        return self.holds(np.arange(len(self), dtype=np.int64), col)

    def total(self, col: int) -> int:
        return int(self.profile.cct.exclusive[:, col].sum())

    def roots(self) -> np.ndarray:
        raise NotImplementedError

    def children(self, key: int) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)

    def has_children(self, key: int) -> bool:
        return False

    def parent(self, key: int) -> int:
        return -1

    def ancestors(self, key: int) -> list[int]:
        """Keys from the outermost visible ancestor down to `key`."""
        return [key]


class TreeRows(Rows):
    """Top-down or bottom-up: the rows are the nodes of a CCT, the root itself hidden."""

    def __init__(self, profile: Profile, name: str = "top-down") -> None:
        super().__init__(profile)
        self.name = name
        self.cct = profile.cct
        self._prefix: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.cct)

    def prefix(self, col: int) -> np.ndarray:
        """Prefix sums of one exclusive column: inclusive[i] = p[end[i]] - p[i]."""
        p = self._prefix.get(col)
        if p is None:
            p = np.zeros(len(self.cct) + 1, dtype=np.int64)
            np.cumsum(self.cct.exclusive[:, col], out=p[1:])
            self._prefix[col] = p
        return p

    def inclusive(self, keys: np.ndarray, col: int) -> np.ndarray:
        p = self.prefix(col)
        return p[self.cct.end[keys]] - p[keys]

    def frame(self, key: int) -> Frame:
        return self.profile.frames[int(self.cct.frame[key])]

    def label(self, key: int) -> str:
        f = int(self.cct.frame[key])
        s = self._labels.get(f)
        if s is None:
            s = self._labels[f] = frame_label(self.profile.frames[f])
        return s

    def primary(self, keys: np.ndarray, col: int) -> np.ndarray:
        return self.inclusive(keys, col)

    def secondary(self, keys: np.ndarray, col: int) -> np.ndarray:
        return self.cct.exclusive[keys, col]

    def total(self, col: int) -> int:
        return int(self.prefix(col)[-1])

    def roots(self) -> np.ndarray:
        return self.cct.children(0)

    def children(self, key: int) -> np.ndarray:
        return self.cct.children(key)

    def has_children(self, key: int) -> bool:
        return bool(self.cct.end[key] > key + 1)

    def parent(self, key: int) -> int:
        return int(self.cct.parent[key])

    def ancestors(self, key: int) -> list[int]:
        return self.cct.path(key)


class FlatRows(Rows):
    """The flat view: one row per group (line, function, file, kernel, op), no children."""

    is_tree = False
    primary_name = "self"
    secondary_name = "total"

    def __init__(self, profile: Profile, by: str) -> None:
        super().__init__(profile)
        self.by = by
        self.name = f"flat by {by}"
        self.view: FlatView = flat(profile, by)
        self._per_rank: dict[int, tuple[list[int], np.ndarray] | None] = {}

    def __len__(self) -> int:
        return len(self.view.labels)

    def frame(self, key: int) -> Frame:
        return self.view.frame[key]

    def label(self, key: int) -> str:
        s = self._labels.get(key)
        if s is None:
            fr = self.view.frame[key]
            if self.by == "kernel" and fr.kind == "kernel":
                s = safe_text(short_kernel_name(fr.name, 200))
            else:
                s = safe_text(self.view.labels[key])
            self._labels[key] = s
        return s

    def primary(self, keys: np.ndarray, col: int) -> np.ndarray:
        return self.view.exclusive[keys, col]

    def secondary(self, keys: np.ndarray, col: int) -> np.ndarray:
        return self.view.inclusive[keys, col]

    def total(self, col: int) -> int:
        return int(self.view.exclusive[:, col].sum())

    def per_rank(self, col: int) -> tuple[list[int], np.ndarray] | None:
        """(ranks, self value of each group on each rank) when the profile holds several ranks."""
        if col not in self._per_rank:
            from dlpt.ranks import rank_values

            self._per_rank[col] = rank_values(self.profile, self.view.owner, len(self), self.profile.cct.exclusive[:, col])
        return self._per_rank[col]

    def rank_spread(self, key: int, col: int) -> tuple[int, int, int, int] | None:
        """(min, median, max, rank of the max) of a group's self value over the ranks, as the
        text report's flat view gives them; None for one rank."""
        from dlpt.ranks import rank_spread

        pr = self.per_rank(col)
        if pr is None:
            return None
        lo, med, hi, rank = rank_spread(pr[0], pr[1][key])
        return lo, int(round(med)), hi, rank

    def roots(self) -> np.ndarray:
        # Groups that hold nothing in any metric would only be noise.
        return np.flatnonzero(self.view.exclusive.any(axis=1) | self.view.inclusive.any(axis=1))


class BottomUpRows(TreeRows):
    """The bottom-up view: a frame's row holds its self time; its callers' rows hold the time
    that flows through them and no self time (dlpt.views.bottom_up_self, read here per row
    without the whole inclusive matrix)."""

    def secondary(self, keys: np.ndarray, col: int) -> np.ndarray:
        return np.where(self.cct.parent[keys] == 0, self.inclusive(keys, col), 0)


def bottom_up_rows(profile: Profile) -> TreeRows:
    return BottomUpRows(bottom_up(profile), "bottom-up")


@dataclass
class Outline:
    """The visible rows of a view: `keys[r]` and `depth[r]` for each row, parents before their
    children. Only expanded keys have their children in the list, so a million-node tree costs
    only what is on screen and what the user opened. `keep` restricts rows to a search filter.

    Rows that hold none of the metric are left out, and counted (`hidden`): under `host_time`
    an opened `opt.step()` of 707 ms showed only `aten::` rows at 0.0% with blank values (the
    ops have CPU time, the line has the wall time). Profilers show what costs: pyinstrument and
    py-spy never draw a frame without samples, and `dlpt report` leaves such nodes out of its
    trees; the count says they exist, as the report's `(49 nodes hidden: …)` does, and another
    metric (`m`, `s`) shows them."""

    rows: Rows
    col: int
    expanded: set[int] = field(default_factory=set)
    keep: np.ndarray | None = None
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    depth: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Per key (None: the top level): how many of its children hold none of the metric; per key,
    # whether it has a child that is shown; the count of `hidden`. Cleared with the metric or filter.
    _zero_children: dict[int | None, int] = field(default_factory=dict, init=False, repr=False)
    _opens: dict[int, bool] = field(default_factory=dict, init=False, repr=False)
    _hidden: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.rebuild()

    def __len__(self) -> int:
        return len(self.keys)

    def sorted_children(self, key: int | None) -> np.ndarray:
        """Children of `key` (None: the top level) that hold something of the current metric,
        biggest first under it."""
        kids = self.rows.roots() if key is None else self.rows.children(key)
        if self.keep is not None and len(kids):
            kids = kids[self.keep[kids]]
        if len(kids):
            held = self.rows.holds(kids, self.col)
            self._zero_children[key] = int(len(kids) - held.sum())
            kids = kids[held]
        else:
            self._zero_children[key] = 0
        if len(kids) > 1:
            vals = self.rows.primary(kids, self.col)
            kids = kids[np.argsort(-vals, kind="stable")]
        return kids

    def hidden_children(self, key: int | None) -> int:
        """How many children of `key` (None: the top level) are left out for holding none of
        the metric (those the search filter keeps, while one is applied)."""
        if key not in self._zero_children:
            self.sorted_children(key)
        return self._zero_children[key]

    def hidden(self) -> int:
        """How many rows are left out for holding none of the metric, among those the open rows
        would show: the top level's and each open row's children."""
        if self._hidden is None:
            shown = self.keys[np.isin(self.keys, list(self.expanded))] if self.expanded else self.keys[:0]
            self._hidden = self.hidden_children(None) + sum(self.hidden_children(int(k)) for k in shown)
        return self._hidden

    def expandable(self, key: int) -> bool:
        if not self.rows.is_tree or not self.rows.has_children(key):
            return False
        opens = self._opens.get(key)
        if opens is None:
            kids = self.rows.children(key)
            if self.keep is not None:
                kids = kids[self.keep[kids]]
            opens = self._opens[key] = bool(self.rows.holds(kids, self.col).any())
        return opens

    def _forget(self) -> None:
        """Drop what was worked out for the previous metric or filter."""
        self._zero_children.clear()
        self._opens.clear()
        self._hidden = None

    def _subtree_rows(self, key: int | None, depth: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Rows beneath `key` that expansion makes visible, in display order."""
        keys_out: list[np.ndarray] = []
        depth_out: list[np.ndarray] = []
        stack: list[tuple[np.ndarray, int, int]] = [(self.sorted_children(key), 0, depth)]
        while stack:
            kids, pos, d = stack.pop()
            # Emit runs of collapsed siblings as one array; descend into expanded ones.
            j = pos
            while j < len(kids) and int(kids[j]) not in self.expanded:
                j += 1
            if j > pos:
                keys_out.append(kids[pos:j])
                depth_out.append(np.full(j - pos, d, dtype=np.int64))
            if j < len(kids):
                k = int(kids[j])
                keys_out.append(kids[j:j + 1])
                depth_out.append(np.full(1, d, dtype=np.int64))
                stack.append((kids, j + 1, d))
                stack.append((self.sorted_children(k), 0, d + 1))
        return keys_out, depth_out

    def rebuild(self) -> None:
        ks, ds = self._subtree_rows(None, 0)
        self.keys = np.concatenate(ks) if ks else np.zeros(0, dtype=np.int64)
        self.depth = np.concatenate(ds) if ds else np.zeros(0, dtype=np.int64)
        self._hidden = None

    def set_metric(self, col: int) -> None:
        self.col = col
        self._forget()
        self.rebuild()

    def set_filter(self, keep: np.ndarray | None, expand_limit: int = 2000) -> None:
        """Apply a filter mask; open the paths to the matches while the list stays short."""
        self.keep = keep
        self.expanded = set()
        self._forget()
        self.rebuild()
        if keep is None or not self.rows.is_tree:
            return
        r = 0
        while r < len(self.keys) and len(self.keys) < expand_limit:
            if self.expandable(int(self.keys[r])):
                self.expand(r)
            r += 1

    def is_expanded(self, r: int) -> bool:
        return int(self.keys[r]) in self.expanded

    def _span_end(self, r: int) -> int:
        """One past the last row of row r's visible subtree."""
        d = self.depth[r]
        after = np.flatnonzero(self.depth[r + 1:] <= d)
        return r + 1 + int(after[0]) if len(after) else len(self.keys)

    def expand(self, r: int) -> bool:
        key = int(self.keys[r])
        if key in self.expanded or not self.expandable(key):
            return False
        self.expanded.add(key)
        ks, ds = self._subtree_rows(key, int(self.depth[r]) + 1)
        if ks:
            self.keys = np.concatenate([self.keys[:r + 1], *ks, self.keys[r + 1:]])
            self.depth = np.concatenate([self.depth[:r + 1], *ds, self.depth[r + 1:]])
        self._hidden = None
        return True

    def collapse(self, r: int) -> bool:
        key = int(self.keys[r])
        if key not in self.expanded:
            return False
        self.expanded.discard(key)
        e = self._span_end(r)
        self.keys = np.concatenate([self.keys[:r + 1], self.keys[e:]])
        self.depth = np.concatenate([self.depth[:r + 1], self.depth[e:]])
        self._hidden = None
        return True

    def toggle(self, r: int) -> bool:
        return self.collapse(r) if self.is_expanded(r) else self.expand(r)

    def parent_row(self, r: int) -> int:
        d = self.depth[r]
        if d == 0:
            return r
        before = np.flatnonzero(self.depth[:r] < d)
        return int(before[-1]) if len(before) else r

    def row_of(self, key: int) -> int:
        hit = np.flatnonzero(self.keys == key)
        return int(hit[0]) if len(hit) else -1

    def reveal(self, key: int) -> int:
        """Expand the ancestors of `key` so that it is visible; its row, or -1."""
        r = self.row_of(key)
        if r >= 0:
            return r
        for a in self.rows.ancestors(key)[:-1]:
            ra = self.row_of(a)
            if ra < 0:
                return -1
            self.expand(ra)
        return self.row_of(key)

    def expand_hottest(self, r: int, min_share: float = 0.0) -> int:
        """Open the hottest path beneath row r; the row where it ends.

        The path follows the hottest child while that child costs more than the row's own
        (self) time, and stops on the row that does most of its work itself: a line with 80 ms
        of its own and a 0.1 ms `aten::empty` beneath is the answer, not the `aten::empty`.
        It also stops before a child that holds less than `min_share` of the view's total."""
        if r < 0 or r >= len(self.keys):
            return r
        src = self.rows
        floor = min_share * src.total(self.col)
        while self.expandable(int(self.keys[r])):
            key = np.array([int(self.keys[r])])
            kids = self.sorted_children(int(key[0]))  # sorted, so the first is the hottest
            if not len(kids):
                break
            hottest = src.primary(kids[:1], self.col)[0]
            if hottest <= src.secondary(key, self.col)[0] or hottest < floor:
                break
            self.expand(r)
            if r + 1 >= len(self.keys) or self.depth[r + 1] <= self.depth[r]:
                break
            r += 1
        return r

    def open_hot_path(self, min_share: float = OPEN_SHARE) -> int:
        """Where a tree opens: the hottest path from the hottest top-level row, down to where
        the work is done or spreads into children each under `min_share` of the total (as
        pyinstrument and memray open their trees); the row to put the cursor on."""
        if not self.rows.is_tree or not len(self.keys):
            return 0
        return self.expand_hottest(0, min_share)
