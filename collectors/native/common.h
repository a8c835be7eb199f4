// dlpt collector: what every part reads — the headers, the clocks, and the collector's own state
// (whether it records, how the recording was started, the diagnostics flags); and the functions
// that two parts call of each other, declared here so that neither has to come first.
// Every header of collectors/native/ includes this first and then the headers it uses, so
// collector.cpp may include them in any order (one translation unit: builds.py says why).
//
// The collector's state is in five objects, one per part, each at static storage: the trie
// (trie.h), this one, the device side (device.h), the host side (host.h) and GPU memory
// (memory.h). A member of such an object is addressed as a global is (its offset folded into
// the address), so the op callback pays nothing for the grouping: no pointer to follow.
#pragma once

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
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <sys/syscall.h>
#include <unistd.h>

namespace py = pybind11;

namespace {

// Diagnostics for measuring the collector's parts (bench/, docs/BENCHMARKS.md), off in use:
// the op callback returns at once; CUPTI without its callbacks; CUPTI without its activities;
// RecordFunction switched per quiet op; kept in backward; off in backward without CUPTI; CUPTI
// without driver-API callbacks (Triton's launches then go unplaced); no sequence numbers claimed
// by launches in backward (autograd.h). Set by start() from DLPT_DIAG.
struct Diagnostics {
  bool noop = false, no_callbacks = false, no_activities = false, toggle = false, rf_backward = false, bw_off = false,
       no_driver = false, no_launch_claims = false;
  bool no_waits = false;     // nowaits: no sync callbacks, no busy intervals (the collector before host.h)
  bool sampler_gil = false;  // samplergil: the sampler reads the main thread with the GIL too (host.h)
  bool no_kernels = false;   // nokernels: CUPTI without kernel records (copies and memsets only)
  // What a graph launch pays CUPTI for (docs/BENCHMARKS.md, #33): nographcb, no callback on graph
  // launches; nocbids, subscribed with no callback enabled; nokinds, the activity API registered with
  // no activity kind; graphonly, graph-level records and no other kind.
  bool no_graph_cb = false, no_cbids = false, no_kinds = false, graph_only = false;
  bool cb_return = false;  // cbreturn: CUPTI's callbacks enabled as always, dlpt's CUPTI callback returning at once
  bool op_time = false;    // optime: TSC ticks spent in the op callback's recorded path, by part, said at stop()
  bool no_walk = false;    // nowalk: every op placed at its thread's root, no frame walk (what the walk costs)
};

// DLPT_DIAG=optime's sums (collector.cpp enter_op/exit_op): ticks in the parts of a recorded op's
// enter (the thread's state and frame, the op's place, its table entry, the rest) and exit.
struct OpTime {
  std::atomic<int64_t> enters{0}, exits{0}, state{0}, place{0}, entry{0}, rest{0}, exit{0};
};
OpTime g_optime;

// The collector as a whole: whether it records, what start() was asked for, the clocks' origin,
// and the `backward()` calls running (autograd.h).
struct CollectorState {
  std::atomic<bool> host_on{false};  // recording: the op callback records, threads register
  at::CallbackHandle handle = 0;     // the RecordFunction callback, while registered
  bool host_registered = false;
  Diagnostics diag;
  std::atomic<bool> gil_frames{false};  // DLPT_FRAMES=gil: frames read with the GIL (collector.cpp's top)
  PyThreadState* main_tstate = nullptr;  // the thread that started the recording
  // When the recording started, in TSC ticks and steady ns: host times are kept in ticks and
  // converted with the rate measured between the two clocks since then (ns_per_tick).
  int64_t tick0 = 0, ns0 = 0;
  std::atomic<int64_t> backward_ctx{-1};  // the running backward() call's context
  std::atomic<int64_t> bw_unrecorded{0};  // backward() calls running now with RecordFunction off
  std::atomic<uint64_t> bw_calls{0};      // backward() calls begun: a new one may place nodes anew
  // This process is a child forked while recording (collector.cpp, after_fork_in_child): it
  // records nothing and stops nothing.
  std::atomic<bool> forked{false};
};
CollectorState g_collector;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Op host times are read twice per op. Where the clock is a system call (some virtual
// machines give clock_gettime no vDSO path) that alone costs a microsecond per op, so on x86-64
// the collector counts TSC ticks (invariant on the CPUs torch runs on) and converts them to
// nanoseconds with the rate measured against the steady clock over the recording.
#if defined(__x86_64__)
inline int64_t ticks() { return int64_t(__rdtsc()); }
#else
inline int64_t ticks() { return steady_ns(); }
#endif

double ns_per_tick() {
#if defined(__x86_64__)
  while (steady_ns() - g_collector.ns0 < 1000000) {
  }  // a recording shorter than 1 ms: wait that long, for a usable rate
  int64_t dt = ticks() - g_collector.tick0, dn = steady_ns() - g_collector.ns0;
  return dt > 0 ? double(dn) / double(dt) : 1.0;
#else
  return 1.0;
#endif
}

// Calls between parts that each need the other: the device side (device.h) reports busy
// intervals, sync time and collective kernels to the host side (host.h), which includes
// device.h for the lock it shares with it; autograd.h, which device.h includes, asks whether
// CUPTI records.
struct ThreadState;  // trie.h
void busy_add(int64_t device, int64_t start, int64_t end, int64_t launched);  // host.h
void sync_enter(ThreadState& ts, int64_t node);                               // host.h
void sync_exit(ThreadState& ts);                                              // host.h
void collective_kernel_log(int64_t node, int64_t start, int64_t end);         // host.h
bool device_recording();  // device.h: CUPTI's callbacks and activities are on

}  // namespace
