// A synthetic model whose costs are set by configuration, so scenarios with a known bottleneck can be
// produced on purpose (design.md §5): CPU-bound preprocessing, many small kernels (launch-bound), copies
// through pageable memory, instances fighting for memory bandwidth. `stoke doctor` is validated on it.
//
// Config (JSON, every key optional; per-item values scale with the batch's rows):
//   {"type": "synthetic",
//    "input_bytes": 4096,              // per item: input "INPUT0" is UINT8 [batch, input_bytes]
//    "output_bytes": 1024,             // per item: output "OUTPUT0" is UINT8 [batch, output_bytes]
//    "h2d_bytes_per_item": 0,          // bytes per row copied to the device (0 = input_bytes; larger: the
//                                      // preprocess expands the input, as decoding a JPEG into a tensor does)
//    "preprocess_us": 0, "preprocess_us_per_item": 200,     // CPU time before the copy in
//    "buffers": "pageable",            // or "pinned": how the host staging buffers are allocated
//    "launch_us": 5,                   // CPU cost of launching one kernel
//    "kernels": [{"name": "gemm", "count": 4, "flops": 0, "flops_per_item": 2e6,
//                 "bytes": 8e6, "bytes_per_item": 4096,     // each launch does this much work
//                 "blocks": 0,         // GPU only: at most this many thread blocks (0 = enough to fill it)
//                 "tensor": false}],   // GPU only: the FLOPs run as fp16 matrix multiply-adds on the tensor
//                                      // cores (wmma) instead of FMAs on the CUDA cores; the CPU burns FMAs
//    "postprocess_us": 0, "postprocess_us_per_item": 50,
//    "sleep_us": 0, "sleep_us_per_item": 0,   // CPU build: the compute stage also sleeps this long (a
//                                              // device's time: it holds the instance, not a core)
//    "sleep_exclusive": false,                 // true: those sleeps take turns across instances (one device
//                                              // that runs one batch at a time)
//    "cpu_scale": 1.0,                 // multiplies kernel FLOPs and bytes on the CPU build
//    "device": "cpu"}                  // "cuda": real copies and kernels on the GPU; "auto": cuda if usable
//
// On the CPU build every stage runs on the calling (instance) thread:
//   preprocess / postprocess  busy-wait for the configured time (CPU work that cannot overlap);
//   h2d / d2h                 memcpy between the host staging buffer and the "device" buffer; "pageable"
//                             stages through a freshly allocated buffer each batch (page faults, like an
//                             unpinned cudaMemcpy's bounce copy), "pinned" reuses one allocated at start;
//   kernels                   per launch: launch_us busy-wait, then `flops` fused multiply-adds on
//                             registers and a read of `bytes` from a weight buffer shared by all
//                             instances (so instances compete for memory bandwidth) plus bytes_per_item
//                             per row from the instance's own activations.
// With "device": "cuda" (a CUDA build: engine/cuda_synthetic) each instance has its own CUDA stream and runs,
// per batch: preprocess on the CPU into a host staging buffer (pinned from a PinnedHostPool, or pageable from
// malloc), one H2D copy, `count` launches per kernel (each after launch_us of extra host time; a launch does
// `flops` in FMA chains on registers and moves `bytes` of device memory: it reads and writes a region of
// bytes/2 of the instance's own device buffer), one D2H copy, then postprocess on the CPU. h2d / compute /
// d2h are timed with CUDA events on the instance's stream. The output is a pure function of the input (byte j
// of a row = input byte j mod input_bytes, XOR 0x5A), so a row's result never depends on its batch (or its
// device).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace stoke {

struct Backends;  // engine/model/backends.h

struct SyntheticKernel {
  std::string name = "kernel";
  int count = 1;  // launches per batch
  double flops = 0, flops_per_item = 0;
  double bytes = 0, bytes_per_item = 0;
  int blocks = 0;  // GPU grid cap; 0 = as many as the work needs, up to a full GPU
  bool tensor = false;  // GPU: the FLOPs on the tensor cores (wmma fp16 -> fp32); CPU: FMAs as usual
};

struct SyntheticConfig {
  int64_t input_bytes = 1024;
  int64_t output_bytes = 1024;
  int64_t h2d_bytes_per_item = 0;  // 0 = input_bytes; else >= input_bytes (the staging row the copy moves)
  double preprocess_us = 0, preprocess_us_per_item = 0;
  bool pinned = false;
  double launch_us = 0;
  std::vector<SyntheticKernel> kernels;
  double postprocess_us = 0, postprocess_us_per_item = 0;
  // Compute time that waits without using a core (sleeps), like a kernel running on a device: a batch's cost
  // is known by construction and a loaded CPU barely changes it (stoke tune's tests use it).
  double sleep_us = 0, sleep_us_per_item = 0;
  bool sleep_exclusive = false;  // one batch sleeps at a time, whatever the instance count
  double cpu_scale = 1.0;
  std::string device = "cpu";  // "cpu" | "cuda" | "auto"

  // Unknown keys are errors naming `source`, except the serving keys (type, name, max_batch_size,
  // dynamic_batching, instance_group, threads), which belong to the caller.
  static StatusOr<SyntheticConfig> FromJson(const nlohmann::json& j, std::string_view source);

  // Bytes per row the host-to-device copy moves.
  int64_t h2d_row_bytes() const { return h2d_bytes_per_item > 0 ? h2d_bytes_per_item : input_bytes; }
};

// Stage durations of one batch, ns.
struct SyntheticTimes {
  Nanos preprocess = 0, h2d = 0, compute = 0, d2h = 0, postprocess = 0;
};

class SyntheticModel {
 public:
  explicit SyntheticModel(SyntheticConfig config);
  const SyntheticConfig& config() const { return config_; }

  // Scratch of one instance (staging and "device" buffers, activations). Not thread-safe: one per instance.
  struct Workspace {
    std::vector<uint8_t> staging_in, staging_out;  // host side, reused when "pinned"
    std::vector<uint8_t> device_in, device_out;    // the "device" side
    std::vector<uint64_t> activations;             // bytes_per_item reads
  };
  std::unique_ptr<Workspace> NewWorkspace() const;

  // input = [rows, input_bytes], output = [rows, output_bytes] (resized).
  Status Run(const uint8_t* input, int64_t rows, std::vector<uint8_t>* output, Workspace& ws,
             SyntheticTimes* times) const;

 private:
  SyntheticConfig config_;
  std::vector<uint64_t> weights_;  // shared by every instance: the largest kernel's `bytes`
  // "sleep_exclusive": the one "device", taken in arrival order (a ticket lock).
  mutable std::mutex sleep_mu_;
  mutable std::condition_variable sleep_cv_;
  mutable uint64_t sleep_next_ticket_ = 0, sleep_serving_ = 0;
};

// One instance's executor of a SyntheticModel: on the CPU (a Workspace) or on a CUDA stream. Not
// thread-safe: each instance owns one and calls Run from its own thread.
class SyntheticRunner {
 public:
  virtual ~SyntheticRunner() = default;
  // input = [rows, input_bytes], output = [rows, output_bytes] (resized); the stage times of this batch.
  virtual Status Run(const uint8_t* input, int64_t rows, std::vector<uint8_t>* output,
                     SyntheticTimes* times) = 0;
  virtual std::string device() const = 0;  // "cpu" | "cuda"
};

// The synthetic model's CUDA runner (engine/cuda_synthetic: CudaSyntheticBackend()), carried in
// Backends::cuda_synthetic so this CPU library never depends on CUDA. `available`: a usable GPU is visible
// (null = always).
struct SyntheticCudaBackend {
  StatusOr<std::unique_ptr<SyntheticRunner>> (*create)(std::shared_ptr<const SyntheticModel> model,
                                                       int64_t max_rows) = nullptr;
  bool (*available)() = nullptr;
};

// A runner on the model's configured device ("auto" resolved here against backends.cuda_synthetic). max_rows:
// the largest batch it will get (buffers are sized for it up front; a larger one grows them).
// FailedPrecondition when "cuda" cannot be had, saying why (built without CUDA, no GPU visible).
StatusOr<std::unique_ptr<SyntheticRunner>> NewSyntheticRunner(std::shared_ptr<const SyntheticModel> model,
                                                              int64_t max_rows, const Backends& backends);

// Spins (no sleep) for `us` microseconds: CPU time that really occupies a core.
void BusyWaitMicros(double us);

}  // namespace stoke
