"""Shared plumbing of the bench cases (`bench/run.py`): run a program in a fresh process with
every output line time-stamped, under a time budget; parse dlpt's save line; read a profile back
through the CLI; print tables; write JSON under $OUT; the third-party programs and the peers'
command lines (torch.profiler around an unmodified script).

Everything runs the programs as separate processes and reads profiles through `dlpt report` /
`dlpt export` in a child too, so a crash in the recorder or the reader shows up as a row in the
table (exit status, "not saved") instead of taking the harness down, and the harness itself
never initialises CUDA next to the program it measures.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
WORKLOADS = os.path.join(BENCH, "workloads")  # the programs the cases measure
PY = sys.executable
# The peer "torch.profiler with stacks": a script run unmodified (`__main__`, `sys.argv`,
# `sys.path[0]` as `python SCRIPT` sets them) inside profile(with_stack=True), the way a user
# would wrap it by hand. Nothing is exported: the step times the program prints are compared,
# and an export would only add to the time after its last line.
TORCH_PROFILER_RUN = """\
import os, runpy, sys
import torch
from torch.profiler import ProfilerActivity, profile
script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(script)
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
with profile(activities=acts, with_stack=True):
    runpy.run_path(script, run_name="__main__")
"""


def torch_profiler_script(folder: str) -> str:
    """A script, written into `folder`, that runs `SCRIPT ARGS` under torch.profiler with Python
    stacks (TORCH_PROFILER_RUN): `python IT SCRIPT ARGS`, or `dlpt record IT SCRIPT ARGS`."""
    path = os.path.join(folder, "torch_profiler_run.py")
    with open(path, "w") as f:
        f.write(TORCH_PROFILER_RUN)
    return path


def parse_config(config: str) -> tuple[str, str, dict[str, str]]:
    """`[LABEL=]MODE[:ENV=VAL,...]` → (label, mode, environment): a configuration of a case that
    runs one mode under several settings, e.g. `old-backward=dlpt:DLPT_DIAG=rfbackward`."""
    head, _, envs = config.partition(":")
    label, _, mode = head.rpartition("=")
    return label or config, mode, dict(kv.split("=", 1) for kv in envs.split(",") if kv)


def parse_configs(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """A list of configurations: comma-separated, or ';'-separated where one sets several
    variables (`K=V,K=V` uses the comma)."""
    return [parse_config(c) for c in text.split(";" if ";" in text else ",") if c]


def out_dir() -> str:
    """$OUT (the device tool's folder that comes back), else a fresh temp folder."""
    d = os.environ.get("OUT") or tempfile.mkdtemp(prefix="dlpt-bench-")
    os.makedirs(d, exist_ok=True)
    return d


def work_dir() -> str:
    """Scratch space for profiles and program copies: never $OUT, whose files are limited in
    number and size (profiles and logs would crowd out the JSON that matters)."""
    return tempfile.mkdtemp(prefix="dlpt-work-")


def programs_dir() -> str:
    """The third-party programs: `shared/programs` inside the repo on the device (the lead copies
    it there, git-ignored), `../shared/programs` beside the checkout here."""
    for d in (os.path.join(ROOT, "shared", "programs"), os.path.join(os.path.dirname(ROOT), "shared", "programs")):
        if os.path.isdir(d):
            return d
    raise SystemExit(f"no shared/programs under {ROOT} or beside it: copy /work/shared/programs to {ROOT}/shared/")


def shared_dir() -> str:
    """The project's shared folder (fixtures, tools, third-party programs): $DLPT_SHARED, else
    `shared/` inside the repo (the device copy), else beside the checkout."""
    for d in (os.environ.get("DLPT_SHARED"), os.path.join(ROOT, "shared"), os.path.join(os.path.dirname(ROOT), "shared")):
        if d and os.path.isdir(d):
            return d
    raise SystemExit(f"no shared/ folder in {ROOT} or beside it (set DLPT_SHARED)")


def gpt_trace() -> str:
    """The biggest Kineto fixture, a GPT training step on an H200 (~18k events)."""
    return os.path.join(shared_dir(), "fixtures", "kineto", "gpt_train.pt.trace.json.gz")


def log_path(out: str, name: str) -> str:
    """Where every run's time-stamped output goes: $DLPT_BENCH_LOG when set (one log for all
    parts: the device tool brings back at most 8 files), else OUT/name."""
    return os.environ.get("DLPT_BENCH_LOG") or os.path.join(out, name)


def emit(out: str, text: str) -> None:
    """Print the tables, and append them to OUT/tables.md, so that a run of several parts ends
    with all of them in one place (the device tool returns only the tail of the output)."""
    print(text, flush=True)
    with open(os.path.join(out, "tables.md"), "a") as f:
        f.write(text + "\n\n")


def finish(out: str, text: str, json_name: str, log: str) -> None:
    """A part's end: its tables (see `emit`) and where its JSON and log are."""
    print()
    emit(out, text)
    print(f"\nJSON: {os.path.join(out, json_name)}; log: {log}")


def has_gpu() -> bool:
    # nvidia-smi rather than torch.cuda: the harness must not hold a CUDA context of its own
    # while the measured programs run.
    if shutil.which("nvidia-smi") is None:
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


def gpu_name() -> str:
    if not has_gpu():
        return "cpu"
    r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True)
    # One line per GPU: a machine of several alike reads "2 × NVIDIA H200, 580.159.04".
    lines = [x.strip() for x in r.stdout.splitlines() if x.strip()]
    kinds = sorted(set(lines))
    return "; ".join(f"{lines.count(k)} × {k}" if lines.count(k) > 1 else k for k in kinds)


def stream(cmd: list[str], timeout: float, say: Callable[[str], None], cwd: str | None = None) -> int:
    """Run cmd with its output, line by line, to `say`; its exit status, or -9 where it ran past
    `timeout` seconds and was killed with every process it started (its own session). The
    deadline is kept by a timer, not by the wait after the output ends: a child that hangs
    without printing, or a grandchild that keeps the pipe open, would otherwise hold the caller
    past any limit (the device tool's 10 minutes, which loses every table not yet printed)."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(max(timeout, 1), kill)
    timer.start()
    try:
        for line in p.stdout or ():
            say(line.rstrip("\n"))
        rc = p.wait()
    finally:
        timer.cancel()
    if killed.is_set():
        say(f"(killed after {max(timeout, 1):.0f} s: {' '.join(cmd)[:200]})")
        return -9
    return rc


class Budget:
    """Wall-clock budget of one harness invocation: the device tool stops a command at 10
    minutes, so a part skips the runs that would not fit (reported as skipped) rather than be
    killed with nothing written."""

    def __init__(self, seconds: float) -> None:
        self.t0 = time.perf_counter()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def allows(self, estimate: float) -> bool:
        return self.left() >= estimate


class Result(dict):
    """One program run: cmd, rc (negative: killed by that signal), wall_s, timed_out, maxrss_mb,
    stdout/stderr as [(seconds since start, line)], last_stdout_s, exit_s."""

    @property
    def out_lines(self) -> list[str]:
        return [t for _, t in self["stdout"]]

    @property
    def err_lines(self) -> list[str]:
        return [t for _, t in self["stderr"]]

    def brief(self) -> dict[str, Any]:
        """The run without its output lines (those go to the log)."""
        return {k: v for k, v in self.items() if k not in ("stdout", "stderr")}


def run(cmd: list[str], cwd: str, timeout: float, log: str | None = None,
        env: dict[str, str] | None = None, interrupt_after: float | None = None) -> Result:
    """Run `cmd` in a new process group; time-stamp each line as it arrives (`interrupt_after`:
    send it SIGINT after that many seconds, then wait up to `timeout`). `exit_s` is when
    the process was reaped, `last_stdout_s` when its last stdout line arrived: their difference
    is the program's end → process exit (for `dlpt record`: building and saving the profile).
    The child's own peak RSS comes from wait4 (RUSAGE_CHILDREN would mix all children)."""
    e = dict(os.environ)
    e["PYTHONUNBUFFERED"] = "1"  # line times are only meaningful when lines are not held back
    # A process that hangs is ended by SIGABRT first (below), which faulthandler turns into every
    # thread's Python stack on stderr: a hang in a measured run says where it waited.
    e.setdefault("PYTHONFAULTHANDLER", "1")
    e.update(env or {})
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # inherited
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    lines: dict[str, list[tuple[float, str]]] = {"stdout": [], "stderr": []}

    def reader(name: str, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            lines[name].append((time.perf_counter() - t0, raw.decode("utf-8", "replace").rstrip("\n")))
        stream.close()

    readers = [threading.Thread(target=reader, args=(n, s), daemon=True)
               for n, s in (("stdout", p.stdout), ("stderr", p.stderr))]
    for t in readers:
        t.start()
    reaped: dict[str, Any] = {}

    def waiter() -> None:
        _, status, ru = os.wait4(p.pid, 0)
        reaped.update(t=time.perf_counter() - t0, status=status, maxrss_kb=ru.ru_maxrss)

    w = threading.Thread(target=waiter, daemon=True)
    w.start()
    if interrupt_after is not None:
        # A program that runs until stopped (a training of many epochs): Ctrl-C, as its user
        # would press it, to the process alone (its dataloader workers follow their parent).
        w.join(interrupt_after)
        if w.is_alive():
            try:
                os.kill(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    w.join(max(timeout - (interrupt_after or 0), 1))
    timed_out = w.is_alive()
    if timed_out:
        try:
            # The stacks of every Python process of the group; no core files (RLIMIT_CORE is 0 for
            # the children, set above before they started): a GPU process's core is gigabytes.
            os.killpg(p.pid, signal.SIGABRT)
        except (ProcessLookupError, PermissionError):
            pass
        w.join(10)
    # The whole group goes: on a timeout the program with it, and in any case what it left behind
    # (a dataloader worker outliving its parent) so that it cannot weigh on the next run.
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    w.join()
    # Popen must not try to reap the pid we already reaped.
    p.returncode = os.waitstatus_to_exitcode(reaped["status"])
    for t in readers:
        t.join(10)
    res = Result(cmd=cmd, cwd=cwd, rc=p.returncode, timed_out=timed_out, wall_s=round(reaped["t"], 3),
                 exit_s=reaped["t"], maxrss_mb=round(reaped["maxrss_kb"] / 1024, 1),
                 stdout=lines["stdout"], stderr=lines["stderr"])
    res["last_stdout_s"] = lines["stdout"][-1][0] if lines["stdout"] else None
    res["tail_s"] = round(res["exit_s"] - res["last_stdout_s"], 3) if res["last_stdout_s"] is not None else None
    if log:
        with open(log, "a") as f:
            f.write(f"\n===== {' '.join(cmd)}  (cwd {cwd})\n")
            f.write(f"rc {res['rc']}  wall {res['wall_s']} s  timed_out {timed_out}  maxrss {res['maxrss_mb']} MB\n")
            for t, text in sorted([(t, "   " + x) for t, x in lines["stdout"]] + [(t, "!! " + x) for t, x in lines["stderr"]]):
                f.write(f"{t:9.3f} {text}\n")
    return res


def dlpt_record(out: str, *program: str, steps: str | None = None) -> list[str]:
    """`dlpt record` as a CLI (the recorder is a black box here): `python -m dlpt` with the
    running interpreter, so it is the dlpt installed for it. Callers run it with a cwd outside
    the repo: the repo's `dlpt/` folder would shadow the installed package's layout."""
    cmd = [PY, "-m", "dlpt", "record", "--force", "-o", out]
    if steps:
        cmd += ["--steps", steps]
    return cmd + list(program)


_SAVED = re.compile(r"profile saved to (.+?)(?: \(|$)")
_POST = re.compile(r"post-processing ([0-9.]+)\s*s")


def parse_saved(res: Result) -> dict[str, Any]:
    """What dlpt said on stderr: the saved path and its own post-processing seconds (None where
    it said nothing of the kind)."""
    saved, post = None, None
    for line in res.err_lines:
        if (m := _SAVED.search(line)) is not None:
            saved = m.group(1)
        if (m := _POST.search(line)) is not None:
            post = float(m.group(1))
    return {"said_saved": saved, "post_processing_s": post}


def read_profile(path: str, top: int = 100000, timeout: float = 120, metric: str = "gpu_time") -> dict[str, Any]:
    """`dlpt report PATH --view flat --by line --format json` in a child (that is `dlpt.load` and
    the flat view): {'ok', 'doc' or 'error', 'read_s'}."""
    if not os.path.exists(path):
        return {"ok": False, "error": "no file"}
    path = os.path.abspath(path)  # the child runs elsewhere
    cwd = tempfile.mkdtemp(prefix="dlpt-read-")
    r = run([PY, "-m", "dlpt", "report", path, "--view", "flat", "--by", "line", "--top", str(top),
             "--metric", metric, "--format", "json"], cwd=cwd, timeout=timeout)
    shutil.rmtree(cwd, ignore_errors=True)
    if r["rc"] != 0:
        return {"ok": False, "error": f"rc {r['rc']}: " + " | ".join(r.err_lines[-3:]), "read_s": r["wall_s"]}
    try:
        doc = json.loads("\n".join(r.out_lines))
    except json.JSONDecodeError as e:
        return {"ok": False, "error": f"report output is not JSON: {e}", "read_s": r["wall_s"]}
    return {"ok": True, "doc": doc, "read_s": r["wall_s"]}


def hotspots_summary(path: str, timeout: float = 120, metric: str = "gpu_time") -> dict[str, Any] | None:
    """`dlpt export PATH -f hotspots` summary block (attributed_to_source, backward_time, ...)."""
    path = os.path.abspath(path)
    cwd = tempfile.mkdtemp(prefix="dlpt-read-")
    out = os.path.join(cwd, "hot.json")
    r = run([PY, "-m", "dlpt", "export", path, "-f", "hotspots", "-o", out, "--top", "5", "--metric", metric], cwd=cwd, timeout=timeout)
    try:
        if r["rc"] != 0:
            return {"error": f"rc {r['rc']}: " + " | ".join(r.err_lines[-3:])}
        with open(out) as f:
            return json.load(f).get("summary")
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[fmt(c) for c in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [f"## {title}", "| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(headers)) + " |",
             "| " + " | ".join("-" * w[i] for i in range(len(headers))) + " |"]
    lines += ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in cells]
    return "\n".join(lines)


def write_json(out: str, name: str, obj: Any) -> str:
    """Write (and rewrite after every run, so a part killed at the device's limit still leaves
    what it measured)."""
    path = os.path.join(out, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)
    return path


def copy_tree_writable(src: str, dst: str) -> str:
    """A writable copy of a read-only program folder (the shared programs are read-only, and
    nanoGPT writes its data and out_dir into its own folder)."""
    shutil.copytree(src, dst)
    for d, _, files in os.walk(dst):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return dst


def nanogpt_copy(work: str) -> str:
    """nanoGPT copied into `work`, with its synthetic shakespeare_char data made inside the copy."""
    progs = programs_dir()
    dst = copy_tree_writable(os.path.join(progs, "nanoGPT"), os.path.join(work, "nanoGPT"))
    r = subprocess.run([PY, os.path.join(progs, "make_nanogpt_data.py"), dst], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"make_nanogpt_data.py failed: {r.stderr}")
    return dst


_ITER = re.compile(r"^iter (\d+): .*time ([0-9.]+)\s*ms")


def nanogpt_iters(res: Result) -> dict[int, float]:
    """{iteration: step ms} from nanoGPT's `iter N: loss …, time X ms` lines."""
    out: dict[int, float] = {}
    for line in res.out_lines:
        if (m := _ITER.match(line)) is not None:
            out[int(m.group(1))] = float(m.group(2))
    return out


def window(iters: dict[int, float], lo: int, hi: int) -> list[float]:
    """Step times of iterations lo..hi inclusive."""
    return [v for k, v in sorted(iters.items()) if lo <= k <= hi]
