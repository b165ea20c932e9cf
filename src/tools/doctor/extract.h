// Scrapes of a server's public endpoints -> Signals (pure: tested on text fixtures in extract_test.cc).
//
// Counters and histograms are read as the difference between the first and the last scrape of the window
// (ledger means, batch close reasons, preemptions, instance busy time, GPU violation ns); gauges as the
// mean / max over every scrape (KV usage, waiting, pending, GPU ratios).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/metrics_scraper.h"
#include "tools/doctor/signals.h"

namespace stoke::doctor {

struct Scrape {
  double t_s = 0;                          // since the window started
  std::vector<bench::PromSample> metrics;  // /metrics (empty if it failed)
  nlohmann::json gpu;                      // GET /v1/gpu (null if absent)
};

// What /v2/models/M/config says about batching (classic models); absent for LLMs.
struct ModelConfigInfo {
  bool known = false;
  int max_batch_size = 0;
  bool dynamic_batching = false;
  double max_queue_delay_us = kNaN;
  int instances = 0;
  std::string kv_cache_dtype, weight_quantization;  // GET /v1/models "precision" (ParseServedPrecision)
  std::string device;  // GET /v1/models "device" of an LLM: "cpu", "cuda:0 (NVIDIA H200)"; "" unknown
};
ModelConfigInfo ParseModelConfig(const nlohmann::json& config);
// The served precision and device of `model` from a GET /v1/models body ({"data": [{"id", "device",
// "precision": {"kv_cache_dtype", "quantization"}}]}) into info; anything missing leaves its field empty.
void ParseServedPrecision(const nlohmann::json& models, const std::string& model, ModelConfigInfo* info);

// `model` filters the labelled series (model_name) when several models are served; "" = all.
Signals ExtractSignals(const std::vector<Scrape>& scrapes, const ModelConfigInfo& config,
                       const std::string& model);

// The step split at the device's rates: hbm_gbps (GB/s a stream reads, e.g. `stoke bench step`'s
// device_roofline.d2d_gbps) and tensor_tflops (its bf16 GEMM TFLOP/s); a rate <= 0 leaves its part NaN.
void ApplyDeviceRates(double hbm_gbps, double tensor_tflops, Signals* s);

}  // namespace stoke::doctor
