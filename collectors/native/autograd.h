// dlpt collector: the backward pass without RecordFunction, found through autograd's own state.
// Why: with a RecordFunction callback registered, every autograd node evaluation pays torch's
// RecordFunction machinery twice (the `evaluate_function: X` wrapper, whose name torch builds
// with a string stream, and the backward op, named by demangling its type), rebuilds of the
// callback cache each time autograd installs the graph task's thread-local state, and the
// machinery again for every op the node runs. Counted with callgrind on nanoGPT's step (CPU,
// docs/BENCHMARKS.md), that was more than half of the collector's cost, nearly all in torch.
//
// So when CUPTI is on, a `backward()` / `autograd.grad()` call runs with RecordFunction off on
// its thread (the Python wrapper in collectors/record/session.py asks for it); autograd hands
// that state to its device threads with the graph task. Each launch, copy or memset there then
// finds its place from autograd's current node (`get_current_node()`, set while a node runs):
// its sequence number and forward thread go through the same backward rule as a recorded
// backward op (`backward_parent`), its name is the node's name. The cost is what it costs:
// backward ops get no host time (`cpu_time`) in GPU recordings. A CPU-only recording, where
// host time is the metric and nothing launches, keeps RecordFunction in backward; so does a
// program that runs torch.profiler meanwhile, which needs RecordFunction for its own trace.
#pragma once

#include "common.h"  // first: Python.h before any other header

#include <torch/csrc/autograd/function.h>

#include <typeinfo>

#include "frames.h"

namespace {

// A node's name as torch's RecordFunction gives it (`torch::autograd::generated::MmBackward0`).
// Demangled once per node type; a type whose name() says more than its type (a Python
// Function's node, named by its class) is asked each time: once per node run, see below.
const std::string& backward_name(ThreadState& ts, torch::autograd::Node& fn) {
  const std::type_info* ti = &typeid(fn);
  auto it = ts.bw_names.find(ti);
  if (it == ts.bw_names.end()) {
    std::string nm = fn.name();
    bool by_type = nm == c10::demangle(ti->name());
    it = ts.bw_names.emplace(ti, std::make_pair(by_type, std::move(nm))).first;
    return it->second.second;
  }
  if (it->second.first) return it->second.second;
  ts.bw_scratch = fn.name();
  return ts.bw_scratch;
}

// Where work launched now, while autograd node `fn` runs on this thread, belongs: the node's
// backward op under its forward line, and beneath it the Python the node runs (a custom
// Function's backward, compiled backward code) down to the `backward()` call's own frame.
int64_t backward_launch_node(ThreadState& ts, torch::autograd::Node& fn, const void* frame) {
  uint64_t seq = fn.sequence_nr(), tid = fn.thread_id(), call = g_collector.bw_calls.load(std::memory_order_relaxed);
  // A node launches a few kernels: the last one's place is kept. Nodes that outlive a backward()
  // call (AccumulateGrad, without a sequence number) go under the call running now.
  if (&fn != ts.bw_fn || seq != ts.bw_seq || tid != ts.bw_tid || call != ts.bw_call) {
    int64_t parent = backward_parent(ts, tid, int64_t(seq));
    ts.bw_node = op_node(ts, parent, backward_name(ts, fn).c_str());
    ts.bw_fn = &fn;
    ts.bw_seq = seq;
    ts.bw_tid = tid;
    ts.bw_call = call;
  }
  if (frame == nullptr || frame == ts.bw_frame) return ts.bw_node;
  return frames_beneath(ts, ts.bw_node, ts.bw_frame);
}

// The autograd node running on this thread while backward runs with RecordFunction off and no
// recorded op is open here; nullptr otherwise. Alive while it runs: the engine holds it.
torch::autograd::Node* unrecorded_node(const ThreadState& ts) {
  if (g_collector.bw_unrecorded.load(std::memory_order_relaxed) == 0 || !(ts.stack.empty() || ts.stack.back().node < 0))
    return nullptr;
  auto fn = torch::autograd::get_current_node();  // shared_ptr in torch 2.11, intrusive_ptr in 2.13
  return fn ? fn.get() : nullptr;
}

// The numbers this thread took since its mark (the last 4096 at most) go to `place`, unless
// claimed already; the mark moves to now.
void claim_since_mark(ThreadState& ts, int64_t place) {
  int64_t now = int64_t(at::sequence_number::peek());
  if (place >= 0 && now != ts.seq_mark && !g_collector.diag.no_launch_claims)
    seq_claim(at::RecordFunction::currentThreadId(), std::max(ts.seq_mark, now - 4096), now, place);
  ts.seq_mark = now;
}

// The node a launch, copy or memset entered now on this thread belongs to.
//
// Autograd nodes made inside a node while backward runs without RecordFunction — a reentrant
// checkpoint's recompute and the backward of the graph it builds, a `create_graph=True`
// backward's own graph — have no op to claim their sequence numbers when it exits. So there, a
// launch claims the numbers its thread took since its last launch: an op makes its autograd
// node before it launches its kernels, so the op that launches is the one whose node it is, or
// a view just before it. Their backward then finds the line that launched their forward, as
// with RecordFunction on. Where that guess is off: a node made after its op's launch
// (CopySlices, for an in-place op on a view) or by an op that launches nothing at the end of a
// node goes to the next launch on the thread; a custom Function's node, made before its forward
// runs, goes to the first launch inside that forward, not to its `apply` line.
int64_t launch_node(ThreadState& ts) {
  const void* frame = current_pyframe();
  torch::autograd::Node* fn = unrecorded_node(ts);
  if (fn == nullptr) return current_node(ts, frame);
  int64_t node = backward_launch_node(ts, *fn, frame);
  claim_since_mark(ts, node);
  ts.seq_place = node;
  return node;
}

// The calling thread's context now, -1 while not recording (with the GIL: from Python). On an
// autograd thread inside a node (a reentrant checkpoint's nested backward() call), the node's
// place, not the thread's own root.
int64_t context_here() {
  if (!g_collector.host_on.load() || g_collector.forked.load()) return -1;
  ThreadState& ts = tstate();
  torch::autograd::Node* fn = unrecorded_node(ts);
  return fn ? backward_launch_node(ts, *fn, current_pyframe()) : context(ts);
}

// Around autograd's engine (from Python, with the GIL): the `backward()` call's context for
// backward work that finds no forward op, and RecordFunction off on this thread when `allow_off`
// and CUPTI is recording (see the top of this file). Calls nest (a backward inside a hook, a
// reentrant checkpoint's inside a node).
void backward_begin(bool allow_off) {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  ThreadState& ts = tstate();
  bool off = allow_off && g_collector.host_on.load() && (device_recording() || g_collector.diag.bw_off) && !g_collector.diag.rf_backward &&
             at::isRecordFunctionEnabled();
  int64_t here = context_here();
  // With RecordFunction on, the ops before this call claimed their numbers. Already off (inside a
  // node), what the recompute made after its last launch goes to that launch's place.
  claim_since_mark(ts, at::isRecordFunctionEnabled() ? -1 : ts.seq_place);
  ts.bw_calls.push_back(BackwardCall{g_collector.backward_ctx.load(), here, ts.bw_frame, off});
  g_collector.backward_ctx.store(here);
  g_collector.bw_calls.fetch_add(1);
  ts.bw_frame = current_pyframe();
  if (off) {
    at::enableRecordFunction(false);
    g_collector.bw_unrecorded.fetch_add(1);
  }
}

void backward_end() {
  if (g_collector.forked.load(std::memory_order_relaxed)) return;  // a forked child records nothing (collector.cpp)
  ThreadState& ts = tstate();
  if (ts.bw_calls.empty()) return;
  BackwardCall c = ts.bw_calls.back();
  ts.bw_calls.pop_back();
  // Back to the enclosing call's context, unless a call on another thread began meanwhile.
  int64_t mine = c.here;
  g_collector.backward_ctx.compare_exchange_strong(mine, c.ctx);
  ts.bw_frame = c.frame;
  if (c.rf_off) {
    at::enableRecordFunction(true);
    g_collector.bw_unrecorded.fetch_sub(1);
  }
}

}  // namespace
