// dlpt collector: why the GPU waits — host time by line (a sampler), host time blocked in CUDA
// synchronisation (sync time), and the GPU's busy intervals that make its idle time.
// Host time. The op callback sees the program only when it calls torch; a pure-Python loop, a
// `time.sleep` or a data loader's wait never reach it. So a sampler thread wakes every `period`
// (1 ms by default, pyinstrument's interval; jittered ±25% so that a loop of a period's multiple
// does not alias) and reads where each Python thread is, innermost frame first, into the same
// trie the ops use: the time since a thread's last sample goes to the line it runs at the tick.
// The recording's main thread is read at every tick *without* the GIL: its frame chain copied
// with process_vm_readv (peek.h), so the tick sees the line that runs at the tick. (A read that
// waits for the GIL sees the line that runs when the main thread lets go of it — at its next op,
// or at the switch interval (5 ms) in pure Python — and put each stretch's time on the line after
// it; reading the main thread from its own op callback put the time before an op on the op.)
// Other threads are read with the GIL (the safe way: a frame changes only while its thread holds
// the GIL), by a second thread, the GIL worker, so that the main thread's ticks never wait for
// it; torch releases the GIL around every op and synchronisation, and a thread that runs pure
// Python hands it over within the switch interval. Builds without the internal frame API read
// every thread with the GIL. Measured: docs/BENCHMARKS.md.
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

#include "common.h"  // first: Python.h before any other header

#include <condition_variable>
#include <thread>
#include <unordered_set>

#include "device.h"  // the leaves' lock, which the busy intervals share
#include "frames.h"
#include "peek.h"
#include "trie.h"

namespace {

struct HostInterval {
  int64_t start, end, node, tid, sync;
};

struct HostRun {  // a thread's current interval
  int64_t node = -1, start = 0, sync = 0;
};

// GPU busy intervals per device (CUPTI's clock), appended by the activity buffers and merged
// in place now and then, so they cost the size of their union, not one entry per kernel.
struct Busy {
  std::vector<std::pair<int64_t, int64_t>> iv;
  size_t merged = 0;  // iv[0, merged) is sorted and disjoint
};

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
// the activity thread holds g_device.leaf_mu when it logs a kernel.
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

// A code the sampler found the main thread running and could not place: its pointer, its frame's
// globals and the code of the frame that called it (interned), as the copy had them.
struct UnknownCode {
  PyObject *code, *globals, *caller;
};

// The host side's state: host and sync time and their intervals, the GPU's busy and queued
// intervals, collective calls, and the sampler's threads and caches (the one instance, g_host,
// is at static storage).
struct HostState {
  std::mutex mu;  // guards what the sampler, callbacks and snapshot share: from here to keep_intervals
  std::unordered_map<int64_t, int64_t> host_ns;  // node → host time (ns)
  std::unordered_map<int64_t, int64_t> sync_ns;  // node → sync time (ns)
  std::vector<HostInterval> intervals;
  std::unordered_map<int64_t, HostRun> runs;  // thread id → its open interval
  std::unordered_set<int64_t> ignored_tids;   // dlpt's own Python threads (the snapshot writer)
  std::atomic<int64_t> samples{0}, sample_waits{0};
  int64_t window_start = 0, window_end = 0;  // steady clock (ns)
  std::atomic<bool> window_open{false};
  bool keep_intervals = false;

  // GPU busy intervals (Busy, above).
  std::unordered_map<int64_t, Busy> busy;  // under g_device.leaf_mu (device.h) with the leaves
  // When the GPU had work queued: from each kernel's, copy's and memset's launch (the host's call)
  // to its start. Idle inside these is not the host's doing — launch latency, a graph replay's
  // nodes one after another, a profiler's records — and dlpt/idle.py keeps it apart. Merged like busy.
  std::unordered_map<int64_t, Busy> ready;  // under g_device.leaf_mu

  // Collective ops' calls (`c10d::…`), in TSC ticks.
  CollLog coll;
  // Collective kernels (NCCL's, device.h), in CUPTI's clock: where RecordFunction is off (the
  // backward pass of a GPU recording, where DDP's buckets are all-reduced) their ops are not seen,
  // and on the GPU a kernel's start is the rank's arrival, better than the host's call.
  CollLog coll_k;

  // The sampler (below).
  std::thread* sampler = nullptr;
  std::mutex sampler_mu;
  std::condition_variable sampler_cv;
  bool sampler_stop = false;
  int64_t sample_period_ns = 1000000;
  ThreadState* sampler_ts = nullptr;  // the sampler's own frame caches (not a thread of the program)

  // The main thread's ticks without the GIL and the other threads' reads (see "The recording's
  // main thread is read without the GIL" below), and the GIL worker.
  std::atomic<bool> peek_on{false};       // the main thread is read without the GIL
  std::atomic<bool> main_op{false};       // the main thread entered an op since the last tick
  std::atomic<bool> others_seen{true};     // the last read found program threads besides the main one
  std::atomic<bool> others_launch{false};  // ... and one of them had launched GPU work
  std::atomic<int64_t> peek_samples{0}, peek_skips{0};
  int64_t main_last = 0;    // the main thread's last sample (steady ns), under mu
  int64_t others_last = 0;  // the other threads' last read, likewise
  int64_t main_tid = 0;
  std::thread* gil_worker = nullptr;
  std::condition_variable gil_cv;  // with sampler_mu
  int gil_req = 0;                 // under sampler_mu
  std::vector<UnknownCode> unknown;  // under sampler_mu: for the GIL worker

  // The main thread's ThreadState, once it has one (it has entered an op): its sync state.
  ThreadState* main_state = nullptr;  // the sampler's
  ThreadState* peek_ts = nullptr;     // the sampler's frame caches for peeks
  std::unordered_set<PyObject*> asked;  // the sampler's: unknown codes handed to the GIL worker once
#if defined(DLPT_INTERNAL_FRAMES)
  Peek peek;  // how the main thread's memory is read, and the copy of its stack (peek.h)
  std::vector<_PyInterpreterFrame> peek_copies;  // the sampler's scratch
  std::vector<const void*> peek_at;
#endif
};
HostState g_host;

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

// Caller holds g_device.leaf_mu. `launched`: when the host launched it (CUPTI's clock; 0: unknown).
void busy_add(int64_t device, int64_t start, int64_t end, int64_t launched) {
  if (end <= start || g_collector.diag.no_waits) return;
  interval_add(g_host.busy[device], start, end);
  if (launched > 0 && launched < start) interval_add(g_host.ready[device], launched, start);
}

// ----- collective calls and kernels (the op callback, collector.cpp; device.h) -----

void collective_log(int64_t node, int64_t t0, int64_t t1) { g_host.coll.add(node, t0, t1); }
void collective_kernel_log(int64_t node, int64_t start, int64_t end) { g_host.coll_k.add(node, start, end); }

// ----- sync time (CUPTI runtime-API callbacks, device.h) -----

void sync_enter(ThreadState& ts, int64_t node) {
  ts.sync_node = node;
  ts.sync_t0 = steady_ns();
  ts.sync_edge.store(ts.sync_t0, std::memory_order_relaxed);
  ts.in_sync.store(1, std::memory_order_relaxed);
}

void sync_exit(ThreadState& ts) {
  if (ts.in_sync.load(std::memory_order_relaxed) == 0) return;
  int64_t end = steady_ns(), dur = end - ts.sync_t0;
  ts.sync_edge.store(end, std::memory_order_relaxed);
  ts.in_sync.store(0, std::memory_order_relaxed);
  if (ts.sync_node < 0 || ts.epoch != g_trie.epoch.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lk(g_host.mu);
  g_host.sync_ns[ts.sync_node] += dur;
}

// ----- the sampler -----

// The ThreadState of the program thread with this PyThreadState, if it ever entered an op.
ThreadState* state_of(PyThreadState* t) {
  std::lock_guard<std::mutex> lk(g_trie.threads_mu);
  for (ThreadState* s : g_trie.threads)
    if (s->py == t) return s;
  return nullptr;
}

// Thread `t`'s innermost frame as a trie node (the GIL is held). Its base: the main thread's
// root, the [thread] node of a thread dlpt saw start (its outermost `cut` frames are dlpt's
// wrapper), else a root of its own; -1 for a thread with no Python frames.
int64_t sample_node(PyThreadState* t, ThreadState* owner, int64_t tid) {
  ThreadState& s = *g_host.sampler_ts;
  read_frames(s, t);
  int64_t base, cut = 0;
  uint64_t epoch = g_trie.epoch.load(std::memory_order_relaxed);
  int64_t phase = g_trie.phase_node.load(std::memory_order_acquire);
  base = -1;
  if (t == g_collector.main_tstate) {
    base = phase;
  } else if (owner != nullptr && owner->epoch == epoch && owner->base >= 0) {
    // A base from an earlier phase (the thread has entered no op since the change) is derived
    // again for this one, as the thread itself will do (trie.h, tstate).
    base = owner->phase_gen == g_trie.phase_gen.load(std::memory_order_acquire) ? owner->base : base_in_phase(owner->base);
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
// where the node or the sync state changed). The caller holds g_host.mu.
// Where the thread changed line (or sync state) since its last sample, the change happened
// somewhere in between: the time up to the midpoint is the last sample's line's, the rest this
// one's — each sample stands for the stretch around it, which is unbiased whatever the phase of
// the ticks. (Giving all of it to this sample's line is unbiased only where both ends of a stretch
// are unknown; after a known end, as below, it would always cost a stretch its tail.)
// `edge`: when the thread last entered or left a CUDA synchronisation (exact: CUPTI's callbacks;
// 0 unknown). Where its sync state changed since the last sample, the change is known: the time up
// to the edge is the last sample's line's, in its state, and the rest this sample's (a stretch
// after a sync would otherwise take the sync's last, GPU-busy moments for its own GPU-idle ones:
// measured, a 4 ms sleep after a synchronize lost 11-12% of its idle).
void add_sample(int64_t tid, int64_t node, int64_t sync, int64_t now, int64_t dt, int64_t edge = 0) {
  HostRun& r = g_host.runs[tid];
  int64_t from = now - dt;
  if (r.node >= 0 && (r.node != node || r.sync != sync)) {
    int64_t cut = r.sync != sync && edge > from && edge < now ? edge : from + dt / 2;
    g_host.host_ns[r.node] += cut - from;
    from = cut;
  }
  g_host.host_ns[node] += now - from;
  if (r.node == node && r.sync == sync) return;
  if (r.node >= 0 && g_host.keep_intervals) g_host.intervals.push_back(HostInterval{r.start, from, r.node, tid, r.sync});
  r.node = node;
  r.sync = sync;
  r.start = from;
}

// The recording's main thread is read without the GIL (peek.h), at every tick: an unbiased
// statistical profiler, each tick's time on what runs at the tick. Taking the GIL from the
// sampler thread gave the main thread's time to the wrong line (the read comes when the main
// thread lets go of the GIL: at its next op, or at the switch interval in pure Python, so a
// stretch's time went to the line after it), and cost a launch-bound loop 2–4% (the main thread,
// back from an op, waits for the sampler to hand the GIL back; docs/BENCHMARKS.md). Where a frame's
// code is not interned yet (no op and no read with the GIL has seen it), the tick's time goes to
// the frames outside it — the line that called it, which is running — and the GIL worker, once
// for each such code, reads the main thread with the GIL (interning what runs then) and looks for
// the code among its caller's constants and its module's functions (intern_unknown), so later
// ticks place it; where no frame at all is known (the recording's first instants, a stack deeper
// than kPeekDepth) the worker's read with the GIL takes the tick, as before. A read that stays torn after its retries
// is a skipped tick (`g_host.peek_skips`): the next one carries its time. Reads of the other threads
// still take the GIL, on a thread of their own (the GIL worker) so that the main thread's ticks
// never wait for it: every tick while one of them launches GPU work (idle blame lays their
// intervals over the GPU's gaps) or while the main thread enters no op (its stretches hand the
// GIL over anyway: a sleep, pure Python), every `kOtherTicks` ticks while there are others (a
// data loader's pin-memory thread, a progress bar's monitor: py-spy reads at 100 Hz), else every
// `kScanTicks` ticks to find new ones. Builds without the internal frame API (the public one),
// or where this process cannot read its own memory, read every thread with the GIL at every
// tick, and so does DLPT_DIAG=samplergil (the comparison). The period is jittered (±25%) so that
// a loop whose iteration is a multiple of it is not always read at the same line.
constexpr int64_t kOtherTicks = 4;
constexpr int64_t kScanTicks = 16;
// From the op callback (collector.cpp), at a top-level op: the main thread runs ops, so the
// other threads need not be read at every tick (see above). A load, and a store once a tick.
void host_op_entered(const ThreadState& ts) {
  if (ts.py == g_collector.main_tstate && !g_host.main_op.load(std::memory_order_relaxed))
    g_host.main_op.store(true, std::memory_order_relaxed);
}

// Reads threads with the GIL held: the main thread where `main`, the others where `others`
// (never the sampler itself). Each sample carries the time since that thread's last read; a
// thread seen for the first time gets at most one period.
void sample_threads(PyThreadState* self, int64_t now, bool main, bool others) {
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> seen;  // (tid, node, sync, sync edge)
  bool any = false, launching = false;
  uint64_t epoch = g_trie.epoch.load();
  for (PyThreadState* t = PyInterpreterState_ThreadHead(self->interp); t != nullptr; t = PyThreadState_Next(t)) {
    bool is_main = t == g_collector.main_tstate;
    if (t == self || (is_main ? !main : !others)) continue;
    int64_t tid = thread_id_of(t);
    ThreadState* owner = state_of(t);
    {
      std::lock_guard<std::mutex> lk(g_host.mu);
      if (g_host.ignored_tids.count(tid)) continue;
    }
    int64_t node = sample_node(t, owner, tid);
    if (node < 0) continue;
    if (!is_main) {
      any = true;
      if (owner != nullptr && owner->epoch == epoch && owner->launched.load(std::memory_order_relaxed)) launching = true;
    }
    int64_t sync = owner != nullptr ? owner->in_sync.load(std::memory_order_relaxed) : 0;
    int64_t edge = owner != nullptr ? owner->sync_edge.load(std::memory_order_relaxed) : 0;
    seen.emplace_back(tid, node, sync, edge);
  }
  if (others) {
    g_host.others_seen.store(any);
    g_host.others_launch.store(launching);
  }
  std::lock_guard<std::mutex> lk(g_host.mu);
  if (!g_host.window_open.load()) return;
  for (auto& [tid, node, sync, edge] : seen) {
    int64_t d = now - (tid == g_host.main_tid ? g_host.main_last : g_host.others_last);
    if (tid != g_host.main_tid && !g_host.runs.count(tid)) d = std::min(d, g_host.sample_period_ns);
    if (d <= 0) continue;  // the main thread's peek (below) sampled it after this read began
    add_sample(tid, node, sync, now, d, edge);
  }
  if (main) g_host.main_last = std::max(g_host.main_last, now);
  if (others) g_host.others_last = now;
}

// ----- the main thread's ticks without the GIL (peek.h), and the GIL worker -----

// What the sampler asks the GIL worker for: the other threads; codes the main thread runs interned
// (a read that places no time); the main thread read with the GIL, its time included.
constexpr int kReqOthers = 1, kReqIntern = 2, kReqMain = 4;
constexpr size_t kMaxUnknown = 64;

void gil_request(int what, const UnknownCode* unknown = nullptr) {
  {
    std::lock_guard<std::mutex> lk(g_host.sampler_mu);
    if (unknown != nullptr && g_host.unknown.size() < kMaxUnknown) g_host.unknown.push_back(*unknown);
    if ((g_host.gil_req | what) == g_host.gil_req) return;  // asked already: it is coming
    g_host.gil_req |= what;
  }
  g_host.gil_cv.notify_one();
}

// With the GIL: whether `want` (a pointer from a copy, never dereferenced) is the code of `obj`,
// a function, a static or class method, a property's getter, or of a function that a function's
// closure holds (a decorator's wrapped function), or of one in a class's dict; `depth` bounds it.
bool holds_code(PyObject* obj, PyObject* want, int depth) {
  if (PyFunction_Check(obj)) {
    if (PyFunction_GET_CODE(obj) == want) return true;
    PyObject* cells = PyFunction_GET_CLOSURE(obj);
    if (depth > 0 && cells != nullptr && PyTuple_Check(cells)) {
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(cells); ++i) {
        PyObject* cell = PyTuple_GET_ITEM(cells, i);
        PyObject* v = PyCell_Check(cell) ? PyCell_GET(cell) : nullptr;
        if (v != nullptr && holds_code(v, want, depth - 1)) return true;
      }
    }
    return false;
  }
  const char* attr = Py_IS_TYPE(obj, &PyStaticMethod_Type) || Py_IS_TYPE(obj, &PyClassMethod_Type) ? "__func__"
                     : Py_IS_TYPE(obj, &PyProperty_Type)                                          ? "fget"
                                                                                                   : nullptr;
  if (attr != nullptr) {  // members of exact built-in types: reading them runs no Python
    PyObject* f = PyObject_GetAttrString(obj, attr);
    if (f == nullptr) {
      PyErr_Clear();
      return false;
    }
    bool found = depth > 0 && holds_code(f, want, depth - 1);
    Py_DECREF(f);
    return found;
  }
  if (depth > 0 && PyType_Check(obj)) {
    PyObject* d = reinterpret_cast<PyTypeObject*>(obj)->tp_dict;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (d != nullptr && PyDict_Next(d, &pos, &k, &v))
      if (holds_code(v, want, depth - 1)) return true;
  }
  return false;
}

// With the GIL: whether `want` is a constant of `code`, or of a code among its constants (nested
// functions, lambdas, comprehensions: they run called from it).
bool consts_hold(PyObject* code, PyObject* want, int depth) {
  PyObject* consts = reinterpret_cast<PyCodeObject*>(code)->co_consts;
  for (Py_ssize_t i = 0; consts != nullptr && i < PyTuple_GET_SIZE(consts); ++i) {
    PyObject* c = PyTuple_GET_ITEM(consts, i);
    if (!PyCode_Check(c)) continue;  // `want` may be any value (a torn copy): only a code is one
    if (c == want || (depth > 0 && consts_hold(c, want, depth - 1))) return true;
  }
  return false;
}

// With the GIL: interns u.code where it can be found alive — a constant of its caller's code, or
// a function (method, decorated function) of the module whose dict its frame had (found among
// sys.modules by that dict's address). A pure-Python function the main thread runs between ops
// is on the stack only briefly, so the read with the GIL (which comes at the next op) seldom
// sees it; found this way, the sampler's later ticks place its lines.
void intern_unknown(const UnknownCode& u) {
  {
    std::lock_guard<std::mutex> lk(g_trie.mu);
    if (g_trie.code_idx.count(u.code) || (u.caller != nullptr && !g_trie.code_idx.count(u.caller))) return;
  }
  bool found = u.caller != nullptr && consts_hold(u.caller, u.code, 3);
  PyObject* modules = found ? nullptr : PyImport_GetModuleDict();
  PyObject *k, *m;
  Py_ssize_t pos = 0;
  while (modules != nullptr && !found && PyDict_Next(modules, &pos, &k, &m)) {
    if (!PyModule_Check(m) || PyModule_GetDict(m) != u.globals) continue;
    PyObject *name, *v;
    Py_ssize_t at = 0;
    while (!found && PyDict_Next(u.globals, &at, &name, &v)) found = holds_code(v, u.code, 2);
    break;
  }
  if (found) intern_code(u.code);
}

// The GIL worker: reads with the GIL whatever the sampler asks for, as it comes; while it waits
// for the GIL (up to the switch interval where the program runs pure Python) the sampler's
// requests pile into one, and the main thread's ticks go on.
void gil_worker_loop() {
  PyGILState_STATE g = PyGILState_Ensure();
  PyThreadState* self = PyThreadState_Get();
  PyThreadState* saved = PyEval_SaveThread();
  std::vector<UnknownCode> unknown;
  for (;;) {
    int req;
    {
      std::unique_lock<std::mutex> lk(g_host.sampler_mu);
      g_host.gil_cv.wait(lk, [] { return g_host.sampler_stop || g_host.gil_req != 0; });
      if (g_host.sampler_stop) break;
      req = g_host.gil_req;
      g_host.gil_req = 0;
      unknown.swap(g_host.unknown);
    }
    PyEval_RestoreThread(saved);
    if (!g_host.sampler_stop) {
      if ((req & kReqIntern) && !(req & kReqMain)) {
        // The main thread's frames with the GIL: their codes interned and their nodes made, so
        // the sampler's next ticks place them; its time stays with the ticks.
        sample_node(g_collector.main_tstate, state_of(g_collector.main_tstate), g_host.main_tid);
      }
      for (const UnknownCode& u : unknown) intern_unknown(u);
      // A read that takes the GIL reads the other threads along: it costs no more.
      sample_threads(self, steady_ns(), (req & kReqMain) != 0, true);
      g_host.samples.fetch_add(1, std::memory_order_relaxed);
    }
    unknown.clear();
    saved = PyEval_SaveThread();
  }
  PyEval_RestoreThread(saved);
  PyGILState_Release(g);
}

// One tick of the main thread without the GIL: the time since its last sample to the line it
// runs now. False where this process cannot read its own memory (the sampler then takes the GIL).
bool peek_main() {
#if defined(DLPT_INTERNAL_FRAMES)
  int64_t now = steady_ns();
  PeekStatus st = peek_frames(g_host.peek, g_collector.main_tstate, g_host.peek_copies, g_host.peek_at);
  if (st == PEEK_UNAVAILABLE) return false;
  if (st == PEEK_TORN) {  // the next tick carries this one's time
    g_host.peek_skips.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (st == PEEK_DEEP) {  // past kPeekDepth: the GIL worker's read takes the tick
    gil_request(kReqMain);
    return true;
  }
  // The main thread's contexts hang from the current phase's node (trie.h); the last walk's
  // nodes are of the phase they were placed in.
  uint64_t gen = g_trie.phase_gen.load(std::memory_order_acquire);
  if (g_host.peek_ts->phase_gen != gen) {
    g_host.peek_ts->phase_gen = gen;
    g_host.peek_ts->forget_walk();
  }
  int64_t base = g_trie.phase_node.load(std::memory_order_acquire);
  PeekPlace p = peek_node(*g_host.peek_ts, g_host.peek_copies, g_host.peek_at, base);
  if (p.torn && peek_frames(g_host.peek, g_collector.main_tstate, g_host.peek_copies, g_host.peek_at) == PEEK_OK)  // once more
    p = peek_node(*g_host.peek_ts, g_host.peek_copies, g_host.peek_at, base);
  if (p.torn) {
    g_host.peek_skips.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (p.unknown != nullptr && p.placed == 0) {  // nothing known to place it on: the GIL worker's read
    gil_request(kReqMain);
    return true;
  }
  if (p.unknown != nullptr && g_host.asked.insert(p.unknown).second) {
    UnknownCode u{p.unknown, p.unknown_globals, p.caller};
    gil_request(kReqIntern, &u);
  }
  if (g_host.main_state == nullptr) g_host.main_state = state_of(g_collector.main_tstate);
  int64_t sync = g_host.main_state != nullptr ? g_host.main_state->in_sync.load(std::memory_order_relaxed) : 0;
  int64_t edge = g_host.main_state != nullptr ? g_host.main_state->sync_edge.load(std::memory_order_relaxed) : 0;
  std::lock_guard<std::mutex> lk(g_host.mu);
  if (!g_host.window_open.load()) return true;
  int64_t d = now - g_host.main_last;
  if (d <= 0) return true;  // a read with the GIL sampled it after this tick began
  if (p.placed > 0) add_sample(g_host.main_tid, p.node, sync, now, d, edge);
  g_host.main_last = now;  // no Python frames (all of them not started): its time is no line's, as with the GIL
  g_host.peek_samples.fetch_add(1, std::memory_order_relaxed);
  return true;
#else
  return false;
#endif
}

// The sampler: wakes every period (jittered), reads the main thread without the GIL where it can
// and asks the GIL worker for the other threads when due (see above); else reads every thread
// with the GIL itself.
void sampler_loop() {
  PyGILState_STATE g = PyGILState_Ensure();  // this thread's own PyThreadState, for its life
  PyThreadState* self = PyThreadState_Get();
  PyThreadState* saved = PyEval_SaveThread();
  int64_t tick = 0;
  uint64_t rng = uint64_t(steady_ns()) | 1;
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;  // xorshift64: a jitter of ±25%
    next += std::chrono::nanoseconds(g_host.sample_period_ns * 3 / 4 + int64_t(rng % uint64_t(g_host.sample_period_ns / 2 + 1)));
    {
      std::unique_lock<std::mutex> lk(g_host.sampler_mu);
      if (g_host.sampler_cv.wait_until(lk, next, [] { return g_host.sampler_stop; })) break;
    }
    auto woke = std::chrono::steady_clock::now();
    // Late: the machine's cores were busy (or, reading with the GIL, the last read waited for it).
    // A late tick's time goes to the line it sees, as any tick's.
    if (woke > next + std::chrono::nanoseconds(g_host.sample_period_ns / 2))
      g_host.sample_waits.fetch_add(1, std::memory_order_relaxed);
    if (woke > next + std::chrono::nanoseconds(g_host.sample_period_ns)) next = woke;  // fell behind: no catch-up burst
    if (g_host.peek_on.load(std::memory_order_relaxed)) {
      if (peek_main()) {
        ++tick;
        bool ops = g_host.main_op.exchange(false, std::memory_order_relaxed);
        if (!ops || tick % kScanTicks == 0 || g_host.others_launch.load() || (g_host.others_seen.load() && tick % kOtherTicks == 0))
          gil_request(kReqOthers);
        continue;
      }
      g_host.peek_on.store(false);  // this process cannot read its own memory: the GIL from now on
    }
    PyEval_RestoreThread(saved);
    if (!g_host.sampler_stop) {
      sample_threads(self, steady_ns(), true, true);
      g_host.samples.fetch_add(1, std::memory_order_relaxed);
    }
    saved = PyEval_SaveThread();
  }
  PyEval_RestoreThread(saved);
  PyGILState_Release(g);
}

// From start(), with the GIL held (g_collector.main_tstate set): a fresh window, and the sampler unless
// period is 0.
void host_start(int64_t period_ns, bool keep_intervals) {
  bool peek = kPeekBuilt && !g_collector.diag.sampler_gil && g_collector.main_tstate != nullptr;
  {
    std::lock_guard<std::mutex> lk(g_host.mu);
    g_host.host_ns.clear();
    g_host.sync_ns.clear();
    g_host.intervals.clear();
    g_host.runs.clear();
    g_host.keep_intervals = keep_intervals;
    g_host.window_start = steady_ns();
    g_host.window_end = 0;
    g_host.window_open.store(true);
    g_host.main_last = g_host.others_last = g_host.window_start;
    g_host.main_tid = g_collector.main_tstate != nullptr ? thread_id_of(g_collector.main_tstate) : 0;
  }
  g_host.peek_on.store(peek);
  g_host.main_op.store(false);
  g_host.others_seen.store(true);
  g_host.others_launch.store(false);
  {
    std::lock_guard<std::mutex> lk(g_device.leaf_mu);
    g_host.busy.clear();
    g_host.ready.clear();
  }
  g_host.coll.clear();
  g_host.coll_k.clear();
  g_host.samples.store(0);
  g_host.sample_waits.store(0);
  g_host.peek_samples.store(0);
  g_host.peek_skips.store(0);
  if (g_host.sampler_ts == nullptr) g_host.sampler_ts = new ThreadState();
  if (g_host.peek_ts == nullptr) g_host.peek_ts = new ThreadState();
  for (ThreadState* s : {g_host.sampler_ts, g_host.peek_ts}) {
    s->frames.clear();  // its caches name nodes of the last recording's trie
    s->forget_walk();
    s->epoch = g_trie.epoch.load();
  }
  g_host.asked.clear();
  {
    std::lock_guard<std::mutex> lk(g_host.sampler_mu);
    g_host.unknown.clear();
  }
  g_host.main_state = nullptr;
#if defined(DLPT_INTERNAL_FRAMES)
  peek_reset(g_host.peek);
#endif
  if (period_ns <= 0 || g_host.sampler != nullptr) return;
  g_host.sample_period_ns = period_ns;
  g_host.sampler_stop = false;
  g_host.gil_req = 0;
  if (peek) g_host.gil_worker = new std::thread(gil_worker_loop);
  g_host.sampler = new std::thread(sampler_loop);
}

// From stop(), without the GIL (the sampler may be waiting for it).
void host_stop() {
  if (g_host.sampler != nullptr) {
    {
      std::lock_guard<std::mutex> lk(g_host.sampler_mu);
      g_host.sampler_stop = true;
    }
    g_host.sampler_cv.notify_all();
    g_host.gil_cv.notify_all();
    g_host.sampler->join();
    delete g_host.sampler;
    g_host.sampler = nullptr;
    if (g_host.gil_worker != nullptr) {
      g_host.gil_worker->join();
      delete g_host.gil_worker;
      g_host.gil_worker = nullptr;
    }
  }
  std::lock_guard<std::mutex> lk(g_host.mu);
  if (g_host.window_open.exchange(false)) g_host.window_end = steady_ns();
}

// How the main thread was read: 0 without the GIL through process_vm_readv, 1 through
// /proc/self/mem, -1 with the GIL (the public frame API, DLPT_DIAG=samplergil, or neither read
// worked: a sandbox that forbids both).
int64_t host_main_read() {
#if defined(DLPT_INTERNAL_FRAMES)
  return g_host.peek_on.load() ? int64_t(g_host.peek.via) : -1;
#else
  return -1;
#endif
}

void ignore_this_thread() {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return;
  std::lock_guard<std::mutex> lk(g_host.mu);
  g_host.ignored_tids.insert(thread_id_of(t));
}

}  // namespace
