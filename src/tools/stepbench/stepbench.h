// stoke bench step: the engine's step time measured directly through DecoderModel::Step (no server, no
// scheduler), against the device's own measured limits.
//
//   decode  : `decode_batch` sequences with `context` tokens already in KV (filled by a prefill), one token
//             each per step; median/p10/p90 step time, tokens/s, bytes read per step (weights + lm_head +
//             KV) and GB/s. CUDA: fraction of the measured D2D copy bandwidth (the HBM roofline).
//   mixed   : with `mixed` > 0, the decode steps again with a `mixed`-token prompt behind the decodes in
//   each:
//             the step time and its excess over the decode step.
//   prefill : `prefill` tokens of one sequence in one step (chunks of `chunk`); tokens/s and FLOP/s
//             (2 * matmul params * tokens + causal attention 2 * T^2 * layers * heads * head_dim). CUDA:
//             fraction of the measured bf16 GEMM rate on the prefill's largest GEMM shape (and 8192^3).
//
// The device limits come from StepBenchOptions::roofline, the CUDA build's probe (tools/stepbench/cuda,
// passed in by apps/stoke); without one the report's device_roofline says so.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model/backends.h"
#include "engine/model/factory.h"

namespace stoke::stepbench {

// A bf16 GEMM y[m, n] = x[m, k] w[n, k]^T.
struct GemmShape {
  std::string name;
  int64_t m = 0, n = 0, k = 0;
};
struct GemmRate {
  GemmShape shape;
  double ms = 0, tflops = 0;
};
// What the device can do, measured in the same run.
struct DeviceRoofline {
  std::string device;  // "NVIDIA H200"
  int64_t copy_bytes = 0;
  double copy_ms = 0;
  double d2d_gbps = 0;  // read + write bytes (2 x size) per second, as cuda_bench counts
  std::vector<GemmRate> gemms;
};
// Measures the device (D2D copy bandwidth, bf16 GEMM rates). gemm_cache_path: the cuBLASLt algorithm cache
// (DecoderOptions::cuda.gemm_cache_path; "" = in memory).
using RooflineProbe = StatusOr<DeviceRoofline> (*)(int gpu_index, const std::vector<GemmShape>& shapes,
                                                   const std::string& gemm_cache_path);

struct StepBenchOptions {
  std::string model;  // alias or path (resolved with ResolveModel)
  DecoderOptions decoder;
  int decode_batch = 1;
  int context = 512;
  int prefill = 2048;
  int chunk = 8192;  // max tokens per prefill step
  // > 0 (with decode_batch): after the decode steps, as many again each with a fresh prompt of this many
  // tokens behind the decodes (a mixed step, as the scheduler builds one); report["mixed"].
  int mixed = 0;
  int iters = 20;    // timed decode steps (prefill: max(3, iters / 4) timed runs)
  int warmup = 3;
  int block_size = 16;
  // Decode steps draw their tokens on the device (Logits::kToken, greedy) when the model can, as `stoke
  // serve` does; false: every row of logits is copied to the host (the step as it was before device
  // sampling).
  bool device_sampling = true;
  std::string command;  // for the report
  // The CUDA roofline probe (tools/stepbench/cuda/roofline_cuda.h CudaRooflineProbe; null: none, as in a
  // CPU-only build). Called only when the model runs on CUDA.
  RooflineProbe roofline = nullptr;
};

// Runs the benchmark on the device options.decoder.device names, resolved against `backends` (LoadDecoder);
// progress lines go to `progress` (may be null). The result is the report JSON.
StatusOr<nlohmann::ordered_json> RunStepBench(const StepBenchOptions& options, const Backends& backends,
                                              std::FILE* progress);

// p-th percentile (0..100) by linear interpolation of the sorted values; 0 for none.
double Percentile(std::vector<double> values, double p);

// `git describe --always --dirty` of the source tree at build (configure) time: what the binary was built from.
// Falls back to the working directory's describe (marked as such) when the build has no stamp.
std::string CommitString();
// The CPU model name from /proc/cpuinfo ("" if unknown).
std::string CpuModel();

}  // namespace stoke::stepbench
