// dlpt collector: why the GPU waits — host time by line (a sampler), host time blocked in CUDA
// synchronisation (sync time), and the GPU's busy intervals that make its idle time.
// Part of collector.cpp (one translation unit): included there after autograd.h, before device.h.
//
// Host time. The op callback sees the program only when it calls torch; a pure-Python loop, a
// `time.sleep` or a data loader's wait never reach it. So a sampler thread wakes every
// `period` (1 ms by default, pyinstrument's interval) and reads every Python thread's frames,
// innermost first, into the same trie the ops use: the time since its last wake goes to each
// thread's innermost frame. It takes the GIL to read other threads' frames (the safe way: a
// frame changes only while its thread holds the GIL). Torch's bindings release the GIL around
// every op and every synchronisation, so a program that launches work is read on time; a
// thread that runs pure Python hands the GIL over within the switch interval (5 ms), so its
// samples come that often and each carries the time that passed. The recording's main thread is
// sampled by its own op callback where it enters ops (see host_self_sample). Measured:
// docs/BENCHMARKS.md.
//
// Idle blame needs to know what the host did *when*: each thread's samples are kept as
// run-length intervals (start, end, node, thread, in-sync), which dlpt/idle.py lays over the GPU's
// idle gaps. Intervals are kept only while CUPTI records (no GPU, no idle to blame); a thread
// that stays on one line (a sleep, a long sync) costs one interval however long it stays.
//
// Sync time is exact, not sampled: CUPTI's runtime-API callbacks bracket each blocking call
// (cudaStreamSynchronize behind `.item()`/`.cpu()`/`.tolist()`, cudaDeviceSynchronize,
// cudaEventSynchronize, synchronous cudaMemcpy) and its duration goes to the node a launch from
// that thread would get: the op under the blocking line.
#pragma once

#include <condition_variable>
#include <thread>
#include <unordered_set>

namespace {

struct HostInterval {
  int64_t start, end, node, tid, sync;
};

struct HostRun {  // a thread's current interval
  int64_t node = -1, start = 0, sync = 0;
};

std::mutex g_host_mu;  // guards everything below that the sampler, callbacks and snapshot share
std::unordered_map<int64_t, int64_t> g_host_ns;  // node → host time (ns)
std::unordered_map<int64_t, int64_t> g_sync_ns;  // node → sync time (ns)
std::vector<HostInterval> g_intervals;
std::unordered_map<int64_t, HostRun> g_runs;  // thread id → its open interval
std::unordered_set<int64_t> g_ignored_tids;   // dlpt's own Python threads (the snapshot writer)
std::atomic<int64_t> g_samples{0}, g_sample_waits{0}, g_self_samples{0};
int64_t g_window_start = 0, g_window_end = 0;  // steady clock (ns)
std::atomic<bool> g_window_open{false};
bool g_keep_intervals = false;

// GPU busy intervals per device (CUPTI's clock), appended by the activity buffers and merged
// in place now and then, so they cost the size of their union, not one entry per kernel.
struct Busy {
  std::vector<std::pair<int64_t, int64_t>> iv;
  size_t merged = 0;  // iv[0, merged) is sorted and disjoint
};
std::unordered_map<int64_t, Busy> g_busy;  // under g_leaf_mu (device.h) with the leaves
// When the GPU had work queued: from each kernel's, copy's and memset's launch (the host's call)
// to its start. Idle inside these is not the host's doing — launch latency, a graph replay's
// nodes one after another, a profiler's records — and dlpt/idle.py keeps it apart. Merged like busy.
std::unordered_map<int64_t, Busy> g_ready;  // under g_leaf_mu

void busy_merge(Busy& b) {
  if (b.merged == b.iv.size()) return;
  std::sort(b.iv.begin(), b.iv.end());
  size_t w = 0;
  for (size_t r = 0; r < b.iv.size(); ++r) {
    if (w > 0 && b.iv[r].first <= b.iv[w - 1].second) {
      if (b.iv[r].second > b.iv[w - 1].second) b.iv[w - 1].second = b.iv[r].second;
    } else {
      b.iv[w++] = b.iv[r];
    }
  }
  b.iv.resize(w);
  b.merged = w;
}

void interval_add(Busy& b, int64_t start, int64_t end) {
  b.iv.emplace_back(start, end);
  if (b.iv.size() >= 2 * b.merged + 65536) busy_merge(b);
}

// Caller holds g_leaf_mu. `launched`: when the host launched it (CUPTI's clock; 0: unknown).
void busy_add(int64_t device, int64_t start, int64_t end, int64_t launched) {
  if (end <= start || g_diag_no_waits) return;
  interval_add(g_busy[device], start, end);
  if (launched > 0 && launched < start) interval_add(g_ready[device], launched, start);
}

// ----- collective calls and kernels (the op callback, collector.cpp; device.h) -----

struct CollCall {
  int64_t node, t0, t1;
};
constexpr size_t kMaxColl = size_t(1) << 20;  // 24 MiB at most; later entries are counted, not kept

struct CollColumns {
  std::vector<int64_t> node, start, end;
  int64_t dropped = 0;
};

// One log of collective entries: few (a step's buckets), and each one's start is what tells
// which rank the others wait for (dlpt/commwait.py), so they are kept one by one. Its own mutex:
// the activity thread holds g_leaf_mu when it logs a kernel.
struct CollLog {
  std::mutex mu;
  std::vector<CollCall> calls;
  int64_t dropped = 0;

  void add(int64_t node, int64_t t0, int64_t t1) {
    std::lock_guard<std::mutex> lk(mu);
    if (calls.size() < kMaxColl) calls.push_back(CollCall{node, t0, t1});
    else ++dropped;
  }
  void clear() {
    std::lock_guard<std::mutex> lk(mu);
    calls.clear();
    dropped = 0;
  }
  // The entries as columns, their times mapped into the steady clock by `to_ns`.
  template <typename F>
  CollColumns columns(F to_ns) {
    std::lock_guard<std::mutex> lk(mu);
    CollColumns out;
    for (const CollCall& c : calls) {
      out.node.push_back(c.node);
      out.start.push_back(to_ns(c.t0));
      out.end.push_back(to_ns(c.t1));
    }
    out.dropped = dropped;
    return out;
  }
};

// Collective ops' calls (`c10d::…`), in TSC ticks.
CollLog g_coll;
// Collective kernels (NCCL's, device.h), in CUPTI's clock: where RecordFunction is off (the
// backward pass of a GPU recording, where DDP's buckets are all-reduced) their ops are not seen,
// and on the GPU a kernel's start is the rank's arrival, better than the host's call.
CollLog g_coll_k;

void collective_log(int64_t node, int64_t t0, int64_t t1) { g_coll.add(node, t0, t1); }
void collective_kernel_log(int64_t node, int64_t start, int64_t end) { g_coll_k.add(node, start, end); }

// ----- sync time (CUPTI runtime-API callbacks, device.h) -----

void sync_enter(ThreadState& ts, int64_t node) {
  ts.sync_node = node;
  ts.sync_t0 = steady_ns();
  ts.in_sync.store(1, std::memory_order_relaxed);
}

void sync_exit(ThreadState& ts) {
  if (ts.in_sync.load(std::memory_order_relaxed) == 0) return;
  int64_t dur = steady_ns() - ts.sync_t0;
  ts.in_sync.store(0, std::memory_order_relaxed);
  if (ts.sync_node < 0 || ts.epoch != g_epoch.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lk(g_host_mu);
  g_sync_ns[ts.sync_node] += dur;
}

// ----- the sampler -----

std::thread* g_sampler = nullptr;
std::mutex g_sampler_mu;
std::condition_variable g_sampler_cv;
bool g_sampler_stop = false;
int64_t g_sample_period_ns = 1000000;
ThreadState* g_sampler_ts = nullptr;  // the sampler's own frame caches (not a thread of the program)

// The ThreadState of the program thread with this PyThreadState, if it ever entered an op.
ThreadState* state_of(PyThreadState* t) {
  std::lock_guard<std::mutex> lk(g_threads_mu);
  for (ThreadState* s : g_threads)
    if (s->py == t) return s;
  return nullptr;
}

// Thread `t`'s innermost frame as a trie node (the GIL is held). Its base: the main thread's
// root, the [thread] node of a thread dlpt saw start (its outermost `cut` frames are dlpt's
// wrapper), else a root of its own; -1 for a thread with no Python frames.
int64_t sample_node(PyThreadState* t, ThreadState* owner, int64_t tid) {
  ThreadState& s = *g_sampler_ts;
  read_frames(s, t);
  int64_t base, cut = 0;
  uint64_t epoch = g_epoch.load(std::memory_order_relaxed);
  int64_t phase = g_phase_node.load(std::memory_order_acquire);
  base = -1;
  if (t == g_main_tstate) {
    base = phase;
  } else if (owner != nullptr && owner->epoch == epoch && owner->base >= 0) {
    // A base from an earlier phase (the thread has entered no op since the change) is derived
    // again for this one, as the thread itself will do (trie.h, tstate).
    base = owner->phase_gen == g_phase_gen.load(std::memory_order_acquire) ? owner->base : base_in_phase(owner->base);
    cut = owner->cut;
  }
  if (base < 0) {
    base = intern_node(phase, N_TID, tid, 0);
    cut = 0;
  }
  int64_t n = int64_t(s.walk.size()) - cut;
  if (n <= 0) return -1;
  int64_t node = base;
  for (int64_t i = n - 1; i >= 0; --i) node = frame_node(s, node, s.walk[size_t(i)].first, s.walk[size_t(i)].second);
  return node;
}

int64_t thread_id_of(PyThreadState* t) {
#if PY_VERSION_HEX >= 0x03080000 && defined(PY_HAVE_THREAD_NATIVE_ID)
  return int64_t(t->native_thread_id);
#else
  return int64_t(t->thread_id);
#endif
}

// One sample of thread `tid`: `dt` of host time to `node`, and its run-length interval (a new one
// where the node or the sync state changed). The caller holds g_host_mu.
void add_sample(int64_t tid, int64_t node, int64_t sync, int64_t now, int64_t dt) {
  g_host_ns[node] += dt;
  HostRun& r = g_runs[tid];
  if (r.node == node && r.sync == sync) return;
  if (r.node >= 0 && g_keep_intervals) g_intervals.push_back(HostInterval{r.start, now - dt, r.node, tid, r.sync});
  r.node = node;
  r.sync = sync;
  r.start = now - dt;
}

// The recording's main thread samples itself. Taking the GIL from the sampler thread costs the
// program more than the sample: the main thread, back from an op (torch releases the GIL around
// each), waits for the sampler to finish and to hand the GIL back, a thread wake-up each time —
// measured: 2–4% of a launch-bound eager decode on the CPU (docs/BENCHMARKS.md). But the op
// callback already knows where the main thread is at each op it enters: the Python context it
// reads for the op (the same node the sampler's walk would give). So a top-level op entered on
// the main thread once its sample is due (a period after the last) is its sample: the time
// since the last one goes to that line, no GIL, no frame walk of its own. Where the main thread
// enters no op for a period (pure Python, a sleep, a synchronisation, a long C call) the sampler
// reads it with the GIL as before, at every tick, with its sync state, and every other thread
// with it. (Asking the main thread
// with Py_AddPendingCall was tried: on 3.11 and 3.12 a call added from another thread does not
// raise the eval breaker, so a pure-Python stretch went unsampled until its end.) While the
// main thread samples itself, other threads are read with the GIL every tick while one of them
// launches GPU work (idle blame lays their intervals over the GPU's gaps), every `kOtherTicks`
// ticks while there are others (a data loader's pin-memory thread, a progress bar's monitor:
// py-spy reads at 100 Hz), else every `kScanTicks` ticks to find new ones. DLPT_DIAG=samplergil reads every thread with the GIL at
// every tick (the sampler before this; the comparison).
constexpr int64_t kOtherTicks = 4;
constexpr int64_t kScanTicks = 16;
std::atomic<bool> g_self_ok{false};        // the op callback samples the main thread
std::atomic<int64_t> g_self_due{INT64_MAX};  // the tick count from which its next sample is due
std::atomic<int64_t> g_period_ticks{0};      // the period in ticks (set by the sampler once it can tell)
std::atomic<bool> g_others_seen{true};     // the last read found program threads besides the main one
std::atomic<bool> g_others_launch{false};  // ... and one of them had launched GPU work
int64_t g_main_last = 0;    // the main thread's last sample (steady ns), under g_host_mu
int64_t g_others_last = 0;  // the other threads' last read, likewise
int64_t g_main_tid = 0;

// From the op callback (collector.cpp), at a top-level op with its Python context `node`.
void host_self_sample(const ThreadState& ts, int64_t node, int64_t t0) {
  if (t0 < g_self_due.load(std::memory_order_relaxed) || ts.py != g_main_tstate || node < 0) return;
  g_self_due.store(t0 + g_period_ticks.load(std::memory_order_relaxed), std::memory_order_relaxed);
  int64_t now = steady_ns();
  std::lock_guard<std::mutex> lk(g_host_mu);
  if (!g_window_open.load()) return;
  add_sample(g_main_tid, node, 0, now, now - g_main_last);
  g_main_last = now;
  g_self_samples.fetch_add(1, std::memory_order_relaxed);
}

// Reads threads with the GIL held: the main thread where `main`, the others where `others`
// (never the sampler itself). Each sample carries the time since that thread's last read; a
// thread seen for the first time gets at most one period.
void sample_threads(PyThreadState* self, int64_t now, bool main, bool others) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> seen;  // (tid, node, sync)
  bool any = false, launching = false;
  uint64_t epoch = g_epoch.load();
  for (PyThreadState* t = PyInterpreterState_ThreadHead(self->interp); t != nullptr; t = PyThreadState_Next(t)) {
    bool is_main = t == g_main_tstate;
    if (t == self || (is_main ? !main : !others)) continue;
    int64_t tid = thread_id_of(t);
    ThreadState* owner = state_of(t);
    {
      std::lock_guard<std::mutex> lk(g_host_mu);
      if (g_ignored_tids.count(tid)) continue;
    }
    int64_t node = sample_node(t, owner, tid);
    if (node < 0) continue;
    if (!is_main) {
      any = true;
      if (owner != nullptr && owner->epoch == epoch && owner->launched.load(std::memory_order_relaxed)) launching = true;
    }
    int64_t sync = owner != nullptr ? owner->in_sync.load(std::memory_order_relaxed) : 0;
    seen.emplace_back(tid, node, sync);
  }
  if (others) {
    g_others_seen.store(any);
    g_others_launch.store(launching);
  }
  std::lock_guard<std::mutex> lk(g_host_mu);
  if (!g_window_open.load()) return;
  for (auto& [tid, node, sync] : seen) {
    int64_t d = now - (tid == g_main_tid ? g_main_last : g_others_last);
    if (tid != g_main_tid && !g_runs.count(tid)) d = std::min(d, g_sample_period_ns);
    add_sample(tid, node, sync, now, d);
  }
  if (main) g_main_last = now;
  if (others) g_others_last = now;
}

void sampler_loop() {
  PyGILState_STATE g = PyGILState_Ensure();  // this thread's own PyThreadState, for its life
  PyThreadState* self = PyThreadState_Get();
  PyThreadState* saved = PyEval_SaveThread();
  int64_t last = steady_ns(), tick = 0;
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    next += std::chrono::nanoseconds(g_sample_period_ns);
    {
      std::unique_lock<std::mutex> lk(g_sampler_mu);
      if (g_sampler_cv.wait_until(lk, next, [] { return g_sampler_stop; })) break;
    }
    auto woke = std::chrono::steady_clock::now();
    if (woke > next + std::chrono::nanoseconds(g_sample_period_ns)) next = woke;  // fell behind: no catch-up burst
    int64_t now = steady_ns(), prev = last;
    if (now - last > 2 * g_sample_period_ns) g_sample_waits.fetch_add(1, std::memory_order_relaxed);
    last = now;
    bool main = true, others = true;
    if (g_self_ok.load()) {
      if (g_period_ticks.load() == 0) {  // a period has passed since the start: the tick rate is known
        // 0.9 of a period: an op-heavy main thread then samples itself within nearly every tick.
        g_period_ticks.store(std::max<int64_t>(1, int64_t(0.9 * double(g_sample_period_ns) / ns_per_tick())));
        g_self_due.store(ticks());
      }
      {
        std::lock_guard<std::mutex> lk(g_host_mu);
        main = g_main_last <= prev;  // not sampled by its op callback since the last tick
      }
      ++tick;
      // A read that takes the GIL for the main thread reads the others too: it costs no more.
      others = main || tick % kScanTicks == 0 || g_others_launch.load() ||
               (g_others_seen.load() && tick % kOtherTicks == 0);
      if (!others) continue;
    }
    PyEval_RestoreThread(saved);
    if (!g_sampler_stop) {
      sample_threads(self, steady_ns(), main, others);
      g_samples.fetch_add(1, std::memory_order_relaxed);
    }
    saved = PyEval_SaveThread();
  }
  PyEval_RestoreThread(saved);
  PyGILState_Release(g);
}

// From start(), with the GIL held (g_main_tstate set): a fresh window, and the sampler unless
// period is 0.
void host_start(int64_t period_ns, bool keep_intervals) {
  bool self_ok = !g_diag_sampler_gil && g_main_tstate != nullptr;
  {
    std::lock_guard<std::mutex> lk(g_host_mu);
    g_host_ns.clear();
    g_sync_ns.clear();
    g_intervals.clear();
    g_runs.clear();
    g_keep_intervals = keep_intervals;
    g_window_start = steady_ns();
    g_window_end = 0;
    g_window_open.store(true);
    g_main_last = g_others_last = g_window_start;
    g_main_tid = g_main_tstate != nullptr ? thread_id_of(g_main_tstate) : 0;
  }
  g_self_due.store(INT64_MAX);  // until the sampler knows the tick rate
  g_period_ticks.store(0);
  g_self_ok.store(self_ok);
  g_others_seen.store(true);
  g_others_launch.store(false);
  {
    std::lock_guard<std::mutex> lk(g_leaf_mu);
    g_busy.clear();
    g_ready.clear();
  }
  g_coll.clear();
  g_coll_k.clear();
  g_samples.store(0);
  g_sample_waits.store(0);
  g_self_samples.store(0);
  if (g_sampler_ts == nullptr) g_sampler_ts = new ThreadState();
  g_sampler_ts->frames.clear();  // its caches name nodes of the last recording's trie
  g_sampler_ts->epoch = g_epoch.load();
  if (period_ns <= 0 || g_sampler != nullptr) return;
  g_sample_period_ns = period_ns;
  g_sampler_stop = false;
  g_sampler = new std::thread(sampler_loop);
}

// From stop(), without the GIL (the sampler may be waiting for it).
void host_stop() {
  if (g_sampler != nullptr) {
    {
      std::lock_guard<std::mutex> lk(g_sampler_mu);
      g_sampler_stop = true;
    }
    g_sampler_cv.notify_all();
    g_sampler->join();
    delete g_sampler;
    g_sampler = nullptr;
  }
  std::lock_guard<std::mutex> lk(g_host_mu);
  if (g_window_open.exchange(false)) g_window_end = steady_ns();
}

void ignore_this_thread() {
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return;
  std::lock_guard<std::mutex> lk(g_host_mu);
  g_ignored_tids.insert(thread_id_of(t));
}

}  // namespace
