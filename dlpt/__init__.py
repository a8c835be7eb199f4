"""dlpt: which line of your PyTorch program spends the GPU's time.

    import dlpt
    prof = dlpt.load("run.dlpt")          # a .dlpt profile, a Kineto trace or a directory
    prof = dlpt.load(["run.rank0.dlpt", "run.rank1.dlpt"])   # ranks, merged
    prof.to_dataframe(view="flat", by="line")
"""

from __future__ import annotations

from dlpt.errors import DlptError
from dlpt.profile import Profile
from dlpt.version import __version__


def load(path: str | list[str], rank: int | None = None, as_ranks: bool = False) -> Profile:
    """Open a `.dlpt` profile, a Kineto trace (`.json`, `.json.gz`) or a directory of them;
    several paths (ranks) are merged, each rank's tree under a `rank N` node; `rank` keeps one.
    Inputs that are not the ranks of one run raise DlptError unless `as_ranks` (`--as-ranks`)."""
    from dlpt.loader import open_profiles

    return open_profiles([path] if isinstance(path, str) else list(path), rank, as_ranks=as_ranks)


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext dlpt`: the `%%dlpt` cell magic (dlpt.viewers.notebook)."""
    from dlpt.viewers.notebook import load_ipython_extension as load

    load(ipython)


def _repr_html_(self: Profile) -> str:
    from dlpt.viewers.notebook import profile_html

    return profile_html(self)


# A Profile in a notebook cell shows as the HTML view. Bound here, by the package, because the
# model (dlpt.profile) never imports viewers (tests/test_layers.py).
Profile._repr_html_ = _repr_html_  # type: ignore[attr-defined]

# Bound last: `dlpt.profile` is also the name of the submodule that holds `Profile`, and importing
# that submodule sets the package attribute; the recording API must win.
from dlpt.api import profile, step  # noqa: E402

__all__ = ["DlptError", "Profile", "__version__", "load", "profile", "step"]
