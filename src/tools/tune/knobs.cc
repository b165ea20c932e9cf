#include "tools/tune/knobs.h"

#include <fmt/format.h>

#include <cstdio>
#include <regex>

namespace stoke::tune {

namespace {

std::string OnOff(int v) {
  return v < 0 ? "own" : (v ? "on" : "off");
}
std::string Own(int64_t v, int64_t unset, const std::string& unit = "") {
  return v == unset ? "own" : std::to_string(v) + unit;
}
nlohmann::json OwnJson(int64_t v, int64_t unset) {
  return v == unset ? nlohmann::json("own") : nlohmann::json(v);
}
nlohmann::json OwnText(const std::string& v) {
  return v.empty() ? nlohmann::json("own") : nlohmann::json(v);
}
nlohmann::json OnOffJson(int v) {
  return v < 0 ? nlohmann::json("own") : nlohmann::json(v ? "on" : "off");
}

}  // namespace

const char* KindName(ModelKind k) {
  switch (k) {
    case ModelKind::kBatched:
      return "batched";
    case ModelKind::kDecoder:
      return "decoder";
    case ModelKind::kUnknown:
      break;
  }
  return "unknown";
}

std::string Knobs::Describe(ModelKind kind) const {
  if (kind == ModelKind::kDecoder)
    return fmt::format("seqs {}, tokens {}, chunked {}, graphs {}{}{}{}{}", Own(max_num_seqs, 0),
                       Own(max_num_batched_tokens, 0), OnOff(chunked_prefill), OnOff(cuda_graphs),
                       target_step_ms > 0 ? fmt::format(", step target {:g} ms", target_step_ms) : "",
                       async_output < 0 ? "" : ", async output " + OnOff(async_output),
                       kv_cache_dtype.empty() ? "" : ", kv " + kv_cache_dtype,
                       quantization.empty() ? "" : ", weights " + quantization);
  return fmt::format("batch {}, delay {}, instances {}{}", Own(max_batch_size, 0),
                     Own(max_queue_delay_us, -1, " us"), Own(instances, 0),
                     quantization.empty() ? "" : ", weights " + quantization);
}

std::vector<std::string> Knobs::Flags(ModelKind kind) const {
  std::vector<std::string> a;
  if (kind == ModelKind::kDecoder) {
    if (max_num_seqs > 0) a.insert(a.end(), {"--max-num-seqs", std::to_string(max_num_seqs)});
    if (max_num_batched_tokens > 0)
      a.insert(a.end(), {"--max-num-batched-tokens", std::to_string(max_num_batched_tokens)});
    if (chunked_prefill == 0) a.push_back("--no-chunked-prefill");
    if (cuda_graphs >= 0) a.insert(a.end(), {"--cuda-graphs", cuda_graphs ? "on" : "off"});
    if (target_step_ms > 0) a.insert(a.end(), {"--target-step-ms", fmt::format("{:g}", target_step_ms)});
    if (async_output >= 0) a.insert(a.end(), {"--async-output", async_output ? "on" : "off"});
    if (!kv_cache_dtype.empty()) a.insert(a.end(), {"--kv-cache-dtype", kv_cache_dtype});
    if (!quantization.empty()) a.insert(a.end(), {"--quantization", quantization});
    return a;
  }
  if (max_batch_size > 0) a.insert(a.end(), {"--max-batch-size", std::to_string(max_batch_size)});
  if (max_queue_delay_us >= 0)
    a.insert(a.end(), {"--max-queue-delay-us", std::to_string(max_queue_delay_us)});
  if (instances > 0) a.insert(a.end(), {"--instances", std::to_string(instances)});
  if (!quantization.empty()) a.insert(a.end(), {"--quantization", quantization});
  if (!calibration_data.empty()) a.insert(a.end(), {"--calibration-data", calibration_data});
  return a;
}

double KnobValue(const std::string& knob, const Knobs& k) {
  if (knob == "max_batch_size") return k.max_batch_size;
  if (knob == "max_queue_delay_us") return static_cast<double>(k.max_queue_delay_us);
  if (knob == "instances") return k.instances;
  if (knob == "max_num_seqs") return k.max_num_seqs;
  if (knob == "max_num_batched_tokens") return k.max_num_batched_tokens;
  if (knob == "chunked_prefill") return k.chunked_prefill;
  if (knob == "cuda_graphs") return k.cuda_graphs;
  if (knob == "target_step_ms") return k.target_step_ms;
  if (knob == "async_output") return k.async_output;
  if (knob == "kv_cache_dtype") return k.kv_cache_dtype == "int8" ? 1 : k.kv_cache_dtype == "fp8" ? 2 : 0;
  if (knob == "weight_precision" || knob == "precision") {
    return k.quantization == "fp8" ? 1 : k.quantization == "int8" ? 2 : 0;
  }
  return 0;
}

nlohmann::json KnobsJson(const Knobs& k, ModelKind kind) {
  if (kind == ModelKind::kDecoder)
    return {
        {"max_num_seqs", OwnJson(k.max_num_seqs, 0)},
        {"max_num_batched_tokens", OwnJson(k.max_num_batched_tokens, 0)},
        {"chunked_prefill", OnOffJson(k.chunked_prefill)},
        {"cuda_graphs", OnOffJson(k.cuda_graphs)},
        {"target_step_ms", k.target_step_ms > 0 ? nlohmann::json(k.target_step_ms) : nlohmann::json("own")},
        {"async_output", OnOffJson(k.async_output)},
        {"kv_cache_dtype", OwnText(k.kv_cache_dtype)},
        {"quantization", OwnText(k.quantization)}};
  return {{"max_batch_size", OwnJson(k.max_batch_size, 0)},
          {"max_queue_delay_us", OwnJson(k.max_queue_delay_us, -1)},
          {"instances", OwnJson(k.instances, 0)},
          {"quantization", OwnText(k.quantization)}};
}

ServeDefaults ParseServeHelp(const std::string& help) {
  ServeDefaults d;
  std::smatch m;
  if (std::regex_search(help, m, std::regex(R"(--max-num-seqs\s+INT=(\d+))")))
    d.max_num_seqs = std::stoi(m[1]);
  if (std::regex_search(help, m, std::regex(R"(--max-num-batched-tokens\s+INT=(\d+))")))
    d.max_num_batched_tokens = std::stoi(m[1]);
  if (std::regex_search(help, m, std::regex(R"(--cuda-graphs\s+\S*=(on|off))"))) d.cuda_graphs = m[1] == "on";
  d.has_kv_cache_dtype = help.find("--kv-cache-dtype") != std::string::npos;
  d.has_quantization = help.find("--quantization") != std::string::npos;
  return d;
}

ServeDefaults ReadServeDefaults(const std::string& exe) {
  std::string cmd = "'" + exe + "' serve --help 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return {};
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  pclose(f);
  return ParseServeHelp(text);
}

}  // namespace stoke::tune
