#include "engine/model/synthetic.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "engine/model/backends.h"
#include "engine/model/device_choice.h"

namespace stoke {

namespace {

using nlohmann::json;

StatusOr<double> NonNegative(const json& v, std::string_view key, std::string_view where) {
  if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>())) {
    return InvalidArgumentError("{}: '{}' must be a non-negative number, got {}", where, key, v.dump());
  }
  return v.get<double>();
}

StatusOr<SyntheticKernel> ParseKernel(const json& j, std::string_view where) {
  if (!j.is_object()) return InvalidArgumentError("{}: each kernel must be an object", where);
  SyntheticKernel k;
  for (const auto& [key, v] : j.items()) {
    if (key == "name") {
      if (!v.is_string()) return InvalidArgumentError("{}: kernel 'name' must be a string", where);
      k.name = v.get<std::string>();
    } else if (key == "count") {
      ASSIGN_OR_RETURN(double c, NonNegative(v, key, where));
      if (c > 1e6) return InvalidArgumentError("{}: kernel count {} is too large", where, c);
      k.count = static_cast<int>(c);
    } else if (key == "flops") {
      ASSIGN_OR_RETURN(k.flops, NonNegative(v, key, where));
    } else if (key == "flops_per_item") {
      ASSIGN_OR_RETURN(k.flops_per_item, NonNegative(v, key, where));
    } else if (key == "bytes") {
      ASSIGN_OR_RETURN(k.bytes, NonNegative(v, key, where));
    } else if (key == "bytes_per_item") {
      ASSIGN_OR_RETURN(k.bytes_per_item, NonNegative(v, key, where));
    } else if (key == "blocks") {
      ASSIGN_OR_RETURN(double b, NonNegative(v, key, where));
      if (b > 1 << 20) return InvalidArgumentError("{}: kernel blocks {} is too large", where, b);
      k.blocks = static_cast<int>(b);
    } else if (key == "tensor") {
      if (!v.is_boolean()) return InvalidArgumentError("{}: kernel 'tensor' must be true or false", where);
      k.tensor = v.get<bool>();
    } else {
      return InvalidArgumentError("{}: unknown kernel key '{}'", where, key);
    }
  }
  return k;
}

// `flops` floating-point operations (fused multiply-adds count 2) on 16 independent accumulators.
float BurnFlops(double flops) {
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = 1.0f + 0.001f * i;
  const float a = 0.999999f, b = 1e-6f;
  const int64_t iters = static_cast<int64_t>(flops / 32);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = acc[i] * a + b;
  }
  float s = 0;
  for (float x : acc) s += x;
  return s;
}

// Reads `bytes` (rounded down to 8) from `buf`, wrapping around it.
uint64_t ReadBytes(const uint64_t* buf, size_t words, double bytes) {
  if (words == 0) return 0;
  int64_t n = static_cast<int64_t>(bytes / 8);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  while (n > 0) {
    const size_t len = static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(words)));
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
      s0 += buf[i];
      s1 += buf[i + 1];
      s2 += buf[i + 2];
      s3 += buf[i + 3];
    }
    for (; i < len; ++i) s0 += buf[i];
    n -= static_cast<int64_t>(len);
  }
  return s0 + s1 + s2 + s3;
}

// Keeps results alive so the work is not optimised away. Atomic: concurrent instances all add to it (a
// volatile read-modify-write here was a data race, found by ThreadSanitizer under `stoke serve --instances`).
std::atomic<uint64_t> g_sink{0};

class CpuRunner final : public SyntheticRunner {
 public:
  explicit CpuRunner(std::shared_ptr<const SyntheticModel> model)
      : model_(std::move(model)), ws_(model_->NewWorkspace()) {}
  Status Run(const uint8_t* input, int64_t rows, std::vector<uint8_t>* output,
             SyntheticTimes* times) override {
    return model_->Run(input, rows, output, *ws_, times);
  }
  std::string device() const override { return "cpu"; }

 private:
  std::shared_ptr<const SyntheticModel> model_;
  std::unique_ptr<SyntheticModel::Workspace> ws_;
};

}  // namespace

StatusOr<std::unique_ptr<SyntheticRunner>> NewSyntheticRunner(std::shared_ptr<const SyntheticModel> model,
                                                              int64_t max_rows, const Backends& backends) {
  const SyntheticCudaBackend& b = backends.cuda_synthetic;
  ASSIGN_OR_RETURN(const std::string device,
                   ResolveBackendDevice(model->config().device, b.create != nullptr, b.available,
                                        "synthetic model: \"device\": \"cuda\" but", "\"cpu\""));
  if (device == "cpu") return std::unique_ptr<SyntheticRunner>(new CpuRunner(std::move(model)));
  return b.create(std::move(model), std::max<int64_t>(1, max_rows));
}

void BusyWaitMicros(double us) {
  if (us <= 0) return;
  const Nanos end = MonotonicNanos() + static_cast<Nanos>(us * 1000);
  while (MonotonicNanos() < end) {
  }
}

StatusOr<SyntheticConfig> SyntheticConfig::FromJson(const json& j, std::string_view source) {
  if (!j.is_object()) return InvalidArgumentError("{}: expected a JSON object", source);
  SyntheticConfig c;
  for (const auto& [key, v] : j.items()) {
    if (key == "type" || key == "name" || key == "max_batch_size" || key == "dynamic_batching" ||
        key == "instance_group" || key == "threads") {
      continue;
    } else if (key == "input_bytes" || key == "output_bytes") {
      ASSIGN_OR_RETURN(double b, NonNegative(v, key, source));
      if (b < 1 || b > (1 << 30)) return InvalidArgumentError("{}: '{}' must be in [1, 1 GiB]", source, key);
      (key == "input_bytes" ? c.input_bytes : c.output_bytes) = static_cast<int64_t>(b);
    } else if (key == "h2d_bytes_per_item") {
      ASSIGN_OR_RETURN(double b, NonNegative(v, key, source));
      if (b > (1 << 30)) return InvalidArgumentError("{}: 'h2d_bytes_per_item' must be at most 1 GiB", source);
      c.h2d_bytes_per_item = static_cast<int64_t>(b);
    } else if (key == "preprocess_us") {
      ASSIGN_OR_RETURN(c.preprocess_us, NonNegative(v, key, source));
    } else if (key == "preprocess_us_per_item") {
      ASSIGN_OR_RETURN(c.preprocess_us_per_item, NonNegative(v, key, source));
    } else if (key == "postprocess_us") {
      ASSIGN_OR_RETURN(c.postprocess_us, NonNegative(v, key, source));
    } else if (key == "postprocess_us_per_item") {
      ASSIGN_OR_RETURN(c.postprocess_us_per_item, NonNegative(v, key, source));
    } else if (key == "sleep_us") {
      ASSIGN_OR_RETURN(c.sleep_us, NonNegative(v, key, source));
    } else if (key == "sleep_us_per_item") {
      ASSIGN_OR_RETURN(c.sleep_us_per_item, NonNegative(v, key, source));
    } else if (key == "sleep_exclusive") {
      if (!v.is_boolean()) return InvalidArgumentError("{}: 'sleep_exclusive' must be true or false", source);
      c.sleep_exclusive = v.get<bool>();
    } else if (key == "launch_us") {
      ASSIGN_OR_RETURN(c.launch_us, NonNegative(v, key, source));
    } else if (key == "cpu_scale") {
      ASSIGN_OR_RETURN(c.cpu_scale, NonNegative(v, key, source));
    } else if (key == "buffers") {
      const std::string b = v.is_string() ? v.get<std::string>() : "";
      if (b != "pageable" && b != "pinned") {
        return InvalidArgumentError("{}: 'buffers' must be \"pageable\" or \"pinned\", got {}", source,
                                    v.dump());
      }
      c.pinned = b == "pinned";
    } else if (key == "device") {
      const std::string d = v.is_string() ? v.get<std::string>() : "";
      if (d != "cpu" && d != "cuda" && d != "auto") {
        return InvalidArgumentError("{}: 'device' must be \"cpu\", \"cuda\" or \"auto\", got {}", source,
                                    v.dump());
      }
      c.device = d;
    } else if (key == "kernels") {
      if (!v.is_array()) return InvalidArgumentError("{}: 'kernels' must be a list", source);
      for (const json& k : v) {
        ASSIGN_OR_RETURN(SyntheticKernel kernel, ParseKernel(k, source));
        c.kernels.push_back(std::move(kernel));
      }
    } else {
      return InvalidArgumentError("{}: unknown key '{}'", source, key);
    }
  }
  if (c.h2d_bytes_per_item > 0 && c.h2d_bytes_per_item < c.input_bytes) {
    return InvalidArgumentError("{}: 'h2d_bytes_per_item' {} is below input_bytes {} (0 means input_bytes)",
                                source, c.h2d_bytes_per_item, c.input_bytes);
  }
  for (const SyntheticKernel& k : c.kernels) {
    if (k.bytes * c.cpu_scale > double(uint64_t{1} << 34)) {
      return InvalidArgumentError("{}: kernel '{}' reads {} bytes; at most 16 GiB", source, k.name, k.bytes);
    }
  }
  return c;
}

SyntheticModel::SyntheticModel(SyntheticConfig config) : config_(std::move(config)) {
  double most = 0;
  for (const SyntheticKernel& k : config_.kernels) most = std::max(most, k.bytes * config_.cpu_scale);
  if (config_.device == "cuda") most = 0;  // the CUDA runner has its own device buffers
  // Touched once here so the first batch does not pay its page faults.
  weights_.assign(static_cast<size_t>(most / 8), 0x0101010101010101ull);
}

std::unique_ptr<SyntheticModel::Workspace> SyntheticModel::NewWorkspace() const {
  return std::make_unique<Workspace>();
}

Status SyntheticModel::Run(const uint8_t* input, int64_t rows, std::vector<uint8_t>* output, Workspace& ws,
                           SyntheticTimes* times) const {
  const SyntheticConfig& c = config_;
  const size_t in_bytes = static_cast<size_t>(rows * c.input_bytes);
  const size_t h2d_bytes = static_cast<size_t>(rows * c.h2d_row_bytes());  // >= in_bytes
  const size_t out_bytes = static_cast<size_t>(rows * c.output_bytes);

  Nanos t = MonotonicNanos();
  auto lap = [&t](Nanos* stage) {
    const Nanos now = MonotonicNanos();
    *stage = now - t;
    t = now;
  };
  // preprocess: CPU work, then the inputs land in the host staging buffer.
  BusyWaitMicros(c.preprocess_us + c.preprocess_us_per_item * rows);
  std::vector<uint8_t> fresh_in;
  std::vector<uint8_t>& stage_in = c.pinned ? ws.staging_in : fresh_in;
  stage_in.resize(std::max(stage_in.size(), h2d_bytes));  // the inputs packed first, then the expansion
  std::memcpy(stage_in.data(), input, in_bytes);
  lap(&times->preprocess);

  // h2d
  ws.device_in.resize(std::max(ws.device_in.size(), h2d_bytes));
  std::memcpy(ws.device_in.data(), stage_in.data(), h2d_bytes);
  lap(&times->h2d);

  // kernels, then the output rows (the last "kernel" writes them).
  uint64_t sink = 0;
  float fsink = 0;
  for (const SyntheticKernel& k : c.kernels) {
    const double flops = (k.flops + k.flops_per_item * rows) * c.cpu_scale;
    const double own = k.bytes_per_item * rows * c.cpu_scale;
    if (ws.activations.size() * 8 < own) ws.activations.assign(static_cast<size_t>(own / 8) + 1, 1);
    for (int i = 0; i < k.count; ++i) {
      BusyWaitMicros(c.launch_us);
      fsink += BurnFlops(flops);
      sink += ReadBytes(weights_.data(), weights_.size(), k.bytes * c.cpu_scale);
      sink += ReadBytes(ws.activations.data(), ws.activations.size(), own);
    }
  }
  if (const double sleep_us = c.sleep_us + c.sleep_us_per_item * rows; sleep_us > 0) {
    const auto sleep = std::chrono::nanoseconds(static_cast<Nanos>(sleep_us * 1000));
    if (c.sleep_exclusive) {  // first come, first served, like a device's queue of work
      std::unique_lock<std::mutex> lock(sleep_mu_);
      const uint64_t ticket = sleep_next_ticket_++;
      sleep_cv_.wait(lock, [&] { return sleep_serving_ == ticket; });
      lock.unlock();
      std::this_thread::sleep_for(sleep);
      lock.lock();
      ++sleep_serving_;
      sleep_cv_.notify_all();
    } else {
      std::this_thread::sleep_for(sleep);
    }
  }
  ws.device_out.resize(std::max(ws.device_out.size(), out_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = ws.device_in.data() + r * c.input_bytes;
    uint8_t* out = ws.device_out.data() + r * c.output_bytes;
    for (int64_t j = 0; j < c.output_bytes; ++j) out[j] = in[j % c.input_bytes] ^ 0x5A;
  }
  g_sink.fetch_add(sink + static_cast<uint64_t>(fsink), std::memory_order_relaxed);
  lap(&times->compute);

  // d2h
  std::vector<uint8_t> fresh_out;
  std::vector<uint8_t>& stage_out = c.pinned ? ws.staging_out : fresh_out;
  stage_out.resize(std::max(stage_out.size(), out_bytes));
  std::memcpy(stage_out.data(), ws.device_out.data(), out_bytes);
  lap(&times->d2h);

  // postprocess
  BusyWaitMicros(c.postprocess_us + c.postprocess_us_per_item * rows);
  output->assign(stage_out.begin(), stage_out.begin() + static_cast<std::ptrdiff_t>(out_bytes));
  lap(&times->postprocess);
  return OkStatus();
}

}  // namespace stoke
