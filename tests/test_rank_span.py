"""What a merged rank's comm wait is a share of (dlpt/findings.py `_rank_span`), from rank meta
written out here: its phase's window, else its collectives' span, else its recording window,
else its host time. Written for mutants tools/mutate.py found reached by no fast test."""

from __future__ import annotations

import pytest
from test_merge_numbers import two_paths

from dlpt.findings import _rank_span
from dlpt.merge import merge_profiles
from dlpt.metrics import COL
from dlpt.ranks import rank_nodes


@pytest.mark.parametrize("meta, want", [
    ({"window": {"start": 0, "end": 900, "wall": 50}}, (50, "its steady time")),
    ({"window": {"start": 0, "end": 900}, "collective_span": 70}, (70, "the time between its first and last collective")),
    ({"window": {"start": 100, "end": 900}}, (800, "its wall time")),
    ({}, None),
])
def test_rank_span(meta, want) -> None:
    merged = merge_profiles([two_paths(1, 2, 0), two_paths(3, 4, 1)])
    merged.meta["phase"] = "steady"
    (r0, n0), (r1, n1) = rank_nodes(merged)
    merged.meta["ranks"] = [{"rank": r0}, {"rank": r1, **meta}]
    host = int(merged.cct.inclusive[n1, COL["host_time"]])
    assert _rank_span(merged, r1, n1) == (want or (host, "its host time"))
    assert _rank_span(merged, r0, n0) == (int(merged.cct.inclusive[n0, COL["host_time"]]), "its host time")
