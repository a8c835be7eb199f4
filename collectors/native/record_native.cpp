// dlpt's native fast path for `dlpt record`: reads a stopped profiler's result
// (`torch._C._autograd._ProfilerResult`, i.e. torch::autograd::profiler::ProfilerResult)
// into flat columns of Python ints and interned strings, so that the recorder's fold runs
// over lists instead of making a pybind wrapper for every tree node and every KinetoEvent
// (that wrapper layer was most of the post-processing time: docs/BENCHMARKS.md, Recording).
//
// JIT-built against the running torch by collectors/record_native.py; any failure there
// (no compiler, another torch whose structs differ) leaves the Python path in charge.
// Only fields that `Recorder._walk_tree` / `_device_event_columns` read are taken, with
// the same meaning as torch's own pybind properties of them.

// Not <torch/extension.h>: all of ATen's headers for nothing used here (twice the build time).
#include <pybind11/pybind11.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/collection.h>

#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

using torch::autograd::profiler::KinetoEvent;
using torch::autograd::profiler::ProfilerResult;
using torch::profiler::impl::EventType;
using torch::profiler::impl::ExtraFields;
using torch::profiler::impl::Result;

// Node kinds, as `collectors/record_native.py` names them.
constexpr int64_t K_OP = 0, K_CALL = 1, K_CCALL = 2, K_KINETO = 3, K_OTHER = 4;

// Strings interned into one Python list; an entry that is not valid UTF-8 is None (torch's
// pybind would raise UnicodeDecodeError for it; the recorder names it "<undecodable...>").
struct Interner {
  std::unordered_map<std::string, int64_t> index;
  // The Python tracer's strings are borrowed `const char*` that stay put while this runs
  // (the GIL is held throughout), so a pointer seen once need not be hashed again.
  std::unordered_map<const char*, int64_t> by_ptr;
  py::list values;

  int64_t add(std::string_view s) {
    auto it = index.find(std::string(s));
    if (it != index.end()) {
      return it->second;
    }
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), nullptr);
    if (o == nullptr) {
      PyErr_Clear();
      values.append(py::none());
    } else {
      values.append(py::reinterpret_steal<py::object>(o));
    }
    int64_t k = static_cast<int64_t>(values.size()) - 1;
    index.emplace(std::string(s), k);
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

ProfilerResult& result_of(py::handle kr) {
  // Same pybind11 internals as torch's own module (built with torch's headers and ABI tag):
  // the registered `_ProfilerResult` type casts straight back to the C++ object.
  return kr.cast<ProfilerResult&>();
}

// The event tree in preorder (roots in `event_tree()` order, children in their order):
// every column has one entry per node; `end` is one past the node's subtree.
py::dict event_tree(py::handle kr) {
  ProfilerResult& res = result_of(kr);
  const auto& roots = res.event_tree();
  std::vector<int64_t> kind, end, start, stop, tid, corr, name, seq, module;
  std::vector<int64_t> cfile, cline, cfunc, sfile, sline, sfunc, root_ix;
  Interner names, strs;
  // Preorder indexes of the nodes whose subtree is still open, innermost last.
  std::vector<int64_t> open;
  // (node, its parent's preorder index) still to visit.
  std::vector<std::pair<const Result*, int64_t>> todo;
  auto grow = [&](size_t n) {
    for (auto* v : {&kind, &end, &start, &stop, &tid, &corr, &name, &seq, &module, &cfile, &cline,
                    &cfunc, &sfile, &sline, &sfunc}) {
      v->reserve(n);
    }
  };
  grow(1 << 16);
  for (const auto& root : roots) {
    if (!root) {
      continue;
    }
    todo.emplace_back(root.get(), -1);
    root_ix.push_back(static_cast<int64_t>(kind.size()));
    while (!todo.empty()) {
      const auto [r, parent] = todo.back();
      todo.pop_back();
      size_t i = kind.size();
      int64_t k = K_OTHER, nm = -1, sq = -1, mod = 0;
      int64_t cf = -1, cl = 0, cfn = -1, sf = -1, sl = 0, sfn = -1;
      if (const auto* op = std::get_if<ExtraFields<EventType::TorchOp>>(&r->extra_fields_)) {
        k = K_OP;
        nm = names.add(op->name_);
        sq = op->sequence_number_;
      } else if (const auto* c = std::get_if<ExtraFields<EventType::PyCall>>(&r->extra_fields_)) {
        k = K_CALL;
        cf = strs.add_ptr(c->caller_.filename_.str());
        cl = c->caller_.line_no_;
        cfn = strs.add_ptr(c->caller_.funcname_.str());
        sf = strs.add_ptr(c->callsite_.filename_.str());
        sl = c->callsite_.line_no_;
        sfn = strs.add_ptr(c->callsite_.funcname_.str());
        if (c->module_.has_value()) {
          mod = 1;
          nm = names.add(r->name());  // "nn.Module: Linear_0", as the pybind `name`
        }
      } else if (const auto* cc = std::get_if<ExtraFields<EventType::PyCCall>>(&r->extra_fields_)) {
        k = K_CCALL;
        cf = strs.add_ptr(cc->caller_.filename_.str());
        cl = cc->caller_.line_no_;
        cfn = strs.add_ptr(cc->caller_.funcname_.str());
      } else if (std::holds_alternative<ExtraFields<EventType::Kineto>>(r->extra_fields_)) {
        k = K_KINETO;
      }
      kind.push_back(k);
      end.push_back(0);
      start.push_back(r->start_time_ns_);
      stop.push_back(r->endTimeNS());
      tid.push_back(static_cast<int64_t>(r->start_tid_));
      corr.push_back(static_cast<int64_t>(r->correlationID()));
      name.push_back(nm);
      seq.push_back(sq);
      module.push_back(mod);
      cfile.push_back(cf);
      cline.push_back(cl);
      cfunc.push_back(cfn);
      sfile.push_back(sf);
      sline.push_back(sl);
      sfunc.push_back(sfn);
      // Close the subtrees this node is not inside of: its parent is the open node it hangs on.
      while (!open.empty() && open.back() != parent) {
        end[open.back()] = static_cast<int64_t>(i);
        open.pop_back();
      }
      open.push_back(static_cast<int64_t>(i));
      for (auto it = r->children_.rbegin(); it != r->children_.rend(); ++it) {
        if (*it) {
          todo.emplace_back(it->get(), static_cast<int64_t>(i));
        }
      }
    }
    for (int64_t o : open) {
      end[o] = static_cast<int64_t>(kind.size());
    }
    open.clear();
  }
  py::dict d;
  d["kind"] = to_list(kind);
  d["end"] = to_list(end);
  d["start"] = to_list(start);
  d["stop"] = to_list(stop);
  d["tid"] = to_list(tid);
  d["corr"] = to_list(corr);
  d["name"] = to_list(name);
  d["seq"] = to_list(seq);
  d["module"] = to_list(module);
  d["caller_file"] = to_list(cfile);
  d["caller_line"] = to_list(cline);
  d["caller_func"] = to_list(cfunc);
  d["site_file"] = to_list(sfile);
  d["site_line"] = to_list(sline);
  d["site_func"] = to_list(sfunc);
  d["roots"] = to_list(root_ix);
  d["names"] = names.values;
  d["strs"] = strs.values;
  return d;
}

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
// annotations cannot be told from kernels here, and `device_events` returns None so that the
// recorder reads device events through pybind (its Python path knows that torch).
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

// Device events: kernels, copies and memsets (by activity type), with the counts of other
// device-side types skipped (gpu_user_annotation is not GPU time). A type is host-side or not
// by its first event's device type, as the Python path decides it. `all` (tests): every event.
py::object device_events(py::handle kr, bool all) {
  ProfilerResult& res = result_of(kr);
  if (!has_activity_type<KinetoEvent>::value) {
    return py::none();
  }
  const auto& evs = res.events();
  using AT = libkineto::ActivityType;
  std::vector<int64_t> name, at, corr, linked, dev, stream, start, dur, nbytes;
  Interner names;
  std::unordered_map<int, bool> host_of;
  std::unordered_map<int, int64_t> skipped;
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
        ++skipped[t];
      }
      continue;
    }
    name.push_back(names.add(e.name()));
    at.push_back(t);
    corr.push_back(static_cast<int64_t>(e.correlationId()));
    linked.push_back(static_cast<int64_t>(e.linkedCorrelationId()));
    dev.push_back(e.deviceIndex());
    stream.push_back(e.deviceResourceId());
    start.push_back(static_cast<int64_t>(e.startNs()));
    dur.push_back(static_cast<int64_t>(e.durationNs()));
    int64_t b = 0;
    if (t != static_cast<int>(AT::CONCURRENT_KERNEL)) {
      // Only copies and memsets carry bytes; `nBytes()` is not filled in every torch.
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
    }
    nbytes.push_back(b < 0 ? 0 : b);
  }
  py::dict sk;
  for (const auto& [t, v] : skipped) {
    sk[py::str(libkineto::toString(static_cast<AT>(t)))] = v;
  }
  py::dict tn;  // activity type → its name, for the types present
  for (int64_t t : at) {
    py::int_ key(t);
    if (!tn.contains(key)) {
      tn[key] = py::str(libkineto::toString(static_cast<AT>(t)));
    }
  }
  py::dict d;
  d["name"] = to_list(name);
  d["activity"] = to_list(at);
  d["corr"] = to_list(corr);
  d["linked"] = to_list(linked);
  d["device"] = to_list(dev);
  d["stream"] = to_list(stream);
  d["start"] = to_list(start);
  d["dur"] = to_list(dur);
  d["nbytes"] = to_list(nbytes);
  d["names"] = names.values;
  d["skipped"] = sk;
  d["activity_names"] = tn;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dlpt: a stopped profiler's result as flat columns (collectors/record_native.py)";
  m.def("event_tree", &event_tree, py::arg("kineto_results"));
  m.def("device_events", &device_events, py::arg("kineto_results"), py::arg("all") = false);
}
