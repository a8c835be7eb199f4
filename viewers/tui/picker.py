"""The `m` screen: pick the metric directly, each shown with its total in the profile."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from dlpt.metrics import METRICS, REGISTRY
from dlpt.viewers.format import fmt_metric

ABOUT = {m.name: m.about for m in REGISTRY}


def offered_metrics(totals: dict[str, int], current: str) -> list[str]:
    """The metrics worth offering: those with something in this profile, and the current one."""
    return [m for m in METRICS if totals.get(m, 0) or m == current]


class MetricPicker(ModalScreen[str | None]):
    """A list of metrics; enter picks one, escape keeps the current."""

    BINDINGS = [Binding("escape,q,m", "cancel", "keep")]

    # One frame, and the list inside it: OptionList's own `tall` border (and its `:focus`
    # variant, which outranks a plain descendant rule) drew a second box within the first, and
    # the title above the list left it taller than the room under the title (percentages are of
    # the whole box), so with many metrics at 80×24 the list ran out through the bottom border.
    # The title sits in the frame's top line instead; the list scrolls within what is left.
    DEFAULT_CSS = """
    MetricPicker { align: center middle; }
    MetricPicker > Vertical { width: 64; max-width: 100%; height: auto; max-height: 100%;
                              border: round $accent; border-title-style: bold; border-title-color: $text;
                              background: $surface; padding: 0 1; }
    MetricPicker OptionList, MetricPicker OptionList:focus { height: auto; max-height: 100%; border: none;
                                                            padding: 0; background-tint: $foreground 0%; }
    """

    def __init__(self, totals: dict[str, int], current: str) -> None:
        super().__init__()
        self.totals = totals
        self.current = current
        self.metrics = offered_metrics(totals, current)

    def compose(self) -> ComposeResult:
        options = []
        for m in self.metrics:
            t = Text()
            t.append(f"{m:<18}", style="bold" if m == self.current else "")
            t.append(f"{fmt_metric(m, self.totals.get(m, 0)):>10}  ")
            t.append(ABOUT.get(m, ""), style="dim")
            options.append(Option(t, id=m))
        with Vertical() as box:
            box.border_title = "metric · enter picks · escape keeps the current one"
            yield OptionList(*options, id="metrics")

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        ol.highlighted = self.metrics.index(self.current) if self.current in self.metrics else 0
        ol.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
