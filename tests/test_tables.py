"""`Profile.to_dataframe`: every view as a pandas table whose totals are the tree's."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import TRACE_NAMES, trace_path

import dlpt
from dlpt.metrics import COL, METRICS
from dlpt.profile import Profile
from dlpt.transforms import hide_library_unless
from dlpt.views import GROUPINGS


@functools.cache
def prof(name: str) -> Profile:
    return dlpt.load(str(trace_path(name)))


def totals(p: Profile) -> dict[str, int]:
    t = p.cct.exclusive.sum(axis=0)
    return {m: int(t[COL[m]]) for m in METRICS}


@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize("include_library", [False, True])
def test_top_down_rows_are_the_cct(name, include_library):
    p = prof(name)
    cct = hide_library_unless(p, include_library).cct
    df = p.to_dataframe(view="top-down", include_library=include_library)
    assert len(df) == len(cct) and df.index.name == "node"
    assert np.array_equal(df["parent"].to_numpy(), cct.parent)
    assert np.array_equal(df["depth"].to_numpy(), cct.depth)
    for m, v in totals(p).items():
        assert int(df[m].sum()) == v
        assert int(df.loc[0, f"{m}_inc"]) == v
    assert {"name", "kind", "file", "line", "function"} <= set(df.columns)


def test_inclusive_is_exclusive_plus_children():
    df = prof("gpt_train").to_dataframe()
    child_inc = df[df.parent >= 0].groupby("parent")["gpu_time_inc"].sum()
    expect = df["gpu_time"].add(child_inc, fill_value=0).astype(np.int64)
    assert (expect == df["gpu_time_inc"]).all()


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_bottom_up_and_flat_keep_totals(name):
    p = prof(name)
    want = totals(p)
    bu = p.to_dataframe(view="bottom-up")
    for m, v in want.items():
        assert int(bu[m].sum()) == v
    for by in GROUPINGS:
        fl = p.to_dataframe(view="flat", by=by)
        for m, v in want.items():
            assert int(fl[m].sum()) == v, (by, m)
        # Inclusive counts each subtree once per group: never above the total.
        assert (fl["gpu_time_inc"] <= want["gpu_time"]).all()


def test_flat_by_line_rows_and_order():
    df = prof("gpt_train").to_dataframe(view="flat", by="line")
    assert list(df["gpu_time"]) == sorted(df["gpu_time"], reverse=True)
    top = df.iloc[0]
    assert top["file"] == "capture_traces.py" and top["line"] > 0 and top["kind"] == "python"
    assert top["name"] == f"capture_traces.py:{top['line']} {top['function']}"
    assert "code" in df.columns


def test_flat_by_kernel_names_kernels():
    p = prof("copies")
    df = p.to_dataframe(view="flat", by="kernel")
    assert any(n.startswith("Memcpy HtoD") for n in df["name"])
    assert set(df["kind"]) <= {"kernel", "memcpy", "memset", "unattributed"}
    htod = df[df["name"].str.startswith("Memcpy HtoD")]
    assert int(htod["htod_bytes"].sum()) == totals(p)["htod_bytes"]


def test_bad_view_or_grouping_is_a_user_error():
    with pytest.raises(dlpt.DlptError):
        prof("copies").to_dataframe(view="sideways")
    with pytest.raises(dlpt.DlptError):
        prof("copies").to_dataframe(view="flat", by="planet")
