#include "engine/model/decoder.h"

namespace stoke {

Status ValidateStepInput(const StepInput& in, int num_blocks, int block_size, int vocab,
                         bool device_sampling) {
  if (num_blocks == 0) return FailedPreconditionError("Step: AllocateKvCache was not called");
  const int64_t total = static_cast<int64_t>(in.token_ids.size());
  int64_t next = 0;
  for (size_t s = 0; s < in.sequences.size(); ++s) {
    const StepSequence& seq = in.sequences[s];
    if (seq.token_begin != next || seq.num_tokens <= 0 || next + seq.num_tokens > total) {
      return InvalidArgumentError(
          "Step: sequence {} covers tokens [{}, {}) but sequences must tile the {} step tokens in order", s,
          seq.token_begin, int64_t{seq.token_begin} + seq.num_tokens, total);
    }
    next += seq.num_tokens;
    if (seq.logits == StepSequence::Logits::kToken && !device_sampling) {
      return InvalidArgumentError(
          "Step: sequence {} asks for a device-sampled token (Logits::kToken) but this backend returns "
          "logits "
          "(SamplesOnDevice() is false)",
          s);
    }
    if (seq.start_pos < 0)
      return InvalidArgumentError("Step: sequence {} has start_pos {}", s, seq.start_pos);
    const int64_t end_pos = int64_t{seq.start_pos} + seq.num_tokens;
    const int64_t blocks_needed = (end_pos + block_size - 1) / block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed) {
      return InvalidArgumentError(
          "Step: sequence {} needs {} blocks for positions [0, {}) but its table has {}", s, blocks_needed,
          end_pos, seq.block_table.size());
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = seq.block_table[b];
      if (id < 0 || id >= num_blocks) {
        return InvalidArgumentError("Step: sequence {} block table entry {} = {} outside [0, {})", s, b, id,
                                    num_blocks);
      }
    }
  }
  if (next != total) {
    return InvalidArgumentError("Step: sequences cover {} of {} tokens", next, total);
  }
  for (int64_t t = 0; t < total; ++t) {
    if (in.token_ids[t] < 0 || in.token_ids[t] >= vocab) {
      return InvalidArgumentError("Step: token id {} at index {} outside [0, {})", in.token_ids[t], t, vocab);
    }
  }
  return OkStatus();
}

}  // namespace stoke
