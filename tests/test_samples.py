"""The profiles tests/data ships are what the current dlpt writes: the current file format and,
for recordings, the meta keys the current collector writes. README's samples and many tests read
these files; one recorded by an older collector shows users figures the recorder no longer makes
(tests/data/cpu_train_small.dlpt did: no host_time, old meta keys) and tests what is gone.

When this fails, re-record the file with the command in its `command` meta key (README says
where each sample comes from; GPU samples on the GPU machine) and run `python docs/readme_samples.py`."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA

from dlpt.metrics import METRICS, PC_METRICS
from dlpt.store import SCHEMA_VERSION
from dlpt.version import __version__

# Keys the collector writes only when the program ran on a GPU: `devices` (the CUDA devices,
# collectors/record/session.py), `gpu_idle` and `timeline` (busy and idle from CUPTI's intervals,
# trie_converter.py), `memory` (the CUDA caching allocator's events, memory.py). A CPU recording
# has none of them, a GPU one all four.
GPU_ONLY = frozenset({"devices", "gpu_idle", "timeline", "memory"})
# A person's word on how a file was made, added after recording; no collector writes it. The
# two current H100 samples carry one: the recorder of the day left its library fold to
# dlpt.transforms.fold_sampled_library, which the recorder now runs itself.
NOTE = "note"
# Keys the collector writes only when the program does something: `dataloaders`, when it iterates
# a DataLoader (collectors/record/session.py); `compiled_provenance`, when torch.compile'd code's
# kernels were placed on their lines (fused.py); `ended_by`, when a signal ended the run (Ctrl-C);
# `run_id` and `collectives`, when it runs as one rank of several (torchrun: rank_env.py, and the
# log of its collective calls that comm wait is estimated from when ranks are merged).
OPTIONAL = frozenset({"dataloaders", "compiled_provenance", "ended_by", "run_id", "collectives",
                      "pc_sampling"})  # pc_sampling: only with --pc-samples
# Dicts whose keys say what the run did (the phases it went through), not what the collector writes.
BY_RUN = frozenset({"phases"})
# Keys recordings write since 2026-11-28 (the snapshot thread's CPU and its stretched wait,
# collectors/record/session.py), after the shipped files were recorded: a shipped file may lack
# them (the GPU samples can only be recorded again on the GPU machine), and no other key.
SINCE_SHIPPED = frozenset({"snapshot_cpu_s", "snapshot_wait_max_s"})
# The collector's counters of CUDA-graph replays (collectors/native/collector.cpp `stats`), in a
# build with CUPTI's graph-level records only: a GPU recording since 2026-11-27 has them, a CPU
# one (the fresh recording here) never.
GRAPH_COUNTERS = frozenset({"graph_trace", "graph_replays_per_graph", "graph_replays_per_kernel",
                            "graph_toggle_errors", "graph_first_records_repaired"})

# A raw recording (`DLPT_RECORDED_OUT`, collectors/record/session.py `stop`: the tree as recorded,
# before the model's pure transformation, for tests that run that transformation again) carries
# the provenance it will be transformed with, and is written before the phases are split and
# before `dlpt record` adds the program's exit status and the post-processing time (so its
# checksums name no phase-table array either).
RAW_ADDS = frozenset({"provenance"})
RAW_LACKS = frozenset({"phase_table", "exit_status", "post_processing_s"})

SHIPPED = sorted(p.stem for p in DATA.glob("*.dlpt"))
PARAMS = SHIPPED


def stored(path: Path) -> tuple[int, dict[str, Any]]:
    """(the file's format version, its meta as written), read with sqlite3 alone: dlpt's loader
    upgrades older files in memory, which is what must not hide them here."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        meta = {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM meta")}
    finally:
        con.close()
    return int(version), meta


@pytest.fixture(scope="module")
def fresh_meta(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The meta of a CPU recording made now by this checkout's collector (a tiny program: which
    keys the collector writes does not depend on what the program does, only on the GPU)."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("fresh")
    (tmp / "prog.py").write_text("import torch\nx = torch.ones(64, 64)\nfor _ in range(3):\n    (x @ x).sum()\n")
    r = subprocess.run([sys.executable, "-m", "dlpt", "record", "-q", "-o", "run.dlpt", "prog.py"], cwd=tmp,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    version, meta = stored(tmp / "run.dlpt")
    assert version == SCHEMA_VERSION and meta["gpu"] is False
    return meta


def test_every_shipped_profile_is_checked() -> None:
    assert "cpu_train_small" in SHIPPED and "gpu_train_small" in SHIPPED
    assert {"gpu_truth", "gpu_case_copies", "gpu_case_cudagraph", "gpu_case_threaded"} <= set(SHIPPED)


@pytest.mark.parametrize("name", PARAMS)
def test_shipped_profile_has_the_current_format(name: str) -> None:
    version, meta = stored(DATA / f"{name}.dlpt")
    assert version == SCHEMA_VERSION, f"{name}.dlpt: format {version}, dlpt writes {SCHEMA_VERSION}"
    # Recorded before the PC-sample columns (2026-11-28): the columns before them, read by name.
    before_pc = [m for m in METRICS if m not in PC_METRICS]
    assert meta.get("metrics") in (list(METRICS), before_pc), f"{name}.dlpt: metric columns {meta.get('metrics')}"
    assert meta.get("format") == "dlpt" and meta.get("dlpt_version") == __version__


@pytest.mark.parametrize("name", PARAMS)
def test_shipped_recording_has_the_current_collectors_meta(name: str, fresh_meta: dict[str, Any]) -> None:
    _, meta = stored(DATA / f"{name}.dlpt")
    if meta.get("source") != "record":
        pytest.skip(f"{name}.dlpt was imported, not recorded")  # none is today; the format test holds it
    want = set(fresh_meta) | (GPU_ONLY if meta.get("gpu") else set())
    if name.endswith("_raw"):
        want = (want | RAW_ADDS) - RAW_LACKS
    got = set(meta) - {NOTE} - OPTIONAL
    want -= SINCE_SHIPPED - got
    assert got == want, f"{name}.dlpt: keys no collector writes now {sorted(got - want)}, missing {sorted(want - got)}"
    # The dicts both kinds of run write (the collector's capabilities and counters, the sampler,
    # the window) hold the same keys too: a collector's new counter shows there first.
    for k, v in fresh_meta.items():
        if isinstance(v, dict) and k not in BY_RUN:
            extra = GRAPH_COUNTERS if k == "collector" and meta.get("gpu") else frozenset()
            expect = set(v)
            if name.endswith("_raw") and k == "checksums":  # no phase table yet: its arrays too
                expect = {c for c in expect if not c.startswith("phase.")}
            assert set(meta[k]) - extra == expect, (name, k, sorted((set(meta[k]) - extra) ^ expect))
