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
