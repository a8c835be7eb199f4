"""Row names of the TUI: a frame as a name, and names cut to a column's width where they read
best (a source row keeps `file:line` whole; paths lose whole directories first)."""

from __future__ import annotations

import os
import re

from rich.cells import cell_len, set_cell_size

from dlpt.frames import Frame, short_path
from dlpt.viewers.format import safe_text, short_kernel_name


def frame_label(frame: Frame) -> str:
    """A frame as a row name: `file:line function` for source, kernel names shortened."""
    if frame.kind == "kernel":
        return safe_text(short_kernel_name(frame.name, 200))
    return safe_text(frame.label())


_FROZEN = re.compile(r"<frozen (.+)>")


def _cell_tail(text: str, width: int) -> str:
    """The longest end of `text` that fits in `width` cells."""
    i = len(text)
    while i > 0 and cell_len(text[i - 1:]) <= width:
        i -= 1
    return text[i:]


def fit_path(path: str, width: int, end: str = "") -> str:
    """`path` and `end` (a `:line`) in at most `width` cells, cut where it reads best: the
    directories go first, from the left and whole (`…/`), then the file name loses its middle,
    never its start or its end, and `end` stays whole. A frozen module's package is its directory
    (`<frozen importlib._bootstrap>` → `<frozen …_bootstrap>`). Cut from the left instead, a
    name read `…lib._bootstrap>:690`: neither the file nor its module."""
    m = _FROZEN.fullmatch(path)
    if m:
        parts = m.group(1).split(".")
        name = parts[-1]
        forms = [path] + ([f"<frozen …{name}>"] if len(parts) > 1 else [])
    else:
        parts = path.split("/")
        name = parts[-1]
        forms = [path] + ["…/" + "/".join(parts[i:]) for i in range(1, len(parts))]
    for form in [*forms, name]:
        if cell_len(form) + cell_len(end) <= width:
            return form + end
    room = width - cell_len(end) - 1  # cells for the name's two ends, beside the `…`
    if room < 2:
        return set_cell_size(name + end, width - 1) + "…" if width > 1 else "…"[:width]
    head = set_cell_size(name, (room + 1) // 2)
    return head + "…" + _cell_tail(name, room - cell_len(head)) + end


def fit_label(frame: Frame, label: str, width: int) -> str:
    """`label` in at most `width` cells. A source row keeps `file:line` whole, because that is
    what the user looks for: its directory goes first, then the end of the function name; a file
    name longer than the column loses its middle (fit_path). A file's row (flat by file) is a
    path, cut the same way. Other names are cut at the end."""
    if cell_len(label) <= width:
        return label
    if width <= 1:
        return "…"[:width]
    if frame.has_source and label == frame_label(frame):
        file = safe_text(os.path.basename(frame.file))
        where = f"{file}:{frame.line}"
        short = f"{where} {safe_text(frame.function)}"
        if cell_len(short) <= width:
            return short
        if cell_len(where) + 2 <= width:
            return set_cell_size(short, width - 1) + "…"
        return fit_path(file, width, f":{frame.line}")
    if frame.kind == "python" and frame.file and label == safe_text(short_path(frame.file)):
        return fit_path(label, width)
    return set_cell_size(label, width - 1) + "…"
