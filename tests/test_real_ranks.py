"""Two real NCCL ranks (tests/data/gpu_ddp2_rank{0,1}.dlpt): bench/ranks.py's DDP program on two
H100 (2026-11-28, `python bench/run.py device ranks ddp --steps 20`), rank 1 given twice rank 0's
batch on the line marked `# forward`, recorded by `torchrun ... dlpt record`. Merging them is
where comm wait is estimated (from the ranks' collective logs) and where the phase tables of the
ranks are joined (dlpt/merge.py): both checked here against the inputs' own figures, and the
straggler against what the program does. Truth: the program's source, stored in the profiles."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA

import dlpt
from dlpt.merge import merge_profiles
from dlpt.metrics import COL, METRICS
from dlpt.phases import phase_profile_rows, select_phase
from dlpt.ranks import straggler
from dlpt.transforms import hide_library_unless

PATHS = [str(DATA / f"gpu_ddp2_rank{r}.dlpt") for r in (0, 1)]


@pytest.fixture(scope="module")
def ranks() -> list[dlpt.Profile]:
    return [dlpt.load(p) for p in PATHS]


@pytest.fixture(scope="module")
def merged(ranks: list[dlpt.Profile]) -> dlpt.Profile:
    return merge_profiles(ranks)


def _forward_line(p: dlpt.Profile) -> int:
    (src,) = p.sources.values()
    return next(i for i, t in enumerate(src.splitlines(), 1) if t.rstrip().endswith("# forward"))


def _per_phase(t) -> dict[str, np.ndarray]:
    """A phase table's rows summed per phase name, from the table's own arrays."""
    out: dict[str, np.ndarray] = {}
    for code, name in enumerate(t.names):
        rows = t.exclusive[t.phase == code]
        if len(rows):
            out[name] = out.get(name, 0) + rows.sum(axis=0)
    return out


def test_the_phases_of_the_merge_are_the_ranks_phases_plus_the_comm_wait(ranks, merged) -> None:
    assert merged.phases is not None
    want: dict[str, np.ndarray] = {}
    for p in ranks:
        for name, v in _per_phase(phase_profile_rows(p)).items():
            want[name] = want.get(name, 0) + v
    got = _per_phase(merged.phases)
    assert set(got) == set(want)
    cw = COL["comm_wait_time"]
    others = [i for i in range(len(METRICS)) if i != cw]
    for name in want:
        assert got[name][others].tolist() == want[name][others].tolist(), name
    # comm wait is the merge's own estimate: in the phases exactly as in the tree, and some of it
    # in the steady state (rank 0 waits there for rank 1's larger batch at every step).
    tree = merged.cct.exclusive.sum(axis=0)
    assert sum(int(v[cw]) for v in got.values()) == int(tree[cw]) > 0
    assert got["steady"][cw] > 0
    # The phases hold the whole tree, metric by metric.
    assert (sum(got.values()) == tree).all()
    # Start-up holds the communicator's rendezvous (DDP's constructor waits for every rank to
    # join before the first step), the steady state the steps' waits: each wait in its phase.
    assert got["start-up"][cw] > 0
    assert merged.meta.comm_wait.startswith("estimated")
    # Each GPU activity keeps the phase it had on its rank.
    count = {}
    for p in [*ranks, merged]:
        t = phase_profile_rows(p)
        count[id(p)] = {n: int((t.activity_phase == c).sum()) for c, n in enumerate(t.names)}
    for name in count[id(merged)]:
        assert count[id(merged)][name] == sum(count[id(p)].get(name, 0) for p in ranks), name


def test_the_straggler_is_the_rank_with_the_larger_batch_on_its_forward_line(ranks, merged) -> None:
    line = _forward_line(ranks[1])
    v = straggler(hide_library_unless(merged, False), "gpu_time")
    assert v["straggler"] and v["rank"] == 1 and v["line"]["line"] == line, v
    # rank 0 sits in collectives while rank 1 computes its second half-batch: the wait mirrors it
    assert v["mirrored"] and v["comm_wait"] > 0.5 * v["excess"] > 0


def test_waiting_for_its_own_gpu_is_not_host_work(merged) -> None:
    # Both ranks run the same Python; rank 1's GPU does twice the work, and its host waits for it
    # at `sync()` every step. In the steady state (what the report judges) the host-time excess
    # must then be small beside the GPU-time excess. Counted as host work, that wait made rank 1's
    # host-time excess 207 ms against a 134 ms GPU excess; without it, 54 ms.
    steady = hide_library_unless(select_phase(merged, "steady"), False)
    gpu, host = straggler(steady, "gpu_time"), straggler(steady, "host_time")
    assert gpu["rank"] == 1 and gpu["excess"] > 0
    assert host["excess"] < 0.5 * gpu["excess"], (host["excess"], gpu["excess"])


def test_each_ranks_entry_keeps_its_collective_span(ranks, merged) -> None:
    """The merged header's rank entries carry each rank's collective span (first collective's
    start to last one's end, from its own log), which tells ranks of one run apart later on."""
    for entry, p in zip(merged.meta["ranks"], ranks):
        log = p.meta.collectives
        want = max(max(e["end"]) for e in log if e.get("end")) - min(min(e["start"]) for e in log if e.get("start"))
        assert want > 0 and entry["collective_span"] == want


def test_an_input_without_phases_joins_as_steady_state(ranks) -> None:
    """One input with phase tables is enough for the merge to have them: an input recorded
    without phases (here a profile made by hand) is all steady state, its GPU time included."""
    from conftest import synthetic_profile

    from dlpt.frames import Frame

    plain = synthetic_profile([([Frame("python", "step (t.py:3)", "t.py", 3, "step"), Frame("kernel", "k")], 777)])
    assert plain.phases is None and ranks[0].phases is not None
    m = merge_profiles([ranks[0], plain], as_ranks=True)
    assert m.phases is not None
    got = _per_phase(m.phases)
    want = _per_phase(phase_profile_rows(ranks[0]))
    assert got["steady"][COL["gpu_time"]] == want["steady"][COL["gpu_time"]] + 777
    assert sum(v[COL["gpu_time"]] for v in got.values()) == int(m.cct.inclusive[0, COL["gpu_time"]])
