// dlpt collector: reading the calling thread's Python frames.
// Without the GIL on 3.11/3.12 (collector.cpp says why that is safe).
#pragma once

#include "common.h"  // first: Python.h before any other header

#include "trie.h"

namespace {

// ----- Python frames -----

// The code object's index, holding a reference to it. `code` is alive: a frame of the calling
// thread holds it while this runs. The GIL is taken for the reference (first sight only).
int64_t intern_code(PyObject* code) {
  {
    std::lock_guard<std::mutex> lk(g_trie.mu);
    auto it = g_trie.code_idx.find(code);
    if (it != g_trie.code_idx.end()) return it->second;
  }
  PyGILState_STATE g = PyGILState_Ensure();
  int64_t i;
  {
    std::lock_guard<std::mutex> lk(g_trie.mu);
    auto it = g_trie.code_idx.find(code);
    if (it != g_trie.code_idx.end()) {
      i = it->second;
    } else {
      Py_INCREF(code);
      i = int64_t(g_trie.codes.size());
      g_trie.codes.push_back(code);
      g_trie.code_idx.emplace(code, i);
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
  // `t` is the calling thread, or another thread the host sampler reads (host.h).
  PyFrameObject* f = t != nullptr ? PyThreadState_GetFrame(t) : nullptr;  // a new reference
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
  if (const int64_t* it = ts.frames.find(k)) return *it;
  int64_t ci = intern_code(code);
  int64_t line;
  if (lasti >= 0)
    line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), int(lasti * sizeof(_Py_CODEUNIT)));
  else
    line = -lasti - 1;
  int64_t n = intern_node(parent, N_PY, ci, line);
  ts.frames.put(k, n);
  return n;
}

int64_t thread_base(ThreadState& ts, PyThreadState* t) {
  if (ts.base >= 0) return ts.base;
  int64_t phase = g_trie.phase_node.load(std::memory_order_acquire);  // the root with phases off
  if (t != nullptr && t == g_collector.main_tstate) {
    ts.base = phase;
  } else {
    // A thread dlpt did not see start (started before recording, a C++ thread): its own root.
    ts.base = intern_node(phase, N_TID, int64_t(syscall(SYS_gettid)), 0);
  }
  return ts.base;
}

// The calling thread's innermost interpreter frame (nullptr where unknown: no way to tell);
// `t` is the calling thread's PyThreadState (PyGILState_GetThisThreadState()).
const void* current_pyframe(PyThreadState* t) {
#if defined(DLPT_INTERNAL_FRAMES)
  if (t == nullptr) return nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  return t->current_frame;
#else
  return t->cframe ? t->cframe->current_frame : nullptr;
#endif
#else
  (void)t;
  return nullptr;
#endif
}

const void* current_pyframe() { return current_pyframe(PyGILState_GetThisThreadState()); }

int64_t context(ThreadState& ts, PyThreadState* t);
int64_t context(ThreadState& ts);
void read_frames(ThreadState& ts, PyThreadState* t);

// Holds the GIL while frames are read, where reading needs it: DLPT_FRAMES=gil, or the
// public frame API.
struct FrameReadGuard {
  bool gil;
  PyGILState_STATE state{};
  FrameReadGuard() {
#if defined(DLPT_INTERNAL_FRAMES)
    gil = g_collector.gil_frames.load(std::memory_order_relaxed);
#else
    gil = true;
#endif
    if (gil) state = PyGILState_Ensure();
  }
  ~FrameReadGuard() {
    if (gil) PyGILState_Release(state);
  }
};
int64_t frame_node(ThreadState& ts, int64_t parent, PyObject* code, int64_t lasti);

// The frames this thread runs inside `cut` (its innermost frames down to `cut`, all of them when
// `cut` is not on the stack), beneath `node`: what a backward op's Python runs.
int64_t frames_beneath(ThreadState& ts, int64_t node, const void* cut) {
  PyThreadState* t = PyGILState_GetThisThreadState();
  if (t == nullptr) return node;
  FrameReadGuard guard;
  read_frames(ts, t);
  int64_t k = 0, n = int64_t(ts.walk.size());
  while (k < n && ts.walk_frames[size_t(k)] != cut) ++k;  // innermost first, down to `cut`
  for (int64_t i = k - 1; i >= 0; --i) node = frame_node(ts, node, ts.walk[size_t(i)].first, ts.walk[size_t(i)].second);
  ts.forget_walk();  // the prefix cache is for walks from the thread's base
  return node;
}

// The frames a backward op has run since it was entered, beneath its node.
int64_t frames_under(ThreadState& ts, const OpenOp& top) { return frames_beneath(ts, top.node, top.pyframe); }

// The node that work entered now on this thread belongs to: the innermost open op, unless
// Python code has run since it was entered (then the Python context; for a backward op, the
// frames it ran, beneath it).
// `t`: the calling thread's PyThreadState, where the caller has it.
int64_t current_node(ThreadState& ts, const void* frame, PyThreadState* t) {
  if (!ts.stack.empty() && ts.stack.back().node >= 0) {
    const OpenOp& top = ts.stack.back();
    if (top.pyframe == frame || frame == nullptr) return top.node;
    if (top.keep) return frames_under(ts, top);
  }
  return context(ts, t);
}

int64_t current_node(ThreadState& ts, const void* frame) {
  return current_node(ts, frame, PyGILState_GetThisThreadState());
}

// Whether walk `w` (innermost first) has no frame that runs: no Python frames of the thread's own.
bool no_running_frame(const std::vector<RawFrame>& w, size_t n);

// The calling thread's Python context: the node of its innermost frame.
int64_t context(ThreadState& ts) { return context(ts, PyGILState_GetThisThreadState()); }

int64_t context(ThreadState& ts, PyThreadState* t) {
  int64_t node = thread_base(ts, t);
  if (t == nullptr) return node;
  FrameReadGuard guard;
#if defined(DLPT_INTERNAL_FRAMES) && PY_VERSION_HEX < 0x030D0000
  if (ts.cut == 0) {
    // The op callback's hot path: a walk for every op entered with none of ours open. Every frame
    // is copied as it is (the frame and its instruction pointer, RawFrame), in one tight loop,
    // innermost first, and compared with the last walk from the outermost in. Code, instruction
    // index and whether a frame runs at all (3.12's C-stack entry frames and frames not started
    // do not) are read only past the part that matched, where nodes are made: a frame that
    // matched is at the instruction where the last walk judged it. (A thread that dlpt saw start
    // has its own outermost frames cut off: the walk below.)
    // (Through plain pointers: stores of pointers through the vectors would make the compiler
    // load their bounds again at every frame.)
    _PyInterpreterFrame* f = t->cframe ? t->cframe->current_frame : nullptr;
    std::vector<RawFrame>& w = ts.raw;
    RawFrame* wp = w.data();
    size_t n = 0, cap = w.size();
    for (; f != nullptr; f = f->previous) {
      if (n == cap) {
        w.resize(cap + 64);
        wp = w.data();
        cap = w.size();
      }
      wp[n].frame = f;
      wp[n].instr = f->prev_instr;
      ++n;
    }
    std::vector<RawFrame>& last = ts.ctx_last;
    const RawFrame* lp = last.data();
    size_t m = std::min(last.size(), ts.last_nodes.size()), same = 0, lim = std::min(n, m);
    while (same < lim && wp[n - 1 - same] == lp[same]) ++same;
    if (same > 0) node = ts.last_nodes[same - 1];
    if (m != n || ts.last_nodes.size() != n) {
      last.resize(n);
      ts.last_nodes.resize(n);
    }
    for (size_t j = same; j < n; ++j) {
      const RawFrame& e = wp[n - 1 - j];
      auto* fr = static_cast<_PyInterpreterFrame*>(const_cast<void*>(e.frame));
      bool runs = !_PyFrame_IsIncomplete(fr);
#if PY_VERSION_HEX >= 0x030C0000
      runs = runs && fr->owner != FRAME_OWNED_BY_CSTACK;
#endif
      if (runs)
        node = frame_node(ts, node, reinterpret_cast<PyObject*>(fr->f_code), int64_t(_PyInterpreterFrame_LASTI(fr)));
      last[j] = e;
      ts.last_nodes[j] = node;  // a frame that does not run keeps its caller's node
    }
    if (t != g_collector.main_tstate && no_running_frame(w, n)) {
      int64_t b = g_collector.backward_ctx.load(std::memory_order_relaxed);  // see below
      if (b >= 0) return b;
    }
    return node;
  }
#endif
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
  if (n <= 0 && t != g_collector.main_tstate) {
    // A thread with no Python frames of its own — autograd's device threads — works for the
    // `backward()` call that is running, if one is.
    int64_t b = g_collector.backward_ctx.load(std::memory_order_relaxed);
    if (b >= 0) return b;
  }
  return node;
}

bool no_running_frame(const std::vector<RawFrame>& w, size_t n) {
#if defined(DLPT_INTERNAL_FRAMES) && PY_VERSION_HEX < 0x030D0000
  for (size_t i = 0; i < n; ++i) {
    auto* fr = static_cast<_PyInterpreterFrame*>(const_cast<void*>(w[i].frame));
#if PY_VERSION_HEX >= 0x030C0000
    if (fr->owner == FRAME_OWNED_BY_CSTACK) continue;
#endif
    if (!_PyFrame_IsIncomplete(fr)) return false;
  }
#else
  (void)w;
  (void)n;
#endif
  return true;
}

int64_t op_node(ThreadState& ts, int64_t parent, const char* name) {
  std::string_view s(name ? name : "");
  FrameKey k{parent, uintptr_t(std::hash<std::string_view>{}(s)), int64_t(s.size())};
  auto it = ts.ops.find(k);
  if (it != ts.ops.end()) return it->second;
  int64_t n;
  {
    std::lock_guard<std::mutex> lk(g_trie.mu);
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

// The one backward rule: a backward op with autograd sequence number `seq`, taken on forward
// thread `tid`, goes under the forward op that took it, beneath a [backward] marker; without a
// match (AccumulateGrad has no number), under the op open on this thread, else the innermost
// `backward()` call that is running — a reentrant checkpoint's nested call sits under the
// checkpoint's own backward — else this thread's own context.
int64_t backward_parent(ThreadState& ts, uint64_t tid, int64_t seq) {
  int64_t fwd = seq_lookup(tid, seq);
  if (fwd < 0 && !ts.stack.empty() && ts.stack.back().node >= 0) fwd = ts.stack.back().node;
  if (fwd < 0) fwd = ts.bw_calls.empty() ? g_collector.backward_ctx.load(std::memory_order_relaxed) : ts.bw_calls.back().here;
  if (fwd < 0) fwd = context(ts);
  return backward_marker(ts, fwd);
}

}  // namespace
