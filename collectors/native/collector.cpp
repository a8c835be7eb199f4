// dlpt's online collector (DESIGN §2): a RecordFunction callback and, on CUDA builds, CUPTI,
// aggregating straight into a calling-context trie. Nothing is kept per event: an op adds its
// host time to its node, a kernel/copy/memset adds its duration, bytes and count to its
// (node, name) leaf, and the Python side (collectors/record/) turns the trie into a profile.
//
// The trie's nodes are raw contexts — a Python frame is (code object, line), an op is its
// name — and Python resolves them to files, functions and dlpt's frames. One rule each:
// - an op entered with no op of ours open on its thread reads that thread's Python frames,
//   innermost first, each at its *current* line (so `x + y` lands on its own line); the ops it
//   calls inside the dispatcher are not recorded apart (RecordFunction is off beneath it), so
//   its kernels and host time count on it; Python it calls back into has its own lines;
// - a backward op (BACKWARD_FUNCTION scope) goes under the node of the forward op that made
//   its autograd node — the op during which the node's sequence number was taken, on the
//   forward thread — beneath a [backward] marker;
//   without a match, under the `backward()` call that is running (set from Python), else the
//   calling thread's own context;
// - a CUDA launch/copy/memset/graph-launch API call maps its CUPTI correlation id to the
//   innermost open op of the calling thread, or to its Python context when none is open
//   (Triton's cuLaunchKernel, a graph replay); activity records find their node through it.
//
// Reading frames without the GIL: torch's bindings release the GIL before dispatch, and a
// thread's interpreter frames change only while that thread runs Python, so the thread that
// runs the callback can walk its own frames without taking the GIL back (3.11/3.12, through
// CPython's internal frame struct). The GIL is taken only the first time a code object is
// seen, to hold a reference to it (so its address can key the trie). DLPT_FRAMES=gil takes
// the GIL around every walk instead, the way Proton reads Python context, for comparison;
// builds without the internal headers always do (public API). docs/BENCHMARKS.md has both.

#include <Python.h>
#if defined(DLPT_INTERNAL_FRAMES)
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif
#include <frameobject.h>

#include <pybind11/pybind11.h>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#if defined(DLPT_CUPTI)
#include <cupti.h>
#endif

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <sys/syscall.h>
#include <unistd.h>

namespace py = pybind11;

namespace {

// Node kinds, as collectors/record/tree.py names them.
constexpr int32_t N_ROOT = 0, N_PY = 1, N_OP = 2, N_BACKWARD = 3, N_THREAD = 4, N_TID = 5, N_UNATTR = 6;
// Activity kinds, as dlpt.metrics numbers them.
constexpr int32_t A_KERNEL = 0, A_HTOD = 1, A_DTOH = 2, A_DTOD = 3, A_OTHER = 4, A_MEMSET = 5;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Op host times are read twice per op. Where the clock is a system call (some virtual
// machines give clock_gettime no vDSO path) that alone costs a microsecond per op, so on x86-64
// the collector counts TSC ticks (invariant on the CPUs torch runs on) and converts them to
// nanoseconds with the rate measured against the steady clock over the recording.
#if defined(__x86_64__)
#include <x86intrin.h>
inline int64_t ticks() { return int64_t(__rdtsc()); }
#else
inline int64_t ticks() { return steady_ns(); }
#endif
int64_t g_tick0 = 0, g_ns0 = 0;

double ns_per_tick() {
#if defined(__x86_64__)
  while (steady_ns() - g_ns0 < 1000000) {
  }  // a recording shorter than 1 ms: wait that long, for a usable rate
  int64_t dt = ticks() - g_tick0, dn = steady_ns() - g_ns0;
  return dt > 0 ? double(dn) / double(dt) : 1.0;
#else
  return 1.0;
#endif
}

// ----- append-only storage that readers on other threads may index while it grows -----

template <typename T>
class Chunked {
 public:
  static constexpr int64_t kBits = 14, kSize = int64_t(1) << kBits, kMaxChunks = 1 << 14;
  Chunked() : chunks_(new std::atomic<T*>[kMaxChunks]) {
    for (int64_t i = 0; i < kMaxChunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
  }
  // Under the owner's lock: make room for index i. False when full (2^28 entries).
  bool reserve(int64_t i) {
    int64_t c = i >> kBits;
    if (c >= kMaxChunks) return false;
    if (!chunks_[c].load(std::memory_order_acquire)) chunks_[c].store(new T[kSize](), std::memory_order_release);
    return true;
  }
  T& operator[](int64_t i) { return chunks_[i >> kBits].load(std::memory_order_acquire)[i & (kSize - 1)]; }

 private:
  std::unique_ptr<std::atomic<T*>[]> chunks_;  // chunks are never freed: nodes live as long as the process
};

struct Node {
  int64_t parent;
  int64_t a;
  int64_t b;
  int32_t kind;
};

struct NodeKey {
  int64_t parent, a, b;
  int32_t kind;
  bool operator==(const NodeKey& o) const { return parent == o.parent && a == o.a && b == o.b && kind == o.kind; }
};
struct NodeKeyHash {
  size_t operator()(const NodeKey& k) const {
    uint64_t h = uint64_t(k.parent) * 0x9E3779B97F4A7C15ULL;
    h ^= uint64_t(k.a) + 0x7F4A7C159E3779B9ULL + (h << 6) + (h >> 2);
    h ^= uint64_t(k.b) * 0xC2B2AE3D27D4EB4FULL + (h << 6) + (h >> 2);
    return size_t(h ^ uint64_t(k.kind));
  }
};

// The global trie. `g_mu` guards the index, the node count and the code/name tables; node
// records and cpu counters are read lock-free by the threads that learned their ids.
// Lock order: the GIL (if taken) before g_mu, never the other way round.
std::mutex g_mu;
Chunked<Node>* g_nodes = nullptr;
Chunked<std::atomic<int64_t>>* g_cpu = nullptr;
std::atomic<int64_t> g_n_nodes{0};
std::unordered_map<NodeKey, int64_t, NodeKeyHash> g_index;
std::vector<PyObject*> g_codes;                      // strong references
std::unordered_map<PyObject*, int64_t> g_code_idx;
std::vector<std::string> g_names;
std::unordered_map<std::string, int64_t> g_name_idx;
std::atomic<uint64_t> g_epoch{1};  // a new recording invalidates every thread's caches
std::atomic<bool> g_gil_frames{false};
PyThreadState* g_main_tstate = nullptr;
std::atomic<int64_t> g_backward_ctx{-1};  // the running backward() call's context
std::atomic<int64_t> g_dropped_nodes{0};

int64_t intern_name_locked(std::string_view s) {
  auto it = g_name_idx.find(std::string(s));
  if (it != g_name_idx.end()) return it->second;
  int64_t i = int64_t(g_names.size());
  g_names.emplace_back(s);
  g_name_idx.emplace(g_names.back(), i);
  return i;
}

int64_t intern_node_locked(int64_t parent, int32_t kind, int64_t a, int64_t b) {
  NodeKey k{parent, a, b, kind};
  auto it = g_index.find(k);
  if (it != g_index.end()) return it->second;
  int64_t i = g_n_nodes.load(std::memory_order_relaxed);
  if (!g_nodes->reserve(i) || !g_cpu->reserve(i)) {
    g_dropped_nodes.fetch_add(1, std::memory_order_relaxed);
    return parent;  // full (2^28 contexts): the work stays on the parent, never lost
  }
  (*g_nodes)[i] = Node{parent, a, b, kind};
  (*g_cpu)[i].store(0, std::memory_order_relaxed);
  g_index.emplace(k, i);
  g_n_nodes.store(i + 1, std::memory_order_release);
  return i;
}

int64_t intern_node(int64_t parent, int32_t kind, int64_t a, int64_t b) {
  std::lock_guard<std::mutex> lk(g_mu);
  return intern_node_locked(parent, kind, a, b);
}

// ----- per-thread state -----

struct OpenOp {
  int64_t node;
  int64_t t0;
  int64_t child;
  uint64_t epoch;
  // The thread's innermost Python frame when the op was entered. An op that calls back into
  // Python (a custom autograd Function's forward, a Python-implemented op) runs other frames:
  // what they launch belongs to their own lines, so a changed frame means "read the context
  // again" — for a backward op (`keep`), only the frames it runs, beneath its own node, since
  // its work belongs to the forward line (a custom backward's lines, compiled backward code).
  const void* pyframe;
  bool keep;
  bool quiet;     // RecordFunction switched off on this thread beneath this op (see on_enter)
  int64_t seq0;   // the thread's next autograd sequence number when the op was entered
};

struct FrameKey {
  int64_t parent;
  uintptr_t code;
  int64_t lasti;
  bool operator==(const FrameKey& o) const { return parent == o.parent && code == o.code && lasti == o.lasti; }
};
struct FrameKeyHash {
  size_t operator()(const FrameKey& k) const {
    uint64_t h = uint64_t(k.parent) * 0x9E3779B97F4A7C15ULL ^ (uint64_t(k.code) >> 4) * 0xC2B2AE3D27D4EB4FULL;
    return size_t(h ^ (uint64_t(k.lasti) + (h << 6) + (h >> 2)));
  }
};

struct ThreadState {
  uint64_t epoch = 0;
  int64_t n_ops = 0;  // ops entered by this thread (all recordings), for stats
  std::vector<OpenOp> stack;
  int64_t base = -1;  // this thread's context root for the current epoch
  int64_t cut = 0;    // outermost Python frames that belong to dlpt's thread start, not the program
  std::unordered_map<FrameKey, int64_t, FrameKeyHash> frames;  // (parent, code, instr) → node
  std::unordered_map<FrameKey, int64_t, FrameKeyHash> ops;     // (parent, name hash, len) → node
  std::vector<std::pair<PyObject*, int64_t>> walk;             // scratch: (code, lasti), innermost first
  std::vector<const void*> walk_frames;                        // scratch: the frames themselves
  // The last walk, outermost first, and its nodes: consecutive ops share their outer frames
  // (the training loop, the model's call), which are then matched by pointer, not looked up.
  std::vector<std::tuple<const void*, PyObject*, int64_t>> last;
  std::vector<int64_t> last_nodes;
};

thread_local ThreadState* t_state = nullptr;
std::mutex g_threads_mu;
std::vector<ThreadState*> g_threads;  // every thread's state, for stats

ThreadState& tstate() {
  ThreadState* s = t_state;
  if (!s) {
    s = t_state = new ThreadState();  // one per thread for the process's life: threads are few
    std::lock_guard<std::mutex> lk(g_threads_mu);
    g_threads.push_back(s);
  }
  uint64_t e = g_epoch.load(std::memory_order_acquire);
  if (s->epoch != e) {
    s->epoch = e;
    s->frames.clear();
    s->ops.clear();
    s->base = -1;
    s->cut = 0;
    s->last.clear();
    s->last_nodes.clear();
  }
  return *s;
}

// ----- backward links: (forward thread, sequence number) → forward op node -----

// A ring per forward thread: a backward op follows its forward within the same step, so the
// last 2^18 autograd ops of each thread are enough, in bounded memory (4 MiB a thread).
constexpr int64_t kSeqBits = 18, kSeqSize = int64_t(1) << kSeqBits;
struct SeqSlot {
  std::atomic<int64_t> seq{-1};
  std::atomic<int64_t> node{-1};
};
constexpr int64_t kMaxSeqThreads = 4096;
std::atomic<SeqSlot*> g_seq[kMaxSeqThreads];
std::mutex g_seq_mu;

void seq_store(uint64_t tid, int64_t seq, int64_t node) {
  if (tid >= uint64_t(kMaxSeqThreads) || seq < 0) return;
  SeqSlot* ring = g_seq[tid].load(std::memory_order_acquire);
  if (!ring) {
    std::lock_guard<std::mutex> lk(g_seq_mu);
    ring = g_seq[tid].load(std::memory_order_acquire);
    if (!ring) {
      ring = new SeqSlot[kSeqSize];
      g_seq[tid].store(ring, std::memory_order_release);
    }
  }
  SeqSlot& s = ring[seq & (kSeqSize - 1)];
  s.seq.store(-1, std::memory_order_relaxed);
  s.node.store(node, std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
}

int64_t seq_lookup(uint64_t tid, int64_t seq) {
  if (tid >= uint64_t(kMaxSeqThreads) || seq < 0) return -1;
  SeqSlot* ring = g_seq[tid].load(std::memory_order_acquire);
  if (!ring) return -1;
  SeqSlot& s = ring[seq & (kSeqSize - 1)];
  if (s.seq.load(std::memory_order_acquire) != seq) return -1;
  int64_t n = s.node.load(std::memory_order_relaxed);
  return s.seq.load(std::memory_order_acquire) == seq ? n : -1;
}

void seq_clear() {
  for (int64_t i = 0; i < kMaxSeqThreads; ++i) {
    SeqSlot* ring = g_seq[i].load(std::memory_order_acquire);
    if (ring)
      for (int64_t k = 0; k < kSeqSize; ++k) ring[k].seq.store(-1, std::memory_order_relaxed);
  }
}

// ----- Python frames -----

// The code object's index, holding a reference to it. `code` is alive: a frame of the calling
// thread holds it while this runs. The GIL is taken for the reference (first sight only).
int64_t intern_code(PyObject* code) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_code_idx.find(code);
    if (it != g_code_idx.end()) return it->second;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  int64_t i;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_code_idx.find(code);
    if (it != g_code_idx.end()) {
      i = it->second;
    } else {
      Py_INCREF(code);
      i = int64_t(g_codes.size());
      g_codes.push_back(code);
      g_code_idx.emplace(code, i);
    }
  }
  PyGILState_Release(g);
  return i;
}

// The calling thread's Python frames into ts.walk, innermost first: (code, instruction index),
// or (code, -line) where only the line is known (the public-API path).
void read_frames(ThreadState& ts, PyThreadState* t) {
  ts.walk.clear();
  ts.walk_frames.clear();
#if defined(DLPT_INTERNAL_FRAMES)
#if PY_VERSION_HEX >= 0x030D0000
  _PyInterpreterFrame* f = t->current_frame;
#else
  _PyInterpreterFrame* f = t->cframe ? t->cframe->current_frame : nullptr;
#endif
  for (; f != nullptr; f = f->previous) {
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK) continue;
#endif
#if PY_VERSION_HEX >= 0x030D0000
    if (!PyCode_Check(f->f_executable)) continue;
    if (_PyFrame_IsIncomplete(f)) continue;
    ts.walk.emplace_back(f->f_executable, int64_t(_PyInterpreterFrame_LASTI(f)));
    ts.walk_frames.push_back(f);
#else
    if (_PyFrame_IsIncomplete(f)) continue;
    ts.walk.emplace_back(reinterpret_cast<PyObject*>(f->f_code), int64_t(_PyInterpreterFrame_LASTI(f)));
    ts.walk_frames.push_back(f);
#endif
  }
#else
  // Public API (needs the GIL, which the caller holds here): frame objects are materialised.
  (void)t;
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* co = PyFrame_GetCode(f);
    ts.walk.emplace_back(reinterpret_cast<PyObject*>(co), -int64_t(PyFrame_GetLineNumber(f)) - 1);
    ts.walk_frames.push_back(nullptr);  // frame objects come and go: no reuse by pointer
    Py_DECREF(co);  // the frame (alive, on this thread's stack) still holds it
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
#endif
}

int64_t frame_node(ThreadState& ts, int64_t parent, PyObject* code, int64_t lasti) {
  FrameKey k{parent, uintptr_t(code), lasti};
  auto it = ts.frames.find(k);
  if (it != ts.frames.end()) return it->second;
  int64_t ci = intern_code(code);
  int64_t line;
  if (lasti >= 0)
    line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), int(lasti * sizeof(_Py_CODEUNIT)));
  else
    line = -lasti - 1;
  int64_t n = intern_node(parent, N_PY, ci, line);
  ts.frames.emplace(k, n);
  return n;
}

int64_t thread_base(ThreadState& ts, PyThreadState* t) {
  if (ts.base >= 0) return ts.base;
  if (t != nullptr && t == g_main_tstate) {
    ts.base = 0;
  } else {
    // A thread dlpt did not see start (started before recording, a C++ thread): its own root.
    ts.base = intern_node(0, N_TID, int64_t(syscall(SYS_gettid)), 0);
  }
  return ts.base;
}

// The calling thread's innermost interpreter frame (nullptr where unknown: no way to tell).
const void* current_pyframe() {
#if defined(DLPT_INTERNAL_FRAMES)
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  return t->current_frame;
#else
  return t->cframe ? t->cframe->current_frame : nullptr;
#endif
#else
  return nullptr;
#endif
}

int64_t context(ThreadState& ts);
void read_frames(ThreadState& ts, PyThreadState* t);
int64_t frame_node(ThreadState& ts, int64_t parent, PyObject* code, int64_t lasti);

// The frames a backward op has run since it was entered, beneath its node.
int64_t frames_under(ThreadState& ts, const OpenOp& top) {
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return top.node;
#if defined(DLPT_INTERNAL_FRAMES)
  bool gil = g_gil_frames.load(std::memory_order_relaxed);
#else
  bool gil = true;
#endif
  PyGILState_STATE g{};
  if (gil) g = PyGILState_Ensure();
  read_frames(ts, t);
  int64_t k = 0, n = int64_t(ts.walk.size());
  while (k < n && ts.walk_frames[size_t(k)] != top.pyframe) ++k;  // innermost first, down to the op's
  int64_t node = top.node;
  for (int64_t i = k - 1; i >= 0; --i) node = frame_node(ts, node, ts.walk[size_t(i)].first, ts.walk[size_t(i)].second);
  if (gil) PyGILState_Release(g);
  ts.last.clear();  // the prefix cache is for walks from the thread's base
  ts.last_nodes.clear();
  return node;
}

// The node that work entered now on this thread belongs to: the innermost open op, unless
// Python code has run since it was entered (then the Python context; for a backward op, the
// frames it ran, beneath it).
int64_t current_node(ThreadState& ts, const void* frame) {
  if (!ts.stack.empty() && ts.stack.back().node >= 0) {
    const OpenOp& top = ts.stack.back();
    if (top.pyframe == frame || frame == nullptr) return top.node;
    if (top.keep) return frames_under(ts, top);
  }
  return context(ts);
}

// The calling thread's Python context: the node of its innermost frame.
int64_t context(ThreadState& ts) {
  PyThreadState* t = PyGILState_GetThisThreadState();
  int64_t node = thread_base(ts, t);
  if (t == nullptr) return node;
#if defined(DLPT_INTERNAL_FRAMES)
  bool gil = g_gil_frames.load(std::memory_order_relaxed);
#else
  bool gil = true;
#endif
  PyGILState_STATE g{};
  if (gil) g = PyGILState_Ensure();
  read_frames(ts, t);
  int64_t n = int64_t(ts.walk.size()) - ts.cut;
  // Outermost first: frames still the same object at the same instruction as in the last walk
  // keep their node.
  int64_t same = 0, m = int64_t(ts.last.size());
  while (same < n && same < m) {
    int64_t i = n - 1 - same;
    const auto& l = ts.last[size_t(same)];
    if (ts.walk_frames[size_t(i)] == nullptr || std::get<0>(l) != ts.walk_frames[size_t(i)] ||
        std::get<1>(l) != ts.walk[size_t(i)].first || std::get<2>(l) != ts.walk[size_t(i)].second)
      break;
    ++same;
  }
  if (same > 0) node = ts.last_nodes[size_t(same - 1)];
  ts.last.resize(size_t(std::max<int64_t>(n, 0)));
  ts.last_nodes.resize(size_t(std::max<int64_t>(n, 0)));
  for (int64_t j = same; j < n; ++j) {
    int64_t i = n - 1 - j;
    node = frame_node(ts, node, ts.walk[size_t(i)].first, ts.walk[size_t(i)].second);
    ts.last[size_t(j)] = std::make_tuple(ts.walk_frames[size_t(i)], ts.walk[size_t(i)].first, ts.walk[size_t(i)].second);
    ts.last_nodes[size_t(j)] = node;
  }
  if (gil) PyGILState_Release(g);
  if (n <= 0 && ts.base != 0) {
    // A thread with no Python frames of its own — autograd's device threads — works for the
    // `backward()` call that is running, if one is.
    int64_t b = g_backward_ctx.load(std::memory_order_relaxed);
    if (b >= 0) return b;
  }
  return node;
}

int64_t op_node(ThreadState& ts, int64_t parent, const char* name) {
  std::string_view s(name ? name : "");
  FrameKey k{parent, uintptr_t(std::hash<std::string_view>{}(s)), int64_t(s.size())};
  auto it = ts.ops.find(k);
  if (it != ts.ops.end()) return it->second;
  int64_t n;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    n = intern_node_locked(parent, N_OP, intern_name_locked(s), 0);
  }
  ts.ops.emplace(k, n);
  return n;
}

int64_t backward_marker(ThreadState& ts, int64_t parent) {
  FrameKey k{parent, 0, -1};  // no op name hashes to 0 with length -1
  auto it = ts.ops.find(k);
  if (it != ts.ops.end()) return it->second;
  int64_t n = intern_node(parent, N_BACKWARD, 0, 0);
  ts.ops.emplace(k, n);
  return n;
}

// ----- the RecordFunction callback -----

std::atomic<bool> g_host_on{false};
at::CallbackHandle g_handle = 0;
// Diagnostics for measuring the collector's parts (bench/, docs/BENCHMARKS.md), off in use:
// the op callback returns at once; CUPTI without its callbacks; CUPTI without its activities.
bool g_diag_noop = false, g_diag_no_callbacks = false, g_diag_no_activities = false;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (g_diag_noop) return nullptr;
  ThreadState& ts = tstate();
  ++ts.n_ops;
  uint64_t epoch = ts.epoch;
  if (!g_host_on.load(std::memory_order_relaxed)) {
    ts.stack.push_back(OpenOp{-1, 0, 0, 0, nullptr, false, false, 0});  // keeps enter/exit paired while switching off
    return nullptr;
  }
  const void* frame = current_pyframe();
  bool backward = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  int64_t t0 = ticks();
  int64_t parent;
  if (backward) {
    int64_t fwd = seq_lookup(fn.forwardThreadId(), fn.seqNr());
    if (fwd < 0) {
      if (!ts.stack.empty() && ts.stack.back().node >= 0) {
        fwd = ts.stack.back().node;
      } else {
        fwd = context(ts);  // the backward() line: on its own thread, or through g_backward_ctx
      }
    }
    parent = backward_marker(ts, fwd);
  } else {
    parent = current_node(ts, frame);
  }
  const char* name = fn.name();
  int64_t node = op_node(ts, parent, name);
  // The ops an op calls inside the dispatcher are its own business: their kernels, copies and
  // host time count on it, and torch's RecordFunction machinery (about a microsecond per op,
  // docs/BENCHMARKS.md) is switched off for them on this thread until the op returns. The one
  // exceptions: autograd's evaluate_function wrapper, whose child is the backward op itself,
  // and ops that run Python — a custom autograd Function (named by its class, no "::") or a
  // compiled region ("Torch-Compiled Region: 0/0") — whose ops and launches keep their own
  // lines. (Python that a quiet op calls back into still gets its lines for what it launches.)
  const char* nm = name ? name : "";
  bool quiet = std::strstr(nm, "::") != nullptr && std::strncmp(nm, "autograd::engine::evaluate_function", 35) != 0;
  if (quiet) at::enableRecordFunction(false);
  ts.stack.push_back(OpenOp{node, t0, 0, epoch, frame, backward, quiet,
                            backward ? -1 : int64_t(at::sequence_number::peek())});
  return nullptr;
}

void on_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (g_diag_noop) return;
  ThreadState* s = t_state;
  if (s == nullptr || s->stack.empty()) return;
  OpenOp op = s->stack.back();
  s->stack.pop_back();
  if (op.quiet) at::enableRecordFunction(true);
  if (op.node < 0) return;
  if (op.seq0 >= 0) {
    // Every autograd node the op made (its own and those of the ops inside it) took a sequence
    // number from op.seq0 on: their backward ops belong to this op — or to the innermost
    // recorded op inside it that made them, which exited first and claimed its numbers.
    int64_t seq1 = int64_t(at::sequence_number::peek());
    uint64_t tid = at::RecordFunction::currentThreadId();
    for (int64_t q = op.seq0; q < seq1 && q < op.seq0 + 4096; ++q)
      if (seq_lookup(tid, q) < 0) seq_store(tid, q, op.node);
  }
  int64_t dur = ticks() - op.t0;
  if (op.epoch == g_epoch.load(std::memory_order_relaxed)) {
    int64_t self = dur - op.child;
    (*g_cpu)[op.node].fetch_add(self > 0 ? self : 0, std::memory_order_relaxed);
  }
  if (!s->stack.empty()) s->stack.back().child += dur;
}

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
std::mutex g_leaf_mu;
std::vector<Leaf> g_leaves;
std::unordered_map<LeafKey, int64_t, LeafKeyHash> g_leaf_idx;
std::unordered_map<const char*, int64_t> g_kernel_name_cache;  // CUPTI's names are stable per kernel
std::atomic<int64_t> g_records{0}, g_unlinked{0};
int64_t g_no_launch_node = -1;

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

// CUPTI correlation id → node, as a ring: ids grow, and a record arrives within a flush of
// its launch, so the last 2^20 launches in flight are enough (16 MiB, no allocation per launch).
constexpr uint64_t kCorrBits = 20, kCorrSize = uint64_t(1) << kCorrBits;
struct CorrSlot {
  std::atomic<uint64_t> corr{0};
  std::atomic<int64_t> node{-1};
};
CorrSlot* g_corr = nullptr;

void corr_put(uint64_t corr, int64_t node) {
  CorrSlot& s = g_corr[corr & (kCorrSize - 1)];
  s.corr.store(0, std::memory_order_relaxed);
  s.node.store(node, std::memory_order_relaxed);
  s.corr.store(corr, std::memory_order_release);
}

int64_t corr_get(uint64_t corr) {
  CorrSlot& s = g_corr[corr & (kCorrSize - 1)];
  if (s.corr.load(std::memory_order_acquire) != corr) return -1;
  return s.node.load(std::memory_order_relaxed);
}

#if defined(DLPT_CUPTI)
CUpti_SubscriberHandle g_sub = nullptr;
std::atomic<bool> g_device_on{false};
std::string g_cupti_error;

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

void CUPTIAPI on_api(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER || !g_device_on.load(std::memory_order_relaxed)) return;
  ThreadState& ts = tstate();
  corr_put(cb->correlationId, current_node(ts, current_pyframe()));
}

constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

int64_t record_node(uint32_t corr) {
  int64_t n = corr_get(corr);
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
  add_leaf_locked(record_node(m->correlationId), cn.second, name_idx(cn.first), int64_t(m->end - m->start),
                  int64_t(m->bytes), m->deviceId, m->streamId);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lk(g_leaf_mu);
  while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<DLPT_KERNEL_T*>(rec);
        int64_t name;
        const char* kn = k->name;  // a packed struct's field: copied, not bound
        auto it = g_kernel_name_cache.find(kn);
        if (it != g_kernel_name_cache.end()) {
          name = it->second;
        } else {
          // CUPTI gives the mangled symbol; users (and Kineto's traces) read it demangled.
          int status = -1;
          char* dm = kn ? abi::__cxa_demangle(kn, nullptr, nullptr, &status) : nullptr;
          name = name_idx(status == 0 && dm ? dm : (kn ? kn : "<unnamed kernel>"));
          std::free(dm);
          g_kernel_name_cache.emplace(kn, name);
        }
        add_leaf_locked(record_node(k->correlationId), A_KERNEL, name, int64_t(k->end - k->start), 0, k->deviceId,
                        k->streamId);
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
        add_leaf_locked(record_node(m->correlationId), A_MEMSET, name_idx(nm), int64_t(m->end - m->start),
                        int64_t(m->bytes), m->deviceId, m->streamId);
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
  if (g_sub == nullptr && !g_diag_no_callbacks) {
    CUptiResult r = cuptiSubscribe(&g_sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr);
    if (r != CUPTI_SUCCESS) {
      g_sub = nullptr;
      return cupti_err("cuptiSubscribe", r);
    }
    struct { CUpti_CallbackDomain d; int n; } doms[] = {{CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE},
                                                         {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE}};
    for (auto& dm : doms)
      for (int cbid = 1; cbid < dm.n; ++cbid) {
        const char* nm = nullptr;
        if (cuptiGetCallbackName(dm.d, CUpti_CallbackId(cbid), &nm) == CUPTI_SUCCESS && wanted(dm.d, nm))
          cuptiEnableCallback(1, g_sub, dm.d, CUpti_CallbackId(cbid));
      }
  }
  g_device_on.store(true);
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
  if (!g_device_on.exchange(false)) return;
  device_flush(true);
  for (auto k : kKinds) cuptiActivityDisable(k);
  device_flush(true);
  if (g_sub != nullptr) {
    cuptiUnsubscribe(g_sub);
    g_sub = nullptr;
  }
}
#endif  // DLPT_CUPTI

// ----- the Python binding -----

bool g_host_registered = false;

std::string switch_on(bool device, bool host) {
  g_host_on.store(true);
  if (host && !g_host_registered) {
    g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit)
                                         .needsInputs(false)
                                         .needsOutputs(false)
                                         .needsIds(false)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    g_host_registered = true;
  }
#if defined(DLPT_CUPTI)
  if (device) {
    g_cupti_error = device_on();
    return g_cupti_error;
  }
#else
  (void)device;
#endif
  return "";
}

// Start a recording: a fresh trie, the host callback, and CUPTI when asked. Returns "" when the
// device side is on (or was not asked for), else why it could not start.
std::string start(bool device, bool gil_frames, bool host, const std::string& diag) {
  g_diag_noop = diag.find("noop") != std::string::npos;
  g_diag_no_callbacks = diag.find("nocallbacks") != std::string::npos;
  g_diag_no_activities = diag.find("noactivities") != std::string::npos;
  if (g_nodes == nullptr) {
    g_nodes = new Chunked<Node>();
    g_cpu = new Chunked<std::atomic<int64_t>>();
    g_corr = new CorrSlot[kCorrSize];
    for (auto& s : g_seq) s.store(nullptr);
  }
  std::vector<PyObject*> codes;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    codes.swap(g_codes);
    g_index.clear();
    g_code_idx.clear();
    g_names.clear();
    g_name_idx.clear();
    g_n_nodes.store(0);
    intern_node_locked(-1, N_ROOT, 0, 0);
  }
  for (PyObject* c : codes) Py_DECREF(c);
  {
    std::lock_guard<std::mutex> lk(g_leaf_mu);
    g_leaves.clear();
    g_leaf_idx.clear();
    g_kernel_name_cache.clear();
    g_no_launch_node = -1;
  }
  seq_clear();
  g_records = 0;
  g_unlinked = 0;
  g_dropped_nodes = 0;
  g_backward_ctx = -1;
  g_epoch.fetch_add(1);
  g_gil_frames = gil_frames;
  g_main_tstate = PyThreadState_Get();
  g_tick0 = ticks();
  g_ns0 = steady_ns();
  return switch_on(device, host);
}

// Everything off: the callback removed (the rest of the program runs at unprofiled speed),
// CUPTI's activities flushed into the trie and disabled.
void stop() {
  g_host_on.store(false);
  if (g_host_registered) {
    at::removeCallback(g_handle);
    g_host_registered = false;
  }
#if defined(DLPT_CUPTI)
  device_off();
#endif
}

void flush(bool forced) {
#if defined(DLPT_CUPTI)
  if (g_device_on.load()) device_flush(forced);
#else
  (void)forced;
#endif
}

py::bytes as_bytes(const std::vector<int64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// The trie as columns: nodes (parent, kind, a, b, cpu) from 0, leaves (node, kind, name,
// count, total, min, max, bytes, device, stream), and the code objects and names from the
// given indices on (earlier ones the caller has). Safe while recording goes on.
py::tuple snapshot(int64_t codes_from, int64_t names_from) {
  std::vector<int64_t> parent, kind, a, b, cpu;
  std::vector<int64_t> leaves;
  std::vector<PyObject*> codes;
  std::vector<std::string> names;
  {
    py::gil_scoped_release nogil;  // threads that intern a new code object need the GIL first
    std::lock_guard<std::mutex> lk(g_mu);
    int64_t n = g_n_nodes.load(std::memory_order_acquire);
    double rate = ns_per_tick();  // host times are kept in ticks
    parent.resize(n);
    kind.resize(n);
    a.resize(n);
    b.resize(n);
    cpu.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      const Node& x = (*g_nodes)[i];
      parent[i] = x.parent;
      kind[i] = x.kind;
      a[i] = x.a;
      b[i] = x.b;
      cpu[i] = int64_t(double((*g_cpu)[i].load(std::memory_order_relaxed)) * rate + 0.5);
    }
    for (size_t i = size_t(std::max<int64_t>(codes_from, 0)); i < g_codes.size(); ++i) codes.push_back(g_codes[i]);
    for (size_t i = size_t(std::max<int64_t>(names_from, 0)); i < g_names.size(); ++i) names.push_back(g_names[i]);
  }
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(g_leaf_mu);
    leaves.reserve(g_leaves.size() * 10);
    for (const Leaf& l : g_leaves) {
      int64_t row[10] = {l.node, l.kind, l.name, l.count, l.total, l.minv, l.maxv, l.bytes, l.device, l.stream};
      leaves.insert(leaves.end(), row, row + 10);
    }
  }
  py::list pcodes, pnames;
  for (PyObject* c : codes) pcodes.append(py::reinterpret_borrow<py::object>(c));
  for (const std::string& s : names)
    pnames.append(py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace")));
  return py::make_tuple(as_bytes(parent), as_bytes(kind), as_bytes(a), as_bytes(b), as_bytes(cpu), as_bytes(leaves),
                        pcodes, pnames);
}

// The calling thread's context node now (with the GIL: called from Python).
int64_t context_here() { return g_host_on.load() ? context(tstate()) : -1; }

// Called first thing in a thread dlpt saw start: its work goes under `start_node` (the line
// that started it) and a [thread] node; the frames on its stack now are dlpt's, not the program's.
void register_thread(int64_t start_node, int64_t key) {
  if (start_node < 0 || !g_host_on.load()) return;  // started while dlpt was not recording
  ThreadState& ts = tstate();
  ts.base = intern_node(start_node, N_THREAD, key, 0);
  ts.last.clear();
  ts.last_nodes.clear();
  PyThreadState* t = PyGILState_GetThisThreadState();
  ts.cut = 0;
  if (t != nullptr) {
    read_frames(ts, t);
    ts.cut = int64_t(ts.walk.size());
  }
}

void set_backward_context(int64_t node) { g_backward_ctx.store(node); }

py::dict capabilities() {
  py::dict d;
#if defined(DLPT_CUPTI)
  d["cupti"] = true;
  d["cupti_error"] = g_cupti_error;
#else
  d["cupti"] = false;
  d["cupti_error"] = "";
#endif
#if defined(DLPT_INTERNAL_FRAMES)
  d["frames"] = g_gil_frames.load() ? "internal+gil" : "internal";
#else
  d["frames"] = "public+gil";
#endif
  return d;
}

py::dict stats() {
  py::dict d;
  d["nodes"] = g_n_nodes.load();
  d["device_records"] = g_records.load();
  d["unlinked_records"] = g_unlinked.load();
  d["dropped_nodes"] = g_dropped_nodes.load();
  int64_t ops = 0;
  {
    std::lock_guard<std::mutex> lk(g_threads_mu);
    for (ThreadState* t : g_threads) ops += t->n_ops;  // a racy read of counters: for stats only
  }
  d["ops"] = ops;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dlpt's online collector: RecordFunction + CUPTI into a calling-context trie";
  m.def("start", &start, py::arg("device"), py::arg("gil_frames") = false, py::arg("host") = true,
        py::arg("diag") = "");
  m.def("stop", &stop, py::call_guard<py::gil_scoped_release>());
  m.def("flush", &flush, py::arg("forced") = true, py::call_guard<py::gil_scoped_release>());
  m.def("snapshot", &snapshot, py::arg("codes_from") = 0, py::arg("names_from") = 0);
  m.def("context_here", &context_here);
  m.def("register_thread", &register_thread);
  m.def("set_backward_context", &set_backward_context);
  m.def("capabilities", &capabilities);
  m.def("stats", &stats);
}
