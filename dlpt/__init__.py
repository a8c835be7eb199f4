"""dlpt: which line of your PyTorch program spends the GPU's time.

    import dlpt
    prof = dlpt.load("run.dlpt")          # a .dlpt profile, a Kineto trace or a directory
    prof = dlpt.load(["run.rank0.dlpt", "run.rank1.dlpt"])   # ranks, merged
    prof.to_dataframe(view="flat", by="line")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlpt.errors import DlptError
from dlpt.profile import Profile, default_metric
from dlpt.version import __version__

if TYPE_CHECKING:
    import hatchet
    import networkx as nx
    import pandas as pd


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


def to_dataframe(self: Profile, view: str = "top-down", by: str = "line",
                 include_library: bool = False) -> pd.DataFrame:
    """The chosen view as a pandas DataFrame, one row per node or group, metrics in
    nanoseconds, bytes and counts (`*_inc` for inclusive)."""
    from dlpt.interop.tables import view_dataframe

    return view_dataframe(self, view=view, by=by, include_library=include_library)


def to_graphframe(self: Profile, include_library: bool = False, metric: str | None = None) -> hatchet.GraphFrame:
    """The calling-context tree as a hatchet GraphFrame (exclusive metrics as `gpu_time`,
    inclusive as `gpu_time (inc)`, integers in ns/bytes/counts), built from the arrays. The
    default metric is the one every view ranks by (`default_metric`)."""
    from dlpt.interop.graphframe import to_graphframe as build

    return build(self, metric or default_metric(self), include_library=include_library)


def call_graph(self: Profile, include_library: bool = False) -> nx.DiGraph:
    """The function-level caller/callee graph (networkx), metrics on nodes and edges."""
    from dlpt.interop.callgraph import call_graph as build

    return build(self, include_library=include_library)


# Methods of Profile that live above the model, bound here by the package: a Profile in a
# notebook cell shows as the HTML view (dlpt.viewers), and `to_dataframe`, `to_graphframe` and
# `call_graph` hand it to the adapters (dlpt.interop), which read the model. The model
# (dlpt.profile) imports neither, so nothing it imports imports it back (tests/test_layers.py).
Profile._repr_html_ = _repr_html_  # type: ignore[attr-defined]
Profile.to_dataframe = to_dataframe  # type: ignore[attr-defined]
Profile.to_graphframe = to_graphframe  # type: ignore[attr-defined]
Profile.call_graph = call_graph  # type: ignore[attr-defined]

# Bound last: `dlpt.profile` is also the name of the submodule that holds `Profile`, and importing
# that submodule sets the package attribute; the recording API must win.
from dlpt.api import profile, step  # noqa: E402

__all__ = ["DlptError", "Profile", "__version__", "load", "profile", "step"]
