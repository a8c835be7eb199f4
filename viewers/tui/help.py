"""The `?` screen: every key, in plain text."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dlpt.viewers.tui.rows import METRIC_CYCLE

KEYS = (
    ("1 / 2 / 3", "top-down / bottom-up / flat view"),
    ("g", "flat view: cycle the grouping (line, function, file, kernel, op)"),
    ("↑ ↓ PgUp PgDn Home End", "move"),
    ("enter, space", "expand or collapse the row"),
    ("→ / ←", "expand / collapse (← on a closed row goes to its parent)"),
    ("e", "open the hottest path beneath the row: it follows the costliest child while that child "
          "costs more than the row's own (self) time, and stops on the row that does the work itself"),
    ("b, backspace", "go back to the view, row and expansion before the last e, 1/2/3 or g"),
    ("/", "search: keep rows whose name or code contains the text, and their ancestors (empty clears)"),
    ("escape", "clear the search"),
    ("m", "pick the metric from a list (with each one's total)"),
    # The list the key cycles through, not a copy of it: a hand-written one left host_time out.
    ("s", "next metric this profile has, in this order: " + ", ".join(METRIC_CYCLE)),
    ("l", "show or hide library frames (torch, standard library, dlpt)"),
    ("d", "show or hide the detail pane"),
    ("x", "export hotspots JSON next to the profile (<profile>.hotspots.json)"),
    ("?", "this help"),
    ("q", "quit"),
)

ABOUT = ("The tree's % is the row's inclusive share of the metric; 'self' is what the row does "
         "itself. In the flat view, 'self' is what the group owns (rows sum to the total) and "
         "'total' everything beneath it. Rows with none of the metric are hidden; the line below the "
         "rows counts them, and another metric shows them. A source row shows its line of code (▸) "
         "where the column has room. Mouse: click selects, double click or a click on ▸ opens.")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: round $accent; padding: 0 1; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        # A grid, so that a long description wraps under itself, not under the keys.
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column(ratio=1)
        for k, what in KEYS:
            keys.add_row(Text(k), Text(what))
        body = Group(Text("dlpt view — keys\n", style="bold"), keys, Text("\n" + ABOUT + "\n", style="dim"),
                     Text("escape, q or ? closes this screen", style="italic"))
        with VerticalScroll():
            yield Static(body, id="help-text")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
