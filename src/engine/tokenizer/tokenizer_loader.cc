// LoadTokenizer: GGUF metadata (tokenizer.ggml.*) or an HF folder (tokenizer.json, else vocab.txt) -> the
// right Tokenizer. Every error names the file and the key at fault.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/file_util.h"
#include "engine/loader/gguf_reader.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/wordpiece_tokenizer.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Control tokens that end a turn although the file may not list them as eos (llama.cpp's EOG heuristic).
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "<|end_of_text|>",
};

bool IsLlama3Pre(std::string_view pre) {
  return pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" || pre == "pixtral";
}

void AddUnique(std::vector<int32_t>* v, int32_t id) {
  if (id >= 0 && std::find(v->begin(), v->end(), id) == v->end()) v->push_back(id);
}

StatusOr<std::unique_ptr<Tokenizer>> LoadGguf(const std::string& path) {
  ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(path));
  auto ctx = [&](const Status& s) { return s.WithContext(path); };
  auto model = gguf->GetString("tokenizer.ggml.model");
  if (!model.ok()) return ctx(model.status());
  if (*model != "gpt2") {
    return UnimplementedError("{}: tokenizer.ggml.model '{}' is not supported (only byte-level BPE 'gpt2')",
                              path, *model);
  }
  BpeVocab v;
  v.source = path;
  auto tokens = gguf->GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return ctx(tokens.status());
  v.tokens = std::move(*tokens);
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  v.kinds.assign(n, TokenKind::kNormal);
  if (gguf->Has("tokenizer.ggml.token_type")) {
    auto types = gguf->GetIntArray("tokenizer.ggml.token_type");
    if (!types.ok()) return ctx(types.status());
    if (static_cast<int32_t>(types->size()) != n) {
      return InvalidArgumentError("{}: tokenizer.ggml.token_type has {} entries for {} tokens", path,
                                  types->size(), n);
    }
    for (int32_t id = 0; id < n; ++id) {
      switch ((*types)[id]) {  // llama_token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
                               // 6 byte
        case 2:
        case 3:
          v.kinds[id] = TokenKind::kControl;
          v.added.push_back({v.tokens[id], id, /*special=*/true});
          break;
        case 4:
          v.kinds[id] = TokenKind::kUserDefined;
          v.added.push_back({v.tokens[id], id, /*special=*/false});
          break;
        case 5:
          v.kinds[id] = TokenKind::kUnused;
          break;
        default:
          break;
      }
    }
  }
  auto merges = gguf->GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return ctx(merges.status());
  v.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    const size_t sp = m.find(' ', 1);  // from 1, as llama.cpp: a part may itself be a space
    if (sp == std::string::npos) {
      return InvalidArgumentError("{}: tokenizer.ggml.merges[{}] '{}' is not 'a b'", path, i,
                                  m.substr(0, 40));
    }
    v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  std::string pre = "default";
  if (gguf->Has("tokenizer.ggml.pre")) {
    auto p = gguf->GetString("tokenizer.ggml.pre");
    if (!p.ok()) return ctx(p.status());
    pre = *p;
  }
  auto pretok = tok::PreTokenizer::ForGgufPre(pre);
  if (!pretok.ok()) return ctx(pretok.status());
  v.pre = std::move(*pretok);
  v.ignore_merges = IsLlama3Pre(pre);

  auto get_id = [&](std::string_view key) -> StatusOr<int32_t> {
    if (!gguf->Has(key)) return -1;
    auto id = gguf->GetInt(key);
    if (!id.ok()) return ctx(id.status());
    if (*id < -1 || *id >= n)
      return InvalidArgumentError("{}: {} = {} outside vocab of {}", path, key, *id, n);
    return static_cast<int32_t>(*id);
  };
  auto get_bool = [&](std::string_view key, bool dflt) -> StatusOr<bool> {
    if (!gguf->Has(key)) return dflt;
    auto b = gguf->GetBool(key);
    if (!b.ok()) return ctx(b.status());
    return *b;
  };
  ASSIGN_OR_RETURN(v.bos_id, get_id("tokenizer.ggml.bos_token_id"));
  ASSIGN_OR_RETURN(int32_t eos, get_id("tokenizer.ggml.eos_token_id"));
  ASSIGN_OR_RETURN(int32_t eot, get_id("tokenizer.ggml.eot_token_id"));
  ASSIGN_OR_RETURN(int32_t eom, get_id("tokenizer.ggml.eom_token_id"));
  AddUnique(&v.eos_ids, eos);
  AddUnique(&v.eos_ids, eot);
  AddUnique(&v.eos_ids, eom);
  for (int32_t id = 0; id < n; ++id) {
    if (v.kinds[id] != TokenKind::kControl) continue;
    for (auto text : kEndOfGenerationTexts) {
      if (v.tokens[id] == text) AddUnique(&v.eos_ids, id);
    }
  }
  // llama.cpp's default for a missing add_bos_token: on for Llama-3 vocabularies only.
  ASSIGN_OR_RETURN(bool add_bos, get_bool("tokenizer.ggml.add_bos_token", IsLlama3Pre(pre)));
  ASSIGN_OR_RETURN(bool add_eos, get_bool("tokenizer.ggml.add_eos_token", false));
  if (add_bos) {
    if (v.bos_id < 0)
      return InvalidArgumentError("{}: add_bos_token is true but there is no bos_token_id", path);
    v.wrap.prefix.push_back(v.bos_id);
  }
  if (add_eos && eos >= 0) v.wrap.suffix.push_back(eos);
  ASSIGN_OR_RETURN(auto bpe, BpeTokenizer::Create(std::move(v)));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

StatusOr<json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("{}: not valid JSON", path);
  return j;
}

std::optional<json> ReadOptionalJson(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  auto j = ReadJson(path.string());
  if (!j.ok()) return std::nullopt;
  return std::move(*j);
}

// "eos_token": "</s>" or {"content": "</s>", ...}
std::string TokenString(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

void AddIds(const json& j, std::vector<int32_t>* out) {
  if (j.is_number_integer()) AddUnique(out, j.get<int32_t>());
  if (j.is_array()) {
    for (const auto& e : j) {
      if (e.is_number_integer()) AddUnique(out, e.get<int32_t>());
    }
  }
}

// Sibling files of tokenizer.json that say which ids are bos/eos and whether BOS is added.
struct HfSpecials {
  int32_t bos = -1;
  std::vector<int32_t> eos;
  std::optional<bool> add_bos, add_eos;
};

HfSpecials ReadHfSpecials(const fs::path& dir, const std::function<int32_t(const std::string&)>& lookup) {
  HfSpecials s;
  auto tc = ReadOptionalJson(dir / "tokenizer_config.json");
  auto cfg = ReadOptionalJson(dir / "config.json");
  auto gen = ReadOptionalJson(dir / "generation_config.json");
  if (cfg) {
    if (cfg->contains("bos_token_id") && (*cfg)["bos_token_id"].is_number_integer())
      s.bos = (*cfg)["bos_token_id"];
    if (cfg->contains("eos_token_id")) AddIds((*cfg)["eos_token_id"], &s.eos);
  }
  if (gen && gen->contains("eos_token_id")) AddIds((*gen)["eos_token_id"], &s.eos);
  if (tc) {
    if (s.bos < 0 && tc->contains("bos_token")) s.bos = lookup(TokenString((*tc)["bos_token"]));
    if (tc->contains("eos_token")) AddUnique(&s.eos, lookup(TokenString((*tc)["eos_token"])));
    if (tc->contains("add_bos_token") && (*tc)["add_bos_token"].is_boolean())
      s.add_bos = (*tc)["add_bos_token"].get<bool>();
    if (tc->contains("add_eos_token") && (*tc)["add_eos_token"].is_boolean())
      s.add_eos = (*tc)["add_eos_token"].get<bool>();
  }
  return s;
}

std::vector<tok::AddedToken> ParseAddedTokens(const json& j) {
  std::vector<tok::AddedToken> out;
  if (!j.is_array()) return out;
  for (const auto& a : j) {
    if (!a.is_object() || !a.contains("id") || !a.contains("content")) continue;
    tok::AddedToken t;
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    out.push_back(std::move(t));
  }
  return out;
}

StatusOr<std::unique_ptr<Tokenizer>> LoadWordPieceJson(const std::string& path, const json& root,
                                                       const fs::path& dir) {
  const json& model = root["model"];
  WordPieceVocab v;
  v.source = path;
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return InvalidArgumentError("{}: model.vocab missing", path);
  int32_t max_id = -1;
  for (const auto& [tok_text, id] : model["vocab"].items()) max_id = std::max(max_id, id.get<int32_t>());
  v.added = ParseAddedTokens(root.value("added_tokens", json::array()));
  for (const auto& a : v.added) max_id = std::max(max_id, a.id);
  v.tokens.assign(max_id + 1, "");
  for (const auto& [tok_text, id] : model["vocab"].items()) {
    const int32_t i = id.get<int32_t>();
    if (i < 0) return InvalidArgumentError("{}: negative id for '{}'", path, tok_text);
    v.tokens[i] = tok_text;
  }
  for (const auto& a : v.added) v.tokens[a.id] = a.content;
  const std::string unk = model.value("unk_token", "[UNK]");
  for (int32_t i = 0; i <= max_id; ++i) {
    if (v.tokens[i] == unk) v.unk_id = i;
  }
  if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string()) {
    v.continuing_prefix = model["continuing_subword_prefix"];
  }
  v.max_input_chars_per_word = model.value("max_input_chars_per_word", 100);
  const json& norm = root.value("normalizer", json());
  if (norm.is_null()) {
    v.clean_text = v.handle_chinese_chars = v.strip_accents = v.lowercase = false;
  } else if (norm.value("type", "") == "BertNormalizer") {
    v.clean_text = norm.value("clean_text", true);
    v.handle_chinese_chars = norm.value("handle_chinese_chars", true);
    v.lowercase = norm.value("lowercase", true);
    v.strip_accents = norm.contains("strip_accents") && norm["strip_accents"].is_boolean()
                          ? norm["strip_accents"].get<bool>()
                          : v.lowercase;
  } else {
    return UnimplementedError("{}: normalizer '{}' for WordPiece", path, norm.value("type", "?"));
  }
  const json& pre = root.value("pre_tokenizer", json());
  if (!pre.is_null() && pre.value("type", "") != "BertPreTokenizer") {
    return UnimplementedError("{}: pre_tokenizer '{}' for WordPiece", path, pre.value("type", "?"));
  }
  const json& dec = root.value("decoder", json());
  v.decode_cleanup = dec.is_object() ? dec.value("cleanup", true) : true;
  std::unordered_map<std::string, int32_t> lookup_map;
  for (int32_t i = 0; i <= max_id; ++i) lookup_map.emplace(v.tokens[i], i);
  auto lookup = [&](const std::string& s) -> int32_t {
    auto it = lookup_map.find(s);
    return it == lookup_map.end() ? -1 : it->second;
  };
  auto wrap = tok::SpecialWrapFromJson(root.value("post_processor", json()), lookup);
  if (!wrap.ok()) return wrap.status().WithContext(path);
  v.wrap = std::move(*wrap);
  ASSIGN_OR_RETURN(auto wp, WordPieceTokenizer::Create(std::move(v)));
  return std::unique_ptr<Tokenizer>(std::move(wp));
}

StatusOr<std::unique_ptr<Tokenizer>> LoadBpeJson(const std::string& path, const json& root,
                                                 const fs::path& dir) {
  const json& model = root["model"];
  BpeVocab v;
  v.source = path;
  if (model.value("byte_fallback", false)) {
    return UnimplementedError("{}: BPE with byte_fallback (SentencePiece-style) is not supported", path);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return UnimplementedError("{}: BPE with model.{} is not supported", path, key);
    }
  }
  if (!model.contains("vocab") || !model["vocab"].is_object())
    return InvalidArgumentError("{}: model.vocab missing", path);
  int32_t max_id = -1;
  for (const auto& [tok_text, id] : model["vocab"].items()) max_id = std::max(max_id, id.get<int32_t>());
  v.added = ParseAddedTokens(root.value("added_tokens", json::array()));
  for (const auto& a : v.added) max_id = std::max(max_id, a.id);
  v.tokens.assign(max_id + 1, "");
  v.kinds.assign(max_id + 1, TokenKind::kUnused);
  for (const auto& [tok_text, id] : model["vocab"].items()) {
    const int32_t i = id.get<int32_t>();
    if (i < 0) return InvalidArgumentError("{}: negative id for '{}'", path, tok_text);
    v.tokens[i] = tok_text;
    v.kinds[i] = TokenKind::kNormal;
  }
  for (const auto& a : v.added) {
    v.tokens[a.id] = a.content;
    v.kinds[a.id] = a.special ? TokenKind::kControl : TokenKind::kUserDefined;
  }
  const json& merges = model.value("merges", json::array());
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos)
        return InvalidArgumentError("{}: model.merges[{}] '{}' is not 'a b'", path, i, s);
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return InvalidArgumentError("{}: model.merges[{}] is neither 'a b' nor [a, b]", path, i);
    }
  }
  v.ignore_merges = model.value("ignore_merges", false);
  const json& norm = root.value("normalizer", json());
  if (!norm.is_null()) {
    return UnimplementedError("{}: normalizer '{}' for BPE is not supported", path, norm.value("type", "?"));
  }
  auto pre = tok::PreTokenizer::FromJson(root.value("pre_tokenizer", json()));
  if (!pre.ok()) return pre.status().WithContext(path);
  v.pre = std::move(*pre);
  const json& dec = root.value("decoder", json());
  v.byte_level = v.pre.has_byte_level() || (dec.is_object() && dec.value("type", "") == "ByteLevel");
  if (!v.byte_level) return UnimplementedError("{}: BPE without a ByteLevel pre-tokenizer/decoder", path);

  std::unordered_map<std::string, int32_t> lookup_map;
  for (int32_t i = 0; i <= max_id; ++i) {
    if (v.kinds[i] != TokenKind::kUnused) lookup_map.emplace(v.tokens[i], i);
  }
  auto lookup = [&](const std::string& s) -> int32_t {
    auto it = lookup_map.find(s);
    return it == lookup_map.end() ? -1 : it->second;
  };
  if (model.contains("unk_token") && model["unk_token"].is_string()) v.unk_id = lookup(model["unk_token"]);
  auto wrap = tok::SpecialWrapFromJson(root.value("post_processor", json()), lookup);
  if (!wrap.ok()) return wrap.status().WithContext(path);
  v.wrap = std::move(*wrap);
  HfSpecials sp = ReadHfSpecials(dir, lookup);
  v.bos_id = sp.bos;
  v.eos_ids = sp.eos;
  if (v.wrap.prefix.empty() && v.wrap.suffix.empty()) {  // no template: tokenizer_config.json decides
    if (sp.add_bos.value_or(false) && v.bos_id >= 0) v.wrap.prefix.push_back(v.bos_id);
    if (sp.add_eos.value_or(false) && !v.eos_ids.empty()) v.wrap.suffix.push_back(v.eos_ids[0]);
  }
  ASSIGN_OR_RETURN(auto bpe, BpeTokenizer::Create(std::move(v)));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(json root, ReadJson(path));
  const fs::path dir = fs::path(path).parent_path();
  if (!root.contains("model") || !root["model"].is_object())
    return InvalidArgumentError("{}: no 'model' object", path);
  std::string type = root["model"].value("type", "");
  if (type.empty()) {  // old files omit the type: infer it
    type = root["model"].contains("merges") ? "BPE" : "WordPiece";
  }
  try {
    if (type == "BPE") return LoadBpeJson(path, root, dir);
    if (type == "WordPiece") return LoadWordPieceJson(path, root, dir);
  } catch (const json::exception& e) {
    return InvalidArgumentError("{}: {}", path, e.what());
  }
  return UnimplementedError("{}: tokenizer model type '{}' is not supported (BPE, WordPiece)", path, type);
}

// An HF BERT folder with only vocab.txt (no tokenizer.json): BertTokenizer defaults.
StatusOr<std::unique_ptr<Tokenizer>> LoadVocabTxt(const fs::path& dir) {
  const std::string path = (dir / "vocab.txt").string();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  WordPieceVocab v;
  v.source = path;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    v.tokens.push_back(std::move(line));
    start = end + 1;
  }
  auto tc = ReadOptionalJson(dir / "tokenizer_config.json");
  v.lowercase = tc ? tc->value("do_lower_case", true) : true;
  v.strip_accents = v.lowercase;
  auto find = [&](std::string_view s) -> int32_t {
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == s) return static_cast<int32_t>(i);
    }
    return -1;
  };
  v.unk_id = find("[UNK]");
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (int32_t id = find(s); id >= 0) v.added.push_back({s, id, /*special=*/true});
  }
  const int32_t cls = find("[CLS]"), sep = find("[SEP]");
  if (cls < 0 || sep < 0) return InvalidArgumentError("{}: no [CLS]/[SEP] in vocab", path);
  v.wrap.prefix = {cls};
  v.wrap.suffix = {sep};
  ASSIGN_OR_RETURN(auto wp, WordPieceTokenizer::Create(std::move(v)));
  return std::unique_ptr<Tokenizer>(std::move(wp));
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerUnchecked(const std::string& model_path) {
  std::error_code ec;
  const fs::path p(model_path);
  if (fs::is_directory(p, ec)) {
    if (fs::is_regular_file(p / "tokenizer.json", ec))
      return LoadTokenizerJson((p / "tokenizer.json").string());
    if (fs::is_regular_file(p / "vocab.txt", ec)) return LoadVocabTxt(p);
    return NotFoundError("{}: no tokenizer.json or vocab.txt in this folder", model_path);
  }
  if (!fs::is_regular_file(p, ec)) return NotFoundError("{}: no such file or folder", model_path);
  if (p.extension() == ".json") return LoadTokenizerJson(model_path);
  std::ifstream f(model_path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  if (f.gcount() == 4 && std::string_view(magic, 4) == "GGUF") return LoadGguf(model_path);
  return InvalidArgumentError("{}: neither a GGUF file, a tokenizer.json nor a model folder", model_path);
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_path) {
  try {  // a JSON value of the wrong type deep in a config file is a user error, never an abort
    return LoadTokenizerUnchecked(model_path);
  } catch (const json::exception& e) {
    return InvalidArgumentError("{}: {}", model_path, e.what());
  }
}

}  // namespace stoke
