"""Shared fixtures: the real H200 traces in ../shared/fixtures/kineto (or $DLPT_FIXTURES)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("DLPT_FIXTURES", ROOT.parent / "shared" / "fixtures" / "kineto"))
TRACE_NAMES = ("copies", "gpt_train", "resnet_infer", "compiled_mlp", "cudagraph_mlp", "threaded")


def trace_path(name: str) -> Path:
    p = FIXTURES / f"{name}.pt.trace.json.gz"
    if not p.exists():
        raise FileNotFoundError(f"fixture trace {p} is missing; set DLPT_FIXTURES")
    return p


def raw_events(name: str) -> list[dict]:
    """The trace decoded by the standard library, independently of dlpt's decoder."""
    with gzip.open(trace_path(name), "rt") as f:
        return json.load(f)["traceEvents"]


@pytest.fixture(params=TRACE_NAMES)
def trace_name(request) -> str:
    return request.param
