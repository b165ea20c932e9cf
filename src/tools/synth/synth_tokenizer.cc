// Generated tokenizers for synthetic models: byte-level BPE (Llama 3 / SmolLM2 style) and WordPiece (BERT).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "tools/synth/synth.h"
#include "tools/synth/synth_internal.h"

namespace stoke::synth {
namespace {

using nlohmann::json;

std::string Quote(const std::string& s) {
  return json(s).dump();
}

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// GPT-2's bytes_to_unicode(), in its order: the printable bytes first, then the rest mapped to 256+n.
std::vector<std::string> ByteAlphabet() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<uint32_t> cs(bs.begin(), bs.end());
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  std::vector<std::string> out;
  for (uint32_t c : cs) out.push_back(Utf8(c));
  return out;
}

// Uniform in [0, n) from the stream `key` (splitmix64 of the counter, as SynthNormal).
uint64_t Pick(uint64_t key, uint64_t index, uint64_t n) {
  uint64_t x = key + 0x9e3779b97f4a7c15ULL * (index + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return n == 0 ? 0 : x % n;
}

// Biased to early (short) tokens: index = n * u^2.
uint64_t PickEarly(uint64_t key, uint64_t index, uint64_t n) {
  const double u = static_cast<double>(Pick(key, index, 1u << 30)) / (1u << 30);
  return std::min<uint64_t>(n - 1, static_cast<uint64_t>(n * u * u));
}

std::string AddedTokenJson(int id, const std::string& content) {
  return fmt::format(R"({{"id": {}, "content": {}, "single_word": false, "lstrip": false, "rstrip": false, )"
                     R"("normalized": false, "special": true}})",
                     id, Quote(content));
}

constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

std::string BpeTokenizerJson(const BpeSpec& spec) {
  std::vector<bool> special_id(spec.vocab_size, false);
  for (const auto& [id, text] : spec.specials) special_id[id] = true;
  const int num_normal = spec.vocab_size - static_cast<int>(spec.specials.size());

  std::vector<std::string> tokens = ByteAlphabet();
  std::vector<std::pair<int, int>> merges;  // indices into tokens
  std::unordered_set<std::string> seen(tokens.begin(), tokens.end());
  const uint64_t key = SynthTensorKey(spec.seed, "tokenizer.bpe");
  uint64_t draw = 0;
  while (static_cast<int>(tokens.size()) < num_normal) {
    const uint64_t n = tokens.size();
    const int a = static_cast<int>(PickEarly(key, draw++, n));
    const int b = static_cast<int>(PickEarly(key, draw++, n));
    std::string merged = tokens[a] + tokens[b];
    if (merged.size() > 24 || !seen.insert(merged).second) continue;
    merges.emplace_back(a, b);
    tokens.push_back(std::move(merged));
  }

  // Normal tokens take the ids the specials leave free, in order.
  std::vector<int> normal_ids;
  for (int id = 0; id < spec.vocab_size; ++id) {
    if (!special_id[id]) normal_ids.push_back(id);
  }

  std::string out =
      "{\n\"version\": \"1.0\",\n\"truncation\": null,\n\"padding\": null,\n\"added_tokens\": [\n";
  for (size_t i = 0; i < spec.specials.size(); ++i) {
    out += AddedTokenJson(spec.specials[i].first, spec.specials[i].second);
    out += i + 1 < spec.specials.size() ? ",\n" : "\n";
  }
  out += "],\n\"normalizer\": null,\n";
  json pre, post, dec;
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
  if (spec.pre == BpeSpec::Pre::kLlama3) {
    json split = {{"type", "Split"},
                  {"pattern", {{"Regex", kLlama3Regex}}},
                  {"behavior", "Isolated"},
                  {"invert", false}};
    json bl = byte_level;
    bl["use_regex"] = false;
    pre = {{"type", "Sequence"}, {"pretokenizers", json::array({split, bl})}};
  } else {
    json digits = {{"type", "Digits"}, {"individual_digits", true}};
    json bl = byte_level;
    bl["use_regex"] = true;
    pre = {{"type", "Sequence"}, {"pretokenizers", json::array({digits, bl})}};
  }
  json post_bl = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  if (!spec.bos.empty()) {
    int bos_id = -1;
    for (const auto& [id, text] : spec.specials) {
      if (text == spec.bos) bos_id = id;
    }
    json bos_piece = {{"SpecialToken", {{"id", spec.bos}, {"type_id", 0}}}};
    json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    json bos1 = {{"SpecialToken", {{"id", spec.bos}, {"type_id", 1}}}};
    json b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
    json tp = {{"type", "TemplateProcessing"},
               {"single", json::array({bos_piece, a})},
               {"pair", json::array({bos_piece, a, bos1, b})},
               {"special_tokens",
                {{spec.bos,
                  {{"id", spec.bos}, {"ids", json::array({bos_id})}, {"tokens", json::array({spec.bos})}}}}}};
    post = {{"type", "Sequence"}, {"processors", json::array({post_bl, tp})}};
  } else {
    post = post_bl;
  }
  dec = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  out += "\"pre_tokenizer\": " + pre.dump() + ",\n";
  out += "\"post_processor\": " + post.dump() + ",\n";
  out += "\"decoder\": " + dec.dump() + ",\n";
  out +=
      "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": "
      "null, "
      "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, ";
  out += spec.pre == BpeSpec::Pre::kLlama3 ? "\"ignore_merges\": true,\n" : "\"ignore_merges\": false,\n";
  // The specials are in model.vocab too (as SmolLM2's file has them): HF tokenizers gives an added token
  // that is not in the model's vocab the next free id, whatever its "id" says.
  out += "\"vocab\": {\n";
  std::vector<std::string> by_id(spec.vocab_size);
  for (const auto& [id, text] : spec.specials) by_id[id] = text;
  for (size_t i = 0; i < tokens.size(); ++i) by_id[normal_ids[i]] = tokens[i];
  for (int id = 0; id < spec.vocab_size; ++id) {
    out += Quote(by_id[id]) + ": " + std::to_string(id);
    out += id + 1 < spec.vocab_size ? ",\n" : "\n";
  }
  out += "},\n\"merges\": [\n";
  for (size_t i = 0; i < merges.size(); ++i) {
    out += Quote(tokens[merges[i].first] + " " + tokens[merges[i].second]);
    out += i + 1 < merges.size() ? ",\n" : "\n";
  }
  out += "]\n}\n}\n";
  return out;
}

std::string WordPieceTokenizerJson(int vocab_size, uint64_t seed, std::string* vocab_txt) {
  std::vector<std::string> tokens;
  tokens.push_back("[PAD]");
  for (int i = 0; i < 99; ++i) tokens.push_back(fmt::format("[unused{}]", i));
  for (const char* s : {"[UNK]", "[CLS]", "[SEP]", "[MASK]"}) tokens.push_back(s);
  std::unordered_set<std::string> seen(tokens.begin(), tokens.end());
  auto add = [&](std::string t) {
    if (static_cast<int>(tokens.size()) < vocab_size && seen.insert(t).second) tokens.push_back(std::move(t));
  };
  std::vector<std::string> chars;
  for (int c = 33; c < 127; ++c) {
    if (c >= 'A' && c <= 'Z') continue;  // lowercased by the normalizer
    chars.push_back(std::string(1, static_cast<char>(c)));
  }
  for (const auto& c : chars) add(c);
  for (const auto& c : chars) add("##" + c);
  const uint64_t key = SynthTensorKey(seed, "tokenizer.wordpiece");
  uint64_t draw = 0;
  while (static_cast<int>(tokens.size()) < vocab_size) {
    const int len = 2 + static_cast<int>(Pick(key, draw++, 7));
    std::string w;
    for (int i = 0; i < len; ++i) w += static_cast<char>('a' + Pick(key, draw++, 26));
    add(Pick(key, draw++, 3) == 0 ? "##" + w : w);
  }
  vocab_txt->clear();
  for (const auto& t : tokens) *vocab_txt += t + "\n";

  std::string out =
      "{\n\"version\": \"1.0\",\n\"truncation\": null,\n\"padding\": null,\n\"added_tokens\": [\n";
  const int specials[] = {0, 100, 101, 102, 103};
  for (size_t i = 0; i < std::size(specials); ++i) {
    out += AddedTokenJson(specials[i], tokens[specials[i]]);
    out += i + 1 < std::size(specials) ? ",\n" : "\n";
  }
  out += "],\n";
  out += R"("normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, )"
         R"("strip_accents": null, "lowercase": true},)"
         "\n";
  out += R"("pre_tokenizer": {"type": "BertPreTokenizer"},)"
         "\n";
  json cls = {{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}};
  json sep0 = {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}};
  json sep1 = {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 1}}}};
  json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  json b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  json post = {
      {"type", "TemplateProcessing"},
      {"single", json::array({cls, a, sep0})},
      {"pair", json::array({cls, a, sep0, b, sep1})},
      {"special_tokens",
       {{"[CLS]", {{"id", "[CLS]"}, {"ids", json::array({101})}, {"tokens", json::array({"[CLS]"})}}},
        {"[SEP]", {{"id", "[SEP]"}, {"ids", json::array({102})}, {"tokens", json::array({"[SEP]"})}}}}}};
  out += "\"post_processor\": " + post.dump() + ",\n";
  out += R"("decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},)"
         "\n";
  out += R"("model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", )"
         R"("max_input_chars_per_word": 100, "vocab": {)"
         "\n";
  for (size_t i = 0; i < tokens.size(); ++i) {
    out += Quote(tokens[i]) + ": " + std::to_string(i);
    out += i + 1 < tokens.size() ? ",\n" : "\n";
  }
  out += "}\n}\n}\n";
  return out;
}

}  // namespace stoke::synth
