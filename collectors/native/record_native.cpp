// dlpt's native fast path for `dlpt record`: reads a stopped profiler's result
// (`torch._C._autograd._ProfilerResult`, i.e. torch::autograd::profiler::ProfilerResult) and
// folds it into a window-local calling-context tree, so that no Python object is made per tree
// node or per KinetoEvent (making them was most of the post-processing time:
// docs/BENCHMARKS.md, Recording). Python then merges the local tree — one entry per distinct
// context, not per event — into the profile (`Recorder._merge_native` in torch_recorder.py).
//
// `fold` is `Recorder._walk_columns` + `Recorder._place_device` step for step; where they differ
// it is a bug, and tests/test_record_native.py folds one result both ways and compares.
// `event_tree` and `device_events` expose the two readers as columns, for those tests.
//
// JIT-built against the running torch by collectors/record_native.py; any failure there
// (no compiler, another torch whose structs differ) leaves the Python path in charge.

// Not <torch/extension.h>: all of ATen's headers for nothing used here (twice the build time).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/collection.h>
#include <torch/csrc/profiler/kineto_shim.h>
#if __has_include(<ITraceActivity.h>) && __has_include(<ActivityTraceInterface.h>)
#include <ActivityTraceInterface.h>  // Kineto's trace and activity records (copies' bytes)
#include <ITraceActivity.h>
#define DLPT_HAVE_TRACE_ACTIVITY 1
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using torch::autograd::profiler::KinetoEvent;
using torch::autograd::profiler::ProfilerResult;
using torch::profiler::impl::EventType;
using torch::profiler::impl::ExtraFields;
using torch::profiler::impl::Result;
using AT = libkineto::ActivityType;

// Node kinds, as `collectors/record_native.py` names them.
constexpr int64_t K_OP = 0, K_CALL = 1, K_CCALL = 2, K_KINETO = 3, K_OTHER = 4;

// Local frame types of `fold`'s tree, as `collectors/record_native.py` names them (F_*).
constexpr int64_t F_ROOT = 0, F_SITE = 1, F_DEF = 2, F_OP = 3, F_MODULE = 4, F_BACKWARD = 5,
                  F_THREAD = 6, F_TID = 7, F_UNATTR = 8, F_KERNEL = 9, F_MEMCPY = 10, F_MEMSET = 11;

// Strings interned by value; `to_py` makes them one Python list, where an entry that is not
// valid UTF-8 is None (torch's pybind would raise UnicodeDecodeError for it; the recorder names
// it "<undecodable...>").
struct Interner {
  std::unordered_map<std::string, int64_t> index;
  // The Python tracer's strings are borrowed `const char*` that stay put while this runs
  // (the GIL is held throughout), so a pointer seen once need not be hashed again.
  std::unordered_map<const char*, int64_t> by_ptr;
  std::vector<std::string> values;

  int64_t add(std::string_view s) {
    std::string key(s);
    auto it = index.find(key);
    if (it != index.end()) {
      return it->second;
    }
    int64_t k = static_cast<int64_t>(values.size());
    values.push_back(key);
    index.emplace(std::move(key), k);
    return k;
  }

  int64_t add_ptr(const char* p) {
    if (p == nullptr) {
      return add(std::string_view());
    }
    auto it = by_ptr.find(p);
    if (it != by_ptr.end()) {
      return it->second;
    }
    int64_t k = add(std::string_view(p, std::strlen(p)));
    by_ptr.emplace(p, k);
    return k;
  }

  py::list to_py() const {
    py::list out;
    for (const auto& s : values) {
      PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), nullptr);
      if (o == nullptr) {
        PyErr_Clear();
        out.append(py::none());
      } else {
        out.append(py::reinterpret_steal<py::object>(o));
      }
    }
    return out;
  }
};

py::list to_list(const std::vector<int64_t>& v) {
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(v.size()));
  if (l == nullptr) {
    throw py::error_already_set();
  }
  for (size_t i = 0; i < v.size(); ++i) {
    PyObject* o = PyLong_FromLongLong(v[i]);
    if (o == nullptr) {
      Py_DECREF(l);
      throw py::error_already_set();
    }
    PyList_SET_ITEM(l, static_cast<Py_ssize_t>(i), o);
  }
  return py::reinterpret_steal<py::list>(l);
}

// int64 column as raw bytes (numpy reads it with frombuffer: no Python int per entry).
py::bytes to_bytes(const std::vector<int64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

ProfilerResult& result_of(py::handle kr) {
  // Same pybind11 internals as torch's own module (built with torch's headers and ABI tag):
  // the registered `_ProfilerResult` type casts straight back to the C++ object.
  return kr.cast<ProfilerResult&>();
}

// ---------------------------------------------------------------- the event tree, as columns

// The event tree in preorder (roots in `event_tree()` order, children in their order): every
// column has one entry per node; `end` is one past the node's subtree. A runtime call directly
// under an op is read without its children: they are only its own device events, which come
// from the device-event reader, and the fold never visits them.
struct Tree {
  std::vector<int64_t> kind, end, start, stop, tid, corr, name, seq, module;
  std::vector<int64_t> cfile, cline, cfunc, sfile, sline, sfunc, roots;
  Interner names, strs;
};

void read_tree(ProfilerResult& res, Tree& T) {
  const auto& roots = res.event_tree();
  for (auto* v : {&T.kind, &T.end, &T.start, &T.stop, &T.tid, &T.corr, &T.name, &T.seq, &T.module,
                  &T.cfile, &T.cline, &T.cfunc, &T.sfile, &T.sline, &T.sfunc}) {
    v->reserve(1 << 16);
  }
  // Preorder indexes of the nodes whose subtree is still open, innermost last.
  std::vector<int64_t> open;
  // (node, its parent's preorder index, the parent's kind) still to visit.
  struct Todo {
    const Result* r;
    int64_t parent;
    int64_t parent_kind;
  };
  std::vector<Todo> todo;
  for (const auto& root : roots) {
    if (!root) {
      continue;
    }
    todo.push_back({root.get(), -1, K_OTHER});
    T.roots.push_back(static_cast<int64_t>(T.kind.size()));
    while (!todo.empty()) {
      const Todo td = todo.back();
      todo.pop_back();
      const Result* r = td.r;
      size_t i = T.kind.size();
      int64_t k = K_OTHER, nm = -1, sq = -1, mod = 0;
      int64_t cf = -1, cl = 0, cfn = -1, sf = -1, sl = 0, sfn = -1;
      if (const auto* op = std::get_if<ExtraFields<EventType::TorchOp>>(&r->extra_fields_)) {
        k = K_OP;
        nm = T.names.add(op->name_);
        sq = op->sequence_number_;
      } else if (const auto* c = std::get_if<ExtraFields<EventType::PyCall>>(&r->extra_fields_)) {
        k = K_CALL;
        cf = T.strs.add_ptr(c->caller_.filename_.str());
        cl = c->caller_.line_no_;
        cfn = T.strs.add_ptr(c->caller_.funcname_.str());
        sf = T.strs.add_ptr(c->callsite_.filename_.str());
        sl = c->callsite_.line_no_;
        sfn = T.strs.add_ptr(c->callsite_.funcname_.str());
        if (c->module_.has_value()) {
          mod = 1;
          nm = T.names.add(r->name());  // "nn.Module: Linear_0", as the pybind `name`
        }
      } else if (const auto* cc = std::get_if<ExtraFields<EventType::PyCCall>>(&r->extra_fields_)) {
        k = K_CCALL;
        cf = T.strs.add_ptr(cc->caller_.filename_.str());
        cl = cc->caller_.line_no_;
        cfn = T.strs.add_ptr(cc->caller_.funcname_.str());
      } else if (std::holds_alternative<ExtraFields<EventType::Kineto>>(r->extra_fields_)) {
        k = K_KINETO;
      }
      T.kind.push_back(k);
      T.end.push_back(0);
      T.start.push_back(r->start_time_ns_);
      T.stop.push_back(r->endTimeNS());
      T.tid.push_back(static_cast<int64_t>(r->start_tid_));
      T.corr.push_back(static_cast<int64_t>(r->correlationID()));
      T.name.push_back(nm);
      T.seq.push_back(sq);
      T.module.push_back(mod);
      T.cfile.push_back(cf);
      T.cline.push_back(cl);
      T.cfunc.push_back(cfn);
      T.sfile.push_back(sf);
      T.sline.push_back(sl);
      T.sfunc.push_back(sfn);
      // Close the subtrees this node is not inside of: its parent is the open node it hangs on.
      while (!open.empty() && open.back() != td.parent) {
        T.end[open.back()] = static_cast<int64_t>(i);
        open.pop_back();
      }
      open.push_back(static_cast<int64_t>(i));
      if (k == K_KINETO && td.parent_kind == K_OP) {
        continue;
      }
      for (auto it = r->children_.rbegin(); it != r->children_.rend(); ++it) {
        if (*it) {
          todo.push_back({it->get(), static_cast<int64_t>(i), k});
        }
      }
    }
    for (int64_t o : open) {
      T.end[o] = static_cast<int64_t>(T.kind.size());
    }
    open.clear();
  }
}

py::dict event_tree(py::handle kr) {
  Tree T;
  read_tree(result_of(kr), T);
  py::dict d;
  d["kind"] = to_list(T.kind);
  d["end"] = to_list(T.end);
  d["start"] = to_list(T.start);
  d["stop"] = to_list(T.stop);
  d["tid"] = to_list(T.tid);
  d["corr"] = to_list(T.corr);
  d["name"] = to_list(T.name);
  d["seq"] = to_list(T.seq);
  d["module"] = to_list(T.module);
  d["caller_file"] = to_list(T.cfile);
  d["caller_line"] = to_list(T.cline);
  d["caller_func"] = to_list(T.cfunc);
  d["site_file"] = to_list(T.sfile);
  d["site_line"] = to_list(T.sline);
  d["site_func"] = to_list(T.sfunc);
  d["roots"] = to_list(T.roots);
  d["names"] = T.names.to_py();
  d["strs"] = T.strs.to_py();
  return d;
}

// ---------------------------------------------------------------- device events, as columns

// `"bytes": N` in CUPTI's metadata (what `_copy_bytes` finds with a regex), else 0.
int64_t metadata_bytes(const std::string& m) {
  static const char key[] = "\"bytes\":";
  size_t p = m.find(key);
  if (p == std::string::npos) {
    return 0;
  }
  p += sizeof(key) - 1;
  while (p < m.size() && (m[p] == ' ' || m[p] == '\t' || m[p] == '\n' || m[p] == '\r')) {
    ++p;
  }
  int64_t v = 0;
  bool any = false;
  for (; p < m.size() && m[p] >= '0' && m[p] <= '9'; ++p) {
    v = v * 10 + (m[p] - '0');
    any = true;
  }
  return any ? v : 0;
}

// Whether this torch's KinetoEvent has `activityType()`: without it (older torch) user
// annotations cannot be told from kernels here, and `device_events` / `fold` return None so that
// the recorder reads device events through pybind (its Python path knows that torch).
template <typename T, typename = void>
struct has_activity_type : std::false_type {};
template <typename T>
struct has_activity_type<T, std::void_t<decltype(std::declval<const T&>().activityType())>> : std::true_type {};

template <typename E>
int activity_of(const E& e) {
  if constexpr (has_activity_type<E>::value) {
    return static_cast<int>(e.activityType());
  } else {
    return -1;
  }
}

// ProfilerResult keeps Kineto's own activity trace in a private member, `trace_`. Naming it in an
// explicit template instantiation is allowed whatever its access ([temp.spec.general]/6), which
// gives a pointer to that member: the trace is where a copy's byte count is (CUPTI's metadata)
// when torch's KinetoEvent lacks it (torch 2.11's live events have neither `nBytes()` nor
// metadata), and `release` frees it with the rest of the window.
using TraceWrapper = torch::profiler::impl::kineto::ActivityTraceWrapper;
using TracePtr = std::unique_ptr<TraceWrapper> ProfilerResult::*;
struct TraceMember {
  friend TracePtr trace_member(TraceMember);
};
template <TracePtr M>
struct ExposeTrace {
  friend TracePtr trace_member(TraceMember) { return M; }
};
template struct ExposeTrace<&ProfilerResult::trace_>;

std::unique_ptr<TraceWrapper>& trace_of(ProfilerResult& res) {
  return res.*trace_member(TraceMember{});
}

// Bytes of each copy and memset by correlation id, from Kineto's activity records.
std::unordered_map<int64_t, int64_t> trace_bytes(ProfilerResult& res) {
  std::unordered_map<int64_t, int64_t> out;
#ifdef DLPT_HAVE_TRACE_ACTIVITY
  auto& wrapper = trace_of(res);
  if (!wrapper || !wrapper->get()) {
    return out;
  }
  const std::vector<const libkineto::ITraceActivity*>* acts = nullptr;
  try {
    acts = wrapper->get()->activities();
  } catch (const std::exception&) {
    acts = nullptr;
  }
  if (acts == nullptr) {
    return out;
  }
  for (const auto* a : *acts) {
    if (a == nullptr) {
      continue;
    }
    AT t = a->type();
    if (t != AT::GPU_MEMCPY && t != AT::GPU_MEMSET) {
      continue;
    }
    int64_t b = metadata_bytes(a->metadataJson());
    if (b > 0) {
      out.emplace(a->correlationId(), b);
    }
  }
#endif
  return out;
}

// What the reader can do with this torch (diagnostics; tests and benchmarks print it).
py::dict capabilities(py::handle kr) {
  py::dict d;
  d["activity_type"] = has_activity_type<KinetoEvent>::value;
#ifdef DLPT_HAVE_TRACE_ACTIVITY
  d["trace_activity_header"] = true;
  auto& wrapper = trace_of(result_of(kr));
  const std::vector<const libkineto::ITraceActivity*>* acts =
      wrapper && wrapper->get() ? wrapper->get()->activities() : nullptr;
  d["trace_activities"] = acts == nullptr ? -1 : static_cast<int64_t>(acts->size());
  py::list copies;
  if (acts != nullptr) {
    for (const auto* a : *acts) {
      if (a != nullptr && (a->type() == AT::GPU_MEMCPY || a->type() == AT::GPU_MEMSET) && copies.size() < 3) {
        copies.append(py::make_tuple(a->name(), a->correlationId(), a->metadataJson()));
      }
    }
  }
  d["copy_samples"] = copies;
#else
  d["trace_activity_header"] = false;
#endif
  return d;
}

struct Devices {
  std::vector<int64_t> name, at, corr, linked, dev, stream, start, dur, nbytes;
  Interner names;
  std::unordered_map<int, int64_t> skipped;  // device-side types that are not GPU time
  bool available = true;                      // false: a torch without activityType()
};

// Device events: kernels, copies and memsets (by activity type), with the counts of other
// device-side types skipped (gpu_user_annotation is not GPU time). A type is host-side or not
// by its first event's device type, as the Python path decides it. `all` (tests): every event.
void read_devices(ProfilerResult& res, bool all, Devices& D) {
  if (!has_activity_type<KinetoEvent>::value) {
    D.available = false;
    return;
  }
  const auto& evs = res.events();
  std::unordered_map<int, bool> host_of;
  std::unordered_map<int64_t, int64_t> from_trace;
  bool trace_read = false;
  for (const KinetoEvent& e : evs) {
    int t = activity_of(e);
    bool device = t == static_cast<int>(AT::CONCURRENT_KERNEL) || t == static_cast<int>(AT::GPU_MEMCPY) ||
        t == static_cast<int>(AT::GPU_MEMSET);
    if (!device && !all) {
      auto h = host_of.find(t);
      if (h == host_of.end()) {
        h = host_of.emplace(t, e.deviceType() == c10::DeviceType::CPU).first;
      }
      if (!h->second) {
        ++D.skipped[t];
      }
      continue;
    }
    D.name.push_back(D.names.add(e.name()));
    D.at.push_back(t);
    D.corr.push_back(static_cast<int64_t>(e.correlationId()));
    D.linked.push_back(static_cast<int64_t>(e.linkedCorrelationId()));
    D.dev.push_back(e.deviceIndex());
    D.stream.push_back(e.deviceResourceId());
    D.start.push_back(static_cast<int64_t>(e.startNs()));
    D.dur.push_back(static_cast<int64_t>(e.durationNs()));
    int64_t b = 0;
    if (t == static_cast<int>(AT::GPU_MEMCPY) || t == static_cast<int>(AT::GPU_MEMSET)) {
      // `nBytes()` is not filled in every torch; then CUPTI's metadata, on the event or in
      // Kineto's own record of it.
      try {
        b = e.nBytes();
      } catch (const std::exception&) {
        b = 0;
      }
      if (b <= 0) {
        try {
          b = metadata_bytes(e.metadataJson());
        } catch (const std::exception&) {
          b = 0;
        }
      }
      if (b <= 0) {
        if (!trace_read) {
          from_trace = trace_bytes(res);
          trace_read = true;
        }
        auto it = from_trace.find(static_cast<int64_t>(e.correlationId()));
        b = it == from_trace.end() ? 0 : it->second;
      }
    }
    D.nbytes.push_back(b < 0 ? 0 : b);
  }
}

py::dict skipped_dict(const Devices& D) {
  py::dict sk;
  for (const auto& [t, v] : D.skipped) {
    sk[py::str(libkineto::toString(static_cast<AT>(t)))] = v;
  }
  return sk;
}

py::object device_events(py::handle kr, bool all) {
  Devices D;
  read_devices(result_of(kr), all, D);
  if (!D.available) {
    return py::none();
  }
  py::dict tn;  // activity type → its name, for the types present
  for (int64_t t : D.at) {
    py::int_ key(t);
    if (!tn.contains(key)) {
      tn[key] = py::str(libkineto::toString(static_cast<AT>(t)));
    }
  }
  py::dict d;
  d["name"] = to_list(D.name);
  d["activity"] = to_list(D.at);
  d["corr"] = to_list(D.corr);
  d["linked"] = to_list(D.linked);
  d["device"] = to_list(D.dev);
  d["stream"] = to_list(D.stream);
  d["start"] = to_list(D.start);
  d["dur"] = to_list(D.dur);
  d["nbytes"] = to_list(D.nbytes);
  d["names"] = D.names.to_py();
  d["skipped"] = skipped_dict(D);
  d["activity_names"] = tn;
  return d;
}

// ---------------------------------------------------------------- the fold

struct Key4 {
  int64_t t, a, b, c;
  bool operator==(const Key4& o) const { return t == o.t && a == o.a && b == o.b && c == o.c; }
};
struct Key4Hash {
  size_t operator()(const Key4& k) const {
    uint64_t h = static_cast<uint64_t>(k.t) * 0x9E3779B97F4A7C15ULL;
    for (int64_t v : {k.a, k.b, k.c}) {
      h ^= static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};
struct PairHash {
  size_t operator()(const std::pair<int64_t, int64_t>& p) const {
    return std::hash<int64_t>()(p.first * 1000003 ^ p.second);
  }
};

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

class Folder {
 public:
  Folder(ProfilerResult& res, const Tree& T, std::string backward_prefix, std::string thread_mark,
         std::unordered_set<int64_t> thread_keys, bool link_ops)
      : res_(res), T_(T), backward_prefix_(std::move(backward_prefix)), thread_mark_(std::move(thread_mark)),
        thread_keys_(std::move(thread_keys)), link_ops_(link_ops) {
    parent_.push_back(-1);
    frame_.push_back(frame(F_ROOT, 0, 0, 0));
    is_backward_.reserve(T.names.values.size());
    for (const auto& s : T.names.values) {
      is_backward_.push_back(starts_with(s, backward_prefix_));
    }
  }

  // Local tree: parent and frame of each node (node 0 is the profile's root).
  std::vector<int64_t> parent_, frame_;
  // Local frames: (type, a, b, c); what a, b, c hold depends on the type (F_*).
  std::vector<int64_t> ftype_, fa_, fb_, fc_;
  // One row per op: its node and its self (exclusive) host time.
  std::vector<int64_t> cpu_node_, cpu_self_;
  // One row per device activity.
  std::vector<int64_t> act_node_, act_frame_;
  int64_t unlinked_backward_ = 0, n_rt_ = 0, n_op_ = 0, n_un_ = 0;

  void walk_roots() {
    const Tree& T = T_;
    std::vector<int64_t> roots = T.roots;
    std::stable_sort(roots.begin(), roots.end(), [&](int64_t x, int64_t y) { return T.start[x] < T.start[y]; });
    std::unordered_set<int64_t> py_tids;
    for (int64_t r : roots) {
      if (T.kind[r] == K_CALL) {
        py_tids.insert(T.tid[r]);
      }
    }
    std::unordered_map<int64_t, int64_t> tid_base;
    for (int64_t r : roots) {
      int64_t tid = T.tid[r];
      if (T.kind[r] == K_OP) {
        const std::string& nm = T.names.values[T.name[r]];
        if (starts_with(nm, thread_mark_)) {
          int64_t key = parse_key(nm.substr(thread_mark_.size()));
          if (thread_keys_.count(key)) {
            int64_t base = tid_base[tid] = child(0, frame(F_THREAD, key, tid, 0));
            for (int64_t c : kids(r)) {
              walk(c, base, tid);
            }
            continue;
          }
        }
      }
      int64_t base = 0;
      if (!py_tids.count(tid)) {
        auto it = tid_base.find(tid);
        if (it != tid_base.end()) {
          base = it->second;
        } else {
          base = tid_base[tid] = child(0, frame(F_TID, tid, 0, 0));
        }
      }
      walk(r, base, tid, -1, -1, false, r);
    }
  }

  void walk_backward() {
    const Tree& T = T_;
    // `backward` grows while it is walked (a backward op inside a backward op).
    for (size_t i = 0; i < backward_.size(); ++i) {
      const Deferred d = backward_[i];
      int64_t seq = T.seq[d.n];
      int64_t fnode = -1;
      auto it = fwd_tids_.find(seq);
      if (it != fwd_tids_.end() && it->second.size() == 1) {
        fnode = fwd_.at({it->second[0], seq});
      } else if (it != fwd_tids_.end() && !it->second.empty()) {
        if (!fwd_tid_read_) {
          read_fwd_tids();
        }
        auto ft = fwd_tid_of_.find(T.corr[d.n]);
        auto f = fwd_.find({ft == fwd_tid_of_.end() ? -1 : ft->second, seq});
        if (f != fwd_.end()) {
          fnode = f->second;
        }
      }
      int64_t ctx = d.ctx;
      if (fnode >= 0) {
        ctx = child(fnode, frame(F_BACKWARD, 0, 0, 0));
      } else {
        ++unlinked_backward_;
      }
      walk(d.n, ctx, d.tid, d.row, d.par, true);
    }
  }

  // Device activities, each under the most specific context of its launch: the runtime call's
  // own place (refined to the innermost call or op open at its start), else the launching op,
  // else `<unattributed: no launch record>`.
  void place(const Devices& D, Interner& names) {
    int64_t no_launch = -1;
    std::unordered_map<int64_t, int64_t> name_of;  // device name index → names index
    for (size_t i = 0; i < D.corr.size(); ++i) {
      int64_t corr = D.corr[i];
      int64_t node = -1;
      auto rt = rt_node_.find(corr);
      if (rt != rt_node_.end()) {
        ++n_rt_;
        node = rt->second;
        auto rr = rt_row_.find(corr);
        if (rr != rt_row_.end()) {
          node = innermost(rr->second.first, rr->second.second, node);
        }
      } else {
        auto op = op_node_.find(D.linked[i]);
        if (op != op_node_.end()) {
          ++n_op_;
          node = op->second;
        } else {
          ++n_un_;
          if (no_launch < 0) {
            no_launch = child(0, frame(F_UNATTR, 0, 0, 0));
          }
          node = no_launch;
        }
      }
      int64_t t = D.at[i];
      int64_t ft = t == static_cast<int64_t>(AT::GPU_MEMCPY) ? F_MEMCPY
          : t == static_cast<int64_t>(AT::GPU_MEMSET)        ? F_MEMSET
                                                               : F_KERNEL;
      auto nm = name_of.find(D.name[i]);
      if (nm == name_of.end()) {
        nm = name_of.emplace(D.name[i], names.add(D.names.values[D.name[i]])).first;
      }
      int64_t lf = frame(ft, nm->second, 0, 0);
      act_node_.push_back(child(node, lf));
      act_frame_.push_back(lf);
    }
  }

 private:
  struct Item {
    int64_t n, ctx, src, row, par;
  };
  struct Deferred {
    int64_t n, ctx, tid, row, par;
  };

  ProfilerResult& res_;
  const Tree& T_;
  std::string backward_prefix_, thread_mark_;
  std::unordered_set<int64_t> thread_keys_;
  bool link_ops_;
  std::vector<bool> is_backward_;
  std::unordered_map<Key4, int64_t, Key4Hash> frame_index_;
  std::unordered_map<uint64_t, int64_t> edges_;
  std::unordered_map<int64_t, int64_t> op_node_, rt_node_;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> rt_row_;  // corr → (op row, start)
  std::vector<int64_t> sp_start_, sp_end_, sp_ctx_, sp_par_, op_lo_, op_hi_;
  std::unordered_map<std::pair<int64_t, int64_t>, int64_t, PairHash> fwd_;  // (tid, seq) → node
  std::unordered_map<int64_t, std::vector<int64_t>> fwd_tids_;                // seq → tids
  std::vector<Deferred> backward_;
  std::vector<std::pair<int64_t, int64_t>> srcs_;  // (call node, its def-line node or -1)
  std::vector<Item> stack_;
  std::unordered_map<int64_t, int64_t> fwd_tid_of_;
  bool fwd_tid_read_ = false;

  static int64_t parse_key(const std::string& s) {
    if (s.empty() || s.size() > 18) {
      return -1;
    }
    int64_t v = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') {
        return -1;
      }
      v = v * 10 + (ch - '0');
    }
    return v;
  }

  int64_t frame(int64_t t, int64_t a, int64_t b, int64_t c) {
    Key4 k{t, a, b, c};
    auto it = frame_index_.find(k);
    if (it != frame_index_.end()) {
      return it->second;
    }
    int64_t f = static_cast<int64_t>(ftype_.size());
    ftype_.push_back(t);
    fa_.push_back(a);
    fb_.push_back(b);
    fc_.push_back(c);
    frame_index_.emplace(k, f);
    return f;
  }

  int64_t child(int64_t p, int64_t f) {
    uint64_t key = (static_cast<uint64_t>(p) << 32) | static_cast<uint64_t>(f);
    auto it = edges_.find(key);
    if (it != edges_.end()) {
      return it->second;
    }
    int64_t n = static_cast<int64_t>(parent_.size());
    parent_.push_back(p);
    frame_.push_back(f);
    edges_.emplace(key, n);
    return n;
  }

  std::vector<int64_t> kids(int64_t n) const {
    std::vector<int64_t> out;
    for (int64_t c = n + 1, e = T_.end[n]; c < e; c = T_.end[c]) {
      out.push_back(c);
    }
    return out;
  }

  void push_kids(int64_t n, int64_t ctx, int64_t src, int64_t row, int64_t par) {
    size_t mark = stack_.size();
    for (int64_t c = n + 1, e = T_.end[n]; c < e; c = T_.end[c]) {
      stack_.push_back({c, ctx, src, row, par});
    }
    std::reverse(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
  }

  void span(int64_t s, int64_t e, int64_t ctx, int64_t& par) {
    sp_par_.push_back(par);
    par = static_cast<int64_t>(sp_start_.size());
    sp_start_.push_back(s);
    sp_end_.push_back(e);
    sp_ctx_.push_back(ctx);
  }

  int64_t at_site(int64_t ctx, int64_t n) {
    return child(ctx, frame(F_SITE, T_.cfile[n], T_.cline[n], T_.cfunc[n]));
  }

  void walk(int64_t root, int64_t ctx0, int64_t tid, int64_t op_row = -1, int64_t par0 = -1,
            bool placed = false, int64_t tree_root = -1) {
    const Tree& T = T_;
    stack_.clear();
    stack_.push_back({root, ctx0, -1, op_row, par0});
    int64_t first = placed ? root : -1;
    while (!stack_.empty()) {
      Item it = stack_.back();
      stack_.pop_back();
      int64_t n = it.n, ctx = it.ctx, src = it.src, row = it.row, par = it.par;
      if (n < 0) {
        op_hi_[ctx] = static_cast<int64_t>(sp_start_.size());  // an op's exit: ctx is its row
        continue;
      }
      int64_t t = T.kind[n];
      if (t == K_OP) {
        int64_t ni = T.name[n];
        if (src >= 0) {
          if (srcs_[src].second < 0) {
            int64_t c = srcs_[src].first;
            srcs_[src].second = child(ctx, frame(F_DEF, T.sfile[c], T.sline[c], T.sfunc[c]));
          }
          ctx = srcs_[src].second;
        }
        int64_t seq = T.seq[n];
        if (seq >= 0 && n != first && is_backward_[ni]) {
          backward_.push_back({n, ctx, tid, row, par});
          continue;
        }
        int64_t node = child(ctx, frame(F_OP, ni, 0, 0));
        if (seq >= 0) {
          fwd_[{tid, seq}] = node;
          auto& ts = fwd_tids_[seq];
          if (std::find(ts.begin(), ts.end(), tid) == ts.end()) {
            ts.push_back(tid);
          }
        }
        if (link_ops_) {
          op_node_[T.corr[n]] = node;
        }
        int64_t s = T.start[n], en = T.stop[n], dur = en - s;
        if (row >= 0) {
          cpu_self_[row] -= dur;
          span(s, en, node, par);
        }
        int64_t r2 = static_cast<int64_t>(cpu_node_.size());
        cpu_node_.push_back(node);
        cpu_self_.push_back(dur);
        op_lo_.push_back(-1);
        op_hi_.push_back(-1);
        if (T.end[n] > n + 1) {
          op_lo_[r2] = static_cast<int64_t>(sp_start_.size());
          stack_.push_back({-1, r2, -1, -1, -1});
          push_kids(n, node, -1, r2, par);
        }
        continue;
      }
      if (t == K_CALL) {
        if (n != tree_root) {
          ctx = at_site(ctx, n);
        }
        if (T.module[n]) {
          ctx = child(ctx, frame(F_MODULE, T.name[n], 0, 0));
          src = -1;
        } else {
          srcs_.push_back({n, -1});
          src = static_cast<int64_t>(srcs_.size()) - 1;
        }
        if (row >= 0) {
          span(T.start[n], T.stop[n], ctx, par);
        }
      } else if (t == K_CCALL) {
        ctx = at_site(ctx, n);
        src = -1;
        if (row >= 0) {
          span(T.start[n], T.stop[n], ctx, par);
        }
      } else if (t == K_KINETO && n != root) {
        int64_t corr = T.corr[n];
        if (rt_node_.find(corr) == rt_node_.end()) {
          rt_node_[corr] = ctx;
          if (row >= 0) {
            rt_row_[corr] = {row, T.start[n]};
            if (ctx == cpu_node_[row]) {
              continue;  // its children are only its own device events
            }
          }
        }
      }
      if (T.end[n] > n + 1) {
        push_kids(n, ctx, src, row, par);
      }
    }
  }

  // The context of the innermost call or op inside op `row` whose [start, end) holds t, else
  // `dflt`: the last span starting at or before t, then up its enclosing spans until one is
  // still open at t (as `_Walked.innermost`).
  int64_t innermost(int64_t row, int64_t t, int64_t dflt) const {
    int64_t lo = op_lo_[row];
    if (lo < 0) {
      return dflt;
    }
    int64_t hi = op_hi_[row] < 0 ? lo : op_hi_[row];
    if (hi <= lo) {
      return dflt;
    }
    auto b = sp_start_.begin();
    int64_t k = static_cast<int64_t>(std::upper_bound(b + lo, b + hi, t) - b) - 1;
    while (k >= lo) {
      if (t < sp_end_[k]) {
        return sp_ctx_[k];
      }
      k = sp_par_[k];
    }
    return dflt;
  }

  void read_fwd_tids() {
    fwd_tid_read_ = true;
    for (const KinetoEvent& e : res_.events()) {
      if (e.sequenceNr() >= 0 && starts_with(e.name(), backward_prefix_)) {
        fwd_tid_of_[static_cast<int64_t>(e.correlationId())] = static_cast<int64_t>(e.fwdThreadId());
      }
    }
  }
};

// Fold one window: the local tree, its frames, the op rows and the device activities, as int64
// columns (bytes) plus the strings they index. None where device events cannot be read here
// (a torch without activityType()): the Python path folds that torch.
py::object fold(py::handle kr, const std::string& backward_prefix, const std::string& thread_mark,
                const std::vector<int64_t>& thread_keys, bool cuda) {
  if (cuda && !has_activity_type<KinetoEvent>::value) {
    return py::none();
  }
  ProfilerResult& res = result_of(kr);
  Tree T;
  read_tree(res, T);
  Folder F(res, T, backward_prefix, thread_mark,
           std::unordered_set<int64_t>(thread_keys.begin(), thread_keys.end()), cuda);
  F.walk_roots();
  F.walk_backward();
  Devices D;
  if (cuda) {
    read_devices(res, false, D);
    F.place(D, T.names);
  }
  py::dict d;
  d["parent"] = to_bytes(F.parent_);
  d["frame"] = to_bytes(F.frame_);
  d["ftype"] = to_bytes(F.ftype_);
  d["fa"] = to_bytes(F.fa_);
  d["fb"] = to_bytes(F.fb_);
  d["fc"] = to_bytes(F.fc_);
  d["cpu_node"] = to_bytes(F.cpu_node_);
  d["cpu_self"] = to_bytes(F.cpu_self_);
  d["act_node"] = to_bytes(F.act_node_);
  d["act_frame"] = to_bytes(F.act_frame_);
  d["device"] = to_bytes(D.dev);
  d["stream"] = to_bytes(D.stream);
  d["start"] = to_bytes(D.start);
  d["dur"] = to_bytes(D.dur);
  d["nbytes"] = to_bytes(D.nbytes);
  d["names"] = T.names.to_py();
  d["strs"] = T.strs.to_py();
  d["skipped"] = skipped_dict(D);
  py::dict links;
  for (auto [k, v] : {std::pair<const char*, int64_t>{"runtime", F.n_rt_}, {"op", F.n_op_}, {"unlinked", F.n_un_}}) {
    if (v) {
      links[k] = v;
    }
  }
  d["links"] = links;
  d["unlinked_backward"] = F.unlinked_backward_;
  d["ops"] = static_cast<int64_t>(T.kind.size());
  return d;
}

// ---------------------------------------------------------------- dropping a window's results

// A window's events, taken out of its ProfilerResult so that freeing them (torch's destructors:
// ~0.3-0.5 s per 100k GPU events on an H100, docs/BENCHMARKS.md) need not hold up the program.
// Nothing in them refers to a Python object (no inputs are recorded: record_shapes is off), so
// they may be freed without the GIL.
struct Released {
  std::vector<KinetoEvent> events;
  std::vector<torch::autograd::profiler::experimental_event_t> tree;
  std::unique_ptr<TraceWrapper> trace;  // Kineto's activity records
};

// Threads freeing earlier windows. Never destroyed: a joinable std::thread destroyed at exit
// would terminate the process; `join_released` (atexit) waits for them instead.
std::vector<std::thread>& freeing() {
  static auto* threads = new std::vector<std::thread>;
  return *threads;
}

// mode 0: free here (timed, for benchmarks); 1: the events and tree on a background thread (the
// trace stays with the result); 2: never — the process is about to exit and the OS takes the
// memory back at once.
py::dict release(py::handle kr, int mode) {
  ProfilerResult& res = result_of(kr);
  auto* r = new Released;
  // Both accessors return references to ProfilerResult's own (non-const) members.
  r->events.swap(const_cast<std::vector<KinetoEvent>&>(res.events()));
  r->tree.swap(const_cast<std::vector<torch::autograd::profiler::experimental_event_t>&>(res.event_tree()));
  if (mode != 1) {
    // Not on a background thread: Kineto's trace holds CUPTI's activity buffers, and freeing
    // them while the next window's profiler starts crashed the process ("double free or
    // corruption", an H100 run of examples/transformer_train.py); torch frees it here instead.
    r->trace = std::move(trace_of(res));
  }
  py::dict d;
  if (mode == 0) {
    double tree_s = 0, events_s = 0, trace_s = 0;
    {
      py::gil_scoped_release nogil;
      auto t0 = std::chrono::steady_clock::now();
      r->tree.clear();
      auto t1 = std::chrono::steady_clock::now();
      r->events.clear();
      auto t2 = std::chrono::steady_clock::now();
      delete r;
      auto t3 = std::chrono::steady_clock::now();
      tree_s = std::chrono::duration<double>(t1 - t0).count();
      events_s = std::chrono::duration<double>(t2 - t1).count();
      trace_s = std::chrono::duration<double>(t3 - t2).count();
    }
    d["tree_s"] = tree_s;
    d["events_s"] = events_s;
    d["trace_s"] = trace_s;
  } else if (mode == 1) {
    freeing().emplace_back([r] { delete r; });
  }
  return d;
}

void join_released() {
  std::vector<std::thread> threads;
  threads.swap(freeing());
  py::gil_scoped_release nogil;
  for (auto& t : threads) {
    if (t.joinable()) {
      t.join();
    }
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dlpt: a stopped profiler's result folded into a local tree (collectors/record_native.py)";
  m.def("fold", &fold, py::arg("kineto_results"), py::arg("backward_prefix"), py::arg("thread_mark"),
        py::arg("thread_keys"), py::arg("cuda"));
  m.def("capabilities", &capabilities, py::arg("kineto_results"));
  m.def("release", &release, py::arg("kineto_results"), py::arg("mode"));
  m.def("join_released", &join_released);
  m.def("event_tree", &event_tree, py::arg("kineto_results"));
  m.def("device_events", &device_events, py::arg("kineto_results"), py::arg("all") = false);
}
