#include "engine/tokenizer/wordpiece_tokenizer.h"

#include <utf8proc.h>

#include "engine/tokenizer/unicode_util.h"

namespace stoke {
namespace {

// Rust char::is_whitespace (Unicode White_Space), which HF's BERT code uses.
bool IsWhiteSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

utf8proc_category_t Category(uint32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

// HF is_control: Cc, Cf, Co, Cs except \t \n \r, which count as whitespace. Unassigned code points (Cn) are
// kept (HF's category tables cannot list them), so they end up as [UNK].
bool IsControl(uint32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CS:
      return true;
    default:
      return false;
  }
}

bool IsChineseChar(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertPreTokenizer punctuation: ASCII punctuation (incl. $ + < = > ^ ` | ~) or any Unicode P* category.
bool IsPunctuation(uint32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
    return true;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

std::vector<uint32_t> Codepoints(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cp;
    if (!tok::DecodeUtf8(s, &pos, &cp)) cp = tok::kReplacementChar;
    out.push_back(cp);
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::Create(WordPieceVocab vocab) {
  if (vocab.tokens.empty()) return InvalidArgumentError("{}: empty WordPiece vocabulary", vocab.source);
  const int32_t n = static_cast<int32_t>(vocab.tokens.size());
  if (vocab.unk_id < 0 || vocab.unk_id >= n) {
    return InvalidArgumentError("{}: WordPiece needs an unk token inside the vocab", vocab.source);
  }
  for (const auto& a : vocab.added) {
    if (a.id < 0 || a.id >= n)
      return InvalidArgumentError("{}: added token id {} outside vocab", vocab.source, a.id);
  }
  for (int32_t id : vocab.wrap.prefix) {
    if (id < 0 || id >= n)
      return InvalidArgumentError("{}: post-processor id {} outside vocab", vocab.source, id);
  }
  for (int32_t id : vocab.wrap.suffix) {
    if (id < 0 || id >= n)
      return InvalidArgumentError("{}: post-processor id {} outside vocab", vocab.source, id);
  }
  std::unique_ptr<WordPieceTokenizer> t(new WordPieceTokenizer(std::move(vocab)));
  t->token_to_id_.reserve(n * 2);
  for (int32_t id = 0; id < n; ++id) t->token_to_id_.emplace(t->v_.tokens[id], id);
  t->special_.assign(n, false);
  for (const auto& a : t->v_.added) {
    if (a.special) t->special_[a.id] = true;
  }
  t->matcher_ = tok::AddedTokenMatcher(t->v_.added);
  return t;
}

std::string WordPieceTokenizer::Normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size() + 8);
  for (uint32_t c : Codepoints(text)) {
    if (v_.clean_text) {
      if (c == 0 || c == tok::kReplacementChar || IsControl(c)) continue;
      if (IsWhiteSpace(c)) c = ' ';
    }
    const bool pad = v_.handle_chinese_chars && IsChineseChar(c);
    if (pad) out.push_back(' ');
    // strip_accents: NFD, then drop nonspacing marks (Mn); lowercase after, as HF does.
    utf8proc_int32_t decomposed[32];
    utf8proc_ssize_t nd = 1;
    decomposed[0] = static_cast<utf8proc_int32_t>(c);
    if (v_.strip_accents) {
      int last_boundclass = 0;
      nd = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), decomposed, 32, UTF8PROC_DECOMPOSE,
                                   &last_boundclass);
      if (nd < 0 || nd > 32) {
        nd = 1;
        decomposed[0] = static_cast<utf8proc_int32_t>(c);
      }
    }
    for (utf8proc_ssize_t k = 0; k < nd; ++k) {
      uint32_t d = static_cast<uint32_t>(decomposed[k]);
      if (v_.strip_accents && Category(d) == UTF8PROC_CATEGORY_MN) continue;
      if (v_.lowercase) {
        if (d == 0x130) {  // the one unconditional multi-char lowercase mapping: İ -> i + U+0307
          out += "i\xCC\x87";
          continue;
        }
        d = static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(d)));
      }
      tok::AppendUtf8(d, &out);
    }
    if (pad) out.push_back(' ');
  }
  return out;
}

std::vector<std::string> WordPieceTokenizer::PreTokenize(const std::string& normalized) const {
  std::vector<std::string> words;
  std::string cur;
  size_t pos = 0;
  while (pos < normalized.size()) {
    const size_t begin = pos;
    uint32_t c;
    if (!tok::DecodeUtf8(normalized, &pos, &c)) c = tok::kReplacementChar;
    if (IsWhiteSpace(c)) {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
    } else if (IsPunctuation(c)) {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
      words.emplace_back(normalized.substr(begin, pos - begin));
    } else {
      cur.append(normalized, begin, pos - begin);
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

void WordPieceTokenizer::EncodeWord(const std::string& word, std::vector<int32_t>* out) const {
  size_t nchars = 0;
  for (char ch : word) nchars += (static_cast<uint8_t>(ch) & 0xC0) != 0x80;
  if (nchars > static_cast<size_t>(v_.max_input_chars_per_word)) {
    out->push_back(v_.unk_id);
    return;
  }
  const size_t mark = out->size();
  size_t start = 0;
  std::string candidate;
  while (start < word.size()) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      candidate.clear();
      if (start > 0) candidate = v_.continuing_prefix;
      candidate.append(word, start, end - start);
      auto it = token_to_id_.find(candidate);
      if (it != token_to_id_.end()) {
        found = it->second;
        break;
      }
      do {  // back off one code point
        --end;
      } while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {  // some position has no piece: the whole word is [UNK]
      out->resize(mark);
      out->push_back(v_.unk_id);
      return;
    }
    out->push_back(found);
    start = end;
  }
}

StatusOr<std::vector<int32_t>> WordPieceTokenizer::Encode(std::string_view text,
                                                          const EncodeOptions& opts) const {
  if (size_t bad = tok::FindInvalidUtf8(text); bad != std::string_view::npos) {
    return InvalidArgumentError("text is not valid UTF-8 (byte {})", bad);
  }
  std::vector<tok::AddedTokenMatcher::Segment> segments;
  matcher_.Split(text, opts.parse_special, &segments);
  std::vector<int32_t> ids;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    for (const auto& word : PreTokenize(Normalize(seg.text))) EncodeWord(word, &ids);
  }
  return tok::WrapAndTruncate(v_.wrap, opts.add_special, std::move(ids), opts.max_length);
}

bool WordPieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::string WordPieceTokenizer::TokenText(int32_t id) const {
  return id >= 0 && id < vocab_size() ? v_.tokens[id] : "";
}

std::string WordPieceTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || special_[id]) return "";
  const std::string& t = v_.tokens[id];
  return t.starts_with(v_.continuing_prefix) ? t.substr(v_.continuing_prefix.size()) : t;
}

namespace {
// HF decoders/wordpiece.rs cleanup(), applied per piece.
void Cleanup(std::string* s) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    size_t pos = 0;
    while ((pos = s->find(from, pos)) != std::string::npos) {
      s->replace(pos, from.size(), to);
      pos += to.size();
    }
  }
}
}  // namespace

std::string WordPieceTokenizer::DecodePiece(int32_t id, bool first, bool skip_special) const {
  if (id < 0 || id >= vocab_size()) return "";
  if (skip_special && special_[id]) return "";
  std::string piece = v_.tokens[id];
  if (!first) {
    if (piece.starts_with(v_.continuing_prefix)) {
      piece.erase(0, v_.continuing_prefix.size());
    } else {
      piece.insert(piece.begin(), ' ');
    }
  }
  if (v_.decode_cleanup) Cleanup(&piece);
  return piece;
}

std::string WordPieceTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || (skip_special && special_[id])) continue;
    out += DecodePiece(id, first, skip_special);
    first = false;
  }
  return tok::SanitizeUtf8(out);
}

}  // namespace stoke
