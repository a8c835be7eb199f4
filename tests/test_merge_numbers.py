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


def subtrees(p, under_rank: bool) -> dict[str, list[tuple[tuple[str, ...], int]]]:
    """Rank name -> sorted (call path below the rank node, exclusive GPU time) of every node
    below it, walked parent by parent. A single profile's is under its root."""
    parent = p.cct.parent.tolist()
    out: dict[str, list] = {}
    for n in range(1, len(parent)):
        path = [n]
        while parent[path[-1]] > 0:
            path.append(parent[path[-1]])
        top = path[-1]
        names = tuple(p.frame_of(i).name for i in reversed(path[:-1] if under_rank else path))
        if names:
            key = p.frame_of(top).name if under_rank else "root"
            out.setdefault(key, []).append((names, int(p.cct.exclusive[n, COL["gpu_time"]])))
    return {k: sorted(v) for k, v in out.items()}


def two_paths(a: int, b: int, rank=None, **meta):
    line = Frame("python", "step (t.py:3)", "t.py", 3, "step")
    p = synthetic_profile([([line, Frame("python", "fwd (m.py:9)", "m.py", 9, "fwd"), Frame("kernel", "k")], a),
                           ([line, Frame("kernel", "copy")], b)])
    p.meta.update(meta)
    if rank is not None:
        p.meta["rank"] = rank
    return p


@pytest.mark.parametrize("as_ranks", [False, True])
def test_every_rank_is_its_input_tree_in_a_merge_of_merges(as_ranks) -> None:
    """Each input's tree, node by node, sits under its rank node; merged inputs' ranks too, and
    the merged root keeps the nothing its inputs' roots held (their sums)."""
    p0, p1, p2, p3 = two_paths(1, 2, 0), two_paths(30, 40, 1), two_paths(500, 600, 2), two_paths(7, 8, 3)
    left, right = merge_profiles([p0, p1]), merge_profiles([p2, p3])
    both = merge_profiles([left, right], as_ranks=as_ranks)
    got = subtrees(both, under_rank=True)
    assert got == {f"rank {r}": subtrees(p, under_rank=False)["root"] for r, p in enumerate([p0, p1, p2, p3])}
    assert int(both.cct.exclusive[0, COL["gpu_time"]]) == 0
    assert [m["rank"] for m in both.meta["ranks"]] == [0, 1, 2, 3]


def test_merged_meta() -> None:
    a = two_paths(1, 2, 0, world_size=2, skipped_events=3, torch_version="2.5", command="python t.py")
    b = two_paths(3, 4, 1, world_size=2, skipped_events=4, torch_version="2.6")
    m = merge_profiles([a, b]).meta
    assert m["world_size"] == 2 and m["skipped_events"] == 3 + 4
    assert m["torch_version"] == "2.5" and m["command"] == "python t.py"  # the first input's
    assert m["source"] == "record"  # conftest's synthetic profiles are recordings
    b.meta["source"] = "kineto"
    m = merge_profiles([a, b, two_paths(5, 6, 2, world_size=1), two_paths(7, 8, 3, skipped_events=None)],
                       as_ranks=True).meta
    assert m["source"] == "mixed" and m["world_size"] == 4  # more ranks than any input said
    assert [(r["rank"], r.get("world_size")) for r in m["ranks"]] == [(0, 2), (1, 2), (2, 1), (3, None)]
    assert m["skipped_events"] == 3 + 4  # absent or None: none skipped
    # device events of kinds dlpt does not read, summed over the inputs, most first
    a.meta["unknown_device_events"], b.meta["unknown_device_events"] = {"mtia_kernel": 3}, {"x": 1, "mtia_kernel": 2}
    assert merge_profiles([a, b]).meta["unknown_device_events"] == {"mtia_kernel": 5, "x": 1}


def test_merged_sources_and_path_are_the_inputs() -> None:
    a, b = two_paths(1, 2, 0), two_paths(3, 4, 1)
    a.sources.update({"t.py": "a's t.py", "m.py": "m"})
    b.sources.update({"t.py": "b's t.py", "n.py": "n"})
    a.path, b.path = "/r/rank0.dlpt", "/r/rank1.dlpt"
    m = merge_profiles([a, b])
    assert m.sources == {"t.py": "a's t.py", "m.py": "m", "n.py": "n"}  # the first input's copy wins
    assert m.path == "/r/rank0.dlpt"


def test_a_merged_input_is_placed_by_its_lowest_rank() -> None:
    """Its rank nodes stay together, in the place of its lowest rank among the others."""
    first = merge_profiles([two_paths(10, 0, 0), two_paths(20, 0, 2)])
    both = merge_profiles([two_paths(40, 0, 1), first, two_paths(80, 0, 3)])
    assert [n for n, _ in ranks_and_totals(both)] == ["rank 0", "rank 2", "rank 1", "rank 3"]


def test_is_merged_needs_every_top_node_a_rank() -> None:
    empty = synthetic_profile([])
    assert not is_merged(empty)
    half = synthetic_profile([([Frame("rank", "rank 0"), Frame("kernel", "k")], 1),
                              ([Frame("python", "step (t.py:3)", "t.py", 3, "step"), Frame("kernel", "k")], 1)])
    assert not is_merged(half)
