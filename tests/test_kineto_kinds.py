"""Device events of kinds dlpt does not read (another accelerator's, a newer profiler's) are
counted and named in one warning, never dropped silently; the ordinary CPU-side categories of
real traces are not."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import FIXTURES, dlpt_in_process
from kineto_builder import PID, TID, TraceBuilder

from dlpt.collectors.kineto import import_traces

decode_mod = sys.modules["dlpt.collectors.kineto.decode"]
WARNING = "7 device events of unknown kinds skipped: mtia_kernel (5), foo (2)"


def dlpt(*args: str) -> subprocess.CompletedProcess:
    return dlpt_in_process(*args)  # reading commands: in this process (conftest.dlpt_in_process)


def mtia_trace(path, labelled: bool = False, kernel: bool = False, damaged: bool = False, scale: int = 1):
    """Host ops on PID, and on a device row 5*scale `mtia_kernel` and 2*scale `foo` events: by
    Kineto's label `MTIA 0` on pid 9000 when `labelled`, else at pid 0 unlabelled. Beside them,
    the kinds that must not warn: a CPU-side category on the host row and on a row labelled CPU,
    Kineto's `Trace` (pid "Spans") and `overhead` (pid -1), GPU annotations, instant events."""
    tb = TraceBuilder()
    tb.py(10, "step", 0.0, 1000.0)
    tb.op("aten::mm", 1.0, 50.0)
    if kernel:
        tb.kernel(60.0, 5.0, 70.0, 20.0)
    dev = 9000 if labelled else 0
    ev = tb.events
    if labelled:
        ev += [{"name": "process_labels", "ph": "M", "pid": dev, "tid": 0, "args": {"labels": "MTIA 0"}},
               {"name": "process_labels", "ph": "M", "pid": 4243, "tid": 0, "args": {"labels": "CPU"}},
               {"ph": "X", "cat": "cpu_side", "name": "x", "pid": 4243, "tid": 1, "ts": 5.0, "dur": 1.0}]
    for k in range(5 * scale):
        ev.append({"ph": "X", "cat": "mtia_kernel", "name": f"k{k}", "pid": dev, "tid": 3, "ts": 10.0 + k, "dur": 0.5,
                   "args": {"stream": 3}})
    for k in range(2 * scale):
        ev.append({"ph": "X", "cat": "foo", "name": "f", "pid": dev, "tid": 4, "ts": 20.0 + k, "dur": 0.5})
    ev += [{"ph": "X", "cat": "gpu_user_annotation", "name": "step", "pid": dev, "tid": 3, "ts": 10.0, "dur": 9.0},
           {"ph": "X", "cat": "my_cpu_category", "name": "y", "pid": PID, "tid": TID, "ts": 2.0, "dur": 1.0},
           {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
            "ts": 0.0, "dur": 1000.0},
           {"ph": "X", "cat": "overhead", "name": "Instrumentation", "pid": -1, "tid": 0, "ts": 3.0, "dur": 1.0},
           {"ph": "i", "cat": "cpu_instant_event", "name": "z", "pid": PID, "tid": TID, "ts": 4.0, "s": "t"}]
    if damaged:  # a wrong type anywhere: the whole file is read by the lenient decoder
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "soon", "dur": 1})
    return tb.write(path)


@pytest.mark.parametrize("labelled", [False, True], ids=["pid 0", "labelled MTIA"])
def test_unknown_device_kinds_are_counted_and_named(tmp_path, labelled):
    p = mtia_trace(tmp_path / "mtia.pt.trace.json.gz", labelled=labelled)
    r = dlpt("report", str(p))
    assert r.returncode == 0, r.stderr
    assert f"dlpt: warning: {p}: {WARNING}\n" in r.stderr
    # Nothing dlpt reads: the "no GPU activity" notice and the header say why there is none.
    assert f"no GPU activity that dlpt reads in this profile ({WARNING}); showing" in r.stderr
    assert f"GPU time 0 (no GPU activity that dlpt reads in this profile; {WARNING})" in r.stdout
    for quiet in ("cpu_side", "my_cpu_category", "Trace", "overhead", "gpu_user_annotation", "cpu_instant"):
        assert quiet not in r.stderr
    assert r.stderr.count("\n") == 2, r.stderr
    # Imported, the profile still says it.
    out = tmp_path / "mtia.dlpt"
    assert dlpt("import", str(p), "-o", str(out)).returncode == 0
    r = dlpt("report", str(out))
    assert WARNING in r.stderr and WARNING in r.stdout


def test_beside_kernels_the_warning_alone(tmp_path):
    p = mtia_trace(tmp_path / "t.json.gz", kernel=True)
    r = dlpt("report", str(p))
    assert r.returncode == 0 and f"dlpt: warning: {p}: {WARNING}\n" == r.stderr, r.stderr


def test_every_reader_counts_them_alike(tmp_path, monkeypatch):
    whole = import_traces(str(mtia_trace(tmp_path / "a.json.gz", scale=100)))
    assert whole.meta["unknown_device_events"] == {"mtia_kernel": 500, "foo": 200}
    lenient = import_traces(str(mtia_trace(tmp_path / "b.json.gz", scale=100, damaged=True)))
    assert lenient.meta["unknown_device_events"] == whole.meta["unknown_device_events"]
    assert lenient.meta["skipped_events"] == 1
    monkeypatch.setattr(decode_mod, "CHUNK_BYTES", 2000)
    assert decode_mod.decode_chunks(str(tmp_path / "a.json.gz")) is not None  # read in slices
    sliced = import_traces(str(tmp_path / "a.json.gz"))
    assert sliced.meta["unknown_device_events"] == whole.meta["unknown_device_events"]


def test_real_traces_do_not_warn(tmp_path):
    # Their categories: python_function, cpu_op, cuda_runtime, cuda_driver, user_annotation,
    # kernel, gpu_memcpy, gpu_memset, gpu_user_annotation, ac2g, fwdbwd, overhead, Trace,
    # cpu_instant_event; and the HTA trace's, from an older torch with profile_memory.
    files = sorted(FIXTURES.glob("*.json.gz"))
    assert len(files) == 8
    for f in files:
        prof = import_traces(str(f))
        assert "unknown_device_events" not in prof.meta, (f.name, prof.meta["unknown_device_events"])
    # One process traced them all: merged as ranks only when asked to.
    r = dlpt("report", *map(str, files), "--as-ranks", "--view", "flat")
    assert r.returncode == 0, r.stderr
    assert "unknown kinds" not in r.stderr and "warning" not in r.stderr, r.stderr
