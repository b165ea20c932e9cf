#include "engine/cuda_synthetic/synthetic_gpu.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/clock.h"
#include "engine/cuda_synthetic/synthetic_kernels.h"
#include "engine/device/device_resources.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"

namespace stoke {
namespace {

constexpr int kThreads = 256;

// Shared by every runner; never destroyed (pinned memory goes with the process, and static destruction
// order against the CUDA runtime is not ours to rely on).
device::PinnedHostPool& Pool() {
  static auto* pool = new device::PinnedHostPool();
  return *pool;
}

Nanos MsToNanos(float ms) {
  return static_cast<Nanos>(static_cast<double>(ms) * 1e6);
}

class CudaRunner final : public SyntheticRunner {
 public:
  static StatusOr<std::unique_ptr<CudaRunner>> Create(std::shared_ptr<const SyntheticModel> model,
                                                      int64_t max_rows) {
    std::unique_ptr<CudaRunner> r(new CudaRunner(std::move(model)));
    int sms = 0;
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    r->max_blocks_ = std::max(1, sms) * (2048 / kThreads);
    ASSIGN_OR_RETURN(r->stream_, device::Stream::Create());
    for (device::Event& e : r->events_) {
      ASSIGN_OR_RETURN(e, device::Event::Create(/*timing=*/true));
    }
    CUDA_RETURN_IF_ERROR(cudaMalloc(&r->d_sink_, sizeof(float)));
    RETURN_IF_ERROR(r->Reserve(std::max<int64_t>(1, max_rows)));
    return r;
  }

  ~CudaRunner() override {
    if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
    FreeBuffers();
    if (d_sink_ != nullptr) cudaFree(d_sink_);
  }

  std::string device() const override { return "cuda"; }

  Status Run(const uint8_t* input, int64_t rows, std::vector<uint8_t>* output,
             SyntheticTimes* times) override {
    const SyntheticConfig& c = model_->config();
    if (rows < 1) return InvalidArgumentError("synthetic (cuda): a batch needs at least 1 row, got {}", rows);
    RETURN_IF_ERROR(Reserve(rows));
    const size_t in_bytes = static_cast<size_t>(rows * c.input_bytes);
    const size_t h2d_bytes = static_cast<size_t>(rows * c.h2d_row_bytes());  // the inputs, then the expansion
    const size_t out_bytes = static_cast<size_t>(rows * c.output_bytes);
    const cudaStream_t s = stream_.get();

    // preprocess: CPU work, then the inputs land in the host staging buffer.
    const Nanos t0 = MonotonicNanos();
    BusyWaitMicros(c.preprocess_us + c.preprocess_us_per_item * rows);
    std::memcpy(host_in_, input, in_bytes);
    const Nanos t1 = MonotonicNanos();

    RETURN_IF_ERROR(events_[0].Record(s));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_in_, host_in_, h2d_bytes, cudaMemcpyHostToDevice, s));
    RETURN_IF_ERROR(events_[1].Record(s));

    int64_t launches = 0;
    for (const SyntheticKernel& k : c.kernels) launches += k.count;
    int64_t launched = 0;
    for (const SyntheticKernel& k : c.kernels) {
      const double flops = k.flops + k.flops_per_item * static_cast<double>(rows);
      const SynthLaunchPlan p = PlanSynthLaunch(k.tensor ? 0.0 : flops,
                                                k.bytes + k.bytes_per_item * static_cast<double>(rows),
                                                k.blocks, max_blocks_);
      cuda::SynthLaunch l;
      l.blocks = p.blocks;
      l.threads = kThreads;
      l.fma_iters = p.fma_iters;
      if (k.tensor) {
        const SynthTensorPlan tp = PlanSynthTensor(flops, k.blocks, max_blocks_);
        l.blocks = std::max(l.blocks, tp.blocks);
        l.tensor_iters = tp.iters;
      }
      l.region = d_region_;
      l.region_float4s = std::min<int64_t>(p.region_float4s, static_cast<int64_t>(region_cap_ / 16));
      l.sink = d_sink_;
      l.in_bytes = c.input_bytes;
      for (int i = 0; i < k.count; ++i) {
        BusyWaitMicros(c.launch_us);
        if (++launched == launches) {  // the last launch writes the output rows
          l.in = d_in_;
          l.out = d_out_;
          l.rows = rows;
          l.out_bytes = c.output_bytes;
        }
        CUDA_RETURN_IF_ERROR(cuda::LaunchSynth(l, s));
      }
    }
    if (launches == 0) {  // no kernels configured: one launch writes the output
      cuda::SynthLaunch l;
      const double per_block = static_cast<double>(kThreads) * 16;
      l.blocks = static_cast<int>(std::clamp(std::ceil(static_cast<double>(out_bytes) / per_block), 1.0,
                                             static_cast<double>(max_blocks_)));
      l.threads = kThreads;
      l.sink = d_sink_;
      l.in = d_in_;
      l.out = d_out_;
      l.rows = rows;
      l.in_bytes = c.input_bytes;
      l.out_bytes = c.output_bytes;
      CUDA_RETURN_IF_ERROR(cuda::LaunchSynth(l, s));
    }
    RETURN_IF_ERROR(events_[2].Record(s));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out_, d_out_, out_bytes, cudaMemcpyDeviceToHost, s));
    RETURN_IF_ERROR(events_[3].Record(s));
    RETURN_IF_ERROR(events_[3].Synchronize());
    const Nanos t2 = MonotonicNanos();

    ASSIGN_OR_RETURN(float h2d, device::Event::ElapsedMs(events_[0], events_[1]));
    ASSIGN_OR_RETURN(float compute, device::Event::ElapsedMs(events_[1], events_[2]));
    ASSIGN_OR_RETURN(float d2h, device::Event::ElapsedMs(events_[2], events_[3]));

    // postprocess
    BusyWaitMicros(c.postprocess_us + c.postprocess_us_per_item * rows);
    output->assign(host_out_, host_out_ + out_bytes);
    const Nanos t3 = MonotonicNanos();

    times->preprocess = t1 - t0;
    times->h2d = MsToNanos(h2d);
    times->compute = MsToNanos(compute);
    times->d2h = MsToNanos(d2h);
    times->postprocess = t3 - t2;
    return OkStatus();
  }

 private:
  explicit CudaRunner(std::shared_ptr<const SyntheticModel> model) : model_(std::move(model)) {}

  // Buffers for batches of up to `rows` rows (grows only; the stream is idle between batches).
  Status Reserve(int64_t rows) {
    if (rows <= reserved_rows_) return OkStatus();
    const SyntheticConfig& c = model_->config();
    const size_t in = static_cast<size_t>(rows * c.h2d_row_bytes());
    const size_t out = static_cast<size_t>(std::max<int64_t>(1, rows * c.output_bytes));
    double most = 0;
    for (const SyntheticKernel& k : c.kernels) {
      most = std::max(most, k.bytes + k.bytes_per_item * static_cast<double>(rows));
    }
    const size_t region = std::max<size_t>(16, static_cast<size_t>(most / 2) / 16 * 16);
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t held = in_cap_ + out_cap_ + region_cap_;
    const size_t want = in + out + region;
    if (want > free_bytes + held) {
      return ResourceExhaustedError(
          "synthetic (cuda): {} rows need {} bytes of device memory (input {}, output {}, kernel region {}) "
          "but {} are free",
          rows, want, in, out, region, free_bytes + held);
    }
    RETURN_IF_ERROR(stream_.Synchronize());
    FreeBuffers();
    CUDA_RETURN_IF_ERROR(cudaMalloc(&d_in_, in));
    in_cap_ = in;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out_, out));
    out_cap_ = out;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&d_region_, region));
    region_cap_ = region;
    CUDA_RETURN_IF_ERROR(cudaMemset(d_region_, 0, region));
    if (c.pinned) {
      ASSIGN_OR_RETURN(pinned_in_, Pool().Acquire(in));
      ASSIGN_OR_RETURN(pinned_out_, Pool().Acquire(out));
      host_in_ = static_cast<uint8_t*>(pinned_in_.data);
      host_out_ = static_cast<uint8_t*>(pinned_out_.data);
    } else {
      host_in_ = static_cast<uint8_t*>(std::malloc(in));
      host_out_ = static_cast<uint8_t*>(std::malloc(out));
      if (host_in_ == nullptr || host_out_ == nullptr) {
        return ResourceExhaustedError("synthetic (cuda): cannot malloc {} + {} bytes of host staging", in,
                                      out);
      }
      // Touch the pages now so the first batch does not pay their faults.
      std::memset(host_in_, 0, in);
      std::memset(host_out_, 0, out);
    }
    reserved_rows_ = rows;
    return OkStatus();
  }

  void FreeBuffers() {
    if (d_in_ != nullptr) cudaFree(d_in_);
    if (d_out_ != nullptr) cudaFree(d_out_);
    if (d_region_ != nullptr) cudaFree(d_region_);
    d_in_ = d_out_ = nullptr;
    d_region_ = nullptr;
    in_cap_ = out_cap_ = region_cap_ = 0;
    if (model_->config().pinned) {
      if (pinned_in_.data != nullptr) Pool().Release(pinned_in_);
      if (pinned_out_.data != nullptr) Pool().Release(pinned_out_);
      pinned_in_ = pinned_out_ = {};
    } else {
      std::free(host_in_);
      std::free(host_out_);
    }
    host_in_ = host_out_ = nullptr;
    reserved_rows_ = 0;
  }

  std::shared_ptr<const SyntheticModel> model_;
  int max_blocks_ = 1;
  device::Stream stream_;
  device::Event events_[4];  // before H2D, after H2D, after the kernels, after D2H
  float* d_sink_ = nullptr;
  int64_t reserved_rows_ = 0;
  uint8_t* d_in_ = nullptr;
  uint8_t* d_out_ = nullptr;
  float* d_region_ = nullptr;
  size_t in_cap_ = 0, out_cap_ = 0, region_cap_ = 0;
  device::PinnedHostPool::Buffer pinned_in_, pinned_out_;
  uint8_t* host_in_ = nullptr;
  uint8_t* host_out_ = nullptr;
};

StatusOr<std::unique_ptr<SyntheticRunner>> CreateForBackend(std::shared_ptr<const SyntheticModel> model,
                                                            int64_t max_rows) {
  return NewSyntheticCudaRunner(std::move(model), max_rows);
}

bool Available() {
  return cuda::DeviceCount() > 0;
}

}  // namespace

SynthLaunchPlan PlanSynthLaunch(double flops, double bytes, int cap_blocks, int max_blocks) {
  SynthLaunchPlan p;
  const double chains = std::max(0.0, flops) / 16.0;  // thread-iterations of 8 FMAs
  p.region_float4s = static_cast<int64_t>(std::max(0.0, bytes) / 2 / 16);
  const double want_compute = std::ceil(chains / (kThreads * 256.0));
  const double want_memory = std::ceil(static_cast<double>(p.region_float4s) / (kThreads * 16.0));
  double blocks =
      std::min(std::max({1.0, want_compute, want_memory}), static_cast<double>(std::max(1, max_blocks)));
  if (cap_blocks > 0) blocks = std::min(blocks, static_cast<double>(cap_blocks));
  p.blocks = static_cast<int>(blocks);
  p.fma_iters = chains > 0 ? static_cast<int64_t>(std::ceil(chains / (blocks * kThreads))) : 0;
  return p;
}

SynthTensorPlan PlanSynthTensor(double flops, int cap_blocks, int max_blocks) {
  SynthTensorPlan p;
  const double warp_iters = std::max(0.0, flops) / kTensorFlopsPerWarpIter;
  if (warp_iters <= 0) return p;
  constexpr double kWarps = kThreads / 32;
  double blocks = std::min(std::max(1.0, std::ceil(warp_iters / (kWarps * 64.0))),
                           static_cast<double>(std::max(1, max_blocks)));
  if (cap_blocks > 0) blocks = std::min(blocks, static_cast<double>(cap_blocks));
  p.blocks = static_cast<int>(blocks);
  p.iters = static_cast<int64_t>(std::ceil(warp_iters / (blocks * kWarps)));
  return p;
}

StatusOr<std::unique_ptr<SyntheticRunner>> NewSyntheticCudaRunner(std::shared_ptr<const SyntheticModel> model,
                                                                  int64_t max_rows) {
  if (cuda::DeviceCount() == 0) return FailedPreconditionError("synthetic (cuda): no CUDA GPU is visible");
  ASSIGN_OR_RETURN(std::unique_ptr<CudaRunner> r, CudaRunner::Create(std::move(model), max_rows));
  return std::unique_ptr<SyntheticRunner>(std::move(r));
}

SyntheticCudaBackend CudaSyntheticBackend() {
  return {.create = &CreateForBackend, .available = &Available};
}

}  // namespace stoke
