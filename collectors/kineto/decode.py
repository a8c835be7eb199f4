"""Typed, selective decoding of Kineto (chrome trace) JSON.

Decoding every field of every event into dicts is what makes generic trace tools slow: a
146 MB trace has hundreds of thousands of events whose `args` carry shapes, strides and
concrete inputs that attribution never reads. msgspec decodes straight into the few typed fields
below and skips the rest without building them.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import Any

import msgspec

from dlpt.errors import DlptError


class Args(msgspec.Struct):
    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    legacy_external_id: Any = msgspec.field(name="external id", default=None)
    python_id: Any = msgspec.field(name="Python id", default=None)
    python_parent_id: Any = msgspec.field(name="Python parent id", default=None)
    seq: Any = msgspec.field(name="Sequence number", default=None)
    bytes: Any = None
    device: Any = None
    stream: Any = None
    name: Any = None


class Event(msgspec.Struct):
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None
    dur: Any = 0
    id: Any = None
    bp: Any = None
    args: Args | None = None


class DistributedInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None


class Trace(msgspec.Struct):
    traceEvents: list[Event]
    baseTimeNanoseconds: Any = None
    distributedInfo: DistributedInfo | None = None
    deviceProperties: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    traceName: Any = None
    schemaVersion: Any = None


_decoder = msgspec.json.Decoder(Trace)


def read_bytes(path: str) -> bytes:
    """The trace's JSON bytes, gunzipped when the file is gzip (by content, not by name)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DlptError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DlptError(f"{path}: is a directory with no traces in it") from None
    except OSError as e:
        raise DlptError(f"{path}: cannot read: {e.strerror or e}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DlptError(f"{path}: the gzip data is damaged or cut short ({e}); "
                            "re-export or re-copy the trace") from None
    elif path.endswith(".gz"):
        raise DlptError(f"{path}: named .gz but is not gzip data")
    if data[:3] == b"\xef\xbb\xbf":
        data = data[3:]
    elif data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        # Some tools save JSON as UTF-16 with a byte-order mark; it is still a trace.
        try:
            data = data.decode("utf-16").encode("utf-8")
        except UnicodeDecodeError:
            raise DlptError(f"{path}: UTF-16 text that does not decode; expected JSON from torch.profiler") from None
    if not data.strip():
        raise DlptError(f"{path}: the file is empty; expected a Kineto trace "
                        "(torch.profiler export_chrome_trace)")
    return data


def decode(path: str) -> Trace:
    data = read_bytes(path)
    try:
        trace = _decoder.decode(data)
    except msgspec.ValidationError as e:
        raise DlptError(f"{path}: not a Kineto trace ({e}); expected a JSON object with "
                        "'traceEvents' as written by torch.profiler") from None
    except msgspec.DecodeError as e:
        what = "cut short" if "truncated" in str(e).lower() else f"not valid JSON ({e})"
        raise DlptError(f"{path}: the trace is {what}; re-export it from torch.profiler") from None
    except UnicodeDecodeError as e:
        raise DlptError(f"{path}: the trace is not UTF-8 text ({e.reason} at byte {e.start}); "
                        "expected JSON from torch.profiler") from None
    return trace


def trace_files(path: str) -> list[str]:
    """A trace file itself, or the trace files in a directory (per-rank files of
    tensorboard_trace_handler), sorted by name."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path)
                       if n.endswith((".json", ".json.gz")) and not n.startswith("."))
        if not names:
            raise DlptError(f"{path}: no Kineto traces (*.json, *.json.gz) in this directory")
        return [os.path.join(path, n) for n in names]
    if not os.path.exists(path):
        raise DlptError(f"{path}: no such file or directory")
    return [path]
