"""The collector's trie → a dlpt profile.

The native collector keys its trie by raw contexts: a Python frame is (code object, line), an
op its name. Here each context becomes a dlpt frame, once: new trie nodes are converted as
they appear (nodes only ever grow, and a node's parent is always older), so the periodic
snapshots and the final profile each cost the nodes added since the last one plus one
renumbering of the tree.
"""

from __future__ import annotations

import os
from types import CodeType
from typing import Any

import numpy as np

from dlpt.cct import TreeBuilder
from dlpt.collectors.assembly import ActivityColumns, build_profile
from dlpt.collectors.record.memory import add_memory
from dlpt.collectors.record.native import (
    MAIN_READ,
    N_BACKWARD,
    N_OP,
    N_PHASE,
    N_PY,
    N_ROOT,
    N_THREAD,
    N_TID,
    N_UNATTR,
    HostSnapshot,
    Leaf,
    Snapshot,
)
from dlpt.collectors.record.pcsamples import add_pc_samples
from dlpt.collectors.record.phases import (
    RAW_NAMES,
    Rehome,
    named_spans,
    phase_idle,
    phase_names,
    phase_walls,
    raw_spans,
)
from dlpt.frames import BACKWARD_FRAME, Frame, FrameTable, source_frame, unattributed_frame
from dlpt.header import Header, Timeline
from dlpt.idle import blame, idle_column, split_by_device, timeline
from dlpt.metrics import ACTIVITY_KIND_INFO, COL
from dlpt.phases import phase_frame
from dlpt.profile import Profile
from dlpt.sources import read_source
from dlpt.transforms import fold_sampled_library

# The sampler's time in frames that are all dlpt's or runpy's: the program had not begun, or had ended.
OUTSIDE = "outside the program's code (dlpt starting or ending it)"


def leaf_frame(kind: int, name: str) -> Frame:
    """The frame of a device activity of metric kind `kind` (every copy kind is a "memcpy")."""
    return Frame(ACTIVITY_KIND_INFO[kind].frame, name)


class TrieConverter:
    """Converts successive snapshots of one recording's trie into profiles.

    `drop` names files (with or without their extension) and `drop_dirs` folders whose frames
    are not the program's (dlpt's own, runpy, the console script): their nodes are spliced
    out, so the program's `<module>` heads its paths.
    `thread_names` maps the keys dlpt gave threads it saw start to their names.
    """

    def __init__(self, root_name: str, drop: frozenset[str], drop_dirs: tuple[str, ...], cwd: str,
                 thread_names: dict[int, str]) -> None:
        self.frames = FrameTable()
        self.builder = TreeBuilder(self.frames.intern(Frame("root", root_name)))
        self.drop = drop
        self.drop_dirs = drop_dirs
        self.cwd = cwd
        self.thread_names = thread_names
        self.node_map: list[int] = []  # trie node → builder node
        self.code_info: list[tuple[str, str] | None] = []  # code index → (path, function); None: dropped
        self.names: list[str] = []
        self.leaf_nodes: list[int] = []  # leaf row → builder node of its activity frame
        self.leaf_frames: list[int] = []
        self._py_frames: dict[tuple[int, int], int] = {}
        self._sources: dict[str, str | None] = {}
        self._rehome = Rehome(self.builder, self.frames)
        self._outside = self.frames.intern(unattributed_frame(OUTSIDE))
        self._metric_node: dict[int, int] = {}  # trie node → the node its metrics go to, where not node_map's
        self._names: dict[str, str] = {}  # raw phase → its name in this profile (phases.phase_names)

    # ----- frames -----

    def _code(self, code: CodeType) -> tuple[str, str] | None:
        path = code.co_filename
        if path.startswith("<frozen runpy"):
            return None
        if path and not path.startswith("<") and not os.path.isabs(path):
            path = os.path.normpath(os.path.join(self.cwd, path))
        if path in self.drop or os.path.splitext(path)[0] in self.drop or path.startswith(self.drop_dirs):
            return None
        return path, code.co_name

    def _frame(self, kind: int, a: int, b: int) -> int | None:
        """The frame of a trie node; None for a frame that is spliced out."""
        if kind == N_PY:
            info = self.code_info[a]
            if info is None:
                return None
            key = (a, b)
            f = self._py_frames.get(key)
            if f is None:
                path, func = info
                f = self._py_frames[key] = self.frames.intern(source_frame(path, b, func))
            return f
        if kind == N_OP:
            return self.frames.intern(Frame("op", self.names[a]))
        if kind == N_BACKWARD:
            return self.frames.intern(BACKWARD_FRAME)
        if kind == N_THREAD:
            return self.frames.intern(Frame("thread", f"[thread {self.thread_names.get(a, a)}]"))
        if kind == N_TID:
            return self.frames.intern(Frame("thread", f"[thread {a}]"))
        if kind == N_UNATTR:
            return self.frames.intern(unattributed_frame(self.names[a]))
        if kind == N_PHASE:
            return self.frames.intern(phase_frame(RAW_NAMES.get(a, str(a))))
        return None

    # ----- snapshots -----

    def update(self, snap: Snapshot, host: HostSnapshot | None = None) -> tuple[ActivityColumns, dict[str, Any]]:
        """Take in one snapshot (and host_snapshot's dict taken just before it, so every node it
        names exists); the activity and metric columns."""
        cpu = snap.cpu
        self.code_info.extend(self._code(c) for c in snap.codes)
        self.names.extend(snap.names)
        node_map = self.node_map
        builder = self.builder
        pl, kl, al, bl = snap.parent.tolist(), snap.kind.tolist(), snap.a.tolist(), snap.b.tolist()
        for i in range(len(node_map), len(pl)):
            if kl[i] == N_ROOT:
                node_map.append(0)
                continue
            p = node_map[pl[i]]
            f = self._frame(kl[i], al[i], bl[i])
            if f is None and (p == 0 or kl[pl[i]] == N_PHASE):
                # Spliced out with nothing of the program's above it (dlpt's and runpy's frames as
                # the program starts and ends): its children go on above it as any spliced node's
                # do, but its own time goes to a row that says so, not to the root (or a phase's
                # node, which becomes the root), which a view does not show.
                self._metric_node[i] = builder.child(p, self._outside)
            node_map.append(p if f is None else builder.child(p, f))
        out = ActivityColumns()
        nz = np.flatnonzero(cpu)
        nmap = np.asarray(node_map, dtype=np.int64)
        if self._metric_node:
            nmap[np.fromiter(self._metric_node, np.int64)] = np.fromiter(self._metric_node.values(), np.int64)
        out.cpu_node = nmap[nz].tolist()
        out.cpu_self = cpu[nz].tolist()
        rows = snap.leaves
        for r in map(Leaf._make, rows[len(self.leaf_nodes):].tolist()):
            fid = self.frames.intern(leaf_frame(r.kind, self.names[r.name]))
            self.leaf_frames.append(fid)
            self.leaf_nodes.append(builder.child(int(nmap[r.node]), fid))
        if len(rows):
            col = Leaf._fields.index
            out.node = self.leaf_nodes[:len(rows)]
            out.name = self.leaf_frames[:len(rows)]
            out.kind = rows[:, col("kind")].tolist()
            out.count = rows[:, col("activities")].tolist()
            out.duration = rows[:, col("total")].tolist()
            out.nbytes = rows[:, col("bytes")].tolist()
            out.device = rows[:, col("device")].tolist()
            out.stream = rows[:, col("stream")].tolist()
            out.start = [0] * len(rows)
        info: dict[str, Any] = {"activity_rows": len(rows)}
        if host is not None:
            info.update(self._host(host, nmap, out))
        return out, info

    def _host(self, host: HostSnapshot, nmap: np.ndarray, out: ActivityColumns) -> dict[str, Any]:
        """host_time and sync_time onto their nodes, and what idle blame needs (host.h)."""
        out.extra["host_time"] = (nmap[host.host_node], host.host_ns)
        out.extra["sync_time"] = (nmap[host.sync_node], host.sync_ns)
        return {"nmap": nmap, "collectives": self._collectives(host, nmap)}

    def _idle(self, host: HostSnapshot, nmap: np.ndarray, out: ActivityColumns, meta: Header,
              spans: list[tuple[int, int, int]], names: dict[str, str]) -> None:
        """GPU idle blamed on the host lines of the threads that launched GPU work (dlpt/idle.py),
        in CUPTI's clock, phase by phase: start-up and unattributed idle as named rows under each
        phase's node (under the root without phases). Done for the final profile only: it reads
        every interval of the run, and a snapshot need not."""
        off = host.cupti_offset
        w = (host.window_start + off, host.window_end + off)
        skipped: dict[str, int] = {}
        busy = split_by_device(host.busy_device, host.busy_start, host.busy_end, skipped)
        ready = split_by_device(host.ready_device, host.ready_start, host.ready_end)
        mine = np.isin(host.iv_tid, host.launch_tids) if len(host.launch_tids) else np.ones(len(host.iv_tid), bool)
        windows = {d: w for d in busy}
        hs, he = host.iv_start[mine] + off, host.iv_end[mine] + off
        hn, ht, hy = nmap[host.iv_node[mine]], host.iv_tid[mine], host.iv_sync[mine]
        tl = meta.timeline if meta.timeline is not None else Timeline()
        tl.update(timeline(windows, busy, *w))  # beside memory's keys
        meta.timeline = tl
        if not spans:
            res = blame(len(self.builder), windows, busy, hs, he, hn, ht, hy, ready)
            res.skipped.update(skipped)
            out.extra["gpu_idle_time"] = idle_column(res, self.builder, self.frames, 0)
            meta.gpu_idle = res.meta()
            return
        shifted = [(s + off, e + off, p) for s, e, p in spans]
        column, gpu_idle = phase_idle(self.builder, self.frames, windows, busy, shifted, names,
                                      (hs, he, hn, ht, hy), meta.phases or {}, self._rehome, ready)
        gpu_idle["skipped"].update(skipped)
        meta.gpu_idle = gpu_idle
        out.extra["gpu_idle_time"] = column

    def _collectives(self, host: HostSnapshot, nmap: np.ndarray) -> list[dict[str, Any]]:
        """Each collective op's calls (host side) and each collective kernel's runs (`"gpu": True`,
        in start order), by the path of frames to their node (dlpt/commwait.py matches the ranks'
        entries through it: node ids differ between ranks, paths do not), in the wall clock."""
        out = []
        parents, frames = self.builder.parent, self.builder.frame
        for gpu, nodes, starts, ends in ((False, host.coll_node, host.coll_start, host.coll_end),
                                         (True, host.collk_node, host.collk_start, host.collk_end)):
            if not len(nodes):
                continue
            order = np.argsort(starts, kind="stable")
            by_node: dict[int, list[int]] = {}
            for i, n in zip(order.tolist(), nmap[nodes[order]].tolist()):
                by_node.setdefault(n, []).append(i)
            for n, idx in by_node.items():
                path = []
                phase = None
                m = n
                while m > 0:
                    f = self.frames.frames[frames[m]]
                    if f.kind == "phase":  # the profile's tree has its phases merged: the path without
                        phase = self._names.get(f.name, f.name)
                    else:
                        path.append([f.kind, f.name, f.file, f.line, f.function])
                    m = parents[m]
                entry: dict[str, Any] = {"path": path[::-1], "start": (starts[idx] + host.realtime_offset).tolist(),
                                         "end": (ends[idx] + host.realtime_offset).tolist()}
                if phase is not None:
                    entry["phase"] = phase  # ranks' calls are matched within a phase (dlpt/commwait.py)
                if gpu:
                    entry["gpu"] = True
                out.append(entry)
        return out

    def profile(self, snap: Snapshot, meta: Header, host: HostSnapshot | None = None,
                memory: dict[str, Any] | None = None, pc: dict[str, Any] | None = None) -> Profile:
        spans: list[tuple[int, int, int]] = []
        if host is not None:
            end = host.window_end or host.now  # still recording (a snapshot): up to now
            spans = raw_spans(host.phase_t, host.phase_id, host.window_start, end)
        self._names = names = phase_names(meta.steps_seen or 0, {p for _, _, p in spans})
        out, info = self.update(snap, host)
        node_map = np.asarray(self.node_map, dtype=np.int64)
        add_memory(memory, node_map, self.builder, self.frames, out, meta)
        add_pc_samples(pc, node_map, self.names, self.builder, self.frames, out, meta)
        if info.get("collectives"):
            meta.collectives = info["collectives"]
        if host is not None:
            if host.coll_dropped or host.collk_dropped:
                # Past a million entries per log the rest are counted, not kept: comm wait is then short.
                meta.collectives_dropped = {"calls": int(host.coll_dropped), "kernels": int(host.collk_dropped)}
            meta.window = {"start": host.window_start, "end": end}
            if spans:
                meta.phases = phase_walls(spans, names)
                meta.phase_spans = named_spans(spans, names)
                meta.phase_names = names
            if len(host.busy_device) and host.window_end:
                self._idle(host, info["nmap"], out, meta, spans, names)
            meta.host_sampler = {"period_ns": host.sample_period_ns, "samples": host.samples + host.peek_samples,
                                    "late": host.sample_waits, "skipped": host.sample_skips,
                                    "main_thread": MAIN_READ.get(host.main_read, "gil")}
        prof = fold_sampled_library(build_profile(self.builder, self.frames, out, meta))
        prof.sources.update(self.sources(prof))
        return prof

    @staticmethod
    def _files_worth_showing(prof: Profile) -> set[str]:
        """The files whose code a view of this profile may show: those of source frames with any
        metric beneath them other than host_time and gpu_idle_time, or with at least 1% of either. The
        sampler sees every import and every library call the program makes; storing each
        third-party file it passed through would make a small profile megabytes of code."""
        inc = prof.cct.inclusive
        sampled = [COL["host_time"], COL["gpu_idle_time"]]  # both follow the sampler everywhere it went
        other = np.delete(inc, sampled, axis=1).any(axis=1)
        keep = other.copy()
        for c in sampled:
            keep |= inc[:, c] >= 0.01 * max(int(inc[0, c]), 1)
        files = set()
        for fid in np.unique(prof.cct.frame[keep]).tolist():
            fr = prof.frames[fid]
            if fr.kind == "python" and fr.file:
                files.add(fr.file)
        return files

    def sources(self, prof: Profile) -> dict[str, str]:
        """Snapshots of the program's files on the paths, so the profile shows code elsewhere
        (each file read once per recording)."""
        out: dict[str, str] = {}
        for f in self._files_worth_showing(prof):
            if f not in self._sources:
                self._sources[f] = read_source(f)
            text = self._sources[f]
            if text is not None:
                out[f] = text
        return out
