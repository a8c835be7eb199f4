// dlpt collector: the device side, CUPTI callbacks and activity buffers.
// Compiled only with DLPT_CUPTI; the op callback's state (trie.h, frames.h) is used here.
#pragma once

#include "common.h"  // first: Python.h before any other header

#include "autograd.h"  // launch_node: where a launch belongs
#include "pcsampling.h"  // --pc-samples: CUPTI's PC sampling, drained at launches
#include "trie.h"

namespace {

// ----- device side: CUPTI -----

struct Leaf {
  int64_t node, name, count, total, minv, maxv, bytes, device, stream;
  int32_t kind;
};
struct LeafKey {
  int64_t node, name;
  int32_t kind;
  bool operator==(const LeafKey& o) const { return node == o.node && name == o.name && kind == o.kind; }
};
struct LeafKeyHash {
  size_t operator()(const LeafKey& k) const {
    return size_t(uint64_t(k.node) * 0x9E3779B97F4A7C15ULL ^ uint64_t(k.name) * 0xC2B2AE3D27D4EB4FULL ^ uint64_t(k.kind));
  }
};

// CUPTI correlation id → (node, when the host's launch call returned), as a ring: ids grow, and a
// record arrives within a flush of its launch, so the last 2^20 launches in flight are enough
// (24 MiB, no allocation per launch). The launch time (TSC ticks: the call's entry, then its exit)
// tells GPU idle with work queued from idle waiting for the host (host.h, `busy_add`).
constexpr uint64_t kCorrBits = 20, kCorrSize = uint64_t(1) << kCorrBits;
struct CorrSlot {
  std::atomic<uint64_t> corr{0};
  std::atomic<int64_t> node{-1};
  std::atomic<int64_t> tick{0};
};

#if defined(DLPT_CUPTI)
constexpr int kMaxRuntimeCbid = 1 << 12;

// CUDA-graph replays traced per kernel and per graph (see "CUDA-graph replays" below).
struct MixPart {
  int64_t count = 0, total = 0, bytes = 0, minv = INT64_MAX, maxv = 0;
};
struct GraphMix {
  std::unordered_map<int64_t, MixPart> parts;  // name index * 8 + activity kind →
  int64_t total = 0;                          // the parts' time
};
struct TracedRecord {
  int64_t node, name, start, end, bytes, device, stream, launched;
  int32_t kind;
};
struct TracedReplay {
  uint32_t graph = 0;
  bool resolved = false;
  std::vector<TracedRecord> records;  // until resolved (graphs_resolve_locked)
};
struct GraphReplays {
  int64_t count = 0, total = 0, minv = INT64_MAX, maxv = 0, device = 0, stream = 0;
};
#endif

// The device side's state: the leaves the activity records add to, the correlation ring, and
// CUPTI's subscription and graph tracing (the one instance, g_device, is at static storage).
struct DeviceState {
  // The (node, name) leaves: guarded by leaf_mu, which the activity thread holds per buffer.
  std::mutex leaf_mu;
  std::vector<Leaf> leaves;
  std::unordered_map<LeafKey, int64_t, LeafKeyHash> leaf_idx;
  // CUPTI's names are stable per kernel: (name index, whether it is a collective's, NCCL's or RCCL's)
  std::unordered_map<const char*, std::pair<int64_t, bool>> kernel_name_cache;
  std::atomic<int64_t> records{0}, unlinked{0};
  int64_t no_launch_node = -1;
  double buffer_rate = 1.0;  // ns per tick, taken once per activity buffer (buffer_completed)

  CorrSlot* corr = nullptr;  // the ring above, kCorrSize slots (made by the first start())

#if defined(DLPT_CUPTI)
  CUpti_SubscriberHandle sub = nullptr;
  std::atomic<bool> on{false};
  std::string cupti_error;
  int64_t cupti_offset = 0;  // CUPTI's timestamp minus steady_ns() (device_on)

  // Switching off leaves CUPTI attached to the process: with every activity kind disabled and no
  // callback wanted, CUDA calls still pay for it (measured: the steps after a `--steps` window ran
  // 9-27% slower than before it). So switching off ends in cuptiFinalize(), which detaches CUPTI;
  // NVIDIA's cupti_finalize sample calls it at the exit site of a CUDA API callback, where no
  // other CUPTI call of this thread is in flight: the next launch's exit does it here. The mutex
  // keeps it from overlapping dlpt's own CUPTI calls (a snapshot's flush, switching on again);
  // the callback only tries it, so a launch never waits. Any later CUPTI call attaches again.
  std::mutex cupti_mu;
  std::atomic<bool> detach{false};

  // Runtime-API calls that block the host until the GPU catches up (host.h: sync time), by
  // callback id; filled when CUPTI is switched on.
  bool sync_cbid[kMaxRuntimeCbid] = {};
  bool launch_cbid[kMaxRuntimeCbid] = {};

  // CUDA-graph replays (see "CUDA-graph replays" below).
  bool graph_level = false;  // DLPT_GRAPH_TRACE=graph
  std::mutex graph_mu;
  std::unordered_map<const void*, uint64_t> graph_launches;  // graph exec → its replays so far
  std::atomic<int64_t> graph_toggle_errors{0};
  std::atomic<bool> graph_restore{false};  // graph-level tracing is due back on (graph_launch_exit)

  // What the replays traced per kernel measured, per graph, and the replays traced per graph, per
  // (node, graph); all under leaf_mu, filled by buffer_completed.
  std::unordered_map<uint32_t, GraphMix> mix;           // graph id →
  std::unordered_map<uint32_t, TracedReplay> sampled;   // correlation id of a replay traced per kernel →
  std::map<std::pair<int64_t, uint32_t>, GraphReplays> graph_replays;  // (node, graph id) →
  int64_t graph_records = 0;
  int64_t graph_repaired = 0;  // traced replays whose first record's end was stale (graphs_resolve_locked)
  int64_t untraced_name = -1;  // "CUDA graph replay (no replay traced per kernel)"
#endif
};
DeviceState g_device;

// Whether CUPTI's callbacks and activities are on (autograd.h asks, through common.h).
bool device_recording() {
#if defined(DLPT_CUPTI)
  return g_device.on.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void add_leaf_locked(int64_t node, int32_t kind, int64_t name, int64_t dur, int64_t bytes, int64_t device,
                     int64_t stream) {
  LeafKey k{node, name, kind};
  auto it = g_device.leaf_idx.find(k);
  if (it == g_device.leaf_idx.end()) {
    g_device.leaf_idx.emplace(k, int64_t(g_device.leaves.size()));
    g_device.leaves.push_back(Leaf{node, name, 1, dur, dur, dur, bytes, device, stream, kind});
    return;
  }
  Leaf& l = g_device.leaves[it->second];
  l.count += 1;
  l.total += dur;
  if (dur < l.minv) l.minv = dur;
  if (dur > l.maxv) l.maxv = dur;
  l.bytes += bytes;
}

void corr_put(uint64_t corr, int64_t node, int64_t tick) {
  CorrSlot& s = g_device.corr[corr & (kCorrSize - 1)];
  s.corr.store(0, std::memory_order_relaxed);
  s.node.store(node, std::memory_order_relaxed);
  s.tick.store(tick, std::memory_order_relaxed);
  s.corr.store(corr, std::memory_order_release);
}

// The launch call returned: its work is queued from `tick` on.
void corr_launched(uint64_t corr, int64_t tick) {
  CorrSlot& s = g_device.corr[corr & (kCorrSize - 1)];
  if (s.corr.load(std::memory_order_acquire) == corr) s.tick.store(tick, std::memory_order_relaxed);
}

int64_t corr_get(uint64_t corr, int64_t* tick = nullptr) {
  CorrSlot& s = g_device.corr[corr & (kCorrSize - 1)];
  if (s.corr.load(std::memory_order_acquire) != corr) return -1;
  if (tick != nullptr) *tick = s.tick.load(std::memory_order_relaxed);
  return s.node.load(std::memory_order_relaxed);
}

#if defined(DLPT_CUPTI)
const char* mem_kind(int k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return "Pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return "Pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE: return "Device";
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY: return "Array";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED: return "Managed";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC: return "Device Static";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC: return "Managed Static";
    default: return "Unknown";
  }
}

// Copy names as Kineto writes them ("Memcpy HtoD (Pageable -> Device)"), so recorded and
// imported profiles name copies alike; the kind follows dlpt.metrics.copy_kind.
std::pair<std::string, int32_t> copy_name(int kind, int src, int dst) {
  const char* k;
  int32_t ak = A_OTHER;
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: k = "HtoD"; ak = A_HTOD; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: k = "DtoH"; ak = A_DTOH; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: k = "DtoD"; ak = A_DTOD; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: k = "HtoA"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: k = "AtoH"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: k = "AtoA"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: k = "AtoD"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: k = "DtoA"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: k = "HtoH"; break;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: k = "PtoP"; break;
    default: k = "Unknown"; break;
  }
  return {std::string("Memcpy ") + k + " (" + mem_kind(src) + " -> " + mem_kind(dst) + ")", ak};
}

// At a CUDA call's exit (DeviceState::cupti_mu and ::detach say why).
void detach_here() {
  std::unique_lock<std::mutex> lk(g_device.cupti_mu, std::try_to_lock);
  if (!lk.owns_lock() || !g_device.detach.exchange(false)) return;
  cuptiFinalize();
  g_device.sub = nullptr;  // finalizing ends every subscription
}

// ----- CUDA-graph replays: per graph (DLPT_GRAPH_TRACE=graph, `dlpt record`'s default), or per kernel -----
// CUPTI's per-kernel records cost a graph launch 1-2 us of host time per kernel node: a
// 132-kernel replay's launch call takes 0.14-0.28 ms against 0.004-0.01 ms unprofiled
// (bench/workloads/graph_replay.py on an H100, docs/BENCHMARKS.md), which a graphed decode loop
// pays on every token. Graph-level records (CUPTI_ACTIVITY_KIND_GRAPH_TRACE: one per replay, its
// span on the GPU) cost about 0.04 ms; Nsight Systems traces graphs per graph by default too.
// With DLPT_GRAPH_TRACE=graph, graph-level tracing is on from the start and each graph's first
// replay is traced per kernel (graph-level tracing switched off for that launch call alone);
// its kernels (the graph's mix) spread every later replay's span over the same kernels at the
// same leaves (graph_leaves_locked). Measured on CUPTI 13.0: switching graph-level tracing on
// after a graph was replayed per kernel crashes the next replay, so it is on before any replay;
// and a replay traced per kernel after replays traced per graph gets stale timestamps on one
// node (a span as long as the time since the graph's previous such replay), so only the first
// replay is traced per kernel; its own stale record is repaired (graphs_resolve_locked).
thread_local bool t_in_graph_launch = false;  // in the runtime's call, whose driver call is the same launch
thread_local bool t_graph_traced = false;     // this thread switched graph-level tracing off for its launch
bool graph_launch_cbid(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API)
    return cbid == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000 ||
           cbid == CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000;
  return domain == CUPTI_CB_DOMAIN_DRIVER_API &&
         (cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch || cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz);
}

bool graph_trace(bool on) {
#if defined(DLPT_GRAPH_T)
  CUptiResult r = on ? cuptiActivityEnable(CUPTI_ACTIVITY_KIND_GRAPH_TRACE)
                     : cuptiActivityDisable(CUPTI_ACTIVITY_KIND_GRAPH_TRACE);
  if (r != CUPTI_SUCCESS) g_device.graph_toggle_errors.fetch_add(1, std::memory_order_relaxed);
  return r == CUPTI_SUCCESS;
#else
  (void)on;
  return false;
#endif
}

// A graph launch's entry (the outermost call: cudaGraphLaunch, or cuGraphLaunch called
// directly). Both take the graph exec first: (exec, stream).
void graph_launch_exit();

void graph_launch_enter(const CUpti_CallbackData* cb) {
  if (g_device.graph_restore.load(std::memory_order_relaxed)) graph_launch_exit();
  if (cb->functionParams == nullptr) return;
  const void* exec = *static_cast<const void* const*>(cb->functionParams);
  uint64_t n;
  {
    std::lock_guard<std::mutex> lk(g_device.graph_mu);
    n = g_device.graph_launches[exec]++;
  }
  if (n > 0) return;
  // Switching off or flushing holds the mutex: this replay is then traced per graph.
  std::unique_lock<std::mutex> lk(g_device.cupti_mu, std::try_to_lock);
  if (lk.owns_lock() && g_device.on.load() && graph_trace(false)) t_graph_traced = true;
}

// After the launch: graph-level tracing back on. Never waits for the mutex (switching off may
// hold it while CUPTI flushes): when it is taken, the next graph launch tries again.
void graph_launch_exit() {
  if (t_graph_traced) {
    t_graph_traced = false;
    g_device.graph_restore.store(true);
  }
  if (!g_device.graph_restore.load()) return;
  std::unique_lock<std::mutex> lk(g_device.cupti_mu, std::try_to_lock);
  if (!lk.owns_lock()) return;
  if (g_device.on.load()) graph_trace(true);
  g_device.graph_restore.store(false);
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  if (g_collector.diag.cb_return) return;
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {  // module loads and unloads: --pc-samples only
    pcs_resource(cbid, data);
    return;
  }
  auto* cb = static_cast<const CUpti_CallbackData*>(data);
  bool sync = domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUpti_CallbackId(kMaxRuntimeCbid) && g_device.sync_cbid[cbid];
  bool launch = domain != CUPTI_CB_DOMAIN_RUNTIME_API || cbid >= CUpti_CallbackId(kMaxRuntimeCbid) || g_device.launch_cbid[cbid];
  // A graph replay's outermost launch call (the runtime's, or the driver's called directly).
  bool graph = launch && g_device.graph_level && graph_launch_cbid(domain, cbid) &&
               !(domain == CUPTI_CB_DOMAIN_DRIVER_API && t_in_graph_launch);
  if (cb->callbackSite != CUPTI_API_ENTER) {
    if (graph) {
      t_in_graph_launch = false;
      graph_launch_exit();
    }
    if (launch && domain == CUPTI_CB_DOMAIN_DRIVER_API && g_pcs.wanted) pcs_launch_exit(cb->context, cbid);
    if (sync) sync_exit(tstate());
    // The work is queued once the launch call returns (its time before that is the host's).
    else if (launch && g_device.on.load(std::memory_order_relaxed)) corr_launched(cb->correlationId, ticks());
    if (g_device.detach.load(std::memory_order_relaxed)) detach_here();
    return;
  }
  if (!g_device.on.load(std::memory_order_relaxed)) return;
  if (graph) {
    t_in_graph_launch = domain == CUPTI_CB_DOMAIN_RUNTIME_API;
    graph_launch_enter(cb);
  }
  // Before this thread's state is read: the program's first GPU work starts the phase it belongs to.
  if (launch && g_trie.phase_auto.load(std::memory_order_relaxed)) phase_first_launch();
  ThreadState& ts = tstate();
  int64_t node = launch_node(ts);
  // PC sampling's turn at a kernel launch (pcsampling.h says what and why).
  if (launch && g_pcs.wanted && domain == CUPTI_CB_DOMAIN_DRIVER_API) pcs_launch(cb->context, cbid, node);
  if (launch) {
    corr_put(cb->correlationId, node, ticks());
    if (!ts.launched.load(std::memory_order_relaxed)) ts.launched.store(true, std::memory_order_relaxed);
  }
  if (sync) sync_enter(ts, node);
}

constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

// The node a record's launch was placed on; `launched`: when, in CUPTI's clock (0: unknown).
int64_t record_node(uint32_t corr, int64_t* launched) {
  int64_t tick = 0;
  int64_t n = corr_get(corr, &tick);
  *launched = tick != 0 ? g_collector.ns0 + int64_t(double(tick - g_collector.tick0) * g_device.buffer_rate) + g_device.cupti_offset : 0;
  if (n >= 0) return n;
  g_device.unlinked.fetch_add(1, std::memory_order_relaxed);
  if (g_device.no_launch_node < 0) {
    std::lock_guard<std::mutex> lk(g_trie.mu);
    g_device.no_launch_node = intern_node_locked(0, N_UNATTR, intern_name_locked("no launch record"), 0);
  }
  return g_device.no_launch_node;
}

int64_t name_idx(const std::string& s) {
  std::lock_guard<std::mutex> lk(g_trie.mu);
  return intern_name_locked(s);
}

bool traced_add(uint32_t graph, uint32_t corr, int64_t node, int64_t name, int32_t kind, int64_t start, int64_t end,
                int64_t bytes, int64_t device, int64_t stream, int64_t launched);

template <typename Copy>
void add_copy(const Copy* m) {
  auto cn = copy_name(m->copyKind, m->srcKind, m->dstKind);
  int64_t launched;
  int64_t node = record_node(m->correlationId, &launched);
  int64_t name = name_idx(cn.first), start = int64_t(m->start), end = int64_t(m->end);
  if (traced_add(m->graphId, m->correlationId, node, name, cn.second, start, end, int64_t(m->bytes), m->deviceId,
                 m->streamId, launched))
    return;
  add_leaf_locked(node, cn.second, name, end - start, int64_t(m->bytes), m->deviceId, m->streamId);
  busy_add(m->deviceId, start, end, launched);
}

void graphs_clear_locked() {
  g_device.mix.clear();
  g_device.sampled.clear();
  g_device.graph_replays.clear();
  g_device.graph_records = 0;
  g_device.graph_repaired = 0;
  g_device.untraced_name = -1;
  // The replay counts stay: a graph replayed in an earlier `--steps` window is not traced per
  // kernel again (such a replay's timestamps are not exact, see above); its replays then keep one
  // leaf each, at their line.
}

// A kernel, copy or memset that ran inside a replay traced per kernel (graph mode): kept with its
// replay until graphs_resolve_locked can judge its timestamps. False: not such a record.
bool traced_add(uint32_t graph, uint32_t corr, int64_t node, int64_t name, int32_t kind, int64_t start, int64_t end,
                int64_t bytes, int64_t device, int64_t stream, int64_t launched) {
  if (graph == 0 || !g_device.graph_level) return false;
  TracedReplay& r = g_device.sampled[corr];
  r.graph = graph;
  r.records.push_back(TracedRecord{node, name, start, end, bytes, device, stream, launched, kind});
  return true;
}

// The replays traced per kernel, once their timestamps can be judged, into the leaves, the busy
// intervals and their graph's mix. Measured on CUPTI 13.0 (H100, bench/workloads/graph_replay.py
// and gpt-fast, docs/BENCHMARKS.md): in a graph's first replay, traced per kernel while later
// replays are traced per graph, every record but the first carries the timestamps of a later
// replay (their durations agree with the per-kernel mode's to 2%), and the first record's end is
// that later replay's too: its span runs from the first replay to the later one (21 ms for a
// 57 us replay; 95% of gpt-fast's GPU time landed on one kernel). So a first record longer than
// the graph's replays take (their mean span, from the graph-level records) is stale, and its
// length is what a replay's span leaves after the rest of the records and one gap between
// records; the record is placed just before the rest. Judged once a graph-level record of the
// graph arrived, or at the end (`final`), when a graph replayed once keeps its records as they are.
// Per graph: (replays traced per graph, their spans' sum), over every line that replayed it.
std::unordered_map<uint32_t, std::pair<int64_t, int64_t>> graph_spans_locked() {
  std::unordered_map<uint32_t, std::pair<int64_t, int64_t>> spans;
  for (const auto& kv : g_device.graph_replays) {
    auto& t = spans[kv.first.second];
    t.first += kv.second.count;
    t.second += kv.second.total;
  }
  return spans;
}

void graphs_resolve_locked(bool final) {
  auto spans = graph_spans_locked();
  for (auto& kv : g_device.sampled) {
    TracedReplay& r = kv.second;
    if (r.resolved || r.records.empty()) continue;
    auto sp = spans.find(r.graph);
    int64_t mean = sp == spans.end() || sp->second.first == 0 ? 0 : sp->second.second / sp->second.first;
    if (mean == 0 && !final) continue;
    std::vector<TracedRecord>& v = r.records;
    std::sort(v.begin(), v.end(), [](const TracedRecord& a, const TracedRecord& b) { return a.start < b.start; });
    if (mean > 0 && v.size() >= 2 && v[0].end - v[0].start > mean) {
      int64_t rest0 = v[1].start, rest1 = 0, taken = 0;
      std::vector<int64_t> gaps;
      for (size_t i = 1; i < v.size(); ++i) {
        rest1 = std::max(rest1, v[i].end);
        if (i + 1 < v.size()) gaps.push_back(std::max<int64_t>(0, v[i + 1].start - v[i].end));
      }
      int64_t gap = 0;
      if (!gaps.empty()) {
        std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
        gap = gaps[gaps.size() / 2];
      }
      int64_t est = mean - (rest1 - rest0) - gap;
      if (est <= 0) {  // the rest took the whole span: the same kernel's other records, if any
        int64_t n = 0;
        for (size_t i = 1; i < v.size(); ++i)
          if (v[i].name == v[0].name && v[i].kind == v[0].kind) taken += v[i].end - v[i].start, ++n;
        est = n > 0 ? taken / n : 0;
      }
      v[0].end = rest0 - gap;
      v[0].start = v[0].end - est;
      ++g_device.graph_repaired;
    }
    GraphMix& mix = g_device.mix[r.graph];
    for (const TracedRecord& x : v) {
      int64_t dur = x.end - x.start;
      add_leaf_locked(x.node, x.kind, x.name, dur, x.bytes, x.device, x.stream);
      busy_add(x.device, x.start, x.end, x.launched);
      MixPart& p = mix.parts[x.name * 8 + x.kind];
      p.count += 1;
      p.total += dur;
      p.bytes += x.bytes;
      p.minv = std::min(p.minv, dur);
      p.maxv = std::max(p.maxv, dur);
      mix.total += dur;
    }
    r.resolved = true;
    std::vector<TracedRecord>().swap(r.records);
  }
}

// The leaf at (node, name, kind), made empty if there is none yet. The converter reads leaves as
// an append-only list (a row keeps its place from snapshot to snapshot), so the leaves that
// replays traced per graph add to are made here, once, in g_device.leaves.
size_t leaf_at_locked(int64_t node, int64_t name, int32_t kind, int64_t device, int64_t stream) {
  LeafKey k{node, name, kind};
  auto it = g_device.leaf_idx.find(k);
  if (it != g_device.leaf_idx.end()) return size_t(it->second);
  g_device.leaf_idx.emplace(k, int64_t(g_device.leaves.size()));
  g_device.leaves.push_back(Leaf{node, name, 0, 0, INT64_MAX, 0, 0, device, stream, kind});
  return g_device.leaves.size() - 1;
}

// The leaves with every replay traced per graph spread over its graph's kernels: each part gets
// the replays' span times the share of a replay's span its kernels took (so the gaps between
// kernels inside a replay stay out of kernel time), and the replays' count times its kernels per
// traced replay. A graph with no replay traced per kernel keeps one leaf.
// The share is the traced replays' kernel time per replay over the graph's mean span from its
// graph-level records, not over the traced replay's own span: that span's timestamps are not to be
// trusted (graphs_resolve_locked): on gpt-fast `--compile` (H100, docs/BENCHMARKS.md) its records
// carried times seconds apart, the share came out near 0, and 1.5 s of replays read as 34 ms.
std::vector<Leaf> graph_leaves_locked() {
  std::unordered_map<uint32_t, int64_t> traced;  // graph → its replays traced per kernel
  for (const auto& kv : g_device.sampled)
    if (kv.second.resolved) traced[kv.second.graph] += 1;
  auto spans = graph_spans_locked();
  struct Add {
    size_t at;
    int64_t count, total, minv, maxv, bytes;
  };
  std::vector<Add> adds;
  for (const auto& kv : g_device.graph_replays) {
    int64_t node = kv.first.first;
    const GraphReplays& g = kv.second;
    auto mix = g_device.mix.find(kv.first.second);
    auto tr = traced.find(kv.first.second);
    const auto& sp = spans[kv.first.second];
    if (mix == g_device.mix.end() || tr == traced.end() || mix->second.total <= 0 || sp.first <= 0 || sp.second <= 0) {
      if (g_device.untraced_name >= 0)
        adds.push_back(Add{leaf_at_locked(node, g_device.untraced_name, A_KERNEL, g.device, g.stream), g.count, g.total, g.minv,
                           g.maxv, 0});
      continue;
    }
    double replays = double(tr->second);
    double busy = std::min(1.0, double(mix->second.total) / replays / (double(sp.second) / double(sp.first)));
    for (const auto& part : mix->second.parts) {
      const MixPart& p = part.second;
      double share = double(p.total) / double(mix->second.total);
      adds.push_back(Add{leaf_at_locked(node, part.first / 8, int32_t(part.first % 8), g.device, g.stream),
                         int64_t(double(g.count) * double(p.count) / replays + 0.5),
                         int64_t(double(g.total) * busy * share + 0.5), p.minv, p.maxv,
                         int64_t(double(g.count) * double(p.bytes) / replays + 0.5)});
    }
  }
  std::vector<Leaf> out = g_device.leaves;
  for (const Add& a : adds) {
    Leaf& l = out[a.at];
    l.count += a.count;
    l.total += a.total;
    l.minv = std::min(l.minv, a.minv);
    l.maxv = std::max(l.maxv, a.maxv);
    l.bytes += a.bytes;
  }
  for (Leaf& l : out)
    if (l.minv == INT64_MAX) l.minv = 0;
  return out;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  g_device.buffer_rate = ns_per_tick();  // launch times are in ticks: one conversion rate per buffer
  std::lock_guard<std::mutex> lk(g_device.leaf_mu);
  while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<DLPT_KERNEL_T*>(rec);
        int64_t name;
        bool coll;
        const char* kn = k->name;  // a packed struct's field: copied, not bound
        auto it = g_device.kernel_name_cache.find(kn);
        if (it != g_device.kernel_name_cache.end()) {
          name = it->second.first;
          coll = it->second.second;
        } else {
          // CUPTI gives the mangled symbol; users (and Kineto's traces) read it demangled.
          int status = -1;
          char* dm = kn ? abi::__cxa_demangle(kn, nullptr, nullptr, &status) : nullptr;
          const char* shown = status == 0 && dm ? dm : (kn ? kn : "<unnamed kernel>");
          name = name_idx(shown);
          // ncclDevKernel_AllReduce_Sum_f32_RING_LL(...), ncclKernel_..., RCCL's alike (metrics.py)
          // Point-to-point kernels (SendRecv: pipeline stages) pair two ranks, not all: left out.
          coll = (std::strncmp(shown, "nccl", 4) == 0 || std::strncmp(shown, "rccl", 4) == 0) &&
                 std::strstr(shown, "SendRecv") == nullptr && std::strstr(shown, "_Send") == nullptr &&
                 std::strstr(shown, "_Recv") == nullptr;
          std::free(dm);
          g_device.kernel_name_cache.emplace(kn, std::make_pair(name, coll));
        }
        int64_t launched;
        int64_t node = record_node(k->correlationId, &launched);
        int64_t start = int64_t(k->start), end = int64_t(k->end);
        if (!traced_add(k->graphId, k->correlationId, node, name, A_KERNEL, start, end, 0, k->deviceId, k->streamId,
                        launched)) {
          add_leaf_locked(node, A_KERNEL, name, end - start, 0, k->deviceId, k->streamId);
          busy_add(k->deviceId, start, end, launched);
        }
        // A collective's kernel starts on its GPU when this rank arrives there and ends once every
        // rank has: its start is the rank's arrival (dlpt/commwait.py), kept per kernel.
        if (coll) collective_kernel_log(node, int64_t(k->start), int64_t(k->end));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY:
        add_copy(reinterpret_cast<DLPT_MEMCPY_T*>(rec));
        break;
      case CUPTI_ACTIVITY_KIND_MEMCPY2:  // peer-to-peer: the same fields
        add_copy(reinterpret_cast<DLPT_MEMCPY2_T*>(rec));
        break;
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<DLPT_MEMSET_T*>(rec);
        std::string nm = std::string("Memset (") + mem_kind(m->memoryKind) + ")";
        int64_t launched;
        int64_t node = record_node(m->correlationId, &launched);
        int64_t name = name_idx(nm), start = int64_t(m->start), end = int64_t(m->end);
        if (!traced_add(m->graphId, m->correlationId, node, name, A_MEMSET, start, end, int64_t(m->bytes), m->deviceId,
                        m->streamId, launched)) {
          add_leaf_locked(node, A_MEMSET, name, end - start, int64_t(m->bytes), m->deviceId, m->streamId);
          busy_add(m->deviceId, start, end, launched);
        }
        break;
      }
#if defined(DLPT_GRAPH_T)
      case CUPTI_ACTIVITY_KIND_GRAPH_TRACE: {
        auto* g = reinterpret_cast<DLPT_GRAPH_T*>(rec);
        if (g->start == 0 && g->end == 0) break;  // no timestamps collected
        int64_t launched;
        int64_t node = record_node(g->correlationId, &launched);
        int64_t dur = int64_t(g->end - g->start);
        GraphReplays& r = g_device.graph_replays[{node, g->graphId}];
        r.count += 1;
        r.total += dur;
        r.minv = std::min(r.minv, dur);
        r.maxv = std::max(r.maxv, dur);
        r.device = g->deviceId;
        r.stream = g->streamId;
        ++g_device.graph_records;
        busy_add(g->deviceId, int64_t(g->start), int64_t(g->end), launched);
        break;
      }
#endif
      default:
        break;
    }
    g_device.records.fetch_add(1, std::memory_order_relaxed);
  }
  if (g_device.graph_level) graphs_resolve_locked(false);
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET};

// A blocking runtime call: the synchronize calls and the synchronous copies (`cudaMemcpy`,
// `cudaMemcpy2D`..., not their `Async` forms). Names come with a version suffix
// (`cudaStreamSynchronize_v3020`).
bool is_sync(const char* name) {
  if (name == nullptr) return false;
  std::string_view s(name);
  s = s.substr(0, s.find("_v"));
  static const char* calls[] = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                                "cudaThreadSynchronize", "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D",
                                "cudaMemcpyPeer", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol"};
  for (const char* c : calls)
    if (s == c) return true;
  return false;
}

bool wanted(CUpti_CallbackDomain domain, const char* name) {
  if (name == nullptr) return false;
  std::string_view s(name);
  static const char* runtime[] = {"cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch"};
  static const char* driver[] = {"cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"};
  const char** list = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? runtime : driver;
  for (int i = 0; i < 4; ++i)
    if (s.rfind(list[i], 0) == 0) return s.find("HostFunc") == std::string_view::npos;
  return false;
}

std::string cupti_err(const char* what, CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return std::string(what) + ": " + (s ? s : "error");
}

// Subscribe to the launch/copy/memset entry points and enable the activity kinds; "" or why not.
std::string device_on() {
  std::lock_guard<std::mutex> lk(g_device.cupti_mu);
  g_device.detach.store(false);  // still attached: keep it so
  if (g_device.sub == nullptr && !g_collector.diag.no_callbacks) {
    CUptiResult r = cuptiSubscribe(&g_device.sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr);
    if (r != CUPTI_SUCCESS) {
      g_device.sub = nullptr;
      return cupti_err("cuptiSubscribe", r);
    }
    struct { CUpti_CallbackDomain d; int n; } doms[] = {{CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE},
                                                         {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE}};
    for (auto& dm : doms)
      for (int cbid = 1; cbid < dm.n && !(g_collector.diag.no_driver && dm.d == CUPTI_CB_DOMAIN_DRIVER_API); ++cbid) {
        const char* nm = nullptr;
        if (cuptiGetCallbackName(dm.d, CUpti_CallbackId(cbid), &nm) != CUPTI_SUCCESS) continue;
        bool launch = wanted(dm.d, nm);
        bool sync = dm.d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < kMaxRuntimeCbid && is_sync(nm) && !g_collector.diag.no_waits;
        if (dm.d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < kMaxRuntimeCbid) {
          g_device.launch_cbid[cbid] = launch;
          g_device.sync_cbid[cbid] = sync;
        }
        if (g_collector.diag.no_cbids || (g_collector.diag.no_graph_cb && graph_launch_cbid(dm.d, CUpti_CallbackId(cbid))))
          continue;
        if (launch || sync) cuptiEnableCallback(1, g_device.sub, dm.d, CUpti_CallbackId(cbid));
      }
  }
  g_device.on.store(true);
  {
    // CUPTI's clock against the steady clock, for laying host samples over GPU intervals: the
    // closest pair of three reads.
    int64_t best = INT64_MAX;
    for (int i = 0; i < 3; ++i) {
      int64_t a = steady_ns();
      uint64_t c = 0;
      cuptiGetTimestamp(&c);
      int64_t b = steady_ns();
      if (b - a < best) {
        best = b - a;
        g_device.cupti_offset = int64_t(c) - (a + (b - a) / 2);
      }
    }
  }
  if (g_collector.diag.no_activities) return "";
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) return cupti_err("cuptiActivityRegisterCallbacks", r);
  if (g_collector.diag.no_kinds) return "";
#if defined(DLPT_GRAPH_T)
  const char* mode = std::getenv("DLPT_GRAPH_TRACE");
  g_device.graph_level = mode != nullptr && std::string(mode) == "graph";
  if (g_device.graph_level) {
    {
      std::lock_guard<std::mutex> lk(g_device.leaf_mu);
      g_device.untraced_name = name_idx("CUDA graph replay (no replay of it traced per kernel)");
    }
    if (!graph_trace(true)) g_device.graph_level = false;  // then per kernel, as CUPTI does by default
  }
#endif
  pcs_on(g_device.sub);
  for (auto k : kKinds) {
    if (g_collector.diag.graph_only) break;
    if (k == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && g_collector.diag.no_kernels) continue;
    r = cuptiActivityEnable(k);
    if (r != CUPTI_SUCCESS && k != CUPTI_ACTIVITY_KIND_MEMCPY2) return cupti_err("cuptiActivityEnable", r);
  }
  return "";
}

// Forced: also the buffers still being filled (at the end); otherwise only full ones, which
// costs the program nothing while it runs (snapshots).
void device_flush(bool forced) { cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0); }

void device_off() {
  std::lock_guard<std::mutex> lk(g_device.cupti_mu);
  if (!g_device.on.exchange(false)) return;
  pcs_off();
  device_flush(true);
  for (auto k : kKinds) cuptiActivityDisable(k);
  if (g_device.graph_level) graph_trace(false);
  g_device.graph_restore.store(false);
  device_flush(true);
  if (g_device.graph_level) {
    std::lock_guard<std::mutex> lk2(g_device.leaf_mu);
    graphs_resolve_locked(true);  // a graph replayed once: its records as they are
  }
  if (g_device.sub != nullptr) g_device.detach.store(true);  // at the next CUDA call's exit (see on_api)
}

// A snapshot's flush of the buffers filled so far, unless switched off meanwhile.
void device_flush_if_on(bool forced) {
  std::lock_guard<std::mutex> lk(g_device.cupti_mu);
  if (!g_device.on.load()) return;
  if (g_pcs.wanted) pcs_drain_all();
  device_flush(forced);
}
#endif  // DLPT_CUPTI

}  // namespace
