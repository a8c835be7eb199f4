// dlpt collector: GPU memory by line, from the CUDA caching allocator's own events.
// Compiled only with DLPT_CUPTI (CUDA builds), the rest of the collector's device side.
//
// Why the allocator's trace tracker (`attachAllocatorTraceTracker`): it is called, in C++, for
// every allocation, free, segment (cudaMalloc/cudaFree, or expandable-segment map/unmap) and
// out-of-memory of the caching allocator, on the thread that makes the call — so the line is the
// one a kernel launched from that thread at that moment would get (`launch_node`, autograd.h):
// an op's allocations sit on the op's line, backward's under `[backward]` below its forward line.
// No Python runs per event, and nothing is kept per event: a map of the live blocks (address →
// size, node), live bytes per node, and the peak kept exactly and online (below). torch.profiler's
// `[memory]` events are the same calls, but need the profiler on; the Kineto importer reads those.
//
// A tracker cannot be detached, so it is attached once per process and returns at once while
// dlpt is not recording. It runs under the allocator's per-device lock, and Python's GIL may be
// held by another thread waiting for that lock (a tensor freed from Python): so it never takes
// the GIL. Placing an allocation reads frames without the GIL (the internal-frames build, as the
// op callback does); where reading would need the GIL (DLPT_FRAMES=gil, the public frame API),
// an allocation outside any op goes to the thread's last Python context and is counted
// (`approx`). The one case left that would take the GIL — an allocation outside any op, without
// the GIL, below a code object never seen before — is the op callback's own first-sight case.
//
// Sizes: the tracker gives the requested size; the allocator counts blocks (512-byte multiples,
// and a large block may be handed out whole when the rest is under 1 MiB). dlpt counts requests
// rounded to 512 bytes: equal to the allocator's counter except for such whole blocks.
//
// Frees: FREE_REQUESTED is where the allocator's `memory_allocated()` goes down (FREE_COMPLETED
// comes later for blocks used on other streams, when their memory can be reused).
//
// The peak, exactly and online: each device keeps the live bytes of every node and, since the
// last peak, the set of nodes whose live bytes changed (dirty). When the device's allocated total
// passes its peak, the dirty nodes' live bytes are copied into the peak's figures and the set is
// emptied: each event marks one node, each mark is copied once, so the cost is amortised O(1) per
// event and memory is the nodes plus the live blocks, whatever the number of events.
#pragma once

#include "common.h"  // first: Python.h before any other header

#include "autograd.h"  // launch_node, unrecorded_node
#include "frames.h"
#include "trie.h"

#if defined(DLPT_CUPTI)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

struct MemBlock {
  int64_t size, node;
};
struct NodeMem {
  int64_t live = 0;
  bool dirty = false;
};
struct MemDevice {
  std::unordered_map<uint64_t, MemBlock> live;  // blocks allocated while recording, by address
  std::unordered_map<int64_t, NodeMem> nodes;    // node → its live bytes
  std::vector<int64_t> dirty;                    // nodes changed since the last peak
  std::unordered_map<int64_t, int64_t> peak;     // node → bytes live at the peak
  std::unordered_map<uint64_t, MemBlock> pool_segments;  // CUDA-graph private pools' segments
  int64_t before = 0;     // live bytes allocated before the recording (the allocator's count at start)
  int64_t allocated = 0;  // before + the live blocks: the allocator's memory_allocated()
  int64_t reserved = 0, reserved_peak = 0;
  int64_t peak_total = -1, peak_before = 0, peak_node = -1, peak_step = -1, peak_time = 0;
  int64_t unmatched_frees = 0, unmatched_bytes = 0;  // frees of blocks never seen allocated
};

// Memory over time, all devices together: at most kSeries bins, each bin's highest allocated
// and reserved totals and the last ones; the bin width doubles (pairs merged) as the run grows.
constexpr int kSeries = 2000;
struct MemSeries {
  int64_t t0 = 0, width = 1000000;  // ns; 1 ms bins to start
  std::vector<int64_t> hi_a, hi_r, last_a, last_r;
  std::vector<char> has;
  void reset(int64_t t) {
    t0 = t;
    width = 1000000;
    hi_a.assign(kSeries, 0), hi_r.assign(kSeries, 0), last_a.assign(kSeries, 0), last_r.assign(kSeries, 0);
    has.assign(kSeries, 0);
  }
  void halve() {  // bins 2j and 2j+1 become bin j
    for (size_t j = 0; j < size_t(kSeries / 2); ++j) {
      size_t a = 2 * j, b = 2 * j + 1;
      bool ha = has[a], hb = has[b];
      int64_t xa = hi_a[a], xr = hi_r[a], la = last_a[a], lr = last_r[a];
      if (hb) {
        xa = ha ? std::max(xa, hi_a[b]) : hi_a[b];
        xr = ha ? std::max(xr, hi_r[b]) : hi_r[b];
        la = last_a[b], lr = last_r[b];
      }
      hi_a[j] = xa, hi_r[j] = xr, last_a[j] = la, last_r[j] = lr, has[j] = ha || hb;
    }
    for (size_t j = size_t(kSeries / 2); j < size_t(kSeries); ++j) has[j] = 0;
    width *= 2;
  }
  void add(int64_t now, int64_t a, int64_t r) {
    if (has.empty()) return;
    int64_t b = (now - t0) / width;
    while (b >= kSeries) {
      halve();
      b = (now - t0) / width;
    }
    if (b < 0) b = 0;
    size_t k = size_t(b);
    if (!has[k]) {
      hi_a[k] = a, hi_r[k] = r, has[k] = 1;
    } else {
      hi_a[k] = std::max(hi_a[k], a), hi_r[k] = std::max(hi_r[k], r);
    }
    last_a[k] = a, last_r[k] = r;
  }
};

// GPU memory while recording (the one instance, g_memory, is at static storage).
struct MemoryState {
  std::mutex mu;  // everything below; taken inside the allocator's lock, never the other way
  std::atomic<bool> on{false};
  std::atomic<bool> attached{false};
  std::string error;
  std::unordered_map<int64_t, MemDevice> dev;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> alloc;  // node → (bytes, count)
  std::unordered_map<int64_t, int64_t> oom;  // node → live bytes at the last out-of-memory
  int64_t oom_device = -1, oom_requested = 0, oom_free = 0, ooms = 0;
  int64_t step = 0, events = 0, end = 0;
  std::atomic<int64_t> approx{0};  // allocations placed at the thread's last context (above)
  int64_t all_alloc = 0, all_reserved = 0;  // over devices, for the series
  MemSeries series;
};
MemoryState g_memory;

int64_t round_block(size_t size) { return size < 512 ? 512 : int64_t((size + 511) & ~size_t(511)); }

// Where an allocation made now on this thread belongs (see the top of this file).
int64_t memory_node() {
  ThreadState& ts = tstate();
  const void* frame = current_pyframe();
  if (!ts.stack.empty() && ts.stack.back().node >= 0) {
    const OpenOp& top = ts.stack.back();
    if (top.pyframe == frame || frame == nullptr) return launch_node(ts);  // the op's node: no frames read
  }
  bool gil_reads = true;
#if defined(DLPT_INTERNAL_FRAMES)
  gil_reads = g_collector.gil_frames.load(std::memory_order_relaxed);
#endif
  if (!gil_reads || PyGILState_Check()) return launch_node(ts);
  if (unrecorded_node(ts) != nullptr && (frame == nullptr || frame == ts.bw_frame)) return launch_node(ts);
  g_memory.approx.fetch_add(1, std::memory_order_relaxed);
  return !ts.last_nodes.empty() ? ts.last_nodes.back() : (ts.base >= 0 ? ts.base : g_trie.phase_node.load(std::memory_order_relaxed));
}

MemDevice& mem_device(int64_t d) { return g_memory.dev[d]; }

void mem_touch(MemDevice& d, int64_t node, int64_t delta) {
  NodeMem& m = d.nodes[node];
  m.live += delta;
  if (!m.dirty) {
    m.dirty = true;
    d.dirty.push_back(node);
  }
}

void mem_peak(MemDevice& d, int64_t node, int64_t now) {
  for (int64_t n : d.dirty) {
    NodeMem& m = d.nodes[n];
    d.peak[n] = m.live;
    m.dirty = false;
  }
  d.dirty.clear();
  d.peak_total = d.allocated;
  d.peak_before = d.before;
  d.peak_node = node;
  d.peak_step = g_memory.step;
  d.peak_time = now;
}

void mem_free_block(MemDevice& d, const MemBlock& b) {
  mem_touch(d, b.node, -b.size);
  d.allocated -= b.size;
  g_memory.all_alloc -= b.size;
}

void on_allocator_event(const cca::TraceEntry& te) {
  if (!g_memory.on.load(std::memory_order_relaxed)) return;
  using A = cca::TraceEntry;
  int64_t node = -1;
  bool pooled = !(te.mempool_.first == 0 && te.mempool_.second == 0);
  if (te.action_ == A::ALLOC || te.action_ == A::OOM ||
      (pooled && (te.action_ == A::SEGMENT_ALLOC || te.action_ == A::SEGMENT_MAP)))
    node = memory_node();  // before the lock: it may take the trie's
  int64_t now = steady_ns();
  std::lock_guard<std::mutex> lk(g_memory.mu);
  ++g_memory.events;
  MemDevice& d = mem_device(int64_t(te.device_));
  switch (te.action_) {
    case A::ALLOC: {
      int64_t size = round_block(te.size_);
      auto ins = d.live.try_emplace(uint64_t(te.addr_), MemBlock{size, node});
      if (!ins.second) {  // its free was missed: the old block ends here
        mem_free_block(d, ins.first->second);
        ins.first->second = MemBlock{size, node};
      }
      mem_touch(d, node, size);
      auto& ac = g_memory.alloc[node];
      ac.first += size;
      ac.second += 1;
      d.allocated += size;
      g_memory.all_alloc += size;
      if (d.allocated > d.peak_total) mem_peak(d, node, now);
      break;
    }
    case A::FREE_REQUESTED: {
      auto it = d.live.find(uint64_t(te.addr_));
      if (it != d.live.end()) {
        mem_free_block(d, it->second);
        d.live.erase(it);
      } else {  // allocated before the recording: the remainder's, never below zero
        int64_t size = std::min(round_block(te.size_), d.before);
        d.before -= size;
        d.allocated -= size;
        g_memory.all_alloc -= size;
        ++d.unmatched_frees;
        d.unmatched_bytes += round_block(te.size_);
      }
      break;
    }
    case A::SEGMENT_ALLOC:
    case A::SEGMENT_MAP: {
      int64_t size = int64_t(te.size_);
      d.reserved += size;
      g_memory.all_reserved += size;
      d.reserved_peak = std::max(d.reserved_peak, d.reserved);
      if (pooled) d.pool_segments[uint64_t(te.addr_)] = MemBlock{size, node};
      break;
    }
    case A::SEGMENT_FREE:
    case A::SEGMENT_UNMAP: {
      int64_t size = std::min(int64_t(te.size_), d.reserved);
      d.reserved -= size;
      g_memory.all_reserved -= size;
      auto it = d.pool_segments.find(uint64_t(te.addr_));
      if (it != d.pool_segments.end()) d.pool_segments.erase(it);
      break;
    }
    case A::OOM: {
      // What each line held when the allocation failed: the saved profile shows it.
      g_memory.oom.clear();
      for (auto& [n, m] : d.nodes)
        if (m.live > 0) g_memory.oom[n] = m.live;
      g_memory.oom_device = int64_t(te.device_);
      g_memory.oom_free = int64_t(te.addr_);  // for OOM the tracker gives the free bytes here
      g_memory.oom_requested = int64_t(te.size_);
      ++g_memory.ooms;
      g_memory.oom[node] += 0;  // the failing line is named even when it held nothing
      break;
    }
    default:
      return;
  }
  g_memory.series.add(now, g_memory.all_alloc, g_memory.all_reserved);
}

// The allocator's counts when recording begins: what was allocated before it. Read before
// g_memory.mu is taken: reading them takes the allocator's lock, inside which the tracker takes
// g_memory.mu.
void memory_baseline() {
  std::vector<std::pair<int64_t, int64_t>> st;
  int n = int(c10::cuda::device_count());
  for (int i = 0; i < n; ++i) {
    auto s = cca::getDeviceStats(c10::DeviceIndex(i));
    st.emplace_back(s.allocated_bytes[0].current, s.reserved_bytes[0].current);  // 0: StatType::AGGREGATE
  }
  std::lock_guard<std::mutex> lk(g_memory.mu);
  if (g_memory.events > 0) return;  // events came first: too late for a consistent start
  for (int i = 0; i < n; ++i) {
    MemDevice& d = mem_device(i);
    d.before = d.allocated = st[size_t(i)].first;
    d.reserved = d.reserved_peak = st[size_t(i)].second;
    g_memory.all_alloc += d.allocated;
    g_memory.all_reserved += d.reserved;
  }
}

// Attach the tracker (once per process) to an initialised allocator: attaching to one not yet
// initialised would reach no device. Called now when CUDA is initialised, else by torch right
// after it initialises CUDA (`torch.cuda._lazy_call`), before any allocation.
void memory_attach() {
  try {
    memory_baseline();
    if (!g_memory.attached.exchange(true)) cca::attachAllocatorTraceTracker(on_allocator_event);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lk(g_memory.mu);
    g_memory.error = std::string("the CUDA allocator has no trace hook: ") + e.what();
  }
}

// From start(), with the GIL held.
void memory_start(bool device) {
  {
    std::lock_guard<std::mutex> lk(g_memory.mu);
    g_memory.dev.clear();
    g_memory.alloc.clear();
    g_memory.oom.clear();
    g_memory.oom_device = -1, g_memory.oom_requested = g_memory.oom_free = g_memory.ooms = 0;
    g_memory.step = g_memory.events = g_memory.end = 0;
    g_memory.approx.store(0);
    g_memory.all_alloc = g_memory.all_reserved = 0;
    g_memory.series.reset(steady_ns());
    g_memory.error.clear();
  }
  const char* off = std::getenv("DLPT_MEMORY");  // DLPT_MEMORY=0: no memory (diagnostics: its overhead)
  if (!device || (off != nullptr && std::string(off) == "0")) return;
  g_memory.on.store(true);
  try {
    py::module_::import("torch.cuda").attr("_lazy_call")(py::cpp_function([] { memory_attach(); }));
  } catch (py::error_already_set& e) {
    // torch.cuda without `_lazy_call`: attach now if CUDA is up (else memory goes unrecorded).
    if (cca::get() != nullptr && cca::get()->initialized()) memory_attach();
    else g_memory.error = std::string("memory not recorded: ") + e.what();
  }
}

void memory_stop() {
  if (!g_memory.on.exchange(false)) return;
  std::lock_guard<std::mutex> lk(g_memory.mu);
  g_memory.end = steady_ns();
}

void memory_set_step(int64_t step) {
  std::lock_guard<std::mutex> lk(g_memory.mu);
  g_memory.step = step;
}

}  // namespace
#endif  // DLPT_CUPTI

namespace {

py::bytes mem_column(const std::vector<int64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// The memory figures so far as named int64 columns (collectors/record/memory.py decodes them):
// allocations per node; per device, the bytes each node held at the device's peak and the peak
// itself; CUDA-graph private pools' segments per node; live bytes per node at the last
// out-of-memory; memory over time. `recorded` false on builds without CUDA, or where the
// allocator's hook could not be attached (`error` says why). Safe while recording goes on.
py::dict memory_snapshot() {
  py::dict out;
  std::vector<int64_t> an, ab, ac, pd, pn, pb, qd, qn, qb, on, ob;
  std::vector<int64_t> did, dpeak, dbefore, dres, dnode, dstep, dtime, dalloc, dresnow, dunf, dunb;
  std::vector<int64_t> st, sha, shr, sla, slr;
  bool recorded = false;
  std::string error;
  int64_t oom_device = -1, oom_req = 0, oom_free = 0, ooms = 0, events = 0, live = 0, approx = 0;
  int64_t t0 = 0, width = 0, end = 0;
#if defined(DLPT_CUPTI)
  {
    py::gil_scoped_release nogil;  // the tracker may wait for g_memory.mu inside the allocator's lock
    std::lock_guard<std::mutex> lk(g_memory.mu);
    recorded = g_memory.attached.load() && g_memory.error.empty();
    error = g_memory.error;
    for (auto& [n, v] : g_memory.alloc) an.push_back(n), ab.push_back(v.first), ac.push_back(v.second);
    for (auto& [id, d] : g_memory.dev) {
      for (auto& [n, v] : d.peak)
        if (v > 0) pd.push_back(id), pn.push_back(n), pb.push_back(v);
      std::unordered_map<int64_t, int64_t> pools;
      for (auto& [a, b] : d.pool_segments) pools[b.node] += b.size;
      for (auto& [n, v] : pools) qd.push_back(id), qn.push_back(n), qb.push_back(v);
      did.push_back(id), dpeak.push_back(std::max<int64_t>(d.peak_total, 0)), dbefore.push_back(d.peak_before);
      dres.push_back(d.reserved_peak), dnode.push_back(d.peak_node), dstep.push_back(d.peak_step);
      dtime.push_back(d.peak_time), dalloc.push_back(d.allocated), dresnow.push_back(d.reserved);
      dunf.push_back(d.unmatched_frees), dunb.push_back(d.unmatched_bytes);
      live += int64_t(d.live.size());
    }
    for (auto& [n, v] : g_memory.oom) on.push_back(n), ob.push_back(v);
    oom_device = g_memory.oom_device, oom_req = g_memory.oom_requested, oom_free = g_memory.oom_free, ooms = g_memory.ooms;
    events = g_memory.events, approx = g_memory.approx.load();
    const MemSeries& s = g_memory.series;
    t0 = s.t0, width = s.width, end = g_memory.end;
    for (size_t k = 0; k < s.has.size(); ++k)
      if (s.has[k]) st.push_back(int64_t(k)), sha.push_back(s.hi_a[k]), shr.push_back(s.hi_r[k]),
                    sla.push_back(s.last_a[k]), slr.push_back(s.last_r[k]);
  }
#endif
  out["recorded"] = recorded;
  out["error"] = error;
  out["alloc_node"] = mem_column(an), out["alloc_bytes"] = mem_column(ab), out["alloc_count"] = mem_column(ac);
  out["peak_device"] = mem_column(pd), out["peak_node"] = mem_column(pn), out["peak_bytes"] = mem_column(pb);
  out["pool_device"] = mem_column(qd), out["pool_node"] = mem_column(qn), out["pool_bytes"] = mem_column(qb);
  out["oom_node"] = mem_column(on), out["oom_bytes"] = mem_column(ob);
  out["dev_id"] = mem_column(did), out["dev_peak"] = mem_column(dpeak), out["dev_before"] = mem_column(dbefore);
  out["dev_reserved_peak"] = mem_column(dres), out["dev_peak_node"] = mem_column(dnode);
  out["dev_peak_step"] = mem_column(dstep), out["dev_peak_time"] = mem_column(dtime);
  out["dev_allocated"] = mem_column(dalloc), out["dev_reserved"] = mem_column(dresnow);
  out["dev_unmatched_frees"] = mem_column(dunf), out["dev_unmatched_bytes"] = mem_column(dunb);
  out["series_bin"] = mem_column(st), out["series_hi_alloc"] = mem_column(sha), out["series_hi_reserved"] = mem_column(shr);
  out["series_last_alloc"] = mem_column(sla), out["series_last_reserved"] = mem_column(slr);
  out["series_t0"] = t0, out["series_width"] = width, out["end"] = end;
  out["oom_device"] = oom_device, out["oom_requested"] = oom_req, out["oom_free"] = oom_free, out["ooms"] = ooms;
  out["events"] = events, out["live_blocks"] = live, out["approx"] = approx;
  return out;
}

// The step the program is in (the recorder counts them): the peak's step comes from it.
void memory_step(int64_t step) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
#if defined(DLPT_CUPTI)
  memory_set_step(step);
#else
  (void)step;
#endif
}

}  // namespace
