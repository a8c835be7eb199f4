"""Building the collector.

The CUPTI half compiles. A recording on this machine builds collector.cpp without
DLPT_CUPTI (a CPU torch), so the code that reads CUPTI's records — kernels, copies, NCCL
kernels for comm wait — would meet the compiler only on a GPU machine. Where CUDA's headers are
installed (nvcc's toolkit, as here), it is compiled with the flags the real build adds for CUPTI,
syntax only.

Builds are kept per environment: `builds.build`, the function that builds the collector, builds
a tiny module here (seconds, where the collector takes a minute) in two environments that have
the same torch and Python, as two virtual environments do — the second imports torch through a
link to the first's, so torch's builder sees another torch folder, as it would in another venv —
and neither rebuilds over the other; every build says why."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dlpt.collectors.record import builds  # noqa: E402
from dlpt.collectors.record.native import SOURCE, _record_types  # noqa: E402


def cuda_include() -> str | None:
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    for root in filter(None, roots):
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cupti.h")) and os.path.isfile(os.path.join(inc, "cupti_activity.h")):
            return inc
    return None


def test_the_cupti_half_compiles(tmp_path: Path) -> None:
    inc = cuda_include()
    if inc is None:
        pytest.skip("no CUDA headers with CUPTI here: the CUPTI half compiles on GPU machines only")
    from torch.utils.cpp_extension import include_paths

    # A CPU build of torch ships c10/cuda's headers without the one its CMake generates.
    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cmd = [os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only", "-w", f"-I{tmp_path}",
           *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}",
           "-DDLPT_CUPTI", "-DDLPT_INTERNAL_FRAMES", f"-I{inc}", *_record_types(inc),
           "-DTORCH_EXTENSION_NAME=dlpt_collector", SOURCE]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


TINY = """\
#include <Python.h>
#include "tiny.h"
#define TINY_STR2(x) #x
#define TINY_STR(x) TINY_STR2(x)
#define TINY_CAT2(a, b) a##b
#define TINY_CAT(a, b) TINY_CAT2(a, b)
static struct PyModuleDef tiny_def = {PyModuleDef_HEAD_INIT, TINY_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC TINY_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* m = PyModule_Create(&tiny_def);
  if (m) PyModule_AddIntConstant(m, "version", TINY_VERSION);
  return m;
}
"""

BUILD = """\
import json, sys
from dlpt.collectors.record import builds
b = builds.build(sys.argv[1:], [], [], prefix="dlpt_buildtest", what="a test module", takes="seconds")
print(json.dumps({"folder": b.folder, "built": b.built, "reason": b.reason, "version": b.module.version}))
"""


def tiny_sources(d: Path, version: int = 1) -> list[str]:
    (d / "tiny.cpp").write_text(TINY)
    (d / "tiny.h").write_text(f"#define TINY_VERSION {version}\n")
    return [str(d / "tiny.cpp"), str(d / "tiny.h")]


def build_in(env_path: str | None, sources: list[str], ext: Path) -> tuple[dict, list[str]]:
    """`builds.build` in a process of its own, with torch imported from `env_path` (None: the
    usual one); its result and its `dlpt:` lines."""
    path = [p for p in (env_path, os.environ.get("PYTHONPATH")) if p]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONPATH": os.pathsep.join(path)}
    r = subprocess.run([sys.executable, "-c", BUILD, *sources], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout), [ln for ln in r.stderr.splitlines() if ln.startswith("dlpt:")]


def other_venv(tmp_path: Path) -> str:
    """A second environment with the same torch at another path, as a second venv has it."""
    import torch

    venv = tmp_path / "venv-b" / "site-packages"
    venv.mkdir(parents=True)
    (venv / "torch").symlink_to(os.path.dirname(os.path.abspath(torch.__file__)))
    return str(venv)


def files_and_times(folder: str) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, f), folder): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(folder) for f in files if f not in ("dlpt-build.json", "dlpt-build.lock")}


def test_two_environments_keep_their_builds(tmp_path: Path) -> None:
    """Environment A builds, B (same torch and Python, torch elsewhere) builds in a folder of
    its own, and A again reuses its build untouched: no compile, no notice, every file as it was."""
    sources, ext, venv_b = tiny_sources(tmp_path), tmp_path / "ext", other_venv(tmp_path)
    a, said_a = build_in(None, sources, ext)
    assert a["built"] and len(said_a) == 1 and said_a[0].startswith("dlpt: building a test module"), said_a
    assert said_a[0].endswith(f"first use (seconds, once for these build inputs, in {a['folder']})")
    a_files = files_and_times(a["folder"])
    assert any(f.endswith(".so") for f in a_files) and "tiny.o" in a_files

    b, said_b = build_in(venv_b, sources, ext)
    assert b["built"] and b["folder"] != a["folder"], (a, b)
    assert len(said_b) == 1 and f"at {venv_b}{os.sep}torch" in said_b[0], said_b
    assert "a new environment: torch's location differs" in said_b[0], said_b

    again, said_again = build_in(None, sources, ext)
    assert again == {**a, "built": False, "reason": ""} and said_again == [], said_again
    assert files_and_times(a["folder"]) == a_files  # not even relinked
    assert len(os.listdir(ext / builds.BUILDS_DIR)) == 2  # B's build stays for B


def test_every_build_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """First use, changed sources, and a file it was built from replaced in place (ninja would
    rebuild it: now it is said first); an up-to-date build is reused without a word."""
    ext = tmp_path / "ext"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    sources = tiny_sources(tmp_path, 1)
    v1 = builds.build(sources, [], [], prefix="dlpt_buildtest", what="a test module")
    assert v1.built and v1.reason == "first use" and v1.module.version == 1
    sources = tiny_sources(tmp_path, 2)
    v2 = builds.build(sources, [], [], prefix="dlpt_buildtest", what="a test module")
    assert v2.built and v2.reason == "its sources changed" and v2.module.version == 2
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("dlpt:")]
    assert [ln.split(": ", 2)[2].split(" (10–60 s, once")[0] for ln in said] == ["first use", "its sources changed"], said

    # v1's copy of its header replaced in place (as a reinstall at the same path would), in a
    # process where v1 is not loaded yet.
    header = os.path.join(v1.folder, "src", "tiny.h")
    os.utime(header)  # now: after v1's objects, made before v2's build
    sources = tiny_sources(tmp_path, 1)
    again, said = build_in(None, sources, ext)
    assert again["built"] and again["folder"] == v1.folder, again
    assert again["reason"] == f"files it was built from changed since ({header} is newer than the build)"
    assert len(said) == 1 and again["reason"] in said[0], said
    reused, said = build_in(None, sources, ext)
    assert not reused["built"] and said == []


def fake_build(root: Path, name: str, inputs: dict, used: float) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / f"{name}.so").write_bytes(b"")
    m = d / builds.MANIFEST
    m.write_text(json.dumps({"inputs": inputs, "built": used}))
    os.utime(m, (used, used))
    return d


def test_clean_up_keeps_each_environments_newest_builds(tmp_path: Path) -> None:
    """After a build: its environment keeps its KEEP_PER_ENVIRONMENT most recently used builds
    (older sources go, unless in use), other environments keep all theirs, and builds whose
    torch folder is gone (a removed venv) go."""
    from dlpt.collectors.record.buildlock import build_lock

    torch_a, torch_b = tmp_path / "a" / "include", tmp_path / "b" / "include"
    torch_a.mkdir(parents=True)
    torch_b.mkdir(parents=True)
    env_a = {"sources": "s0", "torch_include": str(torch_a)}
    root = tmp_path / "builds"
    ours = fake_build(root, "t_0", env_a, 100)
    older = [fake_build(root, f"t_{i}", {**env_a, "sources": f"s{i}"}, 100 - i) for i in range(1, 5)]
    in_use = fake_build(root, "t_9", {**env_a, "sources": "s9"}, 1)
    others = [fake_build(root, f"t_b{i}", {"sources": f"s{i}", "torch_include": str(torch_b)}, 1) for i in range(4)]
    gone = fake_build(root, "t_gone", {"sources": "s0", "torch_include": str(tmp_path / "removed")}, 200)
    with build_lock(str(in_use), lambda m: None):
        builds._clean_up(str(root), "t", "t_0", env_a)
    kept = sorted(p.name for p in root.iterdir())
    assert kept == sorted([ours.name, *(p.name for p in older[:builds.KEEP_PER_ENVIRONMENT - 1]), in_use.name,
                           *(p.name for p in others)]), kept
    assert not gone.exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
