// dlpt collector: reading the recording's main thread's Python frames from the sampler thread
// without the GIL, the way out-of-process samplers (py-spy) read a process's threads.
// Why: a read that takes the GIL comes when the main thread gives it up — at its next op, or at
// the switch interval (5 ms) in pure Python — so it sees the line that runs *then*, and the time
// since the last sample lands on the next line, not on the one that ran (issue 32). Peeking reads
// the frame chain at the tick itself, whatever the main thread holds.
//
// How, safely: the main thread changes its frames while they are read, and frees the memory of
// frames that return (its data stack's chunks are unmapped). So nothing is dereferenced directly:
// every word is copied with process_vm_readv on our own pid (or pread of /proc/self/mem where a
// seccomp filter forbids that), which returns an error on unmapped memory instead of faulting.
// What comes back may be torn; it is trusted only this far:
// - a code object is dereferenced (its first traceable instruction, its size, its line table)
//   only if it is interned in the trie (g_trie.code_idx, which holds a strong reference, so it is
//   alive) and only while g_trie.mu is held (start() clears the table under g_trie.mu before it lets go of
//   the references). A pointer that is not interned is never followed: the frames inside it are
//   left out and the caller is told (`unknown`);
// - an instruction offset outside its code means a torn copy: the tick is read again, else skipped;
// - the stack is copied in one read, nearly at one instant (PeekCopy), and where frames had to be
//   read apart from it the current frame pointer is read again after the walk (peek_frames);
// - the walk is bounded (kPeekDepth frames), so a torn `previous` that loops cannot hang it.
// Frames are skipped as read_frames (frames.h) skips them: the C stack's entry frames (3.12+) and
// frames that have not started (incomplete).
#pragma once

#include "common.h"  // first: Python.h before any other header

#include <fcntl.h>
#include <sys/uio.h>

#include <cerrno>

#include "trie.h"

namespace {

#if defined(DLPT_INTERNAL_FRAMES)

constexpr size_t kPeekDepth = 512;  // deeper stacks are read with the GIL
// The bytes of a frame that are read: everything before its locals.
constexpr size_t kFrameHead = offsetof(_PyInterpreterFrame, localsplus);
// Above every user-space address (x86-64 and AArch64, 5-level page tables included).
constexpr uintptr_t kUserTop = uintptr_t(1) << 57;

enum PeekStatus { PEEK_OK, PEEK_TORN, PEEK_DEEP, PEEK_UNAVAILABLE };

struct Peek;  // below: how memory is copied, and the copy of the stack
PeekStatus peek_mem(Peek& p, const void* addr, void* out, size_t n);

// Thread t's innermost interpreter frame pointer (t is alive: the recording's main thread), and
// on 3.11/3.12 the C frame that holds it (`where`: a walk is trusted only where both are the same
// after it).
PeekStatus peek_current(Peek& p, PyThreadState* t, const void** where, _PyInterpreterFrame** f) {
  *f = nullptr;
  *where = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  return peek_mem(p, &t->current_frame, f, sizeof(*f));
#else
  _PyCFrame* cf = nullptr;
  PeekStatus s = peek_mem(p, &t->cframe, &cf, sizeof(cf));
  if (s != PEEK_OK || cf == nullptr) return s;
  *where = cf;
  return peek_mem(p, &cf->current_frame, f, sizeof(*f));
#endif
}

// The sampler's copy of the main thread's stack. A thread's frames are pushed one after another
// on its data stack (chunks of 16 KiB and up), so a read of the pages holding a frame and two
// below it gives a few dozen frames at once, not one a system call (measured: about 1.5 µs a call
// here); the pages are read highest first, so one that is not there ends the copy, not the read.
// And from one tick to the next a stack keeps most of its frames where they were: the next tick
// reads the ranges this walk used again, in the same system call as the current frame pointer.
// The kernel copies them in order within a few microseconds: a copy of one instant, nearly.
struct PeekCopy {
  static constexpr uintptr_t kPage = 4096, kWindow = 3 * kPage;
  static constexpr size_t kSlots = 8;
  struct Range {
    uintptr_t lo = 0, hi = 0;  // buf[i][0, hi - lo) holds [lo, hi)
    bool used = false;         // a frame of this walk came from it
  };
  Range r[kSlots];
  size_t n = 0;
  Range next[kSlots];  // the ranges the next tick reads at once
  size_t n_next = 0;
  alignas(64) unsigned char buf[kSlots][kWindow];

  bool find(uintptr_t a, size_t len, void* out) {
    for (size_t i = 0; i < n; ++i) {
      if (a >= r[i].lo && a <= r[i].hi && len <= r[i].hi - a) {  // `a` may be any value: no overflow
        std::memcpy(out, buf[i] + (a - r[i].lo), len);
        r[i].used = true;
        return true;
      }
    }
    return false;
  }

  // [a, a + len) and what lies below it in the same pages and the two pages before, as a new range.
  PeekStatus add(Peek& p, uintptr_t a, size_t len, void* out);
  PeekStatus get(Peek& p, const void* addr, void* out, size_t len, bool& added);

  void keep_used() {
    n_next = 0;
    for (size_t i = 0; i < n; ++i)
      if (r[i].used) next[n_next++] = Range{r[i].lo, r[i].hi, false};
  }
};

// How memory is copied: process_vm_readv, else /proc/self/mem (a seccomp profile may forbid the
// former), else not at all (the sampler then reads with the GIL). Only the sampler thread reads
// (HostState::peek).
struct Peek {
  int via = 0;  // 0: process_vm_readv, 1: /proc/self/mem, 2: neither works
  int fd = -1;
  pid_t pid = 0;  // set by host_start (glibc does not cache getpid: a system call each)
  PeekCopy copy;  // the sampler's
};

// Copies n bytes at addr: PEEK_OK, PEEK_TORN where the memory is not there (or only partly),
// PEEK_UNAVAILABLE where this process cannot read itself this way.
PeekStatus peek_mem(Peek& p, const void* addr, void* out, size_t n) {
  if (uintptr_t(addr) >= kUserTop) return PEEK_TORN;  // no one's address: a torn pointer
  if (p.via == 0) {
    iovec local{out, n}, remote{const_cast<void*>(addr), n};
    ssize_t r = process_vm_readv(p.pid, &local, 1, &remote, 1, 0);
    if (r == ssize_t(n)) return PEEK_OK;
    if (r >= 0 || errno == EFAULT) return PEEK_TORN;
    p.via = 1;  // ENOSYS, EPERM (seccomp): try the other way
  }
  if (p.via == 1) {
    if (p.fd < 0) p.fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (p.fd >= 0) {
      ssize_t r = pread(p.fd, out, n, off_t(uintptr_t(addr)));
      if (r == ssize_t(n)) return PEEK_OK;
      if (r >= 0 || errno == EIO || errno == EFAULT) return PEEK_TORN;
    }
    p.via = 2;
  }
  return PEEK_UNAVAILABLE;
}

PeekStatus PeekCopy::add(Peek& p, uintptr_t a, size_t len, void* out) {
  if (p.via != 0 || n == kSlots || a < kWindow) return peek_mem(p, reinterpret_cast<void*>(a), out, len);
  uintptr_t top = (a + len + kPage - 1) & ~(kPage - 1);  // no overflow: `a` is a user-space address
  uintptr_t start = top - kWindow, at = top;
  iovec local[kWindow / kPage], remote[kWindow / kPage];
  size_t k = 0;
  for (; at > start; at -= kPage, ++k) {  // the highest page first
    remote[k] = iovec{reinterpret_cast<void*>(at - kPage), size_t(kPage)};
    local[k] = iovec{buf[n] + (at - kPage - start), size_t(kPage)};
  }
  ssize_t got = process_vm_readv(p.pid, local, k, remote, k, 0);
  if (got < 0 && errno != EFAULT) return peek_mem(p, reinterpret_cast<void*>(a), out, len);  // ENOSYS, EPERM
  if (got < ssize_t(top - a)) return PEEK_TORN;  // the frame's own bytes are not there
  uintptr_t lo = top - uintptr_t(got);
  if (lo != start) std::memmove(buf[n], buf[n] + (lo - start), size_t(got));
  r[n] = Range{lo, top, false};
  ++n;
  return find(a, len, out) ? PEEK_OK : PEEK_TORN;
}

PeekStatus PeekCopy::get(Peek& p, const void* addr, void* out, size_t len, bool& added) {
  // A pointer from a torn copy may be anything: one that no frame can have is a torn read.
  if (uintptr_t(addr) % alignof(void*) != 0 || uintptr_t(addr) >= kUserTop) return PEEK_TORN;
  if (find(uintptr_t(addr), len, out)) return PEEK_OK;
  added = true;
  return add(p, uintptr_t(addr), len, out);
}

// The current frame pointer and the last walk's ranges in one read (see PeekCopy). On 3.11/3.12
// the pointer lives in the C frame that runs the evaluation loop, which changes at every call
// from C into Python (a module's `__call__`, twice a layer in a model): read first, alone.
// Without ranges to read (the first tick, a range gone), plain reads.
PeekStatus peek_snapshot(Peek& p, PyThreadState* t, const void** where, _PyInterpreterFrame** f) {
  PeekCopy& c = p.copy;
  c.n = 0;
  if (p.via != 0 || c.n_next == 0) return peek_current(p, t, where, f);
#if PY_VERSION_HEX >= 0x030D0000
  void* loc = &t->current_frame;
  *where = nullptr;
#else
  _PyCFrame* cf = nullptr;
  PeekStatus s = peek_mem(p, &t->cframe, &cf, sizeof(cf));
  *where = cf;
  *f = nullptr;
  if (s != PEEK_OK || cf == nullptr) return s;
  void* loc = &cf->current_frame;
#endif
  iovec local[PeekCopy::kSlots + 1], remote[PeekCopy::kSlots + 1];
  remote[0] = iovec{loc, sizeof(*f)};
  local[0] = iovec{f, sizeof(*f)};
  size_t k = 1, total = sizeof(*f);
  for (size_t i = 0; i < c.n_next; ++i, ++k) {
    remote[k] = iovec{reinterpret_cast<void*>(c.next[i].lo), size_t(c.next[i].hi - c.next[i].lo)};
    local[k] = iovec{c.buf[i], remote[k].iov_len};
    total += remote[k].iov_len;
  }
  ssize_t got = process_vm_readv(p.pid, local, k, remote, k, 0);
  if (got != ssize_t(total)) {  // a range is gone (the stack shrank out of a chunk), or no read at all
    c.n_next = 0;
    return peek_current(p, t, where, f);  // and, where this read cannot work at all, peek_mem finds out
  }
  for (size_t i = 0; i < c.n_next; ++i) c.r[i] = c.next[i];
  c.n = c.n_next;
  return PEEK_OK;
}

// Thread t's frames, innermost first, as copies of their heads (only `previous`, the code, the
// instruction pointer, the globals and the owner are read from them) and their addresses (`at`).
// A walk of one snapshot stands as it is: Python code calls and returns every few microseconds
// (a model's modules), so a second read of the current frame pointer after the copy often differs
// (measured: a tenth of the ticks of an op-bound training loop, then skipped, and skipped there,
// not at random). Instead every frame is checked as it is placed (its code interned, its
// instruction inside that code: peek_node), and what can come of a frame that changed under the
// copy is the frame that replaced it, another real stack of that instant, or a skipped tick; never
// a fault. Where the walk needed reads of its own after the snapshot, the pointer is read again and
// a walk it moved under is tried again (twice, then taken as it is).
PeekStatus peek_frames(Peek& p, PyThreadState* t, std::vector<_PyInterpreterFrame>& out, std::vector<const void*>& at) {
  PeekCopy& c = p.copy;
  PeekStatus s = PEEK_TORN;
  for (int attempt = 0; attempt < 3; ++attempt) {
    out.clear();
    at.clear();
    _PyInterpreterFrame *first = nullptr, *again = nullptr;
    const void *where = nullptr, *where_again = nullptr;
    bool added = false;
    s = peek_snapshot(p, t, &where, &first);
    if (s != PEEK_OK) {
      if (s == PEEK_UNAVAILABLE) return s;
      continue;
    }
    for (_PyInterpreterFrame* f = first; f != nullptr && s == PEEK_OK; f = out.back().previous) {
      if (out.size() >= kPeekDepth) {
        s = PEEK_DEEP;
        break;
      }
      out.emplace_back();
      at.push_back(f);
      s = c.get(p, f, &out.back(), kFrameHead, added);
    }
    if (s == PEEK_UNAVAILABLE) return s;
    if (s == PEEK_TORN) continue;
    c.keep_used();
    if (!added || attempt == 2) return s;  // PEEK_OK, or PEEK_DEEP
    PeekStatus s2 = peek_current(p, t, &where_again, &again);
    if (s2 == PEEK_UNAVAILABLE) return s2;
    if (s2 == PEEK_OK && again == first && where_again == where) return s;
    s = PEEK_TORN;
  }
  return s;
}

// A new recording: the process's id (it may have forked since: a /proc/self/mem opened before
// reads the parent), both ways of reading tried afresh, no ranges to read again.
void peek_reset(Peek& p) {
  pid_t pid = getpid();
  if (pid != p.pid && p.fd >= 0) {
    close(p.fd);
    p.fd = -1;
  }
  p.pid = pid;
  p.via = 0;
  p.copy.n = p.copy.n_next = 0;
}

// Where a walk of the copies ended up (peek_node).
struct PeekPlace {
  int64_t node = -1;    // the innermost placed frame's node (the base where none is)
  int64_t placed = 0;   // frames placed
  bool torn = false;    // an instruction offset outside its code: a torn copy, nothing placed
  // The outermost frame whose code is not interned, where there is one: the path ends outside it.
  PyObject* unknown = nullptr;
  PyObject* unknown_globals = nullptr;  // its module's dict, as the copy has it (not dereferenced)
  PyObject* caller = nullptr;           // the code of the placed frame that called it (interned)
};

// The instruction offset of a copy's frame in `code`, from pointers alone (nothing is read).
int64_t peek_lasti(const _PyInterpreterFrame* f, PyObject* code) {
  const auto* start = reinterpret_cast<const _Py_CODEUNIT*>(reinterpret_cast<const char*>(code) +
                                                           offsetof(PyCodeObject, co_code_adaptive));
#if PY_VERSION_HEX >= 0x030D0000
  return int64_t(f->instr_ptr - start);
#else
  return int64_t(f->prev_instr - start);
#endif
}

// The copies' frames as a trie node beneath `base`, outermost first (the nodes a read with the GIL
// would give: same code, same line). Frames still where they were at the last walk, with the same
// code at the same instruction, keep their nodes (ts.last, as context() in frames.h does for a
// thread's own walks): from one tick to the next only the innermost few change. Other frames go
// through ts's frame cache; a code is read (its first traceable instruction, its size, its line
// table) only once found interned, under g_trie.mu: see the top of this file.
PeekPlace peek_node(ThreadState& ts, std::vector<_PyInterpreterFrame>& fr, const std::vector<const void*>& at,
                    int64_t base) {
  PeekPlace out;
  int64_t node = base;
  size_t same = 0;  // leading entries of ts.last still true
  bool diverged = false;
  std::lock_guard<std::mutex> lk(g_trie.mu);
  for (size_t j = fr.size(); j-- > 0;) {
    _PyInterpreterFrame* f = &fr[j];
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK) continue;
#endif
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* code = f->f_executable;
#else
    PyObject* code = reinterpret_cast<PyObject*>(f->f_code);
#endif
    const void* addr = at[j];
    int64_t lasti = peek_lasti(f, code);
    size_t k = size_t(out.placed);
    if (!diverged && k < ts.last.size() && std::get<0>(ts.last[k]) == addr && std::get<1>(ts.last[k]) == code &&
        std::get<2>(ts.last[k]) == lasti) {
      node = ts.last_nodes[k];  // placed before, so interned, so alive: nothing to read
      ++out.placed;
      same = k + 1;
      continue;
    }
    diverged = true;
    auto ci = g_trie.code_idx.find(code);
    if (ci == g_trie.code_idx.end()) {
      out.unknown = code;
      out.unknown_globals = f->f_globals;
      break;
    }
    // Alive from here on (interned, g_trie.mu held): the macros may read it.
    if (_PyFrame_IsIncomplete(f)) continue;
    if (lasti < 0 || lasti >= int64_t(Py_SIZE(code))) {
      out.torn = true;
      return out;
    }
    FrameKey key{node, uintptr_t(code), lasti};
    if (const int64_t* it = ts.frames.find(key)) {
      node = *it;
    } else {
      int64_t line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), int(lasti * sizeof(_Py_CODEUNIT)));
      node = intern_node_locked(node, N_PY, ci->second, line);
      ts.frames.put(key, node);
    }
    if (ts.last.size() <= k) {
      ts.last.resize(k + 1);
      ts.last_nodes.resize(k + 1);
    }
    ts.last[k] = std::make_tuple(addr, code, lasti);
    ts.last_nodes[k] = node;
    same = k + 1;
    ++out.placed;
  }
  if (out.placed > 0) out.caller = std::get<1>(ts.last[size_t(out.placed) - 1]);
  ts.last.resize(same);
  ts.last_nodes.resize(same);
  out.node = node;
  return out;
}

constexpr bool kPeekBuilt = true;

#else  // the public frame API: the sampler reads the main thread with the GIL

enum PeekStatus { PEEK_OK, PEEK_TORN, PEEK_DEEP, PEEK_UNAVAILABLE };
constexpr bool kPeekBuilt = false;

#endif

}  // namespace
