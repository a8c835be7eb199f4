"""Digest of what the Kineto importer makes of a trace, to check that a performance change
keeps results identical: `python bench/digest.py TRACE... > before.txt`, change, run again, diff.

Besides the given traces it digests damaged variants of the first one (values of the wrong
type, missing fields, unhashable ids), made in a temporary directory, because the fast typed
decode must fall back to lenient decoding on those and still skip and count the same events.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

from dlpt.collectors.kineto import import_traces
from dlpt.errors import DlptError


def digest(path: str) -> str:
    try:
        p = import_traces(path)
    except DlptError as e:
        return f"error: {e}"
    except Exception as e:  # noqa: BLE001 - a crash is a result to compare too
        return f"crash: {type(e).__name__}: {e}"
    h = hashlib.sha256()
    h.update(repr(p.frames).encode())
    for a in (p.cct.parent, p.cct.frame, p.cct.exclusive):
        h.update(np.ascontiguousarray(a).tobytes())
    for k in p.activities.__dataclass_fields__:
        h.update(np.ascontiguousarray(getattr(p.activities, k)).tobytes())
    meta = {k: v for k, v in p.meta.items() if k != "traces"}
    h.update(json.dumps(meta, sort_keys=True, default=repr).encode())
    return f"nodes={len(p.cct)} acts={len(p.activities)} skipped={p.meta.get('skipped_events')} {h.hexdigest()[:16]}"


def damaged(src: str, out_dir: str) -> list[str]:
    """Variants of `src` with one kind of damage each, spread over many events."""
    op = gzip.open if src.endswith(".gz") else open
    with op(src, "rt") as f:
        doc = json.load(f)
    evs = doc["traceEvents"]

    def bad_ts(e, i):
        if i % 97 == 0 and "ts" in e:
            e["ts"] = "12.5"

    def bad_dur(e, i):
        if i % 89 == 0 and e.get("ph") == "X":
            e["dur"] = None if i % 2 else -3

    def bad_args(e, i):
        a = e.get("args")
        if isinstance(a, dict) and i % 53 == 0:
            for k in ("correlation", "device", "stream", "Sequence number", "bytes"):
                if k in a:
                    a[k] = [a[k]] if i % 2 else str(a[k])

    def args_not_object(e, i):
        if i % 109 == 0:
            e["args"] = "not a dict"

    def bad_ids(e, i):
        if i % 101 == 0:
            e["pid"] = [1, 2] if i % 2 else {"x": 1}
        if i % 103 == 0 and "id" in e:
            e["id"] = {"bad": True}
        if i % 107 == 0:
            e["name"] = 42
        if i % 113 == 0:
            e["ts"] = True
        if i % 127 == 0:
            e["cat"] = None

    out = []
    for name, fn in (("bad_ts", bad_ts), ("bad_dur", bad_dur), ("bad_args", bad_args), ("bad_ids", bad_ids),
                     ("args_not_object", args_not_object)):
        d = dict(doc)
        d["traceEvents"] = [json.loads(json.dumps(e)) for e in evs]
        for i, e in enumerate(d["traceEvents"]):
            fn(e, i)
        p = os.path.join(out_dir, f"{name}.json")
        with open(p, "w") as f:
            json.dump(d, f)
        out.append(p)
    # Ints and floats mixed in ts/dur (Kineto writes both), and a large int id.
    d = dict(doc)
    d["traceEvents"] = [json.loads(json.dumps(e)) for e in evs]
    for i, e in enumerate(d["traceEvents"]):
        if isinstance(e.get("ts"), float) and i % 3 == 0:
            e["ts"] = int(e["ts"])
        if i % 7 == 0 and isinstance(e.get("dur"), (int, float)):
            e["dur"] = float(e["dur"])
    p = os.path.join(out_dir, "mixed_numbers.json")
    with open(p, "w") as f:
        json.dump(d, f)
    out.append(p)
    return out


def main() -> None:
    paths = sys.argv[1:]
    if os.environ.get("DIGEST_CHUNK_BYTES"):
        # Small slices, so that the sliced reading path (decode.decode_chunks) runs on small traces.
        dec = sys.modules["dlpt.collectors.kineto.decode"]
        dec.CHUNK_BYTES = int(os.environ["DIGEST_CHUNK_BYTES"])
    with tempfile.TemporaryDirectory() as tmp:
        extra = damaged(paths[0], tmp) if paths else []
        for p in paths + extra:
            print(os.path.basename(p), digest(p), flush=True)


if __name__ == "__main__":
    main()
