#include "tools/precision/gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "base/clock.h"
#include "engine/runner/generate.h"
#include "tools/precision/metrics.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {
namespace {

MetricResult AtLeast(std::string name, double value, double threshold, std::string detail = {}) {
  return {std::move(name), value, threshold, true, value >= threshold, std::move(detail)};
}
MetricResult AtMost(std::string name, double value, double threshold, std::string detail = {}) {
  return {std::move(name), value, threshold, false, value <= threshold, std::move(detail)};
}

std::string Label(const DecoderModel& m) {
  const std::string q = m.quantization_name();
  return fmt::format("{}{}, kv {}", m.device_name(), q == "none" ? "" : ", weights " + q, m.kv_cache_dtype_name());
}

// One window through both models, chunk by chunk, into `cmp`. next = the text's token after each position.
Status CompareWindow(DecoderModel& ref, DecoderModel& cand, std::span<const int32_t> window,
                     std::span<const int32_t> next, const std::vector<int32_t>& table, int chunk,
                     LogitComparison* cmp) {
  StepInput in;
  in.sequences.resize(1);
  StepSequence& seq = in.sequences[0];
  seq.block_table = table;
  seq.logits = StepSequence::Logits::kAll;
  StepOutput a, b;
  const int vocab = ref.config().vocab_size;
  for (size_t begin = 0; begin < window.size(); begin += static_cast<size_t>(chunk)) {
    const size_t len = std::min(window.size() - begin, static_cast<size_t>(chunk));
    in.token_ids.assign(window.begin() + begin, window.begin() + begin + len);
    seq.num_tokens = static_cast<int32_t>(len);
    seq.start_pos = static_cast<int32_t>(begin);
    RETURN_IF_ERROR(ref.Step(in, &a));
    RETURN_IF_ERROR(cand.Step(in, &b));
    if (a.num_rows != static_cast<int64_t>(len) || b.num_rows != static_cast<int64_t>(len)) {
      return InternalError("gate: a step returned {} and {} rows for {} tokens", a.num_rows, b.num_rows, len);
    }
    cmp->Add(a.logits, b.logits, static_cast<int64_t>(len), vocab, next.subspan(begin, len));
  }
  return OkStatus();
}

// Prompts for greedy generation: `count` sentences spread over the text.
std::vector<std::vector<int32_t>> GreedyPrompts(const Tokenizer& tok, std::string_view text, int count) {
  std::vector<std::vector<int32_t>> prompts;
  if (count <= 0) return prompts;
  const std::vector<std::string> sentences = SplitSentences(text, {.min_chars = 40, .max_chars = 300});
  if (sentences.empty()) return prompts;
  const size_t n = std::min<size_t>(count, sentences.size());
  for (size_t i = 0; i < n; ++i) {
    auto ids = tok.Encode(sentences[i * sentences.size() / n]);
    if (ids.ok() && !ids->empty()) prompts.push_back(std::move(ids).value());
  }
  return prompts;
}

}  // namespace

bool GateReport::pass() const {
  return !metrics.empty() &&
         std::all_of(metrics.begin(), metrics.end(), [](const MetricResult& m) { return m.pass; });
}

nlohmann::ordered_json ReportToJson(const GateReport& r) {
  nlohmann::ordered_json j;
  j["kind"] = r.kind;
  j["reference"] = r.reference;
  j["candidate"] = r.candidate;
  j["positions"] = r.positions;
  j["pass"] = r.pass();
  j["seconds"] = r.seconds;
  nlohmann::ordered_json ms = nlohmann::ordered_json::array();
  for (const MetricResult& m : r.metrics) {
    ms.push_back({{"name", m.name},
                  {"value", m.value},
                  {"threshold", m.threshold},
                  {"comparison", m.higher_is_better ? ">=" : "<="},
                  {"pass", m.pass},
                  {"detail", m.detail}});
  }
  j["metrics"] = std::move(ms);
  return j;
}

std::string ReportToText(const GateReport& r) {
  std::string out =
      fmt::format("{} gate: candidate [{}] against reference [{}], {} {}\n", r.kind, r.candidate, r.reference,
                  r.positions, r.kind == "encoder" ? "sentences" : "positions");
  for (const MetricResult& m : r.metrics) {
    out += fmt::format("  {}  {:<20} {:.5g} {} {:.5g}{}\n", m.pass ? "PASS" : "FAIL", m.name, m.value,
                       m.higher_is_better ? ">=" : "<=", m.threshold,
                       m.detail.empty() ? "" : "  (" + m.detail + ")");
  }
  out += fmt::format("{} ({:.1f} s)\n",
                     r.pass() ? "PASS: the candidate is consistent with the reference"
                              : "FAIL: the candidate is not consistent with the reference",
                     r.seconds);
  return out;
}

DecoderOptions ReferenceOptions(const DecoderOptions& candidate) {
  DecoderOptions o = candidate;
  o.kv_cache = KvCacheOptions{};
  o.quantization = WeightQuantization::kNone;
  return o;
}

bool DiffersFromReference(const DecoderOptions& candidate, const std::string& device) {
  if (candidate.quantization != WeightQuantization::kNone) return true;
  const KvCacheDtype kv = candidate.kv_cache.dtype;
  if (kv == KvCacheDtype::kAuto) return false;
  return !(device == "cuda" && kv == KvCacheDtype::kBf16);
}

DecoderGateOptions ServeGateOptions() {
  return DecoderGateOptions{.tokens = 256, .greedy_prompts = 1, .greedy_tokens = 16};
}

StatusOr<GateReport> RunDecoderGate(DecoderModel& reference, DecoderModel& candidate, const Tokenizer& tok,
                                    std::string_view text, const DecoderGateOptions& o) {
  if (o.tokens < 2 || o.chunk < 1 || o.block_size < 1 || o.window < 0 || o.greedy_tokens < 0) {
    return InvalidArgumentError(
        "gate: tokens {} (>= 2), chunk {}, block size {} (>= 1), window {}, greedy "
        "tokens {} (>= 0)",
        o.tokens, o.chunk, o.block_size, o.window, o.greedy_tokens);
  }
  const LlamaConfig& c = reference.config();
  if (candidate.config().vocab_size != c.vocab_size) {
    return InvalidArgumentError("gate: vocabularies differ ({} and {})", c.vocab_size,
                                candidate.config().vocab_size);
  }
  const Nanos start = MonotonicNanos();
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text));
  if (ids.size() > static_cast<size_t>(o.tokens)) ids.resize(o.tokens);
  if (ids.size() < 2)
    return InvalidArgumentError("gate: the text has {} tokens, need at least 2", ids.size());
  const int window = std::min<int>(o.window > 0 ? o.window : o.tokens, c.max_position);
  const std::vector<std::vector<int32_t>> prompts = GreedyPrompts(tok, text, o.greedy_prompts);
  size_t longest_prompt = 0;
  for (const auto& p : prompts) longest_prompt = std::max(longest_prompt, p.size());

  // One KV allocation per model, large enough for a window and for each greedy run.
  const int64_t kv_tokens = std::max<int64_t>(window, static_cast<int64_t>(longest_prompt) + o.greedy_tokens);
  const int blocks = static_cast<int>((kv_tokens + o.block_size - 1) / o.block_size);
  RETURN_IF_ERROR(reference.AllocateKvCache(blocks, o.block_size));
  RETURN_IF_ERROR(candidate.AllocateKvCache(blocks, o.block_size));
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);

  std::vector<int32_t> next(ids.begin() + 1, ids.end());
  next.push_back(-1);  // the last position has no next token in the text we took
  LogitComparison cmp;
  size_t offset = 0;
  for (std::span<const int32_t> w : TokenWindows(ids, window)) {
    RETURN_IF_ERROR(CompareWindow(reference, candidate, w,
                                  std::span<const int32_t>(next).subspan(offset, w.size()), table, o.chunk,
                                  &cmp));
    offset += w.size();
  }

  double greedy_sum = 0;
  GenerateOptions g;
  g.sampling.temperature = 0.0f;
  g.sampling.max_tokens = o.greedy_tokens;
  g.sampling.ignore_eos = true;
  g.prefill_chunk = o.chunk;
  g.block_size = o.block_size;
  for (const auto& prompt : prompts) {
    ASSIGN_OR_RETURN(GenerateResult a, Generate(reference, prompt, g));
    ASSIGN_OR_RETURN(GenerateResult b, Generate(candidate, prompt, g));
    greedy_sum += GreedyPrefixAgreement(a.tokens, b.tokens);
  }

  GateReport r;
  r.kind = "decoder";
  r.reference = Label(reference);
  r.candidate = Label(candidate);
  r.positions = cmp.positions();
  const DecoderThresholds& t = o.thresholds;
  const double ref_ppl = cmp.reference_perplexity(), cand_ppl = cmp.candidate_perplexity();
  r.metrics.push_back(AtLeast("top1_agreement", cmp.top1_agreement(), t.min_top1));
  r.metrics.push_back(AtMost("mean_kl", cmp.mean_kl(), t.max_mean_kl));
  r.metrics.push_back(AtMost("perplexity_ratio", ref_ppl > 0 ? cand_ppl / ref_ppl : 0.0,
                             t.max_perplexity_ratio,
                             fmt::format("reference {:.4f}, candidate {:.4f}", ref_ppl, cand_ppl)));
  if (!prompts.empty() && o.greedy_tokens > 0) {
    r.metrics.push_back(AtLeast("greedy_agreement", greedy_sum / static_cast<double>(prompts.size()),
                                t.min_greedy,
                                fmt::format("{} prompts x {} tokens", prompts.size(), o.greedy_tokens)));
  }
  r.seconds = (MonotonicNanos() - start) / 1e9;
  return r;
}

StatusOr<GateReport> CheckDecoderPrecision(const DecoderLoader& load, const DecoderOptions& reference,
                                           const DecoderOptions& candidate, const Tokenizer& tokenizer,
                                           std::string_view text, const DecoderGateOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> ref, load(reference));
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> cand, load(candidate));
  return RunDecoderGate(*ref, *cand, tokenizer, text, options);
}

StatusOr<GateReport> RunEncoderGate(const EmbedFn& reference, const EmbedFn& candidate, int hidden,
                                    const Tokenizer& tok, std::string_view text, const EncoderGateOptions& o,
                                    std::string reference_label, std::string candidate_label) {
  if (o.sentences < 1 || o.batch < 1 || hidden < 1) {
    return InvalidArgumentError("gate: sentences {} and batch {} must be >= 1", o.sentences, o.batch);
  }
  const Nanos start = MonotonicNanos();
  const std::vector<std::string> sentences =
      SplitSentences(text, {.max_count = static_cast<size_t>(o.sentences)});
  if (sentences.empty())
    return InvalidArgumentError("gate: the text has no sentence of 24 characters or more");
  double sum = 0, worst = 1;
  for (size_t b = 0; b < sentences.size(); b += static_cast<size_t>(o.batch)) {
    std::vector<std::vector<int32_t>> batch;
    for (size_t i = b; i < std::min(sentences.size(), b + o.batch); ++i) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(sentences[i], {.max_length = o.max_length}));
      batch.push_back(std::move(ids));
    }
    std::vector<float> a, c;
    RETURN_IF_ERROR(reference(batch, &a));
    RETURN_IF_ERROR(candidate(batch, &c));
    if (a.size() != batch.size() * hidden || c.size() != a.size()) {
      return InternalError("gate: embeddings of {} and {} values for {} sentences of {}", a.size(), c.size(),
                           batch.size(), hidden);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const double cos = Cosine(std::span<const float>(a).subspan(i * hidden, hidden),
                                std::span<const float>(c).subspan(i * hidden, hidden));
      sum += cos;
      worst = std::min(worst, cos);
    }
  }
  GateReport r;
  r.kind = "encoder";
  r.reference = std::move(reference_label);
  r.candidate = std::move(candidate_label);
  r.positions = static_cast<int64_t>(sentences.size());
  r.metrics.push_back(AtLeast("mean_cosine", sum / sentences.size(), o.thresholds.min_mean_cosine));
  r.metrics.push_back(AtLeast("min_cosine", worst, o.thresholds.min_cosine));
  r.seconds = (MonotonicNanos() - start) / 1e9;
  return r;
}

}  // namespace stoke::precision
