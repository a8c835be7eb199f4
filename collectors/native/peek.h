// dlpt collector: reading the recording's main thread's Python frames from the sampler thread
// without the GIL, the way out-of-process samplers (py-spy) read a process's threads.
// Part of collector.cpp (one translation unit): included there after frames.h, before host.h.
//
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
//   only if it is interned in the trie (g_code_idx, which holds a strong reference, so it is
//   alive) and only while g_mu is held (start() clears the table under g_mu before it lets go of
//   the references). A pointer that is not interned is never followed: the frames inside it are
//   left out and the caller is told (`unknown`);
// - the current-frame pointer is read again after the walk: a different one means the stack
//   changed under the walk, which is then retried; an instruction offset outside its code means a
//   torn copy, likewise;
// - the walk is bounded (kPeekDepth frames), so a torn `previous` that loops cannot hang it.
// Frames are skipped as read_frames (frames.h) skips them: the C stack's entry frames (3.12+) and
// frames that have not started (incomplete).
#pragma once

#include <fcntl.h>
#include <sys/uio.h>

#include <cerrno>

namespace {

#if defined(DLPT_INTERNAL_FRAMES)

constexpr size_t kPeekDepth = 1024;  // deeper stacks are read with the GIL
// The bytes of a frame that are read: everything before its locals.
constexpr size_t kFrameHead = offsetof(_PyInterpreterFrame, localsplus);

enum PeekStatus { PEEK_OK, PEEK_TORN, PEEK_DEEP, PEEK_UNAVAILABLE };

// How memory is copied: process_vm_readv, else /proc/self/mem (a seccomp profile may forbid the
// former), else not at all (the sampler then reads with the GIL). Only the sampler thread reads.
int g_peek_via = 0;  // 0: process_vm_readv, 1: /proc/self/mem, 2: neither works
int g_peek_fd = -1;
pid_t g_peek_pid = 0;  // set by host_start (glibc does not cache getpid: a system call each)

// Copies n bytes at addr: PEEK_OK, PEEK_TORN where the memory is not there (or only partly),
// PEEK_UNAVAILABLE where this process cannot read itself this way.
PeekStatus peek_mem(const void* addr, void* out, size_t n) {
  if (g_peek_via == 0) {
    iovec local{out, n}, remote{const_cast<void*>(addr), n};
    ssize_t r = process_vm_readv(g_peek_pid, &local, 1, &remote, 1, 0);
    if (r == ssize_t(n)) return PEEK_OK;
    if (r >= 0 || errno == EFAULT) return PEEK_TORN;
    g_peek_via = 1;  // ENOSYS, EPERM (seccomp): try the other way
  }
  if (g_peek_via == 1) {
    if (g_peek_fd < 0) g_peek_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (g_peek_fd >= 0) {
      ssize_t r = pread(g_peek_fd, out, n, off_t(uintptr_t(addr)));
      if (r == ssize_t(n)) return PEEK_OK;
      if (r >= 0 || errno == EIO || errno == EFAULT) return PEEK_TORN;
    }
    g_peek_via = 2;
  }
  return PEEK_UNAVAILABLE;
}

// Thread t's innermost interpreter frame pointer (t is alive: the recording's main thread).
PeekStatus peek_current(PyThreadState* t, _PyInterpreterFrame** f) {
  *f = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  return peek_mem(&t->current_frame, f, sizeof(*f));
#else
  _PyCFrame* cf = nullptr;
  PeekStatus s = peek_mem(&t->cframe, &cf, sizeof(cf));
  if (s != PEEK_OK || cf == nullptr) return s;
  return peek_mem(&cf->current_frame, f, sizeof(*f));
#endif
}

// A copy of the memory just below a frame, where its callers' frames usually are (a thread's
// frames are pushed one after another on its data stack, 16 KiB chunks and up): one read, in
// pages from the highest down, gives a stack's frames a few dozen at a time, not one a system call
// (measured: about 1.5 µs a call here). A page that is not there ends the copy, not the read.
struct PeekWindow {
  static constexpr uintptr_t kPage = 4096, kPages = 3;
  alignas(64) unsigned char buf[kPage * kPages];
  uintptr_t lo = 0, hi = 0;  // buf[0, hi - lo) holds [lo, hi)

  PeekStatus get(const void* addr, void* out, size_t n) {
    uintptr_t a = uintptr_t(addr), end = a + n;
    if (a >= lo && end <= hi && end > a) {
      std::memcpy(out, buf + (a - lo), n);
      return PEEK_OK;
    }
    if (g_peek_via != 0 || end < a || end < kPage * kPages) return peek_mem(addr, out, n);
    iovec local[kPages + 1], remote[kPages + 1];
    uintptr_t start = end - kPage * kPages, top = end;
    size_t k = 0;
    while (top > start) {  // [floor, top) for each page, the highest first
      uintptr_t floor = std::max(start, (top - 1) & ~(kPage - 1));
      remote[k] = iovec{reinterpret_cast<void*>(floor), size_t(top - floor)};
      local[k] = iovec{buf + (floor - start), size_t(top - floor)};
      ++k;
      top = floor;
    }
    ssize_t r = process_vm_readv(g_peek_pid, local, k, remote, k, 0);
    if (r < 0 && errno != EFAULT) return peek_mem(addr, out, n);  // ENOSYS, EPERM: peek_mem says
    if (r < ssize_t(n)) return PEEK_TORN;
    // The copy holds [end - r, end): move it to the start of buf.
    lo = end - uintptr_t(r);
    hi = end;
    if (lo != start) std::memmove(buf, buf + (lo - start), size_t(r));
    std::memcpy(out, buf + (a - lo), n);
    return PEEK_OK;
  }
};
PeekWindow g_peek_window;  // the sampler's

// Thread t's frames, innermost first, as copies of their heads (only `previous`, the code, the
// instruction pointer and the owner are read from them). Retried twice when the stack changed
// under the walk.
PeekStatus peek_frames(PyThreadState* t, std::vector<_PyInterpreterFrame>& out) {
  PeekStatus s = PEEK_TORN;
  for (int attempt = 0; attempt < 3; ++attempt) {
    out.clear();
    g_peek_window.lo = g_peek_window.hi = 0;  // what it held may have changed
    _PyInterpreterFrame *first = nullptr, *again = nullptr;
    s = peek_current(t, &first);
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
      s = g_peek_window.get(f, &out.back(), kFrameHead);
    }
    if (s == PEEK_UNAVAILABLE) return s;
    if (s == PEEK_TORN) continue;
    PeekStatus s2 = peek_current(t, &again);
    if (s2 == PEEK_UNAVAILABLE) return s2;
    if (s2 == PEEK_OK && again == first) return s;  // PEEK_OK, or PEEK_DEEP for a stable deep stack
    s = PEEK_TORN;
  }
  return s;
}

// The copies' frames as a trie node beneath `base`, outermost first, through ts's frame cache
// (the nodes a read with the GIL would give: same code, same line). Frames whose code is not
// interned end the path: `unknown` is set and the node is that of the frames outside them
// (`placed` counts the frames placed); `torn` is set where an instruction offset lies outside
// its code. Takes g_mu: see the top of this file.
int64_t peek_node(ThreadState& ts, std::vector<_PyInterpreterFrame>& fr, int64_t base, bool& unknown, bool& torn,
                  int64_t& placed) {
  unknown = torn = false;
  placed = 0;
  int64_t node = base;
  std::lock_guard<std::mutex> lk(g_mu);
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
    auto ci = g_code_idx.find(code);
    if (ci == g_code_idx.end()) {
      unknown = true;
      break;
    }
    // Alive from here on (interned, g_mu held): the macros may read it.
    if (_PyFrame_IsIncomplete(f)) continue;
    int64_t lasti = int64_t(_PyInterpreterFrame_LASTI(f));
    if (lasti < 0 || lasti >= int64_t(Py_SIZE(code))) {
      torn = true;
      return -1;
    }
    FrameKey k{node, uintptr_t(code), lasti};
    auto it = ts.frames.find(k);
    if (it != ts.frames.end()) {
      node = it->second;
    } else {
      int64_t line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), int(lasti * sizeof(_Py_CODEUNIT)));
      int64_t n = intern_node_locked(node, N_PY, ci->second, line);
      ts.frames.emplace(k, n);
      node = n;
    }
    ++placed;
  }
  return node;
}

constexpr bool kPeekBuilt = true;

#else  // the public frame API: the sampler reads the main thread with the GIL

enum PeekStatus { PEEK_OK, PEEK_TORN, PEEK_DEEP, PEEK_UNAVAILABLE };
constexpr bool kPeekBuilt = false;

#endif

}  // namespace
