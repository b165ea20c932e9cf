#include "engine/runner/generate.h"

#include <algorithm>
#include <numeric>

#include "engine/runner/sampler.h"

namespace stoke {

namespace {

// Makes sure the model has an identity-mappable KV of at least `tokens` slots; returns the block table.
StatusOr<std::vector<int32_t>> PrepareKv(DecoderModel& model, int64_t tokens, int block_size) {
  if (block_size <= 0) return InvalidArgumentError("block_size {} must be positive", block_size);
  const int64_t blocks = (tokens + block_size - 1) / block_size;
  const KvCacheShape shape = model.kv_shape();
  if (shape.block_size != block_size || shape.num_blocks < blocks) {
    RETURN_IF_ERROR(model.AllocateKvCache(static_cast<int>(blocks), block_size));
  }
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  return table;
}

bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

StatusOr<GenerateResult> Generate(DecoderModel& model, std::span<const int32_t> prompt,
                                  const GenerateOptions& opts, const TokenCallback& on_token) {
  if (prompt.empty()) return InvalidArgumentError("generate: the prompt has no tokens");
  if (opts.prefill_chunk <= 0) return InvalidArgumentError("generate: prefill_chunk must be positive");
  const LlamaConfig& config = model.config();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (config.max_position > 0 && n_prompt >= config.max_position) {
    return InvalidArgumentError("generate: prompt of {} tokens does not fit the context of {}", n_prompt,
                                config.max_position);
  }
  int64_t max_tokens = std::max(0, opts.sampling.max_tokens);
  if (config.max_position > 0) max_tokens = std::min<int64_t>(max_tokens, config.max_position - n_prompt);

  GenerateResult result;
  result.prompt_tokens = static_cast<int>(n_prompt);
  if (max_tokens == 0) {
    result.finish = FinishReason::kLength;
    return result;
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> table, PrepareKv(model, n_prompt + max_tokens, opts.block_size));
  Sampler sampler(opts.sampling, Sampler::SeedFor(opts.sampling));
  const int vocab = config.vocab_size;

  const Nanos start = MonotonicNanos();
  StepInput in;
  StepOutput out;
  in.sequences.resize(1);
  StepSequence& seq = in.sequences[0];
  seq.block_table = table;
  for (int64_t begin = 0; begin < n_prompt; begin += opts.prefill_chunk) {
    const int64_t n = std::min<int64_t>(opts.prefill_chunk, n_prompt - begin);
    in.token_ids.assign(prompt.begin() + begin, prompt.begin() + begin + n);
    seq.token_begin = 0;
    seq.num_tokens = static_cast<int32_t>(n);
    seq.start_pos = static_cast<int32_t>(begin);
    seq.logits = begin + n == n_prompt ? StepSequence::Logits::kLast : StepSequence::Logits::kNone;
    RETURN_IF_ERROR(model.Step(in, &out));
  }

  Nanos first_token_at = 0;
  int64_t pos = n_prompt;  // position of the next token to feed
  for (;;) {
    if (out.num_rows != 1 || static_cast<int64_t>(out.logits.size()) != vocab) {
      return InternalError("generate: step returned {} logit rows", out.num_rows);
    }
    const int32_t token = sampler.Sample(out.logits.data(), vocab);
    const int produced = static_cast<int>(result.tokens.size());
    if (first_token_at == 0) first_token_at = MonotonicNanos();
    const bool eos = Contains(opts.eos_ids, token) || Contains(opts.sampling.stop_token_ids, token);
    if (eos && !opts.sampling.ignore_eos && produced >= opts.sampling.min_tokens) {
      result.finish = FinishReason::kStop;
      break;
    }
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) >= max_tokens) {
      result.finish = FinishReason::kLength;
      break;
    }
    in.token_ids.assign(1, token);
    seq.num_tokens = 1;
    seq.start_pos = static_cast<int32_t>(pos);
    seq.logits = StepSequence::Logits::kLast;
    RETURN_IF_ERROR(model.Step(in, &out));
    ++pos;
    ++result.decode_steps;
  }
  const Nanos end = MonotonicNanos();
  result.prefill_ns = first_token_at - start;
  result.decode_ns = end - first_token_at;
  return result;
}

StatusOr<std::vector<float>> ScoreLogits(DecoderModel& model, std::span<const int32_t> ids, int chunk,
                                         int block_size) {
  if (ids.empty()) return InvalidArgumentError("score: no tokens");
  if (chunk <= 0) return InvalidArgumentError("score: chunk must be positive");
  const int64_t n = static_cast<int64_t>(ids.size());
  const int vocab = model.config().vocab_size;
  ASSIGN_OR_RETURN(std::vector<int32_t> table, PrepareKv(model, n, block_size));
  std::vector<float> logits;
  logits.reserve(n * vocab);
  StepInput in;
  StepOutput out;
  in.sequences.resize(1);
  StepSequence& seq = in.sequences[0];
  seq.block_table = std::move(table);
  seq.logits = StepSequence::Logits::kAll;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min<int64_t>(chunk, n - begin);
    in.token_ids.assign(ids.begin() + begin, ids.begin() + begin + len);
    seq.num_tokens = static_cast<int32_t>(len);
    seq.start_pos = static_cast<int32_t>(begin);
    RETURN_IF_ERROR(model.Step(in, &out));
    if (out.num_rows != len)
      return InternalError("score: step returned {} rows for {} tokens", out.num_rows, len);
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  }
  return logits;
}

}  // namespace stoke
