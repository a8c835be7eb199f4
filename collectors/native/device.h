// dlpt collector: the device side, CUPTI callbacks and activity buffers.
// Compiled only with DLPT_CUPTI; the op callback's state (trie.h, frames.h) is used here.
// Part of collector.cpp (one translation unit): included there, in this order.
#pragma once

namespace {

// ----- device side: CUPTI -----

// host.h (included after this file): GPU busy intervals and sync time.
void busy_add(int64_t device, int64_t start, int64_t end, int64_t launched);
void sync_enter(ThreadState& ts, int64_t node);
void sync_exit(ThreadState& ts);
void collective_kernel_log(int64_t node, int64_t start, int64_t end);

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
std::mutex g_leaf_mu;
std::vector<Leaf> g_leaves;
std::unordered_map<LeafKey, int64_t, LeafKeyHash> g_leaf_idx;
// CUPTI's names are stable per kernel: (name index, whether it is a collective's, NCCL's or RCCL's)
std::unordered_map<const char*, std::pair<int64_t, bool>> g_kernel_name_cache;
std::atomic<int64_t> g_records{0}, g_unlinked{0};
int64_t g_no_launch_node = -1;
double g_buffer_rate = 1.0;  // ns per tick, taken once per activity buffer (buffer_completed)

void add_leaf_locked(int64_t node, int32_t kind, int64_t name, int64_t dur, int64_t bytes, int64_t device,
                     int64_t stream) {
  LeafKey k{node, name, kind};
  auto it = g_leaf_idx.find(k);
  if (it == g_leaf_idx.end()) {
    g_leaf_idx.emplace(k, int64_t(g_leaves.size()));
    g_leaves.push_back(Leaf{node, name, 1, dur, dur, dur, bytes, device, stream, kind});
    return;
  }
  Leaf& l = g_leaves[it->second];
  l.count += 1;
  l.total += dur;
  if (dur < l.minv) l.minv = dur;
  if (dur > l.maxv) l.maxv = dur;
  l.bytes += bytes;
}

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
CorrSlot* g_corr = nullptr;

void corr_put(uint64_t corr, int64_t node, int64_t tick) {
  CorrSlot& s = g_corr[corr & (kCorrSize - 1)];
  s.corr.store(0, std::memory_order_relaxed);
  s.node.store(node, std::memory_order_relaxed);
  s.tick.store(tick, std::memory_order_relaxed);
  s.corr.store(corr, std::memory_order_release);
}

// The launch call returned: its work is queued from `tick` on.
void corr_launched(uint64_t corr, int64_t tick) {
  CorrSlot& s = g_corr[corr & (kCorrSize - 1)];
  if (s.corr.load(std::memory_order_acquire) == corr) s.tick.store(tick, std::memory_order_relaxed);
}

int64_t corr_get(uint64_t corr, int64_t* tick = nullptr) {
  CorrSlot& s = g_corr[corr & (kCorrSize - 1)];
  if (s.corr.load(std::memory_order_acquire) != corr) return -1;
  if (tick != nullptr) *tick = s.tick.load(std::memory_order_relaxed);
  return s.node.load(std::memory_order_relaxed);
}

#if defined(DLPT_CUPTI)
CUpti_SubscriberHandle g_sub = nullptr;
std::atomic<bool> g_device_on{false};
std::string g_cupti_error;
int64_t g_cupti_offset = 0;  // CUPTI's timestamp minus steady_ns() (device_on)

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

// Switching off leaves CUPTI attached to the process: with every activity kind disabled and no
// callback wanted, CUDA calls still pay for it (measured: the steps after a `--steps` window ran
// 9-27% slower than before it). So switching off ends in cuptiFinalize(), which detaches CUPTI;
// NVIDIA's cupti_finalize sample calls it at the exit site of a CUDA API callback, where no
// other CUPTI call of this thread is in flight: the next launch's exit does it here. The mutex
// keeps it from overlapping dlpt's own CUPTI calls (a snapshot's flush, switching on again);
// the callback only tries it, so a launch never waits. Any later CUPTI call attaches again.
std::mutex g_cupti_mu;
std::atomic<bool> g_detach{false};

void detach_here() {
  std::unique_lock<std::mutex> lk(g_cupti_mu, std::try_to_lock);
  if (!lk.owns_lock() || !g_detach.exchange(false)) return;
  cuptiFinalize();
  g_sub = nullptr;  // finalizing ends every subscription
}

// Runtime-API calls that block the host until the GPU catches up (host.h: sync time), by
// callback id; filled when CUPTI is switched on.
constexpr int kMaxRuntimeCbid = 1 << 12;
bool g_sync_cbid[kMaxRuntimeCbid] = {};
bool g_launch_cbid[kMaxRuntimeCbid] = {};

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  auto* cb = static_cast<const CUpti_CallbackData*>(data);
  bool sync = domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUpti_CallbackId(kMaxRuntimeCbid) && g_sync_cbid[cbid];
  bool launch = domain != CUPTI_CB_DOMAIN_RUNTIME_API || cbid >= CUpti_CallbackId(kMaxRuntimeCbid) || g_launch_cbid[cbid];
  if (cb->callbackSite != CUPTI_API_ENTER) {
    if (sync) sync_exit(tstate());
    // The work is queued once the launch call returns (its time before that is the host's).
    else if (launch && g_device_on.load(std::memory_order_relaxed)) corr_launched(cb->correlationId, ticks());
    if (g_detach.load(std::memory_order_relaxed)) detach_here();
    return;
  }
  if (!g_device_on.load(std::memory_order_relaxed)) return;
  // Before this thread's state is read: the program's first GPU work starts the phase it belongs to.
  if (launch && g_phase_auto.load(std::memory_order_relaxed)) phase_first_launch();
  ThreadState& ts = tstate();
  int64_t node = launch_node(ts);
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
  *launched = tick != 0 ? g_ns0 + int64_t(double(tick - g_tick0) * g_buffer_rate) + g_cupti_offset : 0;
  if (n >= 0) return n;
  g_unlinked.fetch_add(1, std::memory_order_relaxed);
  if (g_no_launch_node < 0) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_no_launch_node = intern_node_locked(0, N_UNATTR, intern_name_locked("no launch record"), 0);
  }
  return g_no_launch_node;
}

int64_t name_idx(const std::string& s) {
  std::lock_guard<std::mutex> lk(g_mu);
  return intern_name_locked(s);
}

template <typename Copy>
void add_copy(const Copy* m) {
  auto cn = copy_name(m->copyKind, m->srcKind, m->dstKind);
  int64_t launched;
  int64_t node = record_node(m->correlationId, &launched);
  add_leaf_locked(node, cn.second, name_idx(cn.first), int64_t(m->end - m->start), int64_t(m->bytes), m->deviceId,
                  m->streamId);
  busy_add(m->deviceId, int64_t(m->start), int64_t(m->end), launched);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  g_buffer_rate = ns_per_tick();  // launch times are in ticks: one conversion rate per buffer
  std::lock_guard<std::mutex> lk(g_leaf_mu);
  while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<DLPT_KERNEL_T*>(rec);
        int64_t name;
        bool coll;
        const char* kn = k->name;  // a packed struct's field: copied, not bound
        auto it = g_kernel_name_cache.find(kn);
        if (it != g_kernel_name_cache.end()) {
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
          g_kernel_name_cache.emplace(kn, std::make_pair(name, coll));
        }
        int64_t launched;
        int64_t node = record_node(k->correlationId, &launched);
        add_leaf_locked(node, A_KERNEL, name, int64_t(k->end - k->start), 0, k->deviceId, k->streamId);
        busy_add(k->deviceId, int64_t(k->start), int64_t(k->end), launched);
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
        add_leaf_locked(node, A_MEMSET, name_idx(nm), int64_t(m->end - m->start), int64_t(m->bytes), m->deviceId,
                        m->streamId);
        busy_add(m->deviceId, int64_t(m->start), int64_t(m->end), launched);
        break;
      }
      default:
        break;
    }
    g_records.fetch_add(1, std::memory_order_relaxed);
  }
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
  std::lock_guard<std::mutex> lk(g_cupti_mu);
  g_detach.store(false);  // still attached: keep it so
  if (g_sub == nullptr && !g_diag_no_callbacks) {
    CUptiResult r = cuptiSubscribe(&g_sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr);
    if (r != CUPTI_SUCCESS) {
      g_sub = nullptr;
      return cupti_err("cuptiSubscribe", r);
    }
    struct { CUpti_CallbackDomain d; int n; } doms[] = {{CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE},
                                                         {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE}};
    for (auto& dm : doms)
      for (int cbid = 1; cbid < dm.n && !(g_diag_no_driver && dm.d == CUPTI_CB_DOMAIN_DRIVER_API); ++cbid) {
        const char* nm = nullptr;
        if (cuptiGetCallbackName(dm.d, CUpti_CallbackId(cbid), &nm) != CUPTI_SUCCESS) continue;
        bool launch = wanted(dm.d, nm);
        bool sync = dm.d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < kMaxRuntimeCbid && is_sync(nm) && !g_diag_no_waits;
        if (dm.d == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < kMaxRuntimeCbid) {
          g_launch_cbid[cbid] = launch;
          g_sync_cbid[cbid] = sync;
        }
        if (launch || sync) cuptiEnableCallback(1, g_sub, dm.d, CUpti_CallbackId(cbid));
      }
  }
  g_device_on.store(true);
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
        g_cupti_offset = int64_t(c) - (a + (b - a) / 2);
      }
    }
  }
  if (g_diag_no_activities) return "";
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) return cupti_err("cuptiActivityRegisterCallbacks", r);
  for (auto k : kKinds) {
    r = cuptiActivityEnable(k);
    if (r != CUPTI_SUCCESS && k != CUPTI_ACTIVITY_KIND_MEMCPY2) return cupti_err("cuptiActivityEnable", r);
  }
  return "";
}

// Forced: also the buffers still being filled (at the end); otherwise only full ones, which
// costs the program nothing while it runs (snapshots).
void device_flush(bool forced) { cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0); }

void device_off() {
  std::lock_guard<std::mutex> lk(g_cupti_mu);
  if (!g_device_on.exchange(false)) return;
  device_flush(true);
  for (auto k : kKinds) cuptiActivityDisable(k);
  device_flush(true);
  if (g_sub != nullptr) g_detach.store(true);  // at the next CUDA call's exit (see on_api)
}

// A snapshot's flush of the buffers filled so far, unless switched off meanwhile.
void device_flush_if_on(bool forced) {
  std::lock_guard<std::mutex> lk(g_cupti_mu);
  if (g_device_on.load()) device_flush(forced);
}
#endif  // DLPT_CUPTI

}  // namespace
