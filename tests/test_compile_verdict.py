"""The compile verdict (dlpt/findings.py `compile_time`) on run metadata written out here: the
share of the run spent compiling, taken over the ranks (the longest compile against the longest
window), and compiles after a tenth of the steady state had run counted as recompiles. Written
for the mutants tools/mutate.py found alive in findings.py (docs/MUTATION.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import synthetic_profile

from dlpt.findings import compile_time
from dlpt.frames import Frame

KERNEL = [([Frame("python", "step (t.py:3)", "t.py", 3, "step"), Frame("kernel", "k")], 1000)]


def verdict(meta: dict):
    prof = synthetic_profile(KERNEL)
    prof.meta.update(meta)
    return compile_time(SimpleNamespace(whole=prof))


def test_a_long_compile_is_a_verdict_a_short_one_is_not() -> None:
    f = verdict({"window": {"start": 0, "end": 1000}, "phases": {"compile": {"wall": 300}}})
    assert f is not None and f.rule == "compile" and f.share == pytest.approx(300 / 1000)
    assert "more time" not in f.figure and "recompiles" not in f.remedy
    assert verdict({"window": {"start": 0, "end": 1000}, "phases": {"compile": {"wall": 199}}}) is None
    assert verdict({"window": {"start": 0, "end": 1000}}) is None  # no compile
    assert verdict({"phases": {"compile": {"wall": 300}}}) is None  # no window


def test_ranks_longest_compile_against_longest_window() -> None:
    ranks = [{"window": {"start": 0, "end": 1000}, "phases": {"compile": {"wall": 100}}},
             {"window": {"start": 0, "end": 2000}, "phases": {"compile": {"wall": 400}}},
             {"window": {"start": 5, "end": 6}}]
    f = verdict({"ranks": ranks})
    # exactly a fifth of the run: a verdict
    assert f is not None and f.share == pytest.approx(400 / 2000)
    ranks[1]["phases"]["compile"]["wall"] = 399
    assert verdict({"ranks": ranks}) is None


def test_a_compile_after_the_steady_state_began_is_a_recompile() -> None:
    base = {"window": {"start": 0, "end": 10_000}, "phases": {"compile": {"wall": 100}}}  # 1% of the run
    assert verdict(base) is None
    # Steady state 800 + 9,050 = 9,850 ns; the compile at 900 comes after 800 ns of it, less than
    # a tenth (985 ns): part of the first compile's cluster, not a recompile.
    early = [[0, 100, "compile"], [100, 900, "steady"], [900, 950, "compile"], [950, 10_000, "steady"]]
    assert verdict({**base, "phase_spans": early}) is None
    # Steady state 1,000 + 8,830 = 9,830 ns; a compile after 1,000 ns of it (more than 983): a
    # recompile, named with its 70 ns. Spans that are not [start, end, phase] are skipped.
    late = [[0, 100, "compile"], [100, 1100, "steady"], [1100, 1170, "compile"], [1170, 10_000, "steady"],
            [1, 2], "bad"]
    f = verdict({**base, "phase_spans": late})
    assert f is not None and f.share == pytest.approx(100 / 10_000)
    assert "compiled 1 more time after" in f.figure and "recompiles" in f.remedy
    assert "(70 ns)" in f.figure
