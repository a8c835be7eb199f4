"""A gzip trace read while it is decompressed (collectors/kineto/gunzip.py): the same profile as
the Python reader's; what is not the plain case (several members, a false size, damage) read by
the reader that decompresses first, which says what is wrong."""

from __future__ import annotations

import gzip
import importlib
import json
import zlib

import pytest
from conftest import assert_same_profile, raw_events, trace_path

from dlpt.collectors.kineto import import_traces

gunzip = importlib.import_module("dlpt.collectors.kineto.gunzip")
scan_mod = importlib.import_module("dlpt.collectors.kineto.scan")
kineto = importlib.import_module("dlpt.collectors.kineto")


def _python(path, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("DLPT_NATIVE_READ", "0")
        m.setattr(scan_mod, "_lib", None)
        return import_traces(str(path))


@pytest.fixture
def spy(monkeypatch):
    """How many traces gunzip.read read to the end."""
    done = []
    real = gunzip.read

    def read(raw, add):
        meta = real(raw, add)
        done.append(len(raw))
        return meta

    monkeypatch.setattr(gunzip, "read", read)
    return done


@pytest.mark.parametrize("name", ["gpt_train", "resnet_infer"])
def test_a_gzip_trace_reads_as_the_python_reader_reads_it(name, monkeypatch, spy):
    p = trace_path(name)
    assert p.stat().st_size > kineto.GZIP_MIN_BYTES
    native = import_traces(str(p))
    assert spy, "not read while decompressed"
    assert_same_profile(native, _python(p, monkeypatch))


def test_many_pieces_while_it_fills(tmp_path, monkeypatch, spy):
    """Small pieces and small output steps: the scan waits for the buffer again and again."""
    evs = raw_events("gpt_train")
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": evs, "deviceProperties": [{"id": 0}],
                                            "INFO": ["a]b"]}).encode()))
    monkeypatch.setattr(scan_mod, "PIECE_BYTES", 50_000)
    monkeypatch.setattr(gunzip, "OUT_STEP", 30_000)
    monkeypatch.setattr(kineto, "GZIP_MIN_BYTES", 1000)
    native = import_traces(str(p))
    assert spy
    assert native.meta.devices == [{"id": 0}]
    assert_same_profile(native, _python(p, monkeypatch))


@pytest.mark.parametrize("how", ["two members", "false size", "cut short", "not an object"])
def test_what_is_not_the_plain_case_is_read_by_the_other_reader(tmp_path, monkeypatch, spy, how):
    doc = json.dumps({"traceEvents": raw_events("threaded")}).encode()
    monkeypatch.setattr(kineto, "GZIP_MIN_BYTES", 1000)
    p = tmp_path / "t.json.gz"
    if how == "two members":  # gzip allows it, and the trailer's size is the last member's
        half = len(doc) // 2
        p.write_bytes(gzip.compress(doc[:half]) + gzip.compress(doc[half:]))
    elif how == "false size":
        raw = bytearray(gzip.compress(doc))
        raw[-4:] = (len(doc) + 5).to_bytes(4, "little")
        p.write_bytes(bytes(raw))
    elif how == "cut short":
        p.write_bytes(gzip.compress(doc)[:-100])
    else:
        p.write_bytes(gzip.compress(b"   " + json.dumps(raw_events("threaded")).encode()))
    with pytest.raises(scan_mod.Declined):
        gunzip.read(p.read_bytes(), lambda b: None)
    if how in ("two members", "not an object"):
        assert_same_profile(import_traces(str(p)), _python(p, monkeypatch))
    else:
        from dlpt.errors import DlptError

        with pytest.raises((DlptError, zlib.error), match="gzip|cut short|damaged|CRC"):
            import_traces(str(p))
    assert not spy
