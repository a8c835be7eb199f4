"""The tree table: a line-API widget that renders only the rows on screen from an `Outline`.

textual's Tree widget builds a node object per row and takes seconds at 100k nodes; here a row
is two integers in numpy arrays and `render_line` formats the few dozen that are visible."""

from __future__ import annotations

import time

import numpy as np
from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from dlpt.metrics import COL
from dlpt.viewers.format import bar, fmt_metric, safe_text
from dlpt.viewers.tui.labels import fit_label
from dlpt.viewers.tui.rows import KIND_COLUMNS, FlatRows, Outline

NAME_MIN = 36  # columns are dropped, right to left, before names get narrower than this
CODE_MARK = "  ▸ "
CODE_MIN = 12  # a line's code is shown beside its name when at least this much of it fits
VALUE_W = 9
COUNT_W = 7
PCT_W = 6  # `100.0%`
BAR_W = 8

_KIND_STYLE = {
    "kernel": Style(color="cyan"), "memcpy": Style(color="magenta"), "memset": Style(color="magenta"),
    "op": Style(), "module": Style(color="blue"), "backward": Style(color="yellow"),
    "unattributed": Style(color="red"), "thread": Style(italic=True), "rank": Style(bold=True),
}


class TreeTable(ScrollView, can_focus=True):
    """Rows of a view with lazy expansion. Posts `Highlighted` when the cursor moves."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "up", show=False),
        Binding("down", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "jump(0)", "top", show=False),
        Binding("end", "jump(-1)", "bottom", show=False),
        Binding("enter,space", "toggle_row", "expand", show=False),
        Binding("right", "open", "open", show=False),
        Binding("left", "close", "close", show=False),
    ]

    COMPONENT_CLASSES = {"tree-table--cursor", "tree-table--header", "tree-table--source", "tree-table--library",
                         "tree-table--code"}

    DEFAULT_CSS = """
    TreeTable { height: 1fr; }
    TreeTable > .tree-table--cursor { background: $block-cursor-background; color: $block-cursor-foreground; text-style: bold; }
    TreeTable:blur > .tree-table--cursor { background: $block-cursor-blurred-background; text-style: bold; }
    TreeTable > .tree-table--header { text-style: bold underline; }
    TreeTable > .tree-table--source { text-style: bold; }
    TreeTable > .tree-table--library { text-style: dim; }
    TreeTable > .tree-table--code { text-style: dim; }
    """

    class Highlighted(Message):
        def __init__(self, table: TreeTable, key: int) -> None:
            super().__init__()
            self.table = table
            self.key = key

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.outline: Outline | None = None
        self.cursor = 0
        self.metric = "gpu_time"
        self.total = 0
        self.first_paint: float | None = None  # perf_counter of the first frame with rows (benchmarks)
        self._columns: list[tuple[str, str, int]] = []
        self._col_width = 0
        # What the table says when the outline has no rows (a search that matches nothing here).
        self.empty_message = ""
        # show() before the first layout cannot tell how many rows fit: center on the first resize.
        self._center_pending = False

    # -- data -------------------------------------------------------------------------------

    def show(self, outline: Outline, metric: str, key: int | None = None) -> None:
        """Show an outline; keep the cursor on `key` when it is visible."""
        self.outline = outline
        self.metric = metric
        self.total = outline.rows.total(COL[metric])
        self._col_width = 0
        r = outline.row_of(key) if key is not None else -1
        self.cursor = max(r, 0)
        self._update_size()
        self._center_pending = self.scrollable_content_region.height <= 1
        self._scroll_to_cursor(center=True)
        self.refresh()
        self._post()

    @property
    def current_key(self) -> int | None:
        o = self.outline
        if o is None or not len(o):
            return None
        return int(o.keys[min(self.cursor, len(o) - 1)])

    def hidden_note(self) -> str:
        """The line below the rows that counts the rows left out for holding none of the metric
        (Outline), where the report puts its `(49 nodes hidden: …)`; '' when there are none."""
        n = self.outline.hidden() if self.outline is not None else 0
        if not n:
            return ""
        return f"({n:,} row{'s' if n != 1 else ''} with no {self.metric} hidden; m picks another metric)"

    def _note_row(self) -> int:
        """The row (0: the first below the column headers) the hidden rows' note is drawn on."""
        o = self.outline
        n = len(o) if o is not None else 0
        return n if n else int(bool(self.empty_message))

    def _update_size(self) -> None:
        n = len(self.outline) if self.outline is not None else 0
        # Width 0: rows are cut to the width on screen, never scrolled sideways. A virtual width
        # of the whole widget would add a horizontal scrollbar (the vertical one takes columns),
        # which takes the bottom line and hides the row the cursor moved to.
        # +1: the column header line; and the hidden rows' note, under the rows.
        self.virtual_size = Size(0, n + 1 + bool(self.hidden_note()))

    def _post(self) -> None:
        k = self.current_key
        if k is not None:
            self.post_message(self.Highlighted(self, k))

    def structure_changed(self) -> None:
        self._update_size()
        self._scroll_to_cursor()
        self.refresh()

    # -- columns ----------------------------------------------------------------------------

    def _layout(self, width: int) -> list[tuple[str, str, int]]:
        """(header, metric or role, width) of the value columns that fit beside the names.

        Every column is as wide as its widest value, so that the header, right-aligned like
        the numbers, ends where they end: the view's total bounds every row's value (metrics
        are sums of non-negative parts), so its text is the widest there is. The `%` column
        holds the percentage only; the bar beside it has no header."""
        if self._col_width == width and self._columns:
            return self._columns
        src = self.outline.rows if self.outline is not None else None

        def fit(head: str, m: str, least: int) -> int:
            widest = fmt_metric(m, src.total(COL[m])) if src is not None else ""
            return max(least, len(head), len(widest))

        prim, sec = (src.primary_name, src.secondary_name) if src else ("incl", "self")
        vw = fit(prim, self.metric, VALUE_W)
        cols: list[tuple[str, str, int]] = [("%", "%", PCT_W), ("", "bar", BAR_W), (prim, "primary", vw),
                                            (sec, "secondary", max(vw, len(sec)))]
        # Several ranks, flat view: each row's spread over the ranks, before the per-kind columns.
        ranks = src.per_rank(COL[self.metric]) if isinstance(src, FlatRows) else None
        if ranks is not None:
            cols += [("min", "rank:min", vw), ("median", "rank:median", vw), ("max", "rank:max", vw),
                     ("rank", "rank:which", max(5, len(f"r{max(ranks[0])}")))]
        for head, m in KIND_COLUMNS:
            if src is None or m == self.metric or src.total(COL[m]) == 0:
                continue
            cols.append((head, m, fit(head, m, COUNT_W if m.endswith("count") else VALUE_W)))
        while len(cols) > 4 and width - sum(w + 1 for _, _, w in cols) < NAME_MIN:
            cols.pop()
        self._columns, self._col_width = cols, width
        return cols

    def column_spans(self) -> list[tuple[str, str, int, int]]:
        """(header, role, first cell, one past the last cell) of each value column on screen,
        in cells from the table's left edge: where each header and its values are drawn."""
        width = self.scrollable_content_region.width
        cols = self._layout(width)
        x = max(width - sum(w + 1 for _, _, w in cols), 8)
        spans = []
        for head, role, w in cols:
            spans.append((head, role, x + 1, x + 1 + w))
            x += w + 1
        return spans

    def on_resize(self, event: events.Resize) -> None:
        self._col_width = 0
        self._update_size()
        if self._center_pending and event.size.height > 1:
            # The scroll show() made for a one-row table is no guide: from the top when the
            # cursor fits on the first screen (the path above it shows), else centered.
            self._center_pending = False
            h = self.visible_rows()
            y = 0 if self.cursor < h else self.cursor - h // 2
            self.scroll_to(y=y, animate=False, immediate=True, force=True)
        self._scroll_to_cursor()

    # -- rendering --------------------------------------------------------------------------

    def _indent_unit(self, name_w: int) -> int:
        # Deep trees in narrow terminals: one cell per level keeps names readable.
        return 2 if name_w >= 60 else 1

    def _name_width(self) -> int:
        width = self.scrollable_content_region.width
        return max(width - sum(w + 1 for _, _, w in self._layout(width)), 8)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        cols = self._layout(width)
        name_w = max(width - sum(w + 1 for _, _, w in cols), 8)
        if y == 0:
            return self._header_strip(cols, name_w, width)
        o = self.outline
        r = int(self.scroll_offset.y) + y - 1
        if o is not None and not len(o) and y == 1 and self.empty_message:
            text = set_cell_size("  " + safe_text(self.empty_message), width)
            return Strip([Segment(text, self.rich_style + Style(italic=True))], width)
        if o is not None and r == self._note_row():
            note = self.hidden_note()
            if note:
                text = set_cell_size("  " + note, width)
                return Strip([Segment(text, self.rich_style + Style(italic=True, dim=True))], width)
        if o is None or r >= len(o):
            return Strip.blank(width, self.rich_style)
        if self.first_paint is None:
            self.first_paint = time.perf_counter()
        return Strip(self._row_segments(r, cols, name_w, width), width)

    def _header_strip(self, cols: list[tuple[str, str, int]], name_w: int, width: int) -> Strip:
        """Column headers, right-aligned in the columns' widths as the numbers are. Only the
        words are underlined: a rule across the gaps would join each header to its neighbours."""
        style = self.get_component_rich_style("tree-table--header")
        gap = style + Style(underline=False)
        segs = [Segment("name", style), Segment(" " * (name_w - 4), gap)]
        for head, _, w in cols:
            segs += [Segment(" " * (w + 1 - len(head)), gap), Segment(head, style)]
        return Strip(list(Segment.adjust_line_length(segs, width, gap)), width)

    def _row_segments(self, r: int, cols: list[tuple[str, str, int]], name_w: int, width: int) -> list[Segment]:
        o = self.outline
        assert o is not None
        src = o.rows
        key = int(o.keys[r])
        k1 = np.array([key])
        col = COL[self.metric]
        base = self.rich_style
        frame = src.frame(key)
        if r == self.cursor:
            row_style = base + self.get_component_rich_style("tree-table--cursor")
        else:
            row_style = base
        # Name cell: indentation, expander, the name (never markup: Segments are literal text).
        depth = int(o.depth[r])
        indent = " " * (self._indent_unit(name_w) * min(depth, 30)) if src.is_tree else ""
        if src.is_tree and o.expandable(key):
            mark = "▾ " if key in o.expanded else "▸ "
        else:
            mark = "  " if src.is_tree else ""
        label = src.label(key)
        if frame.kind == "python" and frame.has_source and src.is_tree:
            name_style = self.get_component_rich_style("tree-table--source")
        elif frame.kind == "python":
            name_style = self.get_component_rich_style("tree-table--library")
        else:
            name_style = _KIND_STYLE.get(frame.kind, Style())
        head = indent + mark
        if cell_len(head) > name_w - 8:
            head = "…" + head[-(name_w - 9):] if name_w > 9 else ""
        room = name_w - cell_len(head)
        name = fit_label(frame, label, room)
        segs = [Segment(head, row_style), Segment(name, row_style + name_style)]
        # The line's code beside its name, as `dlpt report` prints it, where the column has room.
        spare = room - cell_len(name) - len(CODE_MARK)
        code = src.code(key) if spare >= CODE_MIN and frame.kind == "python" else ""
        if code:
            text = code if cell_len(code) <= spare else set_cell_size(code, spare - 1) + "…"
            segs.append(Segment(CODE_MARK + text, row_style + self.get_component_rich_style("tree-table--code")))
            spare -= cell_len(text)
        segs.append(Segment(" " * max(spare + (len(CODE_MARK) if not code else 0), 0), row_style))
        prim = int(src.primary(k1, col)[0])
        frac = prim / self.total if self.total > 0 else 0.0
        for _, role, w in cols:
            if role == "%":
                cell = f"{100.0 * frac:5.1f}%"
            elif role == "bar":
                cell = bar(frac, w)
            elif role == "primary":
                cell = fmt_metric(self.metric, prim) if prim else ""
            elif role == "secondary":
                v = int(src.secondary(k1, col)[0])
                cell = fmt_metric(self.metric, v) if v else ""
            elif role.startswith("rank:"):
                spread = src.rank_spread(key, col) if isinstance(src, FlatRows) else None
                i = ("rank:min", "rank:median", "rank:max", "rank:which").index(role)
                if spread is None or not spread[2]:
                    cell = ""
                else:
                    cell = f"r{spread[3]}" if i == 3 else fmt_metric(self.metric, spread[i]) if spread[i] else ""
            else:
                v = int(src.kind_values(k1, COL[role])[0])
                cell = fmt_metric(role, v) if v else ""
            segs.append(Segment(" " + set_cell_size(cell, w) if role == "bar" else " " + cell[-w:].rjust(w), row_style))
        used = sum(cell_len(s.text) for s in segs)
        if used < width:
            segs.append(Segment(" " * (width - used), row_style))
        return list(Segment.adjust_line_length(segs, width, row_style))

    # -- cursor and keys --------------------------------------------------------------------

    def visible_rows(self) -> int:
        """Rows on screen below the column header line."""
        return max(self.scrollable_content_region.height - 1, 1)

    def _page(self) -> int:
        return max(self.visible_rows() - 1, 1)

    def _scroll_to_cursor(self, center: bool = False) -> None:
        # force=True: right after rows were added (`e`, enter) textual has not yet decided that
        # the table needs a scrollbar, and would refuse to scroll until the next layout.
        h = self.visible_rows()
        top = int(self.scroll_offset.y)
        # On the last row, the note below it comes into view with it.
        last = self.outline is not None and self.cursor == len(self.outline) - 1 and bool(self.hidden_note())
        bottom = self.cursor + last
        if center and not (top <= self.cursor < top + h):
            self.scroll_to(y=max(self.cursor - h // 2, 0), animate=False, immediate=True, force=True)
        elif self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True, force=True)
        elif bottom >= top + h:
            self.scroll_to(y=bottom - h + 1, animate=False, immediate=True, force=True)

    def move_to(self, r: int) -> None:
        o = self.outline
        if o is None or not len(o):
            return
        r = min(max(r, 0), len(o) - 1)
        old, self.cursor = self.cursor, r
        self._scroll_to_cursor()
        top = int(self.scroll_offset.y)
        # Repaint only the two rows that changed.
        for row in (old, r):
            if 0 <= row - top < self.visible_rows():
                self.refresh_line(row + 1)  # virtual line: +1 for the column header
        if old != r:
            self._post()

    def action_cursor(self, step: int) -> None:
        self.move_to(self.cursor + step)

    def action_page(self, step: int) -> None:
        self.move_to(self.cursor + step * self._page())

    def action_jump(self, where: int) -> None:
        self.move_to(0 if where == 0 else (len(self.outline) - 1 if self.outline is not None else 0))

    def action_toggle_row(self) -> None:
        if self.outline is not None and len(self.outline) and self.outline.toggle(self.cursor):
            self.structure_changed()

    def action_open(self) -> None:
        o = self.outline
        if o is None or not len(o):
            return
        if o.expand(self.cursor):
            self.structure_changed()
        elif o.is_expanded(self.cursor) and self.cursor + 1 < len(o) and o.depth[self.cursor + 1] > o.depth[self.cursor]:
            self.move_to(self.cursor + 1)

    def action_close(self) -> None:
        o = self.outline
        if o is None or not len(o):
            return
        if o.collapse(self.cursor):
            self.structure_changed()
        else:
            self.move_to(o.parent_row(self.cursor))

    def on_click(self, event: events.Click) -> None:
        o = self.outline
        if o is None or event.y < 1:
            return
        r = int(self.scroll_offset.y) + event.y - 1
        if r >= len(o):
            return
        self.move_to(r)
        indent = self._indent_unit(self._name_width()) * min(int(o.depth[r]), 30) if o.rows.is_tree else 0
        # A double click, or a click on the ▸/▾ mark, opens or closes the row.
        if event.chain >= 2 or indent <= event.x + int(self.scroll_offset.x) < indent + 2:
            self.action_toggle_row()
