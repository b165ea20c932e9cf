#include "engine/tokenizer/bpe_tokenizer.h"

#include <queue>

#include "engine/tokenizer/unicode_util.h"

namespace stoke {

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(BpeVocab vocab) {
  if (vocab.tokens.empty()) return InvalidArgumentError("{}: empty vocabulary", vocab.source);
  if (vocab.kinds.size() != vocab.tokens.size()) {
    return InvalidArgumentError("{}: {} token kinds for {} tokens", vocab.source, vocab.kinds.size(),
                                vocab.tokens.size());
  }
  const int32_t n = static_cast<int32_t>(vocab.tokens.size());
  auto check_id = [&](int32_t id, std::string_view what) -> Status {
    if (id < -1 || id >= n)
      return InvalidArgumentError("{}: {} id {} outside vocab of {}", vocab.source, what, id, n);
    return OkStatus();
  };
  RETURN_IF_ERROR(check_id(vocab.bos_id, "bos"));
  RETURN_IF_ERROR(check_id(vocab.unk_id, "unk"));
  for (int32_t id : vocab.eos_ids) RETURN_IF_ERROR(check_id(id, "eos"));
  for (int32_t id : vocab.wrap.prefix) RETURN_IF_ERROR(check_id(id, "post-processor"));
  for (int32_t id : vocab.wrap.suffix) RETURN_IF_ERROR(check_id(id, "post-processor"));
  for (const auto& a : vocab.added) RETURN_IF_ERROR(check_id(a.id, "added token"));

  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer(std::move(vocab)));
  const BpeVocab& v = t->v_;
  t->token_to_id_.reserve(n * 2);
  t->bytes_.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    switch (v.kinds[id]) {
      case TokenKind::kNormal:
        t->token_to_id_.emplace(v.tokens[id], id);  // first id wins on duplicates, as in llama.cpp
        t->bytes_[id] = v.byte_level ? tok::ByteLevelDecode(v.tokens[id]) : v.tokens[id];
        break;
      case TokenKind::kUserDefined:
        t->bytes_[id] = v.tokens[id];
        break;
      case TokenKind::kControl:
      case TokenKind::kUnused:
        break;
    }
  }
  t->merge_.reserve(v.merges.size() * 2);
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const auto& [a, b] = v.merges[rank];
    auto ia = t->token_to_id_.find(a);
    auto ib = t->token_to_id_.find(b);
    auto im = t->token_to_id_.find(a + b);
    // A merge whose parts or result are not in the vocabulary can never fire; skip it.
    if (ia == t->token_to_id_.end() || ib == t->token_to_id_.end() || im == t->token_to_id_.end()) continue;
    t->merge_.emplace(PairKey(ia->second, ib->second),
                      std::make_pair(static_cast<int32_t>(rank), im->second));
  }
  t->matcher_ = tok::AddedTokenMatcher(v.added);
  return t;
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && v_.kinds[id] == TokenKind::kControl;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return bytes_[id];
}

std::string BpeTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return v_.tokens[id];
}

std::string BpeTokenizer::DecodePiece(int32_t id, bool first, bool skip_special) const {
  if (id < 0 || id >= vocab_size()) return "";
  if (v_.kinds[id] == TokenKind::kControl) return skip_special ? "" : v_.tokens[id];
  return bytes_[id];
}

std::string BpeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) out += DecodePiece(id, false, skip_special);
  return tok::SanitizeUtf8(out);
}

void BpeTokenizer::MergePiece(const std::string& piece, std::vector<int32_t>* out) const {
  // Symbols: one per UTF-8 character of the byte-level string, kept as a doubly linked list.
  struct Symbol {
    int32_t id;  // -1: character not in the vocabulary (never merges)
    size_t begin, len;
    int prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t begin = pos;
    uint32_t cp;
    tok::DecodeUtf8(piece, &pos, &cp);
    auto it = token_to_id_.find(piece.substr(begin, pos - begin));
    const int idx = static_cast<int>(sym.size());
    sym.push_back({it == token_to_id_.end() ? -1 : it->second, begin, pos - begin, idx - 1, idx + 1});
  }
  if (!sym.empty()) sym.back().next = -1;

  // Candidate merges ordered by (rank, left position): the lowest rank fires first, leftmost on ties, as in
  // both llama.cpp and HF tokenizers. Stale entries (a side already merged) are skipped when popped.
  struct Cand {
    int32_t rank;
    int left;
    int32_t right_id, left_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto push = [&](int left) {
    if (left < 0) return;
    const int right = sym[left].next;
    if (right < 0 || sym[left].id < 0 || sym[right].id < 0) return;
    auto it = merge_.find(PairKey(sym[left].id, sym[right].id));
    if (it == merge_.end()) return;
    q.push({it->second.first, left, sym[right].id, sym[left].id, it->second.second});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push(i);
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Symbol& l = sym[c.left];
    if (l.len == 0 || l.id != c.left_id || l.next < 0) continue;
    Symbol& r = sym[l.next];
    if (r.id != c.right_id) continue;
    l.id = c.merged;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    push(l.prev);
    push(c.left);
  }
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out->push_back(sym[i].id);
    } else if (v_.unk_id >= 0) {
      out->push_back(v_.unk_id);
    }
  }
}

void BpeTokenizer::EncodePiece(const std::string& piece, std::vector<int32_t>* out) const {
  if (v_.ignore_merges) {
    auto it = token_to_id_.find(piece);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCacheMaxPieceBytes) {  // long pieces are rare and would bloat the cache
    MergePiece(piece, out);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  MergePiece(piece, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kCacheMaxEntries) cache_.clear();
  cache_.emplace(piece, std::move(ids));
}

StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, const EncodeOptions& opts) const {
  if (size_t bad = tok::FindInvalidUtf8(text); bad != std::string_view::npos) {
    return InvalidArgumentError("text is not valid UTF-8 (byte {})", bad);
  }
  std::vector<tok::AddedTokenMatcher::Segment> segments;
  matcher_.Split(text, opts.parse_special, &segments);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> pieces;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    pieces.clear();
    v_.pre.Split(seg.text, &pieces);
    for (const auto& p : pieces) EncodePiece(v_.byte_level ? tok::ByteLevelEncode(p) : p, &ids);
  }
  return tok::WrapAndTruncate(v_.wrap, opts.add_special, std::move(ids), opts.max_length);
}

}  // namespace stoke
