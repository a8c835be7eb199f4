"""How dlpt/merge.py numbers ranks, on profiles written out here: the ranks their meta records
when every input has a distinct one, else the order given (skipping the ranks of inputs that are
merged already); `--as-ranks` numbers every rank in the order given, merged inputs' too. Each
rank node's total is checked against its input's own total. Written for the mutants
tools/mutate.py found alive in merge.py (docs/MUTATION.md)."""

from __future__ import annotations

import pytest
from conftest import synthetic_profile

from dlpt.frames import Frame
from dlpt.merge import is_merged, merge_profiles, rank_numbers, rank_of
from dlpt.metrics import COL


def prof(ns: int, rank=None):
    p = synthetic_profile([([Frame("python", "step (t.py:3)", "t.py", 3, "step"), Frame("kernel", "k")], ns)])
    if rank is not None:
        p.meta["rank"] = rank
    return p


def ranks_and_totals(merged) -> list[tuple[str, int]]:
    """(rank node name, its inclusive GPU time), top nodes in tree order."""
    cct = merged.cct
    tops = [i for i in range(len(cct.parent)) if cct.parent[i] == 0]
    return [(merged.frame_of(i).name, int(cct.inclusive[i, COL["gpu_time"]])) for i in tops]


@pytest.mark.parametrize("ranks, taken, want", [
    ([2, 0], None, [2, 0]),  # every input's own rank, distinct
    ([1, 1], None, [0, 1]),  # shared: the order given
    ([3, None], None, [0, 1]),  # one unknown
    ([True, 0], None, [0, 1]),  # a bool is no rank
    ([-1, 0], None, [0, 1]),
    ([None, None], {0, 2}, [1, 3]),  # the order given, around the ranks already merged
    ([1, 4], {1}, [0, 2]),  # an own rank already taken
    ([3, 4], {1}, [3, 4]),
])
def test_rank_numbers(ranks, taken, want) -> None:
    assert rank_numbers([prof(1, r) for r in ranks], taken) == want


def test_rank_of_and_is_merged() -> None:
    assert rank_of(Frame("rank", "rank 12")) == 12
    assert rank_of(Frame("rank", "rank x")) is None
    assert rank_of(Frame("python", "rank 3", "t.py", 1, "f")) is None
    assert rank_of(Frame("rank", "node 3")) is None
    a, b = prof(10, 0), prof(20, 1)
    assert not is_merged(a)
    assert is_merged(merge_profiles([a, b]))


def test_merged_inputs_keep_their_ranks_and_the_new_ones_fill_the_gaps() -> None:
    first = merge_profiles([prof(10, 0), prof(20, 2)])
    assert ranks_and_totals(first) == [("rank 0", 10), ("rank 2", 20)]
    both = merge_profiles([prof(40), first, prof(80)])  # the unnumbered take 1 and 3
    # (a merged input's rank nodes stay together, placed by its first rank)
    assert sorted(ranks_and_totals(both)) == [("rank 0", 10), ("rank 1", 40), ("rank 2", 20), ("rank 3", 80)]


def test_as_ranks_numbers_every_rank_in_the_order_given() -> None:
    first = merge_profiles([prof(10, 0), prof(20, 1)])
    got = merge_profiles([prof(5, 7), first, prof(80, 0)], as_ranks=True)
    assert ranks_and_totals(got) == [("rank 0", 5), ("rank 1", 10), ("rank 2", 20), ("rank 3", 80)]
    assert merge_profiles([first]) is first  # one input: itself
