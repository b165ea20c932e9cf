#include "telemetry/cupti_tracer.h"

#include "telemetry/trace.h"

#ifdef STOKE_TELEMETRY_CUPTI
#include <cupti_activity.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <type_traits>
#include <vector>
#endif

namespace stoke {

CuptiTracer& CuptiTracer::Get() {
  static CuptiTracer* t = new CuptiTracer();  // never destroyed: CUPTI may call back during exit
  return *t;
}

#ifndef STOKE_TELEMETRY_CUPTI

bool CuptiTracer::Start(TraceRecorder& recorder) {
  recorder.SetInfo("kernel_track", "off: this stoke was built without the CUDA toolkit (no CUPTI)");
  return false;
}
void CuptiTracer::Stop(TraceRecorder&) {}

#else  // STOKE_TELEMETRY_CUPTI

namespace {

// The entry points, resolved with dlsym (types from the toolkit's headers: records are never hand-declared).
struct CuptiApi {
  void* handle = nullptr;
  std::string path, error;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetTimestamp) get_timestamp = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

// Loads once; later calls return the same result.
const CuptiApi& Api() {
  static const CuptiApi api = [] {
    CuptiApi a;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv(kCuptiLibraryEnv); env != nullptr && env[0] != '\0') {
      candidates = {env};
    } else {
      candidates = {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so",
                    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"};
    }
    std::string tried;
    for (const std::string& c : candidates) {
      a.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (a.handle != nullptr) {
        a.path = c;
        break;
      }
      const char* e = dlerror();
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", e != nullptr ? e : c.c_str());
    }
    if (a.handle == nullptr) {
      a.error = "cannot load libcupti (" + tried + ")";
      return a;
    }
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)> >(dlsym(a.handle, name));
      if (*fn == nullptr && a.error.empty()) a.error = fmt::format("{} lacks {}", a.path, name);
    };
    sym(&a.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(&a.enable, "cuptiActivityEnable");
    sym(&a.disable, "cuptiActivityDisable");
    sym(&a.flush_all, "cuptiActivityFlushAll");
    sym(&a.next_record, "cuptiActivityGetNextRecord");
    sym(&a.get_timestamp, "cuptiGetTimestamp");
    sym(&a.result_string, "cuptiGetResultString");
    return a;
  }();
  return api;
}

std::string ResultString(CUptiResult r) {
  const char* s = nullptr;
  if (Api().result_string != nullptr) Api().result_string(r, &s);
  return fmt::format("CUPTI error {} ({})", static_cast<int>(r), s != nullptr ? s : "?");
}

// Where completed buffers go (set while a trace is on) and CUPTI's clock -> the trace's (monotonic) clock.
std::atomic<TraceRecorder*> g_recorder{nullptr};
std::atomic<int64_t> g_clock_offset{0};  // monotonic ns - CUPTI ns

constexpr size_t kBufferBytes = size_t{4} << 20;  // Kineto's size
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

const char* MemoryKind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE:
      return "pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
      return "pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
      return "device";
    default:
      return "other";
  }
}

const char* CopyKind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

// A record flushed before its work finished carries start = end = 0 (seen on the H200 at the end of a trace
// of a busy server): it has no place on the timeline.
bool Incomplete(uint64_t start, uint64_t end) {
  return start == 0 || end < start;
}

void Emit(TraceRecorder& tr, const CUpti_Activity* rec) {
  const int64_t off = g_clock_offset.load(std::memory_order_relaxed);
  auto track = [&](uint32_t device, uint32_t stream) {
    return tr.Track(fmt::format("GPU {}", device), fmt::format("stream {}", stream));
  };
  if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
    // Fields read here sit at the same offsets in every later record version (CUPTI appends fields).
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (Incomplete(k->start, k->end)) return;
    tr.Span(track(k->deviceId, k->streamId), k->name != nullptr ? k->name : "kernel",
            static_cast<Nanos>(k->start) + off, static_cast<Nanos>(k->end - k->start),
            {{"grid", fmt::format("{}x{}x{}", k->gridX, k->gridY, k->gridZ)},
             {"block", fmt::format("{}x{}x{}", k->blockX, k->blockY, k->blockZ)},
             {"registers", static_cast<int>(k->registersPerThread)},
             {"correlation", static_cast<int64_t>(k->correlationId)},
             {"graph", static_cast<int64_t>(k->graphId)}});
  } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
    const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
    if (Incomplete(m->start, m->end)) return;
    tr.Span(track(m->deviceId, m->streamId), CopyKind(m->copyKind), static_cast<Nanos>(m->start) + off,
            static_cast<Nanos>(m->end - m->start),
            {{"bytes", static_cast<int64_t>(m->bytes)},
             {"src", MemoryKind(m->srcKind)},
             {"dst", MemoryKind(m->dstKind)},
             {"correlation", static_cast<int64_t>(m->correlationId)}});
  } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
    const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
    if (Incomplete(m->start, m->end)) return;
    tr.Span(track(m->deviceId, m->streamId), "memset", static_cast<Nanos>(m->start) + off,
            static_cast<Nanos>(m->end - m->start), {{"bytes", static_cast<int64_t>(m->bytes)}});
  }
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  TraceRecorder* tr = g_recorder.load();
  CUpti_Activity* rec = nullptr;
  while (tr != nullptr && Api().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) Emit(*tr, rec);
  std::free(buffer);
}

}  // namespace

bool CuptiTracer::Start(TraceRecorder& recorder) {
  std::lock_guard lock(mu_);
  const CuptiApi& api = Api();
  if (!api.error.empty()) {
    recorder.SetInfo("kernel_track", "off: " + api.error);
    return false;
  }
  static bool registered = false;  // guarded by mu_: the callbacks are registered once per process
  if (!registered) {
    if (CUptiResult r = api.register_callbacks(BufferRequested, BufferCompleted); r != CUPTI_SUCCESS) {
      recorder.SetInfo("kernel_track", "off: cuptiActivityRegisterCallbacks: " + ResultString(r));
      return false;
    }
    registered = true;
  }
  uint64_t cupti_now = 0;
  api.get_timestamp(&cupti_now);
  g_clock_offset.store(MonotonicNanos() - static_cast<int64_t>(cupti_now));
  g_recorder.store(&recorder);
  for (CUpti_ActivityKind k : kKinds) {
    if (CUptiResult r = api.enable(k); r != CUPTI_SUCCESS) {
      // e.g. another subscriber (ncu, nsys) holds CUPTI, or no GPU/driver.
      for (CUpti_ActivityKind d : kKinds) api.disable(d);
      g_recorder.store(nullptr);
      recorder.SetInfo("kernel_track", "off: cuptiActivityEnable: " + ResultString(r));
      return false;
    }
  }
  active_ = true;
  recorder.SetInfo("kernel_track", "cupti (" + api.path + ")");
  return true;
}

void CuptiTracer::Stop(TraceRecorder&) {
  std::lock_guard lock(mu_);
  if (!active_) return;
  const CuptiApi& api = Api();
  for (CUpti_ActivityKind k : kKinds) api.disable(k);
  api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // completed buffers are parsed into the trace here
  g_recorder.store(nullptr);
  active_ = false;
}

#endif  // STOKE_TELEMETRY_CUPTI

}  // namespace stoke
