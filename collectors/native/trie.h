// dlpt collector: the calling-context trie, per-thread state and backward links.
// Shared by the op callback, the CUPTI side and the binding.
#pragma once

#include "common.h"  // first: Python.h before any other header

namespace {

// Node kinds, as collectors/record/native.py names them (checked at load).
constexpr int32_t N_ROOT = 0, N_PY = 1, N_OP = 2, N_BACKWARD = 3, N_THREAD = 4, N_TID = 5, N_UNATTR = 6,
                  N_PHASE = 7;
// Activity kinds, as dlpt.metrics numbers them.
constexpr int32_t A_KERNEL = 0, A_HTOD = 1, A_DTOH = 2, A_DTOD = 3, A_OTHER = 4, A_MEMSET = 5;

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

// ----- phases -----
// A recording's contexts hang from one node per phase (start-up, warm-up, steady, compile) under
// the root, so every metric of the tree — host and op time, kernels by their launch, sync, idle,
// memory — is kept per phase at no cost per op: the phase is where a context is interned, not a
// field of each record. The converter names the phases and merges them into one tree with a table
// per phase beside it (dlpt/phases.py). Raw ids, as collectors/record/phases.py knows them:
// start-up (before any GPU work), warm-up (from the first GPU work to the end of the first step),
// steady (after it, or after the first compile), compile (while torch.compile compiles, autotunes
// or captures a CUDA graph).
constexpr int64_t P_STARTUP = 0, P_WARMUP = 1, P_STEADY = 2, P_COMPILE = 3;

// ----- backward links: (forward thread, sequence number) → forward op node -----

// A ring per forward thread: a backward op follows its forward within the same step, so the
// last 2^18 autograd ops of each thread are enough, in bounded memory (4 MiB a thread).
constexpr int64_t kSeqBits = 18, kSeqSize = int64_t(1) << kSeqBits;
struct SeqSlot {
  std::atomic<int64_t> seq{-1};
  std::atomic<int64_t> node{-1};
};
constexpr int64_t kMaxSeqThreads = 4096;

// The trie, its phases, the threads that record into it and the backward links: what the op
// callback and the CUPTI side share (the one instance, g_trie, is at static storage).
struct Trie {
  // The global trie. `mu` guards the index, the node count and the code/name tables; node
  // records and cpu counters are read lock-free by the threads that learned their ids.
  // Lock order: the GIL (if taken) before mu, never the other way round.
  std::mutex mu;
  Chunked<Node>* nodes = nullptr;
  Chunked<std::atomic<int64_t>>* cpu = nullptr;
  std::atomic<int64_t> n_nodes{0};
  std::unordered_map<NodeKey, int64_t, NodeKeyHash> index;
  std::vector<PyObject*> codes;  // strong references
  std::unordered_map<PyObject*, int64_t> code_idx;
  std::vector<std::string> names;
  std::unordered_map<std::string, int64_t> name_idx;
  std::atomic<uint64_t> epoch{1};  // a new recording invalidates every thread's caches
  std::atomic<int64_t> dropped_nodes{0};

  // Phases (above).
  std::atomic<int64_t> phase_node{0};   // the current phase's node (0, the root, with phases off)
  std::atomic<uint64_t> phase_gen{0};   // bumped at every change: threads re-derive their base
  std::atomic<bool> phase_auto{false};  // the first GPU launch ends the start-up phase
  std::mutex phase_mu;                  // guards the three below; taken before mu
  int64_t phase_base = P_STEADY, compile_depth = 0;
  std::vector<std::pair<int64_t, int64_t>> phase_log;  // (steady ns, phase) at every change

  std::mutex threads_mu;
  std::vector<ThreadState*> threads;  // every thread's state, for stats

  // Backward links (above): each forward thread's ring, made at its first number.
  std::atomic<SeqSlot*> seq[kMaxSeqThreads];
  std::mutex seq_mu;
};
Trie g_trie;

int64_t intern_name_locked(std::string_view s) {
  auto it = g_trie.name_idx.find(std::string(s));
  if (it != g_trie.name_idx.end()) return it->second;
  int64_t i = int64_t(g_trie.names.size());
  g_trie.names.emplace_back(s);
  g_trie.name_idx.emplace(g_trie.names.back(), i);
  return i;
}

int64_t intern_node_locked(int64_t parent, int32_t kind, int64_t a, int64_t b) {
  NodeKey k{parent, a, b, kind};
  auto it = g_trie.index.find(k);
  if (it != g_trie.index.end()) return it->second;
  int64_t i = g_trie.n_nodes.load(std::memory_order_relaxed);
  if (!g_trie.nodes->reserve(i) || !g_trie.cpu->reserve(i)) {
    g_trie.dropped_nodes.fetch_add(1, std::memory_order_relaxed);
    return parent;  // full (2^28 contexts): the work stays on the parent, never lost
  }
  (*g_trie.nodes)[i] = Node{parent, a, b, kind};
  (*g_trie.cpu)[i].store(0, std::memory_order_relaxed);
  g_trie.index.emplace(k, i);
  g_trie.n_nodes.store(i + 1, std::memory_order_release);
  return i;
}

int64_t intern_node(int64_t parent, int32_t kind, int64_t a, int64_t b) {
  std::lock_guard<std::mutex> lk(g_trie.mu);
  return intern_node_locked(parent, kind, a, b);
}

// ----- phases (above) -----

// `node`'s path, from below its phase node (or the root) down, interned again under the current
// phase's node: a thread started in one phase works on in the next under the same path.
int64_t rebase(int64_t node) {
  std::lock_guard<std::mutex> lk(g_trie.mu);
  std::vector<Node> chain;
  for (int64_t n = node; n > 0; n = (*g_trie.nodes)[n].parent) {
    const Node& x = (*g_trie.nodes)[n];
    if (x.kind == N_PHASE) break;
    chain.push_back(x);
  }
  int64_t p = g_trie.phase_node.load(std::memory_order_acquire);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) p = intern_node_locked(p, it->kind, it->a, it->b);
  return p;
}

// A thread's base as of the current phase: the phase's node itself for the recording's main
// thread and for a thread of its own root (both re-derived by thread_base), else its path again.
int64_t base_in_phase(int64_t base) {
  if (base <= 0) return -1;
  int32_t kind = (*g_trie.nodes)[base].kind;
  if (kind == N_PHASE || kind == N_TID) return -1;
  return rebase(base);
}

// Under g_trie.phase_mu: the phase now in force; a change interns its node and is logged.
void phase_apply_locked() {
  // Before the first start() there is no trie to intern the phase's node in: `dlpt record --steps
  // 4:6` on a program that compiles before step 4 called here from the compile hooks and died of
  // SIGSEGV. The state above is kept; start() sets the phase it starts in.
  if (g_trie.nodes == nullptr) return;
  int64_t p = g_trie.compile_depth > 0 ? P_COMPILE : g_trie.phase_base;
  if (!g_trie.phase_log.empty() && g_trie.phase_log.back().second == p) return;
  g_trie.phase_node.store(intern_node(0, N_PHASE, p, 0), std::memory_order_release);
  g_trie.phase_gen.fetch_add(1, std::memory_order_acq_rel);
  g_trie.phase_log.emplace_back(steady_ns(), p);
}

// The session's calls (collectors/record/session.py): the base phase (warm-up → steady at the
// first step), and compile brackets, which may nest and come from any thread.
void set_phase(int64_t p) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  std::lock_guard<std::mutex> lk(g_trie.phase_mu);
  g_trie.phase_base = p;
  g_trie.phase_auto.store(false);
  phase_apply_locked();
}

void compile_phase(int64_t delta) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  std::lock_guard<std::mutex> lk(g_trie.phase_mu);
  g_trie.compile_depth = std::max<int64_t>(0, g_trie.compile_depth + delta);
  // The first compile's end ends the warm-up too: a program compiles on its first calls, and
  // what runs after is its loop (a decode loop has no optimizer step to say so). It ends start-up
  // as well where no GPU work has begun a warm-up (a CPU program): that start-up had been named the
  // steady state (phases.py), imports included, and the first compile read as a recompile. Should
  // GPU work start later with no step yet (a CPU function compiled before training), that work
  // begins the warm-up still (phase_first_launch), as it did before the compile's end was heeded.
  if (delta < 0 && g_trie.compile_depth == 0 && (g_trie.phase_base == P_WARMUP || g_trie.phase_base == P_STARTUP))
    g_trie.phase_base = P_STEADY;
  phase_apply_locked();
}

// From the CUPTI launch callback (device.h): the program's first GPU work ends its start-up, or
// the steady state a compile's end began before any GPU work and any step (set_phase clears
// phase_auto at a step).
void phase_first_launch() {
  if (!g_trie.phase_auto.exchange(false)) return;
  std::lock_guard<std::mutex> lk(g_trie.phase_mu);
  if (g_trie.phase_base == P_STARTUP || g_trie.phase_base == P_STEADY) g_trie.phase_base = P_WARMUP;
  phase_apply_locked();
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
  bool quiet;     // the callback returns at once beneath this op (see on_enter)
  int64_t seq0;   // the thread's next autograd sequence number when the op was entered
  bool coll = false;  // a collective (c10d::...): its calls are logged one by one (host.h)
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

// (parent, code, instruction) → node, a thread's frame nodes: open addressing in a power-of-two
// table, at most half full. The op callback looks a frame up for nearly every op it records
// (the innermost frame has moved on); std::unordered_map's lookup (a division by a prime, a
// chain of nodes) cost about a hundred instructions, this one about twenty (callgrind,
// docs/BENCHMARKS.md). Never shrinks while a recording lasts, like the trie.
class FrameTable {
 public:
  const int64_t* find(const FrameKey& k) const {
    if (used_ == 0) return nullptr;
    size_t mask = slots_.size() - 1;
    for (size_t i = mix(k) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.code == 0) return nullptr;
      if (s.code == k.code && s.parent == k.parent && s.lasti == k.lasti) return &s.node;
    }
  }
  void put(const FrameKey& k, int64_t node) {  // a key not in the table (code never 0)
    if (2 * (used_ + 1) > slots_.size()) grow();
    insert(Slot{k.parent, k.code, k.lasti, node});
    ++used_;
  }
  void clear() {
    slots_.clear();
    used_ = 0;
  }

 private:
  struct Slot {
    int64_t parent = 0;
    uintptr_t code = 0;  // 0: empty
    int64_t lasti = 0;
    int64_t node = 0;
  };
  static size_t mix(const FrameKey& k) {
    uint64_t h = uint64_t(k.parent) * 0x9E3779B97F4A7C15ULL ^ uint64_t(k.code) * 0xC2B2AE3D27D4EB4FULL ^
                 uint64_t(k.lasti) * 0x165667B19E3779F9ULL;
    return size_t(h ^ (h >> 29));
  }
  void insert(const Slot& x) {
    size_t mask = slots_.size() - 1;
    size_t i = mix(FrameKey{x.parent, x.code, x.lasti}) & mask;
    while (slots_[i].code != 0) i = (i + 1) & mask;
    slots_[i] = x;
  }
  void grow() {
    std::vector<Slot> old(std::max<size_t>(256, slots_.size() * 2));
    old.swap(slots_);
    for (const Slot& x : old)
      if (x.code != 0) insert(x);
  }
  std::vector<Slot> slots_;
  size_t used_ = 0;
};

// An op's node under a parent, and what on_enter decides from its name once (collector.cpp):
// a per-thread table in front of `ops`, keyed by the name's address, which is stable for the
// ops the dispatcher names (their schema's string) and saves hashing the name: the map's lookup
// cost about a hundred instructions and the name's hash sixty more, this one about thirty. A
// name that torch builds per call (`evaluate_function: ...`, a backward node's) has an address
// that a later name may reuse, so a hit also compares the text with the name the entry was made
// for; and since such addresses come and go, the table is emptied when it grows past kMaxUsed
// (the `ops` map behind it keeps every node).
struct OpEntry {
  int64_t node;
  const char* name;  // the text this entry is for (the thread's OpTable::names keeps it)
  bool quiet;        // quiet_beneath (collector.cpp)
  bool coll;         // a collective (c10d::...)
};
class OpTable {
 public:
  static constexpr size_t kMaxUsed = 16384;
  const OpEntry* find(int64_t parent, const char* ptr, bool backward) const {
    if (used_ == 0) return nullptr;
    size_t mask = slots_.size() - 1;
    for (size_t i = mix(parent, ptr, backward) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.ptr == nullptr) return nullptr;
      if (s.ptr == ptr && s.parent == parent && s.backward == backward)
        return std::strcmp(ptr, s.e.name) == 0 ? &s.e : nullptr;
    }
  }
  // After find() said no: the entry for this key, made or replaced.
  const OpEntry& put(int64_t parent, const char* ptr, bool backward, int64_t node, bool quiet, bool coll) {
    const char* name = names_.emplace(ptr).first->c_str();
    if (used_ > 0) {  // the same key, made for another name at this address: replaced in place
      size_t mask = slots_.size() - 1;
      for (size_t i = mix(parent, ptr, backward) & mask; slots_[i].ptr != nullptr; i = (i + 1) & mask) {
        Slot& s = slots_[i];
        if (s.ptr == ptr && s.parent == parent && s.backward == backward) {
          s.e = OpEntry{node, name, quiet, coll};
          return s.e;
        }
      }
    }
    if (used_ >= kMaxUsed) clear();
    if (2 * (used_ + 1) > slots_.size()) grow();
    ++used_;
    return insert(Slot{parent, ptr, backward, OpEntry{node, name, quiet, coll}}).e;
  }
  void clear() {
    slots_.clear();
    used_ = 0;
  }

 private:
  struct Slot {
    int64_t parent = 0;
    const char* ptr = nullptr;  // nullptr: empty
    bool backward = false;
    OpEntry e{};
  };
  static size_t mix(int64_t parent, const char* ptr, bool backward) {
    uint64_t h = uint64_t(parent) * 0x9E3779B97F4A7C15ULL ^ uint64_t(uintptr_t(ptr)) * 0xC2B2AE3D27D4EB4FULL ^
                 uint64_t(backward);
    return size_t(h ^ (h >> 29));
  }
  Slot& insert(const Slot& x) {
    size_t mask = slots_.size() - 1;
    size_t i = mix(x.parent, x.ptr, x.backward) & mask;
    while (slots_[i].ptr != nullptr) i = (i + 1) & mask;
    slots_[i] = x;
    return slots_[i];
  }
  void grow() {
    std::vector<Slot> old(std::max<size_t>(256, slots_.size() * 2));
    old.swap(slots_);
    for (const Slot& x : old)
      if (x.ptr != nullptr) insert(x);
  }
  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::unordered_set<std::string> names_;  // node-based: the texts stay where they are
};

// A frame as context()'s walk sees it (frames.h): the frame and its instruction pointer, which
// stands for its code and instruction index — it points into the code's own bytecode.
struct RawFrame {
  const void* frame;
  const void* instr;
  bool operator==(const RawFrame& o) const { return frame == o.frame && instr == o.instr; }
};

// A `backward()` call running on this thread (autograd.h).
struct BackwardCall {
  int64_t ctx;        // the enclosing call's context, restored at its end
  int64_t here;       // this call's context
  const void* frame;  // the enclosing call's frame
  bool rf_off;        // RecordFunction switched off on this thread for it
};

struct ThreadState {
  uint64_t epoch = 0;
  int64_t n_ops = 0;  // ops entered by this thread (all recordings), for stats
  int64_t quiet = 0;    // quiet ops open on this thread (see on_enter)
  int64_t skipped = 0;  // ops entered beneath them and not yet exited
  std::vector<OpenOp> stack;
  int64_t base = -1;  // this thread's context root for the current epoch
  int64_t cut = 0;    // outermost Python frames that belong to dlpt's thread start, not the program
  FrameTable frames;                                           // (parent, code, instr) → node
  std::unordered_map<FrameKey, int64_t, FrameKeyHash> ops;     // (parent, name hash, len) → node
  OpTable op_table;                                            // in front of `ops`
  std::vector<std::pair<PyObject*, int64_t>> walk;             // scratch: (code, lasti), innermost first
  std::vector<const void*> walk_frames;                        // scratch: the frames themselves
  uint64_t rf_tid = 0;  // RecordFunction's id of this thread (a thread-local of torch's, read once)
  // The last walk, outermost first, and its nodes: consecutive ops share their outer frames
  // (the training loop, the model's call), which are then matched by pointer, not looked up.
  std::vector<std::tuple<const void*, PyObject*, int64_t>> last;  // (frame, code, instruction index)
  std::vector<int64_t> last_nodes;
  // context()'s own walk (frames.h), innermost first, and the last one, outermost first (its
  // nodes in last_nodes): every frame as it is.
  std::vector<RawFrame> raw, ctx_last;
  void forget_walk() {
    last.clear();
    last_nodes.clear();
    ctx_last.clear();
  }
  // Backward work found through autograd's current node (autograd.h): the calls running, the
  // frame of the innermost one, the last node seen and its op node, node names by type.
  std::vector<BackwardCall> bw_calls;
  const void* bw_frame = nullptr;
  const void* bw_fn = nullptr;
  uint64_t bw_seq = 0, bw_tid = 0, bw_call = 0;
  int64_t bw_node = -1;
  // Launch claims (autograd.h): this thread's sequence numbers from seq_mark on are unclaimed;
  // seq_place is the place of its last claiming launch.
  int64_t seq_mark = 0, seq_place = -1;
  std::unordered_map<const std::type_info*, std::pair<bool, std::string>> bw_names;
  std::string bw_scratch;
  // For the host sampler and sync time (host.h): this thread's PyThreadState (the sampler finds
  // its base and cut through it), whether it is blocked in a CUDA synchronisation now, and
  // whether it launched GPU work (GPU idle is blamed on the lines of launching threads).
  PyThreadState* py = nullptr;
  int64_t tid = 0;  // the OS thread id (what PyThreadState's native_thread_id holds)
  std::atomic<int64_t> in_sync{0};
  int64_t sync_node = -1, sync_t0 = 0;
  std::atomic<bool> launched{false};
  uint64_t phase_gen = 0;  // the phase its base and prefix cache were made in (see phases below)
  std::atomic<int64_t> sync_edge{0};  // when it last entered or left a CUDA synchronisation (steady ns)
};

// Initial-exec: read with one instruction, not a __tls_get_addr call per op (the extension is
// loaded after start-up; one pointer of static TLS is well within what glibc keeps for that).
thread_local ThreadState* t_state __attribute__((tls_model("initial-exec"))) = nullptr;

ThreadState& tstate() {
  ThreadState* s = t_state;
  if (!s) {
    s = t_state = new ThreadState();  // one per thread for the process's life: threads are few
    s->py = PyGILState_GetThisThreadState();
    s->tid = int64_t(syscall(SYS_gettid));
    s->rf_tid = at::RecordFunction::currentThreadId();  // fixed for the thread's life
    std::lock_guard<std::mutex> lk(g_trie.threads_mu);
    g_trie.threads.push_back(s);
  }
  uint64_t e = g_trie.epoch.load(std::memory_order_acquire);
  if (s->epoch != e) {
    s->epoch = e;
    s->frames.clear();
    s->ops.clear();
    s->op_table.clear();
    s->base = -1;
    s->cut = 0;
    s->forget_walk();
    s->bw_fn = nullptr;
    s->seq_mark = int64_t(at::sequence_number::peek());  // numbers from before this recording
    s->seq_place = -1;
    s->launched.store(false, std::memory_order_relaxed);
  }
  uint64_t g = g_trie.phase_gen.load(std::memory_order_acquire);
  if (s->phase_gen != g) {  // a new phase: this thread's contexts hang from its node from now on
    s->phase_gen = g;
    s->base = base_in_phase(s->base);
    s->forget_walk();
  }
  return *s;
}

// ----- backward links (the rings above) -----

void seq_store(uint64_t tid, int64_t seq, int64_t node) {
  if (tid >= uint64_t(kMaxSeqThreads) || seq < 0) return;
  SeqSlot* ring = g_trie.seq[tid].load(std::memory_order_acquire);
  if (!ring) {
    std::lock_guard<std::mutex> lk(g_trie.seq_mu);
    ring = g_trie.seq[tid].load(std::memory_order_acquire);
    if (!ring) {
      ring = new SeqSlot[kSeqSize];
      g_trie.seq[tid].store(ring, std::memory_order_release);
    }
  }
  SeqSlot& s = ring[seq & (kSeqSize - 1)];
  s.seq.store(-1, std::memory_order_relaxed);
  s.node.store(node, std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
}

int64_t seq_lookup(uint64_t tid, int64_t seq) {
  if (tid >= uint64_t(kMaxSeqThreads) || seq < 0) return -1;
  SeqSlot* ring = g_trie.seq[tid].load(std::memory_order_acquire);
  if (!ring) return -1;
  SeqSlot& s = ring[seq & (kSeqSize - 1)];
  if (s.seq.load(std::memory_order_acquire) != seq) return -1;
  int64_t n = s.node.load(std::memory_order_relaxed);
  return s.seq.load(std::memory_order_acquire) == seq ? n : -1;
}

// Sequence numbers [from, to) taken on forward thread `tid` belong to `node`, except those an op
// inside it claimed first (it exited first). The first 4096 at most: an op makes a few nodes, and
// its own comes first.
void seq_claim(uint64_t tid, int64_t from, int64_t to, int64_t node) {
  for (int64_t q = from; q < to && q < from + 4096; ++q)
    if (seq_lookup(tid, q) < 0) seq_store(tid, q, node);
}

void seq_clear() {
  for (int64_t i = 0; i < kMaxSeqThreads; ++i) {
    SeqSlot* ring = g_trie.seq[i].load(std::memory_order_acquire);
    if (ring)
      for (int64_t k = 0; k < kSeqSize; ++k) ring[k].seq.store(-1, std::memory_order_relaxed);
  }
}

}  // namespace
