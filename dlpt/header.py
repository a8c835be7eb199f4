"""The profile's header: what is known about the run beside its tree (`Profile.meta`), one typed
field per key of the `.dlpt` file's `meta` table.

Why typed: the keys used to be a `dict[str, Any]` whose contract lived in docstrings across a
dozen modules; a misspelt key read as None without a word. Here each key has one field, its
type and who writes it, and mypy checks every reader.

On disk nothing changes (dlpt/store.py converts): `to_dict` gives exactly the keys and JSON
values the table holds, so older dlpt versions read new files as before. A field that is None is
a key the file does not have (`meta.get(key)` was None for both). Reading (`from_dict`):

- a missing key is its field's default, None (every key is optional: older files lack newer ones);
- an unknown key (a newer dlpt's, a user's) goes into `extra` and is written back unchanged;
- a known key whose value is not of its field's type (a damaged or hand-edited file) also stays in
  `extra`, written back as it was, and its field is None: readers can trust the types;
- a known key stored as JSON null is kept in `extra` as null, so it is written back as null.

Values are kept as read (checked, not converted): a float stays a float, a nested object keeps
its keys' order, so save → load → save gives the same table.

Versioning: the file's schema version (`PRAGMA user_version`, dlpt/store.py SCHEMA_VERSION) is the
header's version; `schema` holds the one the file was written with. A change that renames or
retypes a key bumps it, and `from_dict` reads the older form by that number. Adding a key needs no
bump: older readers keep it in their `extra`.

Nested values: TypedDicts where the shape is dlpt's own and fixed (window, GPU idle, timeline,
phases): typed for mypy, still plain dicts at run time, so they round-trip byte for byte. Plain
`dict[str, Any]` where the inner shape varies by collector or build (the native collector's
stats, device properties, memory, the compile summaries), each says where its shape is written.

`Header` is also a read-write mapping by key name, the form `Profile.meta` had before: for user
code and notebooks (`prof.meta["command"]`). dlpt's own modules use the attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, get_type_hints

import msgspec


class Window(TypedDict, total=False):
    """[start, end) in ns since the Unix epoch; `wall` (ns) where a phase's window replaced the
    run's (dlpt.phases.phase_meta): the time spent in the phase, not end − start."""

    start: int
    end: int
    wall: int


class DeviceIdle(TypedDict, total=False):
    """One device's GPU idle figures (ns), dlpt.idle.IdleBlame.meta; "start-up" also has a hyphen."""

    window: int
    busy: int
    idle: int
    unattributed: int
    queued: int


# "start-up" is no identifier: the functional form. total=False: older profiles lack newer keys.
GpuIdle = TypedDict("GpuIdle", {
    "busy": int, "idle": int, "host": int, "sync": int, "start-up": int, "unattributed": int, "queued": int,
    "devices": dict[str, DeviceIdle],  # by device id as text
    "skipped": dict[str, int],  # what bad input was left out, by why
    "after_sync": int,
}, total=False)


class Timeline(TypedDict, total=False):
    """Series over the window for the timelines (dlpt.idle.timeline, the collectors' memory.py):
    `t` (ns from the window's start) and `gpu_busy` (fraction busy per stretch); `mem_t` and
    the `allocated` and `reserved` bytes at each; `mem_device` the device they are of (Kineto)."""

    t: list[int]
    gpu_busy: list[float]
    mem_t: list[int]
    allocated: list[int]
    reserved: list[int]
    mem_device: int


class PhaseMeta(TypedDict, total=False):
    """One phase's figures (collectors/record/phases.py; `sync` by dlpt.phases.split_phases)."""

    wall: int  # ns of the run in the phase
    window: Window  # its first start, its last end
    gpu_idle: GpuIdle  # of its stretches alone
    sync: int  # host sync time in it (ns)


class Stragglers(TypedDict):
    """The straggler verdict of several ranks, judged on `phase` (dlpt.scope.Scope.apply)."""

    phase: str
    verdicts: dict[str, Any]  # metric → dlpt.ranks.stragglers' verdict


@dataclass(eq=True)
class Header(MutableMapping[str, Any]):
    """What is known about the run. Writers: R the recorder (collectors/record/session.py, its
    trie_converter, memory and recording), K the Kineto importer (collectors/kineto/), M the merge
    of ranks (dlpt/merge.py), S a command's Scope and the model's transformations (dlpt/scope.py,
    phases.py, compile_time.py, compiled/fused.py), F the store (dlpt/store.py)."""

    # --- the file and the run (R, K, M, F)
    format: str | None = None  # F: "dlpt", the magic that tells a profile from any SQLite file
    source: str | None = None  # R/K/M: "record", "kineto", "mixed" (ranks of both); read via Profile.collector
    dlpt_version: str | None = None  # R/K/M: the dlpt that made it
    command: str | None = None  # R: the program's command line; K: ""; M: the first input's
    start_time: str | None = None  # R: when the recording started, ISO 8601 with its zone
    host: str | None = None  # R: the machine's host name
    python_version: str | None = None  # R
    torch_version: str | None = None  # R
    cuda_version: str | None = None  # R: torch's CUDA build (null on a CPU build)
    # K: from the trace's header; Kineto writes numbers, other tools text.
    cuda_runtime_version: int | str | None = None
    cuda_driver_version: int | str | None = None
    cupti_version: int | str | None = None
    devices: list[dict[str, Any]] | None = None  # R/K: device properties; keys differ by collector (Kineto's own)
    gpu: bool | None = None  # R: whether CUDA was on
    steps: list[int] | None = None  # R: the steps asked for (`--steps`), null for all
    steps_seen: int | None = None  # R: steps the program ran (dlpt.step or the optimizer)
    dataloaders: list[dict[str, Any]] | None = None  # R: the DataLoaders seen, their settings
    collector: dict[str, Any] | None = None  # R: the native collector's capabilities and stats; vary by build
    host_sampler: dict[str, Any] | None = None  # R: the sampler's period, samples, late, skipped, main_thread
    snapshots: int | None = None  # R: partial profiles written while the program ran
    snapshot_pause_max_s: float | None = None  # R: the longest snapshot build, wall (it shares the GIL with the program)
    snapshot_cpu_s: float | None = None  # R: the snapshot thread's CPU seconds in all (builds and writes)
    snapshot_wait_max_s: float | None = None  # R: the longest wait between snapshots (stretched by their cost)
    partial: bool | None = None  # R: a snapshot of a program still running
    snapshot_time: str | None = None  # R: when that snapshot was taken, ISO 8601
    exit_status: int | None = None  # R: the program's exit status
    ended_by: str | None = None  # R: the signal that ended it
    post_processing_s: float | None = None  # R: seconds spent turning the recording into the profile
    provenance: dict[str, Any] | None = None  # R: Inductor's provenance records (--keep; dlpt.compiled.provenance)
    traces: list[str] | None = None  # K: the trace files read
    nonfinite: int | None = None  # K: NaN and Infinity values read as missing (collectors/kineto/nonfinite.py)
    nonfinite_at: int | None = None  # K: the byte offset of the first
    skipped_events: int | None = None  # K/M: events left out as unreadable
    unknown_device_events: dict[str, int] | None = None  # K/M: device events of unknown kinds, by category
    # --- who this process was among a job's ranks (R: collectors/record/rank_env.py; K: distributedInfo)
    rank: int | None = None
    world_size: int | None = None  # M: the largest of the ranks' and their number
    local_rank: int | None = None
    run_id: str | None = None  # R: torchrun's run id, the same in every rank of one job
    host_pids: list[int] | None = None  # K: the host processes (two traces of one process are no two ranks)
    wall_window: Window | None = None  # K: first event's start, last event's end (dlpt/runs.py)
    # --- the wait figures (dlpt/idle.py has the contract, dlpt/waits.py the one reading)
    window: Window | None = None  # R/K: the recorded window; S: a phase's (with its wall)
    gpu_idle: GpuIdle | None = None  # R/K: GPU busy and idle, blamed on host lines; S: a phase's
    timeline: Timeline | None = None  # R/K: busy fraction and memory over the window
    memory: dict[str, Any] | None = None  # R/K: peaks, where, OOM (dlpt/memory.py, collectors/*/memory.py); shapes differ
    pc_sampling: dict[str, Any] | None = None  # R: --pc-samples' period, counts, reasons (collectors/record/pcsamples.py)
    collectives: list[dict[str, Any]] | None = None  # R: each collective op's calls (dlpt/commwait.py)
    collectives_dropped: dict[str, int] | None = None  # R: calls and kernels past the log's limit, not kept
    # --- phases (collectors/record/phases.py writes them; dlpt/phases.py reads)
    phases: dict[str, PhaseMeta] | None = None  # R: by phase name; S (split_phases) adds each one's sync
    phase_spans: list[list[Any]] | None = None  # R: [start, end, name] stretches, neighbours joined
    phase_names: dict[str, str] | None = None  # R: raw phase → its name (start-up, compile, steady)
    phase: str | None = None  # S: the phase the views show (select_phase); absent: all
    # --- several ranks as one (M: dlpt/merge.py)
    ranks: list[Header] | None = None  # M: each rank's own header (a subset of these fields)
    path: str | None = None  # M, in a rank's entry: the file it came from
    collective_span: int | None = None  # M, in a rank's entry: first collective's start to last one's end
    comm_wait: str | None = None  # M: how comm wait was estimated
    # --- what a command judged and changed (S)
    diagnosis: list[dict[str, Any]] | None = None  # S: dlpt.findings' verdicts, as JSON (Finding.to_json)
    stragglers: Stragglers | None = None  # S: the straggler verdict of several ranks
    torch_compile: dict[str, Any] | None = None  # S: torch.compile's summary (dlpt.compile_time.compile_summary)
    torch_compile_included: bool | None = None  # S: whether the views rank compile work with the rest
    compiled_provenance: dict[str, Any] | None = None  # S: compiled kernels placed on lines (dlpt.compiled.fused)

    # Not meta keys: what the file had that this dlpt does not type (written back unchanged), and
    # the schema version it was read from (None: made in memory).
    extra: dict[str, Any] = field(default_factory=dict)
    schema: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # A copy (dataclasses.replace) gets its own `extra`, as `{**meta}` got its own dict.
        self.extra = dict(self.extra)

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any], schema: int | None = None) -> Header:
        """The header of a meta table's keys and JSON values (`schema`: the file's version), or
        of a dict a caller built (no schema). Only a file's values are checked against the
        fields' types: they are JSON, and may be damaged; a dict built in memory may hold what
        JSON would turn into the type (a numpy integer, an integer key), as it always could."""
        if isinstance(meta, Header):
            return dataclasses.replace(meta)
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in meta.items():
            hint = _HINTS.get(key)
            if hint is None or value is None:
                extra[key] = value
            elif key == "ranks":
                if isinstance(value, list) and all(isinstance(r, Mapping) for r in value):
                    known[key] = [cls.from_dict(r, schema) for r in value]
                else:
                    extra[key] = value
            elif schema is None or _fits(value, hint):
                known[key] = value
            else:
                extra[key] = value
        return cls(**known, extra=extra, schema=schema)

    def to_dict(self) -> dict[str, Any]:
        """The meta table's keys and JSON values: the set fields, then `extra` (a field that is
        set wins over an `extra` entry of its name)."""
        out: dict[str, Any] = {}
        for name in _KEYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = [r.to_dict() for r in value] if name == "ranks" else value
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def updated(self, other: Header) -> Header:
        """A copy with `other`'s set fields and extra entries over this one's."""
        set_fields = {name: getattr(other, name) for name in _KEYS if getattr(other, name) is not None}
        return dataclasses.replace(self, **set_fields, extra={**self.extra, **other.extra})

    def per_rank(self) -> list[Header]:
        """The merged ranks' headers, or this header alone for a profile of one rank: where the
        per-rank figures (window, idle, phases) are."""
        return self.ranks or [self]

    # The mapping by key name (user code; see the module's docstring). Values are the stored
    # forms: `ranks` reads as a list of dicts (a copy).
    def __getitem__(self, key: str) -> Any:
        if key in _HINTS:
            value = getattr(self, key)
            if value is not None:
                return [r.to_dict() for r in value] if key == "ranks" else value
        return self.extra[key]

    def __setitem__(self, key: str, value: Any) -> None:
        one = Header.from_dict({key: value})
        self.extra.pop(key, None)
        if key in _HINTS:
            setattr(self, key, getattr(one, key))
        self.extra.update(one.extra)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        if key in _HINTS:
            setattr(self, key, None)
        self.extra.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __contains__(self, key: object) -> bool:
        return (isinstance(key, str) and key in _HINTS and getattr(self, key) is not None) or key in self.extra


_NOT_KEYS = {"extra", "schema"}
_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Header) if f.name not in _NOT_KEYS)
# Each key's type without its None: what `_fits` checks a stored value against.
_HINTS: dict[str, Any] = {k: v for k, v in get_type_hints(Header).items() if k in _KEYS}


_OPEN = dict[str, Any]
_OPEN_LIST = list[dict[str, Any]]


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value is of a field's type (msgspec checks it, strictly: no "1" for 1).
    Open dicts, and lists of them, are checked one level deep: their values are anything, and a
    recording's collective log can hold a million entries that msgspec would copy to check."""
    inner = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
    if len(inner) == 1 and inner[0] == _OPEN:
        return isinstance(value, dict)
    if len(inner) == 1 and inner[0] == _OPEN_LIST:
        return isinstance(value, list) and all(isinstance(x, dict) for x in value)
    try:
        msgspec.convert(value, hint)
    except (msgspec.ValidationError, TypeError):
        return False
    return True


__all__ = ["DeviceIdle", "GpuIdle", "Header", "PhaseMeta", "Stragglers", "Timeline", "Window"]
