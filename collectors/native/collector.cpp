// dlpt's online collector (DESIGN §2): a RecordFunction callback and, on CUDA builds, CUPTI,
// aggregating straight into a calling-context trie. Nothing is kept per event: an op adds its
// host time to its node, a kernel/copy/memset adds its duration, bytes and count to its
// (node, name) leaf, and the Python side (collectors/record/) turns the trie into a profile.
//
// The trie's nodes are raw contexts — a Python frame is (code object, line), an op is its
// name — and Python resolves them to files, functions and dlpt's frames. One rule each:
// - an op entered with no op of ours open on its thread reads that thread's Python frames,
//   innermost first, each at its *current* line (so `x + y` lands on its own line); the ops it
//   calls inside the dispatcher are not recorded apart (the callback returns at once beneath
//   it), so its kernels and host time count on it; Python it calls back into has its own lines;
// - a backward op goes under the node of the forward op that made its autograd node — the op
//   during which the node's sequence number was taken, on the forward thread — beneath a
//   [backward] marker; without a match, under the `backward()` call that is running (set from
//   Python), else the calling thread's own context (`backward_parent`, frames.h). The backward
//   op is RecordFunction's (BACKWARD_FUNCTION scope) in CPU recordings, and autograd's current
//   node at each launch when CUPTI records (autograd.h says why);
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

// Each header includes what it uses (common.h first), so their order here does not matter.
#include "common.h"    // the headers, the clocks, the collector's own state
#include "autograd.h"  // backward work found through autograd's current node
#include "device.h"    // CUPTI: kernels, copies and memsets into their leaves
#include "frames.h"    // the calling thread's Python frames
#include "host.h"      // host time, sync time, GPU busy intervals
#include "memory.h"    // GPU memory by line: the caching allocator's events
#include "peek.h"      // the main thread's frames read without the GIL, for the sampler
#include "trie.h"      // the trie, per-thread state, backward links

#include <pthread.h>  // pthread_atfork: a forked child records nothing (after_fork_in_child)

#include <future>
#include <new>

namespace {

// ----- the RecordFunction callback -----

// Whether an op runs no Python of its own, so nothing beneath it needs a line: an aten/c10 op
// (a name with "::"), except autograd's evaluate_function wrapper, whose child is the backward
// op; and a backward node that torchgen generated from derivatives.yaml (`AddmmBackward0`:
// "Backward" and a number), whose inner ops (mm, t, sum...) would otherwise each take
// RecordFunction's cost, the backward pass's larger half. A custom Function's backward
// (`MyFnBackward`, `CompiledFunctionBackward`) runs Python and stays open.
bool quiet_beneath(const char* nm, bool backward) {
  if (std::strstr(nm, "::") != nullptr) return std::strncmp(nm, "autograd::engine::evaluate_function", 35) != 0;
  if (!backward) return false;
  size_t n = std::strlen(nm), d = n;
  while (d > 0 && nm[d - 1] >= '0' && nm[d - 1] <= '9') --d;
  return d < n && d >= 8 && std::strncmp(nm + d - 8, "Backward", 8) == 0;
}

// An op's node under `parent`, and whether it is quiet and a collective, through the thread's
// op table (trie.h): the name's text is hashed, looked up and scanned only the first time. Names
// that torch builds per call — a backward node's, autograd's evaluate_function wrapper's, a short
// one kept inside the RecordFunction itself — are not entered there: each call's is at another
// address, or another name is at the same one; they go through the `ops` map (`scratch` holds
// their entry).
const OpEntry& op_entry(ThreadState& ts, const at::RecordFunction& fn, int64_t parent, bool backward, OpEntry& scratch) {
  const char* name = fn.name();
  const char* nm = name ? name : "";
  if (const OpEntry* e = ts.op_table.find(parent, nm, backward)) return *e;
  int64_t node = op_node(ts, parent, nm);
  bool quiet = quiet_beneath(nm, backward);
  // A collective's calls are few (a step's buckets) and each one's start is what tells which
  // rank the others wait for (host.h), so they are logged, not only summed. Backward ones too:
  // DDP's buckets are all-reduced from hooks that run inside the backward pass.
  bool coll = std::strncmp(nm, "c10d::", 6) == 0;
  auto at = reinterpret_cast<uintptr_t>(nm), self = reinterpret_cast<uintptr_t>(&fn);
  bool per_call = backward || (at >= self && at < self + sizeof(at::RecordFunction)) ||
                  std::strncmp(nm, "autograd::engine::evaluate_function", 35) == 0;
  if (!per_call) return ts.op_table.put(parent, nm, backward, node, quiet, coll);
  scratch = OpEntry{node, nullptr, quiet, coll};
  return scratch;
}

// An op entered with no quiet op open on this thread (on_enter's rarer path, kept out of line so
// that the common one, beneath a quiet op, saves and restores no registers).
__attribute__((noinline)) void enter_op(const at::RecordFunction& fn) {
  const bool timed = g_collector.diag.op_time;
  int64_t c0 = timed ? ticks() : 0;
  ThreadState& ts = tstate();
  ++ts.n_ops;
  uint64_t epoch = ts.epoch;
  if (!g_collector.host_on.load(std::memory_order_relaxed)) {
    ts.stack.push_back(OpenOp{-1, 0, 0, 0, nullptr, false, false, 0});  // keeps enter/exit paired while switching off
    return;
  }
  PyThreadState* py = PyGILState_GetThisThreadState();
  const void* frame = current_pyframe(py);
  bool backward = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  int64_t t0 = ticks();
  int64_t parent;
  if (backward) {
    parent = backward_parent(ts, fn.forwardThreadId(), fn.seqNr());
  } else {
    parent = g_collector.diag.no_walk ? thread_base(ts, py) : current_node(ts, frame, py);
    if (ts.stack.empty()) host_op_entered(ts);  // the sampler reads other threads less often (host.h)
  }
  int64_t c2 = timed ? ticks() : 0;
  OpEntry scratch;
  const OpEntry& op = op_entry(ts, fn, parent, backward, scratch);
  int64_t c3 = timed ? ticks() : 0;
  // The ops an op calls inside the dispatcher are its own business: their kernels, copies and
  // host time count on it, and the callback returns at once for them (`ts.quiet`) until it
  // returns. The one exceptions: autograd's evaluate_function wrapper, whose child is the
  // backward op itself, and ops that run Python — a custom autograd Function (named by its
  // class, no "::") or a compiled region ("Torch-Compiled Region: 0/0") — whose ops and
  // launches keep their own lines. (Python that a quiet op calls back into still gets its lines
  // for what it launches.) Switching RecordFunction off on the thread instead would spare the
  // inner ops torch's machinery, but each switch rebuilds torch's per-thread callback cache:
  // counted with callgrind on nanoGPT's step, two switches cost more than the machinery of the
  // 2-3 inner ops an op has on average (DLPT_DIAG=toggle switches, for comparison).
  if (op.quiet) {
    if (g_collector.diag.toggle) at::enableRecordFunction(false);
    else ++ts.quiet;
  }
  ts.stack.push_back(OpenOp{op.node, t0, 0, epoch, frame, backward, op.quiet, int64_t(at::sequence_number::peek()),
                            op.coll});
  if (timed) {
    int64_t c4 = ticks();
    g_optime.enters.fetch_add(1, std::memory_order_relaxed);
    g_optime.state.fetch_add(t0 - c0, std::memory_order_relaxed);
    g_optime.place.fetch_add(c2 - t0, std::memory_order_relaxed);
    g_optime.entry.fetch_add(c3 - c2, std::memory_order_relaxed);
    g_optime.rest.fetch_add(c4 - c3, std::memory_order_relaxed);
  }
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (g_collector.diag.noop) return nullptr;
  // Beneath a quiet op (most ops: those an op calls inside the dispatcher) only a count. Read
  // before tstate()'s checks of the recording and the phase, which change nothing here.
  ThreadState* s = t_state;
  if (s != nullptr && s->quiet > 0) {
    ++s->n_ops;
    ++s->skipped;
    return nullptr;
  }
  enter_op(fn);
  return nullptr;
}

// A recorded op's exit (on_exit's rarer path, out of line like enter_op).
__attribute__((noinline)) void exit_op(ThreadState* s) {
  if (s->stack.empty()) return;
  OpenOp op = s->stack.back();
  s->stack.pop_back();
  if (op.quiet) {
    if (g_collector.diag.toggle) at::enableRecordFunction(true);
    else --s->quiet;
  }
  if (op.node < 0) return;
  if (op.seq0 >= 0) {
    // Every autograd node the op made (its own and those of the ops inside it) took a sequence
    // number from op.seq0 on: their backward ops belong to this op — or to the innermost
    // recorded op inside it that made them, which exited first and claimed its numbers. A
    // backward op too: under create_graph=True it makes the nodes of the next order's backward.
    int64_t seq1 = int64_t(at::sequence_number::peek());
    if (seq1 > op.seq0) seq_claim(s->rf_tid, op.seq0, seq1, op.node);
  }
  int64_t dur = ticks() - op.t0;
  if (op.epoch == g_trie.epoch.load(std::memory_order_relaxed)) {
    int64_t self = dur - op.child;
    (*g_trie.cpu)[op.node].fetch_add(self > 0 ? self : 0, std::memory_order_relaxed);
    if (op.coll) collective_log(op.node, op.t0, op.t0 + dur);
  }
  if (!s->stack.empty()) s->stack.back().child += dur;
}

void on_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (g_collector.diag.noop) return;
  ThreadState* s = t_state;
  if (s == nullptr) return;
  if (s->skipped > 0) {
    --s->skipped;
    return;
  }
  if (g_collector.diag.op_time && !s->stack.empty() && s->stack.back().node >= 0) {  // a recorded op's exit
    int64_t c0 = ticks();
    exit_op(s);
    g_optime.exit.fetch_add(ticks() - c0, std::memory_order_relaxed);
    g_optime.exits.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  exit_op(s);
}

}  // namespace



namespace {

// ----- the Python binding -----

std::string switch_on(bool device, bool host) {
  g_collector.host_on.store(true);
  if (host && !g_collector.host_registered) {
    g_collector.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit)
                                         .needsInputs(false)
                                         .needsOutputs(false)
                                         .needsIds(false)
                                         .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    g_collector.host_registered = true;
  }
#if defined(DLPT_CUPTI)
  if (device) {
    g_device.cupti_error = device_on();
    return g_device.cupti_error;
  }
#else
  (void)device;
#endif
  return "";
}

// Start a recording: a fresh trie, the host callback, and CUPTI when asked. Returns "" when the
// device side is on (or was not asked for), else why it could not start.
std::string start(bool device, bool gil_frames, bool host, const std::string& diag, int64_t sample_ns,
                  int64_t phase) {
  g_collector.forked.store(false);  // a recording started in a forked child is the child's own
  g_collector.diag.noop = diag.find("noop") != std::string::npos;
  g_collector.diag.no_callbacks = diag.find("nocallbacks") != std::string::npos;
  g_collector.diag.no_activities = diag.find("noactivities") != std::string::npos;
  g_collector.diag.toggle = diag.find("toggle") != std::string::npos;
  g_collector.diag.rf_backward = diag.find("rfbackward") != std::string::npos;
  g_collector.diag.bw_off = diag.find("bwoff") != std::string::npos;
  g_collector.diag.no_driver = diag.find("nodriver") != std::string::npos;  // runtime API callbacks only
  g_collector.diag.no_launch_claims = diag.find("nolaunchclaims") != std::string::npos;
  g_collector.diag.no_waits = diag.find("nowaits") != std::string::npos;
  g_collector.diag.sampler_gil = diag.find("samplergil") != std::string::npos;
  g_collector.diag.no_kernels = diag.find("nokernels") != std::string::npos;
  g_collector.diag.no_graph_cb = diag.find("nographcb") != std::string::npos;
  g_collector.diag.no_cbids = diag.find("nocbids") != std::string::npos;
  g_collector.diag.no_kinds = diag.find("nokinds") != std::string::npos;
  g_collector.diag.graph_only = diag.find("graphonly") != std::string::npos;
  // Names are found as substrings: no name may hold another's ("cbnoop" held "noop").
  g_collector.diag.cb_return = diag.find("cbreturn") != std::string::npos;
  g_collector.diag.op_time = diag.find("optime") != std::string::npos;
  g_collector.diag.no_walk = diag.find("nowalk") != std::string::npos;
  for (auto* a : {&g_optime.enters, &g_optime.exits, &g_optime.state, &g_optime.place, &g_optime.entry,
                  &g_optime.rest, &g_optime.exit})
    a->store(0);  // this recording's alone
  if (g_trie.nodes == nullptr) {
    g_trie.nodes = new Chunked<Node>();
    g_trie.cpu = new Chunked<std::atomic<int64_t>>();
    g_device.corr = new CorrSlot[kCorrSize];
    for (auto& s : g_trie.seq) s.store(nullptr);
  }
  std::vector<PyObject*> codes;
  {
    std::lock_guard<std::mutex> lk(g_trie.mu);
    codes.swap(g_trie.codes);
    g_trie.index.clear();
    g_trie.code_idx.clear();
    g_trie.names.clear();
    g_trie.name_idx.clear();
    g_trie.n_nodes.store(0);
    intern_node_locked(-1, N_ROOT, 0, 0);
  }
  for (PyObject* c : codes) Py_DECREF(c);
  {
    std::lock_guard<std::mutex> lk(g_device.leaf_mu);
    g_device.leaves.clear();
    g_device.leaf_idx.clear();
    g_device.kernel_name_cache.clear();
    g_device.no_launch_node = -1;
#if defined(DLPT_CUPTI)
    graphs_clear_locked();
#endif
  }
#if defined(DLPT_CUPTI)
  pcs_clear();
#endif
  seq_clear();
  g_device.records = 0;
  g_device.unlinked = 0;
  g_trie.dropped_nodes = 0;
  g_collector.backward_ctx = -1;
  g_trie.epoch.fetch_add(1);
  {
    // Phases (trie.h): `phase` is the one the recording starts in; below 0, none (one tree).
    std::lock_guard<std::mutex> lk(g_trie.phase_mu);
    g_trie.phase_log.clear();
    g_trie.compile_depth = 0;
    g_trie.phase_node.store(0);
    g_trie.phase_gen.fetch_add(1);
    g_trie.phase_auto.store(phase == P_STARTUP);
    if (phase >= 0) {
      g_trie.phase_base = phase;
      phase_apply_locked();
    }
  }
  g_collector.gil_frames = gil_frames;
  g_collector.main_tstate = PyThreadState_Get();
  g_collector.tick0 = ticks();
  g_collector.ns0 = steady_ns();
  host_start(sample_ns, device);
#if defined(DLPT_CUPTI)
  memory_start(device);
#endif
  return switch_on(device, host);
}

// ----- fork -----
// A program that forks while recording (DataLoader workers, multiprocessing's fork pools, a
// bare os.fork) gets a child with one thread, the one that called fork(). A mutex of the
// collector's that another thread held at that moment (the sampler's, CUPTI's activity thread's,
// which holds leaf_mu per buffer, a snapshot's) stays locked in the child for good, and the
// child's first op that interns a new frame would wait on it: a DataLoader worker hangs, and
// its parent waits for the batch without end. The child records nothing: what it recorded would
// end with it (workers leave by os._exit), and the profile is the parent's. So fork() runs this
// in the child before returning there: the op callback returns at once from then on, the device
// and memory sides are off, and every other entry point the child can still reach (the phase,
// backward, thread and step calls from Python, CUPTI's callbacks) returns at once on `forked`.
// Every mutex and condition variable is made anew as well, for what is left: a child that ends
// normally runs the static destructors, and destroying a condition variable the parent's
// sampler was waiting on waits for good. The parent's threads, which do not exist in the child,
// are forgotten rather than joined. The Python side takes its hooks out, and neither stops nor
// saves in the child (collectors/record/session.py, recording.py).
void after_fork_in_child() {
  g_collector.forked.store(true);
  g_collector.diag.noop = true;  // on_enter/on_exit return before they touch any state
  g_collector.host_on.store(false);
  for (std::mutex* m : {&g_trie.mu, &g_trie.phase_mu, &g_trie.threads_mu, &g_trie.seq_mu, &g_host.mu,
                        &g_host.sampler_mu, &g_host.coll.mu, &g_host.coll_k.mu, &g_device.leaf_mu})
    new (m) std::mutex();
  new (&g_host.sampler_cv) std::condition_variable();
  new (&g_host.gil_cv) std::condition_variable();
  g_host.sampler = nullptr;  // the thread objects are left as they are: destroying one would end the process
  g_host.gil_worker = nullptr;
  g_host.peek_on.store(false);
#if defined(DLPT_CUPTI)
  g_device.on.store(false);
  g_device.detach.store(false);  // no cuptiFinalize, no graph-level toggle, no sampling at a CUDA call's exit
  g_device.graph_restore.store(false);
  g_pcs.wanted.store(false);
  for (std::mutex* m : {&g_device.cupti_mu, &g_device.graph_mu, &g_memory.mu, &g_pcs.mu}) new (m) std::mutex();
  g_memory.on.store(false);
#endif
}

// For tests (tests/test_fork.py): a thread that holds the trie's, the host side's and the
// leaves' mutexes for `seconds`, as the sampler or CUPTI's activity thread may hold them at the
// moment the program forks; returns once they are held (called without the GIL, so a thread
// that holds the GIL while it waits for one of them does not stall the caller). std::scoped_lock
// takes them without an order of its own, so it cannot deadlock with a thread that takes two of
// them in the collector's.
void hold_locks(double seconds) {
  auto held = std::make_shared<std::promise<void>>();
  std::future<void> ready = held->get_future();
  std::thread([seconds, held] {
    std::scoped_lock lk(g_trie.mu, g_host.mu, g_device.leaf_mu);
    held->set_value();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }).detach();
  ready.wait();
}

// In a forked child, from the Python side's at-fork hook (collectors/record/session.py), once
// fork() has returned there: the op callback taken out of torch, so that the child's ops (a
// DataLoader worker's transforms) do not pay RecordFunction's machinery (1.12x an op-bound
// loop's instructions, counted: docs/BENCHMARKS.md) for a recording that is not theirs. Not in
// after_fork_in_child: torch's registry takes a mutex, which no thread holds at a fork from
// Python (registering holds the GIL, and so does os.fork).
void forget_callback() {
  if (!g_collector.forked.load() || !g_collector.host_registered) return;
  at::removeCallback(g_collector.handle);
  g_collector.host_registered = false;
}

// Everything off: the callback removed (the rest of the program runs at unprofiled speed),
// CUPTI's activities flushed into the trie and disabled. In a forked child, nothing: its
// recording was never on (after_fork_in_child).
void stop() {
  if (g_collector.forked.load()) return;
  if (g_collector.diag.op_time) {  // ns per recorded op, by part (a diagnostic: docs/BENCHMARKS.md)
    double n = double(std::max<int64_t>(1, g_optime.enters.load())), r = ns_per_tick();
    std::fprintf(stderr, "dlpt optime: %lld ops entered, %lld exited; ns per op: state %.1f, place %.1f, entry %.1f, "
                 "rest %.1f, exit %.1f\n", (long long)g_optime.enters.load(), (long long)g_optime.exits.load(),
                 g_optime.state.load() * r / n, g_optime.place.load() * r / n, g_optime.entry.load() * r / n,
                 g_optime.rest.load() * r / n,
                 g_optime.exit.load() * r / double(std::max<int64_t>(1, g_optime.exits.load())));
  }
  host_stop();
#if defined(DLPT_CUPTI)
  memory_stop();
#endif
  g_collector.host_on.store(false);
  if (g_collector.host_registered) {
    at::removeCallback(g_collector.handle);
    g_collector.host_registered = false;
  }
#if defined(DLPT_CUPTI)
  device_off();
#endif
}

void flush(bool forced) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
#if defined(DLPT_CUPTI)
  device_flush_if_on(forced);
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
    std::lock_guard<std::mutex> lk(g_trie.mu);
    int64_t n = g_trie.n_nodes.load(std::memory_order_acquire);
    double rate = ns_per_tick();  // host times are kept in ticks
    parent.resize(n);
    kind.resize(n);
    a.resize(n);
    b.resize(n);
    cpu.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      const Node& x = (*g_trie.nodes)[i];
      parent[i] = x.parent;
      kind[i] = x.kind;
      a[i] = x.a;
      b[i] = x.b;
      cpu[i] = int64_t(double((*g_trie.cpu)[i].load(std::memory_order_relaxed)) * rate + 0.5);
    }
    for (size_t i = size_t(std::max<int64_t>(codes_from, 0)); i < g_trie.codes.size(); ++i) codes.push_back(g_trie.codes[i]);
    for (size_t i = size_t(std::max<int64_t>(names_from, 0)); i < g_trie.names.size(); ++i) names.push_back(g_trie.names[i]);
  }
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(g_device.leaf_mu);
    leaves.reserve(g_device.leaves.size() * 10);
    auto put = [&leaves](const Leaf& l) {
      int64_t row[10] = {l.node, l.kind, l.name, l.count, l.total, l.minv, l.maxv, l.bytes, l.device, l.stream};
      leaves.insert(leaves.end(), row, row + 10);
    };
#if defined(DLPT_CUPTI)
    // Graph replays traced per graph, spread over their kernels (device.h), merged into the
    // traced leaves of the same nodes, so a snapshot never holds one leaf twice.
    if (g_device.graph_replays.empty())  // no replay traced per graph: the leaves as they are, no copy
      for (const Leaf& l : g_device.leaves) put(l);
    else
      for (const Leaf& l : graph_leaves_locked()) put(l);
#else
    for (const Leaf& l : g_device.leaves) put(l);
#endif
  }
  py::list pcodes, pnames;
  for (PyObject* c : codes) pcodes.append(py::reinterpret_borrow<py::object>(c));
  for (const std::string& s : names)
    pnames.append(py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace")));
  return py::make_tuple(as_bytes(parent), as_bytes(kind), as_bytes(a), as_bytes(b), as_bytes(cpu), as_bytes(leaves),
                        pcodes, pnames);
}


template <typename T>
py::bytes column(const std::vector<T>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Host time, sync time and the GPU's busy intervals so far (host.h), as int64 columns:
// host_node/host_ns and sync_node/sync_ns per node; the host intervals (iv_*: start, end, node,
// thread id, in-sync; steady clock), the open ones up to now; busy intervals per device
// (busy_device/busy_start/busy_end, merged; CUPTI's clock); the window (steady clock, end 0
// while recording), CUPTI's clock offset, the threads that launched GPU work.
py::dict host_snapshot() {
  std::vector<int64_t> hn, hv, sn, sv, is, ie, in, it, iy, bd, bs, be, rd, rs, re, launch_tids, pt, pp;
  int64_t w0, w1, now = steady_ns();
  {
    py::gil_scoped_release nogil;
    {
      std::lock_guard<std::mutex> lk(g_host.mu);
      for (auto& [n, v] : g_host.host_ns) hn.push_back(n), hv.push_back(v);
      for (auto& [n, v] : g_host.sync_ns) sn.push_back(n), sv.push_back(v);
      auto put = [&](const HostInterval& x) {
        is.push_back(x.start), ie.push_back(x.end), in.push_back(x.node), it.push_back(x.tid), iy.push_back(x.sync);
      };
      for (const HostInterval& x : g_host.intervals) put(x);
      int64_t open_end = g_host.window_open.load() ? now : g_host.window_end;
      if (g_host.keep_intervals)
        for (auto& [tid, r] : g_host.runs)
          if (r.node >= 0 && open_end > r.start) put(HostInterval{r.start, open_end, r.node, tid, r.sync});
      w0 = g_host.window_start;
      w1 = g_host.window_open.load() ? 0 : g_host.window_end;
    }
    {
      std::lock_guard<std::mutex> lk(g_device.leaf_mu);
      for (auto& [d, b] : g_host.busy) {
        busy_merge(b);
        for (auto& [x, y] : b.iv) bd.push_back(d), bs.push_back(x), be.push_back(y);
      }
      for (auto& [d, b] : g_host.ready) {
        busy_merge(b);
        for (auto& [x, y] : b.iv) rd.push_back(d), rs.push_back(x), re.push_back(y);
      }
    }
    {
      std::lock_guard<std::mutex> lk(g_trie.threads_mu);
      for (ThreadState* t : g_trie.threads)
        if (t->launched.load(std::memory_order_relaxed) && t->epoch == g_trie.epoch.load()) launch_tids.push_back(t->tid);
    }
    {
      std::lock_guard<std::mutex> lk(g_trie.phase_mu);
      for (auto& [t, p] : g_trie.phase_log) pt.push_back(t), pp.push_back(p);
    }
  }
  py::dict d;
  d["host_node"] = column(hn);
  d["host_ns"] = column(hv);
  d["sync_node"] = column(sn);
  d["sync_ns"] = column(sv);
  d["iv_start"] = column(is);
  d["iv_end"] = column(ie);
  d["iv_node"] = column(in);
  d["iv_tid"] = column(it);
  d["iv_sync"] = column(iy);
  d["busy_device"] = column(bd);
  d["busy_start"] = column(bs);
  d["busy_end"] = column(be);
  d["ready_device"] = column(rd);  // work queued: launch to start, merged (CUPTI's clock)
  d["ready_start"] = column(rs);
  d["ready_end"] = column(re);
  d["launch_tids"] = column(launch_tids);
  d["phase_t"] = column(pt);  // each phase change (steady clock) and the phase it started
  d["phase_id"] = column(pp);
  d["window_start"] = w0;
  d["window_end"] = w1;
  d["now"] = now;
#if defined(DLPT_CUPTI)
  d["cupti_offset"] = g_device.cupti_offset;
#else
  d["cupti_offset"] = 0;
#endif
  {
    // Collective calls and kernels, in the steady clock, and (below) the wall clock's offset from
    // it now: ranks on one host share the steady clock; ranks on several compare in the wall clock.
    py::gil_scoped_release nogil;
    double rate = ns_per_tick();
    CollColumns calls = g_host.coll.columns([rate](int64_t t) { return g_collector.ns0 + int64_t(double(t - g_collector.tick0) * rate); });
#if defined(DLPT_CUPTI)
    const int64_t cupti = g_device.cupti_offset;
#else
    const int64_t cupti = 0;  // without CUPTI no kernel is logged
#endif
    CollColumns kernels = g_host.coll_k.columns([cupti](int64_t t) { return t - cupti; });
    py::gil_scoped_acquire gil;
    for (auto& [prefix, cols] : {std::pair<const char*, CollColumns*>{"coll", &calls}, {"collk", &kernels}}) {
      std::string p(prefix);
      d[(p + "_node").c_str()] = column(cols->node);
      d[(p + "_start").c_str()] = column(cols->start);
      d[(p + "_end").c_str()] = column(cols->end);
      d[(p + "_dropped").c_str()] = cols->dropped;
    }
  }
  d["realtime_offset"] = int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::system_clock::now().time_since_epoch()).count()) - steady_ns();
  d["samples"] = g_host.samples.load();
  d["sample_waits"] = g_host.sample_waits.load();
  d["peek_samples"] = g_host.peek_samples.load();
  d["sample_skips"] = g_host.peek_skips.load();
  d["main_read"] = host_main_read();
  d["sample_period_ns"] = g_host.sample_period_ns;
  return d;
}

// Called first thing in a thread dlpt saw start: its work goes under `start_node` (the line
// that started it) and a [thread] node; the frames on its stack now are dlpt's, not the program's.
void register_thread(int64_t start_node, int64_t key) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  if (start_node < 0 || !g_collector.host_on.load()) return;  // started while dlpt was not recording
  ThreadState& ts = tstate();
  ts.base = intern_node(start_node, N_THREAD, key, 0);
  ts.forget_walk();
  PyThreadState* t = PyGILState_GetThisThreadState();
  ts.cut = 0;
  if (t != nullptr) {
    read_frames(ts, t);
    ts.cut = int64_t(ts.walk.size());
  }
}

py::dict capabilities() {
  py::dict d;
#if defined(DLPT_CUPTI)
  d["cupti"] = true;
  d["cupti_error"] = g_device.cupti_error;
#else
  d["cupti"] = false;
  d["cupti_error"] = "";
#endif
#if defined(DLPT_INTERNAL_FRAMES)
  d["frames"] = g_collector.gil_frames.load() ? "internal+gil" : "internal";
#else
  d["frames"] = "public+gil";
#endif
  return d;
}

// --pc-samples (pcsampling.h): the samples as int64 columns (node, name, file, line, reason,
// samples; file -1: no line table), CUPTI's stall reason names by index, and the counts CUPTI
// gave. Taken before the trie's snapshot, so every node and name it holds is in that snapshot.
py::dict pc_samples() {
  py::dict d;
#if defined(DLPT_CUPTI)
  std::vector<int64_t> node, name, file, line, reason, samples;
  std::vector<std::string> reasons;
  std::string error;
  std::vector<std::pair<const char*, int64_t>> counts;
  {
    py::gil_scoped_release nogil;  // nothing of Python's is touched in here
    if (g_device.on.load() && g_pcs.wanted) {
      std::lock_guard<std::mutex> lk(g_device.cupti_mu);
      pcs_drain_all();
    }
    std::lock_guard<std::mutex> lk(g_pcs.mu);
    for (const auto& kv : g_pcs.samples) {
      node.push_back(kv.first.node);
      name.push_back(kv.first.name);
      file.push_back(kv.first.file);
      line.push_back(kv.first.line);
      reason.push_back(kv.first.reason);
      samples.push_back(kv.second);
    }
    reasons = g_pcs.reason_names;
    error = g_pcs.error;
    counts = {{"period_exponent", g_pcs.period_read}, {"total", g_pcs.total}, {"dropped", g_pcs.dropped},
              {"non_user", g_pcs.non_user}, {"buffer_full", g_pcs.buffer_full}, {"drains", g_pcs.drains},
              {"get_errors", g_pcs.get_errors}, {"cubins", int64_t(g_pcs.cubins.size())},
              {"cubin_bytes", g_pcs.cubin_bytes}, {"contexts", int64_t(g_pcs.contexts.size())}};
  }
  d["error"] = error;
  for (const auto& kv : counts) d[kv.first] = kv.second;
  d["node"] = as_bytes(node);
  d["name"] = as_bytes(name);
  d["file"] = as_bytes(file);
  d["line"] = as_bytes(line);
  d["reason"] = as_bytes(reason);
  d["samples"] = as_bytes(samples);
  py::list rn;
  for (const auto& r : reasons) rn.append(r);
  d["reasons"] = rn;
#endif
  return d;
}

py::dict stats() {
  py::dict d;
  d["nodes"] = g_trie.n_nodes.load();
  d["device_records"] = g_device.records.load();
#if defined(DLPT_CUPTI)
  {
    std::lock_guard<std::mutex> lk(g_device.leaf_mu);
    d["graph_trace"] = g_device.graph_level ? "graph" : "node";  // DLPT_GRAPH_TRACE (device.h)
    d["graph_replays_per_graph"] = g_device.graph_records;
    d["graph_replays_per_kernel"] = int64_t(g_device.sampled.size());
    d["graph_toggle_errors"] = g_device.graph_toggle_errors.load();
    d["graph_first_records_repaired"] = g_device.graph_repaired;  // stale first records (graphs_resolve_locked)
  }
#endif
  d["unlinked_records"] = g_device.unlinked.load();
  d["dropped_nodes"] = g_trie.dropped_nodes.load();
  int64_t ops = 0;
  {
    std::lock_guard<std::mutex> lk(g_trie.threads_mu);
    for (ThreadState* t : g_trie.threads) ops += t->n_ops;  // a racy read of counters: for stats only
  }
  d["ops"] = ops;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dlpt's online collector: RecordFunction + CUPTI into a calling-context trie";
  pthread_atfork(nullptr, nullptr, after_fork_in_child);  // once per process: the module loads once
  m.def("start", &start, py::arg("device"), py::arg("gil_frames") = false, py::arg("host") = true,
        py::arg("diag") = "", py::arg("sample_ns") = 1000000, py::arg("phase") = -1);
  m.def("set_phase", &set_phase);
  m.def("compile_phase", &compile_phase);
  m.def("host_snapshot", &host_snapshot);
  m.def("ignore_this_thread", &ignore_this_thread);
  m.def("stop", &stop, py::call_guard<py::gil_scoped_release>());
  m.def("flush", &flush, py::arg("forced") = true, py::call_guard<py::gil_scoped_release>());
  m.def("snapshot", &snapshot, py::arg("codes_from") = 0, py::arg("names_from") = 0);
  m.def("context_here", &context_here);
  m.def("register_thread", &register_thread);
  m.def("backward_begin", &backward_begin, py::arg("allow_off"));
  m.def("backward_end", &backward_end);
  m.def("memory_snapshot", &memory_snapshot);
  m.def("memory_step", &memory_step);
  m.def("capabilities", &capabilities);
  m.def("stats", &stats);
  m.def("pc_samples", &pc_samples);
  m.def("hold_locks", &hold_locks, py::arg("seconds"), py::call_guard<py::gil_scoped_release>());  // tests only
  m.def("forget_callback", &forget_callback);
  m.def("has_global_callbacks", [] { return at::hasGlobalCallbacks(); });  // torch's registry, for tests
  // The numbers the Python side decodes snapshots with (collectors/record/native.py checks
  // them at load time): node kinds, activity kinds, columns of a leaf row.
  m.def("constants", [] {
    py::dict nodes, acts, d;
    nodes["root"] = N_ROOT;
    nodes["python"] = N_PY;
    nodes["op"] = N_OP;
    nodes["backward"] = N_BACKWARD;
    nodes["thread"] = N_THREAD;
    nodes["tid"] = N_TID;
    nodes["unattributed"] = N_UNATTR;
    nodes["phase"] = N_PHASE;
    py::dict phases;
    phases["start-up"] = P_STARTUP;
    phases["warm-up"] = P_WARMUP;
    phases["steady"] = P_STEADY;
    phases["compile"] = P_COMPILE;
    d["phases"] = phases;
    acts["kernel"] = A_KERNEL;
    acts["htod"] = A_HTOD;
    acts["dtoh"] = A_DTOH;
    acts["dtod"] = A_DTOD;
    acts["memcpy_other"] = A_OTHER;
    acts["memset"] = A_MEMSET;
    d["node_kinds"] = nodes;
    d["activity_kinds"] = acts;
    d["leaf_columns"] = 10;
    return d;
  });
}
