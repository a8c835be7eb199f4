"""The dataloader-wait verdict's wording from what the recording knew of the DataLoader
(`meta["dataloaders"]`: num_workers, pin_memory): the remedy must fit the loader the program
had. Written for the mutants tools/mutate.py found alive in findings.py (docs/MUTATION.md)."""

from __future__ import annotations

import pytest
from test_findings import _loop, _rules


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    return _loop(tmp_path_factory.mktemp("loader"), loader_us=200.0)


def verdict(prof, loaders):
    prof.meta.pop("dataloaders", None)
    if loaders is not None:
        prof.meta["dataloaders"] = loaders
    return _rules(prof)["dataloader-wait"]


def test_in_the_main_process(loop) -> None:
    f = verdict(loop, [{"num_workers": 0, "pin_memory": False}])
    assert f.figure.endswith("in the main process (num_workers=0)")
    assert "DataLoader(num_workers=N, pin_memory=True," in f.remedy


def test_one_worker_and_several(loop) -> None:
    f = verdict(loop, [{"num_workers": 1, "pin_memory": True}])
    assert f.figure.endswith("waiting on its 1 worker process") and "its 1 worker process does not" in f.remedy
    assert "pin_memory" not in f.remedy  # already pinned
    f = verdict(loop, [{"num_workers": 2, "pin_memory": True}, {"num_workers": 4, "pin_memory": False}])
    assert f.figure.endswith("waiting on its 4 worker processes") and "its 4 worker processes do not" in f.remedy
    assert "persistent_workers=True, pin_memory=True)" in f.remedy  # not every loader pinned


def test_nothing_known_of_the_loader(loop) -> None:
    f = verdict(loop, None)
    assert f.figure.endswith("while the data loader fetched batches")
    assert "DataLoader(num_workers=N, pin_memory=True," in f.remedy
