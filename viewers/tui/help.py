"""The `?` screen: every key, in plain text."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("1 / 2 / 3", "top-down / bottom-up / flat view"),
    ("g", "flat view: cycle the grouping (line, function, file, kernel, op)"),
    ("↑ ↓ PgUp PgDn Home End", "move"),
    ("enter, space", "expand or collapse the row"),
    ("→ / ←", "expand / collapse (← on a closed row goes to its parent)"),
    ("e", "expand the hottest path beneath the row"),
    ("/", "search: keep rows whose name contains the text, and their ancestors (empty clears)"),
    ("escape", "clear the search"),
    ("s", "cycle the metric: gpu, kernel, HtoD, DtoH, DtoD, memset, cpu time; kernel, copy counts"),
    ("l", "show or hide library frames (torch, standard library, dlpt)"),
    ("d", "show or hide the detail pane"),
    ("x", "export hotspots JSON next to the profile (<profile>.hotspots.json)"),
    ("?", "this help"),
    ("q", "quit"),
)

ABOUT = ("The tree's % is the row's inclusive share of the metric; 'self' is what the row does "
         "itself. In the flat view, 'self' is what the group owns (rows sum to the total) and "
         "'total' everything beneath it. Mouse: click selects, double click or a click on ▸ opens.")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: round $accent; padding: 0 1; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        t = Text()
        t.append("dlpt view — keys\n\n", style="bold")
        w = max(len(k) for k, _ in KEYS)
        for k, what in KEYS:
            t.append(k.ljust(w + 2), style="bold")
            t.append(what + "\n")
        t.append("\n" + ABOUT + "\n", style="dim")
        t.append("\nescape, q or ? closes this screen", style="italic")
        with VerticalScroll():
            yield Static(t, id="help-text")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
