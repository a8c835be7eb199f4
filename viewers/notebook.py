"""dlpt in Jupyter: `%load_ext dlpt` registers the `%%dlpt` cell magic, which records the cell
(`dlpt.profile`) and shows the profile as the HTML view; a `Profile` shown in a cell is that view.

    %load_ext dlpt
    %%dlpt                      # the profile goes to a new temporary file
    %%dlpt run.dlpt             # or to run.dlpt (overwritten: the cell is meant to be re-run)
    %%dlpt run.dlpt --steps 2:4 # record steps 2..3 only

After the cell, `_dlpt` holds the `Profile`."""

from __future__ import annotations

import os
import shlex
import tempfile
from typing import Any

from dlpt.errors import DlptError
from dlpt.profile import Profile

CELL_HEIGHT = 640  # pixels: the view in a notebook is a frame of this height, full width


def profile_html(profile: Profile) -> str:
    """`Profile._repr_html_`: the HTML view in a frame sized for a cell."""
    from dlpt.viewers.exporters.html import notebook_html

    return notebook_html(profile, CELL_HEIGHT)


def _parse(line: str) -> tuple[str | None, str | None]:
    words = shlex.split(line)
    path = steps = None
    while words:
        w = words.pop(0)
        if w == "--steps" and words:
            steps = words.pop(0)
        elif w.startswith("--steps="):
            steps = w.split("=", 1)[1]
        elif not w.startswith("-") and path is None:
            path = w
        else:
            raise DlptError(f"%%dlpt: unknown argument {w!r}; usage: %%dlpt [OUT.dlpt] [--steps A:B]")
    return path, steps


_CELL_DIR: list[str] = []


def _cell_dir() -> str:
    """The folder of this kernel's cell profiles without a path of their own: one per process,
    removed when the kernel exits (`_dlpt.path` stays readable while it runs)."""
    if not _CELL_DIR:
        import atexit
        import shutil

        _CELL_DIR.append(tempfile.mkdtemp(prefix="dlpt-cells-"))
        atexit.register(shutil.rmtree, _CELL_DIR[0], True)
    return _CELL_DIR[0]


def dlpt_cell(line: str, cell: str, shell: Any) -> Profile | None:
    """Run `cell` in the notebook's namespace under `dlpt.profile(path, force=True)`, then show
    the result. A fresh temporary file when no path is given."""
    from dlpt.api import profile

    try:
        path, steps = _parse(line)
    except DlptError as e:
        print(f"dlpt: {e}")
        return None
    count = getattr(shell, "execution_count", None)
    if path is None:
        path = os.path.join(_cell_dir(), f"cell-{count}.dlpt" if count is not None else "cell.dlpt")
    # The run is the cell, not the kernel's command line (`ipykernel_launcher.py -f …`).
    rec = profile(path, steps=steps, force=True, quiet=True, name=f"%%dlpt cell [{count}]" if count else "%%dlpt cell")
    import linecache

    before = set(linecache.cache)
    try:
        with rec:
            shell.run_cell(cell)
    except DlptError as e:
        print(f"dlpt: {e}")
        return None
    prof = rec.result
    entry = _cell_file(cell, set(linecache.cache) - before)
    if prof is not None and entry is not None:
        # The cell as its user reads it: not the kernel's threads and machinery (dlpt.transforms).
        from dlpt.store import save
        from dlpt.transforms import to_block

        prof = to_block(prof, entry)
        save(prof, path, force=True)
    if prof is not None:
        shell.user_ns["_dlpt"] = prof
        from IPython.display import display

        display(prof)
    return None


def _cell_file(cell: str, new_files: set[str]) -> str | None:
    """The file name IPython compiled the cell under: of the names it put into `linecache` while
    the cell ran (IPython keeps each cell's code there), the one holding the cell's code."""
    import linecache

    want = cell.strip()
    for name in sorted(new_files):
        entry = linecache.cache.get(name)
        lines = entry[2] if isinstance(entry, tuple) and len(entry) > 2 else None
        if lines is not None and "".join(lines).strip() == want:
            return name
    return None


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magic_function(lambda line, cell: dlpt_cell(line, cell, ipython), magic_kind="cell",
                                    magic_name="dlpt")
