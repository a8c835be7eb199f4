// dlpt collector: GPU PC sampling (`dlpt record --pc-samples`), CUPTI's PC Sampling API.
// Included by device.h (DLPT_CUPTI builds only), before its callback, which calls in here.
//
// What it keeps: samples per (launching node, kernel, source file and line of the sampled
// instruction, stall reason), the reasons as CUPTI names them; the Python side
// (collectors/record/pcsamples.py) turns them into the model's metric family.
//
// Choices, and why:
// * Kernel-serialized collection (CUPTI_PC_SAMPLING_COLLECTION_MODE_KERNEL_SERIALIZED): every PC
//   record then carries its kernel's correlation id, which the launch callback already mapped to
//   the line that launched it (device.h's correlation ring). So a sample lands on the launching
//   line exactly as the kernel's time does, backward and CUDA-graph replays included, with no
//   device synchronisation of our own around each launch (Proton's continuous mode starts and
//   stops sampling around every launch and synchronises the context before each).
// * The data is drained at each kernel launch's entry in the driver API, at a snapshot's flush,
//   before a module unloads, and when recording stops: CUPTI asks for a drain after every kernel
//   in this mode, and a launch's entry is the first point after the previous kernel.
// * SASS → source (cuptiGetSassToSourceCorrelation) is asked once per (cubin, function, PC
//   offset) as samples arrive, on a copy of the cubin kept from its module's load: CUPTI's
//   pointer is valid only inside the load callback. Kernels built with line information (Triton's,
//   Inductor's, nvcc -lineinfo) get their file and line; library kernels (cuBLAS, cuDNN, ATen)
//   have none and keep their samples per kernel.
// * Only the base stall reasons are collected (`..._not_issued` variants left out): each sample
//   has one base reason, so the reasons' samples add up to the kernel's.
#pragma once

#include "common.h"  // first: Python.h before any other header

#if defined(DLPT_CUPTI)
#include <cupti_pcsampling.h>
#include <dlfcn.h>

namespace {

int64_t record_node(uint32_t corr, int64_t* launched);  // device.h
int64_t name_idx(const std::string& s);                // device.h

struct PcKey {
  int64_t node, name, file;
  int32_t line, reason;
  bool operator==(const PcKey& o) const {
    return node == o.node && name == o.name && file == o.file && line == o.line && reason == o.reason;
  }
};
struct PcKeyHash {
  size_t operator()(const PcKey& k) const {
    uint64_t h = uint64_t(k.node) * 0x9E3779B97F4A7C15ULL;
    h ^= uint64_t(k.name) * 0xC2B2AE3D27D4EB4FULL + (h << 6);
    h ^= uint64_t(k.file) * 0x165667B19E3779F9ULL + (h >> 3);
    h ^= uint64_t(uint32_t(k.line)) << 20 ^ uint64_t(uint32_t(k.reason));
    return size_t(h);
  }
};
struct PcLineKey {
  uint64_t crc, pc;
  uint32_t function;
  bool operator==(const PcLineKey& o) const { return crc == o.crc && pc == o.pc && function == o.function; }
};
struct PcLineKeyHash {
  size_t operator()(const PcLineKey& k) const {
    return size_t(k.crc * 0x9E3779B97F4A7C15ULL ^ k.pc * 0xC2B2AE3D27D4EB4FULL ^ k.function);
  }
};

constexpr size_t kPcBufferPcs = 8192;  // PCs per drain call; the rest come with the next call

struct PcState {
  bool serial = true;       // DLPT_PC_MODE: serial (default) or continuous (see pcs_launch)
  std::vector<bool> kernel_cbid;  // driver callback ids that launch kernels or graphs
  std::atomic<bool> wanted{false};  // DLPT_PC_SAMPLES set when CUPTI was switched on
  uint32_t period = 0;      // 2^period cycles between samples; 0: CUPTI's default for the GPU
  std::mutex mu;            // everything below
  std::string error;        // why sampling is not on ("" while it works)
  std::vector<CUcontext> contexts;                 // contexts sampling was enabled on
  std::vector<std::string> reason_names;           // CUPTI's stall reason names, by CUPTI's index
  std::vector<uint32_t> reasons;                   // the indices configured (the base reasons)
  CUpti_PCSamplingData buf{};                      // the drain buffer (also given to CUPTI at configuration)
  std::unordered_map<uint64_t, std::string> cubins;  // cubin CRC → a copy of the cubin
  std::unordered_map<PcLineKey, std::pair<int64_t, int32_t>, PcLineKeyHash> lines;  // → (file name index, line)
  std::unordered_map<std::string, int64_t> functions;  // CUPTI's function name → the kernel's name index
  std::unordered_map<PcKey, int64_t, PcKeyHash> samples;
  int64_t total = 0, dropped = 0, non_user = 0, buffer_full = 0, drains = 0, get_errors = 0;
  int64_t period_read = 0;  // the period CUPTI reports using, as its exponent
  int64_t cubin_bytes = 0, unloaded = 0;
};
PcState g_pcs;

// DLPT_PC_TRACE=1: each step of sampling's life said on stderr (bring-up on a new GPU or CUPTI).
bool pcs_trace() {
  static const bool on = [] {
    const char* v = std::getenv("DLPT_PC_TRACE");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}
#define PCS_TRACE(...)                          \
  do {                                          \
    if (pcs_trace()) {                          \
      std::fprintf(stderr, "dlpt pcs: " __VA_ARGS__); \
      std::fputc('\n', stderr);                \
    }                                           \
  } while (0)

std::string pcs_err(const char* what, CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return std::string(what) + ": " + (s ? s : "error");
}

// A module's cubin, kept for line lookups (CUPTI's pointer dies with the callback).
void pcs_module_loaded(const CUpti_ResourceData* rd) {
  auto* md = static_cast<const CUpti_ModuleResourceData*>(rd->resourceDescriptor);
  if (md == nullptr || md->pCubin == nullptr || md->cubinSize == 0) return;
  CUpti_GetCubinCrcParams p{};
  p.size = CUpti_GetCubinCrcParamsSize;
  p.cubinSize = md->cubinSize;
  p.cubin = md->pCubin;
  if (cuptiGetCubinCrc(&p) != CUPTI_SUCCESS) return;
  std::lock_guard<std::mutex> lk(g_pcs.mu);
  auto it = g_pcs.cubins.find(p.cubinCrc);
  if (it != g_pcs.cubins.end()) return;
  g_pcs.cubins.emplace(p.cubinCrc, std::string(md->pCubin, md->cubinSize));
  PCS_TRACE("module loaded: cubin %llx, %zu bytes", (unsigned long long)p.cubinCrc, md->cubinSize);
  g_pcs.cubin_bytes += int64_t(md->cubinSize);
}

// (file name index, line) of one sampled instruction: -1 and 0 where the cubin has no line table.
std::pair<int64_t, int32_t> pcs_line_locked(const CUpti_PCSamplingPCData& pc) {
  PcLineKey k{pc.cubinCrc, pc.pcOffset, pc.functionIndex};
  auto it = g_pcs.lines.find(k);
  if (it != g_pcs.lines.end()) return it->second;
  std::pair<int64_t, int32_t> out{-1, 0};
  auto cb = g_pcs.cubins.find(pc.cubinCrc);
  if (cb != g_pcs.cubins.end() && pc.functionName != nullptr) {
    CUpti_GetSassToSourceCorrelationParams p{};
    p.size = CUpti_GetSassToSourceCorrelationParamsSize;
    p.cubin = cb->second.data();
    p.cubinSize = cb->second.size();
    p.functionName = pc.functionName;
    p.pcOffset = pc.pcOffset;
    // Fails where the cubin has no line table: then the sample stays on its kernel.
    if (cuptiGetSassToSourceCorrelation(&p) == CUPTI_SUCCESS && p.fileName != nullptr && p.lineNumber > 0) {
      std::string file = p.fileName;
      if (p.dirName != nullptr && p.dirName[0] != '\0' && file[0] != '/') file = std::string(p.dirName) + "/" + file;
      out = {name_idx(file), int32_t(p.lineNumber)};
    }
    std::free(p.fileName);
    std::free(p.dirName);
  }
  g_pcs.lines.emplace(k, out);
  if (g_pcs.lines.size() <= 3)
    PCS_TRACE("line of %s+%llx: file %lld line %d", pc.functionName ? pc.functionName : "?",
              (unsigned long long)pc.pcOffset, (long long)out.first, int(out.second));
  return out;
}

// The kernel's name as its activity leaf has it (demangled, as device.h's buffer_completed does).
int64_t pcs_function_locked(const char* fn) {
  std::string key = fn ? fn : "";
  auto it = g_pcs.functions.find(key);
  if (it != g_pcs.functions.end()) return it->second;
  int status = -1;
  char* dm = fn ? abi::__cxa_demangle(fn, nullptr, nullptr, &status) : nullptr;
  int64_t idx = name_idx(status == 0 && dm ? dm : (fn ? fn : "<unnamed kernel>"));
  std::free(dm);
  g_pcs.functions.emplace(key, idx);
  return idx;
}

// The PCs CUPTI put in the drain buffer into the sample table; the buffer emptied.
void pcs_take_locked(int64_t at_node = -1) {
  CUpti_PCSamplingData& d = g_pcs.buf;
  {
    g_pcs.total += int64_t(d.totalSamples);
    g_pcs.dropped += int64_t(d.droppedSamples);
    g_pcs.non_user += int64_t(d.nonUsrKernelsTotalSamples);
    if (d.hardwareBufferFull) ++g_pcs.buffer_full;
    for (size_t i = 0; i < d.totalNumPcs; ++i) {
      const CUpti_PCSamplingPCData& pc = d.pPcData[i];
      int64_t launched;
      int64_t node = at_node >= 0 ? at_node : record_node(pc.correlationId, &launched);
      int64_t name = pcs_function_locked(pc.functionName);
      auto line = pcs_line_locked(pc);
      for (size_t j = 0; j < pc.stallReasonCount; ++j) {
        const CUpti_PCSamplingStallReason& s = pc.stallReason[j];
        if (s.samples == 0) continue;
        g_pcs.samples[PcKey{node, name, line.first, line.second, int32_t(s.pcSamplingStallReasonIndex)}] +=
            int64_t(s.samples);
      }
    }
  }
  d.totalNumPcs = 0;  // taken: a later look at the buffer (after disabling) sees only what is new
  d.totalSamples = d.droppedSamples = d.nonUsrKernelsTotalSamples = 0;
  d.hardwareBufferFull = 0;
}

// What the buffer and CUPTI hold for `ctx` into the sample table. Mid-range (`final` false) CUPTI gives what its
// worker threads decoded so far (they wake every 100 ms) and may refuse: the next drain takes it.
// After cuptiPCSamplingStop (`final`) it gives everything, in buffer-sized parts.
void pcs_drain_locked(CUcontext ctx, bool final = false, int64_t at_node = -1) {
  // A stop (and a disable) writes what it flushed into the buffer given at configuration, which
  // is this one: taken before GetData writes over it (as Proton's first round does).
  pcs_take_locked(at_node);
  for (int round = 0; round < 100000; ++round) {
    CUpti_PCSamplingGetDataParams gp{};
    gp.size = CUpti_PCSamplingGetDataParamsSize;
    gp.ctx = ctx;
    gp.pcSamplingData = &g_pcs.buf;
    CUptiResult r = cuptiPCSamplingGetData(&gp);
    ++g_pcs.drains;
    if (g_pcs.drains <= 3 || final || r != CUPTI_SUCCESS)
      PCS_TRACE("drain %lld%s: %d, %zu PCs, %zu remaining", (long long)g_pcs.drains, final ? " (final)" : "", int(r),
                g_pcs.buf.totalNumPcs, g_pcs.buf.remainingNumPcs);
    if (r != CUPTI_SUCCESS) {
      ++g_pcs.get_errors;
      if (r == CUPTI_ERROR_OUT_OF_MEMORY) ++g_pcs.buffer_full;
      if (final && g_pcs.error.empty() && r != CUPTI_ERROR_OUT_OF_MEMORY)
        g_pcs.error = pcs_err("cuptiPCSamplingGetData", r);
      return;
    }
    size_t remaining = g_pcs.buf.remainingNumPcs;
    pcs_take_locked(at_node);
    if (remaining == 0) return;
  }
}

// Sampling switched on for `ctx` (once per context): the base stall reasons, serialized
// collection, the period asked for. False (with g_pcs.error) when CUPTI refuses.
bool pcs_enable_locked(CUcontext ctx) {
  for (CUcontext c : g_pcs.contexts)
    if (c == ctx) return true;
  if (!g_pcs.error.empty()) return false;
  CUpti_PCSamplingEnableParams ep{};
  ep.size = CUpti_PCSamplingEnableParamsSize;
  ep.ctx = ctx;
  CUptiResult r = cuptiPCSamplingEnable(&ep);
  PCS_TRACE("enable on context %p: %d", static_cast<void*>(ctx), int(r));
  if (r != CUPTI_SUCCESS) {
    g_pcs.error = pcs_err("cuptiPCSamplingEnable", r);
    return false;
  }
  size_t n = 0;
  CUpti_PCSamplingGetNumStallReasonsParams np{};
  np.size = CUpti_PCSamplingGetNumStallReasonsParamsSize;
  np.ctx = ctx;
  np.numStallReasons = &n;
  r = cuptiPCSamplingGetNumStallReasons(&np);
  if (r != CUPTI_SUCCESS || n == 0) {
    g_pcs.error = pcs_err("cuptiPCSamplingGetNumStallReasons", r);
    return false;
  }
  std::vector<std::vector<char>> names(n, std::vector<char>(CUPTI_STALL_REASON_STRING_SIZE, '\0'));
  std::vector<char*> name_ptrs(n);
  for (size_t i = 0; i < n; ++i) name_ptrs[i] = names[i].data();
  std::vector<uint32_t> idx(n, 0);
  CUpti_PCSamplingGetStallReasonsParams sp{};
  sp.size = CUpti_PCSamplingGetStallReasonsParamsSize;
  sp.ctx = ctx;
  sp.numStallReasons = n;
  sp.stallReasonIndex = idx.data();
  sp.stallReasons = name_ptrs.data();
  r = cuptiPCSamplingGetStallReasons(&sp);
  if (r != CUPTI_SUCCESS) {
    g_pcs.error = pcs_err("cuptiPCSamplingGetStallReasons", r);
    return false;
  }
  uint32_t top = 0;
  for (uint32_t i : idx) top = std::max(top, i);
  g_pcs.reason_names.assign(size_t(top) + 1, "");
  g_pcs.reasons.clear();
  for (size_t i = 0; i < n; ++i) {
    std::string nm = names[i].data();
    g_pcs.reason_names[idx[i]] = nm;
    // The stall reasons (`..._stalled_X`), not the `_not_issued` variants nor the sample and
    // dropped-sample counters CUPTI lists beside them.
    if (nm.find("stalled_") != std::string::npos && nm.find("not_issued") == std::string::npos)
      g_pcs.reasons.push_back(idx[i]);
  }
  if (g_pcs.buf.pPcData == nullptr) {
    g_pcs.buf.size = sizeof(CUpti_PCSamplingData);
    g_pcs.buf.collectNumPcs = kPcBufferPcs;
    g_pcs.buf.pPcData = static_cast<CUpti_PCSamplingPCData*>(std::calloc(kPcBufferPcs, sizeof(CUpti_PCSamplingPCData)));
    for (size_t i = 0; i < kPcBufferPcs; ++i) {
      g_pcs.buf.pPcData[i].size = sizeof(CUpti_PCSamplingPCData);
      g_pcs.buf.pPcData[i].stallReason =
          static_cast<CUpti_PCSamplingStallReason*>(std::calloc(n, sizeof(CUpti_PCSamplingStallReason)));
    }
  }
  std::vector<CUpti_PCSamplingConfigurationInfo> cfg(5);
  cfg[0].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON;
  cfg[0].attributeData.stallReasonData.stallReasonCount = g_pcs.reasons.size();
  cfg[0].attributeData.stallReasonData.pStallReasonIndex = g_pcs.reasons.data();
  cfg[1].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE;
  cfg[1].attributeData.collectionModeData.collectionMode =
      g_pcs.serial ? CUPTI_PC_SAMPLING_COLLECTION_MODE_KERNEL_SERIALIZED : CUPTI_PC_SAMPLING_COLLECTION_MODE_CONTINUOUS;
  cfg[2].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER;
  cfg[2].attributeData.samplingDataBufferData.samplingDataBuffer = &g_pcs.buf;
  cfg[3].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_ENABLE_START_STOP_CONTROL;
  // Start and stop by hand: CUPTI hands over all it holds only after a range ends (a stop).
  cfg[3].attributeData.enableStartStopControlData.enableStartStopControl = 1;
  size_t ncfg = 4;
  if (g_pcs.period >= 5 && g_pcs.period <= 31) {
    cfg[4].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD;
    cfg[4].attributeData.samplingPeriodData.samplingPeriod = g_pcs.period;
    ncfg = 5;
  }
  CUpti_PCSamplingConfigurationInfoParams cp{};
  cp.size = CUpti_PCSamplingConfigurationInfoParamsSize;
  cp.ctx = ctx;
  cp.numAttributes = ncfg;
  cp.pPCSamplingConfigurationInfo = cfg.data();
  r = cuptiPCSamplingSetConfigurationAttribute(&cp);
  PCS_TRACE("configured: %d (%zu reasons of %zu)", int(r), g_pcs.reasons.size(), n);
  if (r != CUPTI_SUCCESS) {
    g_pcs.error = pcs_err("cuptiPCSamplingSetConfigurationAttribute", r);
    for (size_t i = 0; i < ncfg; ++i)
      if (cfg[i].attributeStatus != CUPTI_SUCCESS)
        g_pcs.error += " (attribute " + std::to_string(int(cfg[i].attributeType)) + ")";
    CUpti_PCSamplingDisableParams dp{};
    dp.size = CUpti_PCSamplingDisableParamsSize;
    dp.ctx = ctx;
    cuptiPCSamplingDisable(&dp);
    return false;
  }
  {
    CUpti_PCSamplingConfigurationInfo q{};
    q.attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD;
    CUpti_PCSamplingConfigurationInfoParams qp{};
    qp.size = CUpti_PCSamplingConfigurationInfoParamsSize;
    qp.ctx = ctx;
    qp.numAttributes = 1;
    qp.pPCSamplingConfigurationInfo = &q;
    if (cuptiPCSamplingGetConfigurationAttribute(&qp) == CUPTI_SUCCESS)
      g_pcs.period_read = int64_t(q.attributeData.samplingPeriodData.samplingPeriod);
  }
  g_pcs.contexts.push_back(ctx);
  if (!g_pcs.serial) return true;  // continuous: started and stopped around each launch
  CUpti_PCSamplingStartParams stp{};
  stp.size = CUpti_PCSamplingStartParamsSize;
  stp.ctx = ctx;
  r = cuptiPCSamplingStart(&stp);
  PCS_TRACE("started: %d", int(r));
  if (r != CUPTI_SUCCESS) {
    g_pcs.contexts.pop_back();
    g_pcs.error = pcs_err("cuptiPCSamplingStart", r);
    CUpti_PCSamplingDisableParams dp{};
    dp.size = CUpti_PCSamplingDisableParamsSize;
    dp.ctx = ctx;
    cuptiPCSamplingDisable(&dp);
    return false;
  }
  return true;
}

using CtxSync = int (*)();
CtxSync pcs_ctx_sync() {
  static CtxSync sync = [] {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return h != nullptr ? reinterpret_cast<CtxSync>(dlsym(h, "cuCtxSynchronize")) : nullptr;
  }();
  return sync;
}

thread_local int64_t t_pcs_node = -1;  // continuous mode: the node of the launch in flight

// A launch's entry in the driver API (`node`: where its work goes): sampling on for its
// context; serial mode drains what the kernels before it left; continuous mode waits for the
// GPU's earlier work and starts a range for this launch alone (Proton's scheme).
void pcs_launch(CUcontext ctx, CUpti_CallbackId cbid, int64_t node) {
  if (ctx == nullptr || size_t(cbid) >= g_pcs.kernel_cbid.size() || !g_pcs.kernel_cbid[cbid]) return;
  std::lock_guard<std::mutex> lk(g_pcs.mu);
  if (!pcs_enable_locked(ctx)) return;
  if (g_pcs.serial) {
    pcs_drain_locked(ctx);
    return;
  }
  if (CtxSync sync = pcs_ctx_sync()) sync();
  CUpti_PCSamplingStartParams stp{};
  stp.size = CUpti_PCSamplingStartParamsSize;
  stp.ctx = ctx;
  if (cuptiPCSamplingStart(&stp) == CUPTI_SUCCESS) t_pcs_node = node;
}

// Continuous mode, the launch's exit: its range stopped, its samples onto its node.
void pcs_launch_exit(CUcontext ctx, CUpti_CallbackId cbid) {
  if (g_pcs.serial || t_pcs_node < 0 || size_t(cbid) >= g_pcs.kernel_cbid.size() || !g_pcs.kernel_cbid[cbid]) return;
  int64_t node = t_pcs_node;
  t_pcs_node = -1;
  std::lock_guard<std::mutex> lk(g_pcs.mu);
  CUpti_PCSamplingStopParams sp{};
  sp.size = CUpti_PCSamplingStopParamsSize;
  sp.ctx = ctx;
  CUptiResult r = cuptiPCSamplingStop(&sp);
  if (g_pcs.drains < 3) PCS_TRACE("stop at launch exit: %d", int(r));
  pcs_drain_locked(ctx, true, node);
}

void pcs_drain_all() {
  std::lock_guard<std::mutex> lk(g_pcs.mu);
  for (CUcontext c : g_pcs.contexts) pcs_drain_locked(c);
}

// Module load and unload (CUPTI's resource domain): cubins kept, and drained before one goes.
void pcs_resource(CUpti_CallbackId cbid, const void* data) {
  auto* rd = static_cast<const CUpti_ResourceData*>(data);
  if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED) {
    pcs_module_loaded(rd);
  } else if (cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING) {
    std::lock_guard<std::mutex> lk(g_pcs.mu);
    for (CUcontext c : g_pcs.contexts) pcs_drain_locked(c);
    ++g_pcs.unloaded;
  }
}

// When CUPTI is switched on: sampling wanted? DLPT_PC_SAMPLES is "1" (CUPTI's default period)
// or the period's exponent (5..31: 2^N cycles). The resource callbacks that keep cubins.
void pcs_on(CUpti_SubscriberHandle sub) {
  const char* v = std::getenv("DLPT_PC_SAMPLES");
  g_pcs.wanted = v != nullptr && v[0] != '\0' && std::string(v) != "0";
  if (!g_pcs.wanted || sub == nullptr) return;
  int p = std::atoi(v);
  g_pcs.period = p >= 5 && p <= 31 ? uint32_t(p) : 0;
  const char* mode = std::getenv("DLPT_PC_MODE");
  g_pcs.serial = mode == nullptr || std::string(mode) != "continuous";
  g_pcs.kernel_cbid.assign(CUPTI_DRIVER_TRACE_CBID_SIZE, false);
  for (int cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE; ++cbid) {
    const char* nm = nullptr;
    if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, CUpti_CallbackId(cbid), &nm) != CUPTI_SUCCESS || !nm) continue;
    std::string_view s(nm);
    g_pcs.kernel_cbid[cbid] = s.rfind("cuLaunch", 0) == 0 || s.rfind("cuGraphLaunch", 0) == 0;
  }
  cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
  cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING);
}

// When recording stops: the GPU's work finished (the last kernels' samples), drained, and
// sampling disabled on every context, so the rest of the program runs unserialized.
void pcs_off() {
  if (!g_pcs.wanted) return;
  CtxSync sync = pcs_ctx_sync();
  std::lock_guard<std::mutex> lk(g_pcs.mu);
  PCS_TRACE("off: %zu contexts, sync %p", g_pcs.contexts.size(), reinterpret_cast<void*>(sync));
  if (sync != nullptr && !g_pcs.contexts.empty()) sync();
  for (CUcontext c : g_pcs.contexts) {
    CUptiResult r = CUPTI_SUCCESS;
    if (g_pcs.serial) {
      CUpti_PCSamplingStopParams sp{};
      sp.size = CUpti_PCSamplingStopParamsSize;
      sp.ctx = c;
      r = cuptiPCSamplingStop(&sp);
      PCS_TRACE("stopped: %d", int(r));
    }
    pcs_drain_locked(c, true);
    CUpti_PCSamplingDisableParams dp{};
    dp.size = CUpti_PCSamplingDisableParamsSize;
    dp.ctx = c;
    r = cuptiPCSamplingDisable(&dp);
    // Disabling writes what CUPTI still held into the buffer given at configuration (this one).
    PCS_TRACE("disabled: %d; %zu PCs in the buffer after", int(r), g_pcs.buf.totalNumPcs);
    pcs_take_locked();
    PCS_TRACE("%zu sample rows", g_pcs.samples.size());
  }
  g_pcs.contexts.clear();
  g_pcs.wanted = false;
}

void pcs_clear() {
  std::lock_guard<std::mutex> lk(g_pcs.mu);
  g_pcs.samples.clear();
  g_pcs.functions.clear();  // name indices are the trie's, which a new recording restarts
  g_pcs.lines.clear();
  g_pcs.error.clear();
  g_pcs.total = g_pcs.dropped = g_pcs.non_user = g_pcs.buffer_full = g_pcs.drains = g_pcs.get_errors = 0;
  g_pcs.unloaded = 0;
}

}  // namespace

#endif  // DLPT_CUPTI
