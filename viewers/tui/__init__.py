"""`dlpt view`: the terminal UI. `DlptApp` is the textual application; `model` holds the pure
row logic it draws from."""

from __future__ import annotations

from dlpt.viewers.tui.app import DlptApp, run_app

__all__ = ["DlptApp", "run_app"]
