// The output-consistency gate (`stoke model check`, and `stoke serve` at load): runs one model at a
// candidate precision and at its reference precision on the same text and device, and says, metric by metric
// against documented thresholds (docs/precision.md), whether the candidate may serve.
//
//   ASSIGN_OR_RETURN(GateReport r, CheckDecoderPrecision(load, ReferenceOptions(cand), cand, *tok, text,
//   {})); fmt::print("{}", ReportToText(r));  return r.pass() ? 0 : 1;
//
// The precision choice is whatever a DecoderOptions expresses (today its KvCacheOptions; weight precisions
// later): the gate only loads the model twice and compares what comes out.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/model/decoder.h"
#include "engine/model/factory.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke::precision {

// Decoder bounds. docs/precision.md gives the measured values they were set against.
struct DecoderThresholds {
  double min_top1 = 0.90;              // teacher-forced top-1 agreement, fraction of positions
  double max_mean_kl = 0.05;           // mean KL(reference || candidate), nats per position
  double max_perplexity_ratio = 1.05;  // candidate perplexity / reference perplexity
  double min_greedy = 0.25;            // mean greedy-text prefix agreement over the prompts
};

// Encoder bounds (cosine of the pooled, normalised embeddings of the same sentence).
struct EncoderThresholds {
  double min_mean_cosine = 0.999;
  double min_cosine = 0.99;  // the worst sentence
};

struct MetricResult {
  std::string name;  // "top1_agreement", "mean_kl", "perplexity_ratio", "greedy_agreement", "cosine", ...
  double value = 0;
  double threshold = 0;
  bool higher_is_better = true;
  bool pass = false;
  std::string detail;  // e.g. "reference 6.81, candidate 6.83"
};

struct GateReport {
  std::string kind;       // "decoder" or "encoder"
  std::string reference;  // what was compared against, e.g. "cpu, kv fp32"
  std::string candidate;  // e.g. "cpu, kv int8"
  int64_t positions = 0;  // teacher-forced positions (decoder) or sentences (encoder)
  std::vector<MetricResult> metrics;
  double seconds = 0;  // wall time of the comparison (not of loading)
  bool pass() const;
};
nlohmann::ordered_json ReportToJson(const GateReport& report);
// One line per metric ("PASS  top1_agreement  0.9912 >= 0.95"), then the verdict.
std::string ReportToText(const GateReport& report);

struct DecoderGateOptions {
  int tokens = 512;  // teacher-forced positions: the text's first `tokens` tokens
  int window = 0;    // tokens per independent sequence; 0 = min(tokens, the model's context length)
  int chunk = 256;   // tokens per step (chunked prefill, Logits::kAll)
  int block_size = 16;
  int greedy_prompts = 3;  // sentences of the text used as prompts
  int greedy_tokens = 32;  // new tokens generated greedily per prompt (EOS ignored)
  DecoderThresholds thresholds;
};

// Compares two already loaded models (the same weights at two precisions) on `text`. Each model's KV cache is
// (re)allocated as the gate needs. InvalidArgument when the text has fewer than 2 tokens or the vocabularies
// differ.
StatusOr<GateReport> RunDecoderGate(DecoderModel& reference, DecoderModel& candidate,
                                    const Tokenizer& tokenizer, std::string_view text,
                                    const DecoderGateOptions& options);

// Loads the model with `reference`, then with `candidate`, through `load` (LoadDecoder with the model path
// bound: the gate does not care how), and runs RunDecoderGate.
using DecoderLoader = std::function<StatusOr<std::unique_ptr<DecoderModel>>(const DecoderOptions&)>;
StatusOr<GateReport> CheckDecoderPrecision(const DecoderLoader& load, const DecoderOptions& reference,
                                           const DecoderOptions& candidate, const Tokenizer& tokenizer,
                                           std::string_view text, const DecoderGateOptions& options);

// The reference for a candidate: the same options at the backend's own precision (KV cache kAuto), on the
// same device.
DecoderOptions ReferenceOptions(const DecoderOptions& candidate);

// Whether `candidate` asks for another precision than ReferenceOptions(candidate) on `device` (resolved:
// "cpu" or "cuda"): false for the reference itself, and for bf16 KV on cuda (its native cache).
bool DiffersFromReference(const DecoderOptions& candidate, const std::string& device);

// The short gate `stoke serve` runs at load (a few hundred tokens, one greedy prompt).
DecoderGateOptions ServeGateOptions();

// One embedding function per precision: batch of token-id sequences -> [batch, hidden] pooled embeddings.
using EmbedFn = std::function<Status(const std::vector<std::vector<int32_t>>&, std::vector<float>*)>;
struct EncoderGateOptions {
  int sentences = 64;    // sentences of the text embedded by both
  int batch = 16;        // sentences per Embed call
  int max_length = 256;  // tokens per sentence at most (with [CLS]/[SEP])
  EncoderThresholds thresholds;
};
// `reference_label` / `candidate_label` name the two sides in the report.
StatusOr<GateReport> RunEncoderGate(const EmbedFn& reference, const EmbedFn& candidate, int hidden,
                                    const Tokenizer& tokenizer, std::string_view text,
                                    const EncoderGateOptions& options, std::string reference_label,
                                    std::string candidate_label);

}  // namespace stoke::precision
