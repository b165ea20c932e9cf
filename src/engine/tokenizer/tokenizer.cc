#include "engine/tokenizer/tokenizer.h"

#include "engine/tokenizer/unicode_util.h"

namespace stoke {

Tokenizer::~Tokenizer() = default;

int32_t Tokenizer::bos_id() const {
  return -1;
}

const std::vector<int32_t>& Tokenizer::eos_ids() const {
  static const std::vector<int32_t> kNone;
  return kNone;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return false;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  return "";
}

std::string Tokenizer::DecodePiece(int32_t id, bool first, bool skip_special) const {
  if (skip_special && IsSpecial(id)) return "";
  return TokenBytes(id);
}

std::string Tokenizer::TokenText(int32_t id) const {
  return TokenBytes(id);
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

std::string StreamDecoder::Push(int32_t id) {
  if (id < 0 || id >= tok_->vocab_size() || (skip_special_ && tok_->IsSpecial(id))) return "";
  pending_ += tok_->DecodePiece(id, first_, skip_special_);
  first_ = false;
  const size_t n = tok::CompleteUtf8Prefix(pending_);
  if (n == 0) return "";
  std::string out = tok::SanitizeUtf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = tok::SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace stoke
