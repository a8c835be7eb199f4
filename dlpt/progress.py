"""Progress on long work: a bar on a terminal, silence otherwise (pipes, CI, tests)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Progress = Callable[[str, int, int], None]


@contextmanager
def progress_for(progress: Progress | None) -> Iterator[Progress | None]:
    """`progress` if given; else a rich bar on stderr when it is a terminal; else None."""
    if progress is not None or not sys.stderr.isatty():
        yield progress
        return
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    bar = Bar(TextColumn("dlpt: {task.description}"), BarColumn(), TimeElapsedColumn(),
              console=Console(stderr=True), transient=True)
    task = bar.add_task("", total=None)
    with bar:
        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total or None)

        yield update
