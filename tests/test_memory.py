"""dlpt/memory.py: exact peak attribution, checked against an event-by-event simulation."""

from __future__ import annotations

import numpy as np
import pytest

from dlpt.memory import attribute, running_total, timeline


def simulate(n_nodes, device, addr, nbytes, node, total=None):
    """One event at a time, the obvious way: a dict of live blocks per device, the remainder
    from before the recording grown on demand so that it never goes negative."""
    out = {}
    for d in sorted(set(device)):
        live, before, best = {}, 0, None
        need = 0  # the least base that keeps the remainder non-negative
        held = 0
        for i in range(len(addr)):
            if device[i] != d or nbytes[i] == 0:
                continue
            if nbytes[i] > 0:
                if addr[i] in live:  # a missed free: the old block ends here
                    blk = live.pop(addr[i])
                    if blk[1] < 0:
                        held -= blk[0]
                live[addr[i]] = (nbytes[i], node[i])
                if node[i] < 0:
                    held += nbytes[i]
            elif addr[i] in live:
                blk = live.pop(addr[i])
                if blk[1] < 0:
                    held -= blk[0]
            else:
                held -= -nbytes[i]
            need = max(need, -held)
        held = 0
        live = {}
        for i in range(len(addr)):
            if device[i] != d or nbytes[i] == 0:
                continue
            if nbytes[i] > 0:
                if addr[i] in live:
                    blk = live.pop(addr[i])
                    if blk[1] < 0:
                        held -= blk[0]
                live[addr[i]] = (nbytes[i], node[i])
                if node[i] < 0:
                    held += nbytes[i]
            elif addr[i] in live:
                blk = live.pop(addr[i])
                if blk[1] < 0:
                    held -= blk[0]
            else:
                held += nbytes[i]
            mine = sum(s for s, nd in live.values() if nd >= 0)
            tot = total[i] if total is not None else mine + held + need
            if best is None or tot > best[0]:
                per = [0] * n_nodes
                for s, nd in live.values():
                    if nd >= 0:
                        per[nd] += s
                before = tot - mine
                best = (tot, per, before)
        out[d] = best
    return out


def random_events(rng, n, n_nodes, devices=2, damage=True):
    device, addr, nbytes, node, live = [], [], [], [], {}
    free_addrs = list(range(1, 60))
    for _ in range(n):
        d = int(rng.integers(devices))
        r = rng.random()
        lv = live.setdefault(d, {})
        if r < 0.55 and free_addrs:
            a = free_addrs.pop(int(rng.integers(len(free_addrs))))
            if a in lv:
                continue
            lv[a] = int(rng.integers(1, 9)) * 512
            device.append(d)
            addr.append(a)
            nbytes.append(lv[a])
            node.append(int(rng.integers(-1 if damage else 0, n_nodes)))
        elif lv and r < 0.95:
            a = list(lv)[int(rng.integers(len(lv)))]
            device.append(d)
            addr.append(a)
            nbytes.append(-lv.pop(a))
            node.append(0)
            free_addrs.append(a)
        elif damage:  # a free of a block allocated before the recording
            device.append(d)
            addr.append(1000 + int(rng.integers(100)))
            nbytes.append(-int(rng.integers(1, 5)) * 512)
            node.append(0)
    return [np.asarray(x, dtype=np.int64) for x in (device, addr, nbytes, node)]


@pytest.mark.parametrize("seed", range(12))
def test_attribution_matches_simulation(seed):
    rng = np.random.default_rng(seed)
    n_nodes = 5
    device, addr, nbytes, node = random_events(rng, 400, n_nodes)
    res = attribute(n_nodes, device, addr, nbytes, node)
    want = simulate(n_nodes, device.tolist(), addr.tolist(), nbytes.tolist(), node.tolist())
    assert set(res.devices) == set(want)
    per = np.zeros(n_nodes, dtype=np.int64)
    for d, (tot, p, before) in want.items():
        assert res.devices[d].peak_allocated == tot
        assert res.devices[d].before == before >= 0
        per += p
    assert res.peak_bytes.tolist() == per.tolist()
    # The sum over lines is the peak less the remainder from before the recording.
    assert int(res.peak_bytes.sum()) + res.before == res.peak_allocated
    mine = (nbytes > 0) & (node >= 0)
    assert res.alloc_bytes.tolist() == np.bincount(node[mine], weights=nbytes[mine], minlength=n_nodes).tolist()
    assert res.alloc_count.tolist() == np.bincount(node[mine], minlength=n_nodes).tolist()
    assert (res.peak_bytes >= 0).all() and (res.peak_bytes <= res.alloc_bytes).all()


def test_allocator_total_decides_the_peak():
    # The allocator says 100 bytes were live before the first event: they are the remainder.
    device = np.zeros(4, dtype=np.int64)
    addr = np.array([1, 2, 1, 3])
    nbytes = np.array([512, 1024, -512, 2048])
    node = np.array([0, 1, 0, 2])
    total = 100 + np.array([512, 1536, 1024, 3072])
    res = attribute(3, device, addr, nbytes, node, total=total)
    assert res.devices[0].peak_allocated == 3172
    assert res.devices[0].index == 3
    assert res.before == 100
    assert res.peak_bytes.tolist() == [0, 1024, 2048]
    want = simulate(3, device.tolist(), addr.tolist(), nbytes.tolist(), node.tolist(), total.tolist())
    assert want[0][1] == res.peak_bytes.tolist()


def test_frees_without_allocation_never_go_negative():
    # Only frees: everything is the remainder, which must cover them (2048 bytes before the
    # first; the peak is taken after each event, the first one's free done).
    res = attribute(2, np.zeros(3, np.int64), np.array([5, 6, 7]), np.array([-512, -512, -1024]), np.zeros(3, np.int64))
    assert res.unmatched_frees == 3
    assert res.devices[0].peak_allocated == 1536 == res.before
    assert res.peak_bytes.tolist() == [0, 0] and res.alloc_bytes.tolist() == [0, 0]


def test_empty():
    res = attribute(3, *(np.zeros(0, np.int64),) * 4)
    assert res.devices == {} and res.peak_allocated == 0 and res.peak_bytes.tolist() == [0, 0, 0]
    assert timeline(np.zeros(0), np.zeros(0), 0, 10) == []


def test_timeline_keeps_the_peak():
    t = np.arange(10_000)
    device, addr, nbytes, node = random_events(np.random.default_rng(3), 10_000, 3, devices=1, damage=False)
    tot = running_total(device, addr, nbytes, 0)
    pts = timeline(t[:len(tot)], tot, 0, len(tot), points=100)
    assert len(pts) == 100
    assert max(pts) == int(tot.max())
    assert min(pts) >= 0


def test_memory_timeline_by_hand():
    # Levels set at events, each holding until the next, read as each bin's highest level (the
    # one it starts with included). Window [100, 130), three bins of 10 ns; events given unsorted.
    t = [125, 100, 131, 102]
    v = [8, 5, 2, 3]
    # bin 0 [100, 110): 5, then 3 -> 5; bin 1 [110, 120): no event, the 3 it starts with -> 3;
    # bin 2 [120, 130): 8 at 125, and 131 (past the window's end) lands in the last bin -> 8.
    assert timeline(t, v, 100, 130, points=3) == [5, 3, 8]
    # A bin with no event has the level it starts with: 6 from t=101 holds through bin 1.
    assert timeline([100, 101, 125], [4, 6, 1], 100, 130, points=3) == [6, 6, 6]
    # An event before the window counts in its first bin; never more bins than events.
    assert timeline([90, 120], [7, 1], 100, 130, points=3) == [7, 7]
    # An empty or inverted window is one bin wide per event's time: all in the first bin.
    assert timeline([5, 6], [2, 9], 10, 10, points=4) == [9, 9]
    assert timeline([], [], 0, 10) == []
    # Nothing allocated reads 0, in a bin of its own events and in one that holds it; one event, one bin.
    assert timeline([100, 101, 125], [0, 0, 4], 100, 130, points=3) == [0, 0, 4]
    assert timeline([105], [7], 100, 130) == [7]


def test_running_total_by_hand():
    # Device 0's events only, zero-byte ones left out: +8 at 1, +1 at 5 (one byte), -8 at 1, -1 at 5.
    device = np.array([0, 1, 0, 0, 0, 0])
    addr = np.array([1, 1, 5, 9, 1, 5])
    nbytes = np.array([8, 16, 1, 0, -8, -1])
    assert running_total(device, addr, nbytes, 0).tolist() == [8, 9, 1, 0]
    assert running_total(device, addr, nbytes, 1).tolist() == [16]  # never freed here


def test_node_place_names_the_user_s_line_else_the_library_s_else_the_op():
    from dlpt.frames import Frame, FrameTable
    from dlpt.memory import node_place

    ft = FrameTable()
    ids = [ft.intern(f) for f in (
        Frame("root", "r"),
        Frame("python", "train.py(12): step", "/home/me/train.py", 12, "step"),
        Frame("python", "linear.py(125): forward", "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125,
              "forward"),
        Frame("op", "aten::linear"),
        Frame("op", "aten::empty"),
    )]
    # node: 0 root, 1 train.py:12, 2 linear.py:125 under it, 3 aten::linear, 4 aten::empty under that;
    # 5 aten::linear and 6 aten::empty straight under the root (a trace without stacks);
    # 7 linear.py under the root, 8 aten::linear under it (library code alone).
    parent = [-1, 0, 1, 2, 3, 0, 5, 0, 7]
    frame = [ids[0], ids[1], ids[2], ids[3], ids[4], ids[3], ids[4], ids[2], ids[3]]
    assert node_place(parent, frame, ft, 4) == "/home/me/train.py:12"
    assert node_place(parent, frame, ft, 1) == "/home/me/train.py:12"
    assert node_place(parent, frame, ft, 6) == "aten::linear"  # the outermost op, not aten::empty
    assert node_place(parent, frame, ft, 8) == "/usr/lib/python3/site-packages/torch/nn/modules/linear.py:125"


def test_attribute_by_hand():
    # Device 0: node 0 allocates 1 byte (kept to the end), node 1 100 bytes, then frees them.
    device, addr, nbytes, node = (np.array(x) for x in ([0, 0, 0], [1, 2, 2], [1, 100, -100], [0, 1, 1]))
    for total in (None, np.array([1, 101, 1])):  # the allocator's own counter, where known, agrees
        res = attribute(2, device, addr, nbytes, node, total=total)
        assert res.alloc_bytes.tolist() == [1, 100] and res.alloc_count.tolist() == [1, 1]
        assert res.peak_bytes.tolist() == [1, 100]
        p = res.devices[0]
        # the peak: 101 bytes after the second event, nothing from before the recording, no
        # reserved figure given
        assert (p.peak_allocated, p.index, p.before, p.peak_reserved) == (101, 1, 0, 0)
    # 50 bytes allocated before the recording (`base`) add to the peak and are its `before`.
    p = attribute(2, device, addr, nbytes, node, base={0: 50}).devices[0]
    assert (p.peak_allocated, p.before) == (151, 50)


def test_a_one_byte_block_is_a_block():
    # +1 at addr 1, freed: matched (not a free of something allocated before the recording).
    res = attribute(1, np.array([0, 0]), np.array([1, 1]), np.array([1, -1]), np.array([0, 0]))
    assert res.unmatched_frees == 0 and res.alloc_bytes.tolist() == [1]
    d = res.devices[0].to_dict()
    assert d == {"peak_allocated": 1, "peak_reserved": 0, "before_recording": 0}
