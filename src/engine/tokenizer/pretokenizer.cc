#include "engine/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

namespace stoke::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

StatusOr<Regex> Regex::Compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgumentError("pre-tokenizer regex /{}/ does not compile at offset {}: {}", pattern,
                                err_offset, reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
  Regex r;
  r.code_ = std::make_shared<Code>();
  r.code_->code = code;
  r.pattern_ = std::string(pattern);
  return r;
}

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or a resource limit: the rest stays one gap)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // empty match: step over one code point so the loop always advances
      if (begin >= text.size()) break;
      end = begin + 1;
      while (end < text.size() && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) ++end;
      offset = end;
      continue;
    }
    matches->emplace_back(begin, end);
    offset = end;
  }
  pcre2_match_data_free(md);
}

namespace {

// llama.cpp (llama-vocab.cpp) pre-tokenizer names -> the regexes it applies in sequence.
struct GgufPreEntry {
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes;
};

const std::vector<GgufPreEntry>& GgufPreTable() {
  static const std::vector<GgufPreEntry> table = {
      {{"gpt2", "gpt-2", "mpt", "olmo", "jais", "trillion"}, {kGpt2Regex}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"}, {kLlama3Regex}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2Regex}},
      {{"qwen2", "stablelm2", "deepseek-r1-qwen", "hunyuan", "megrez"}, {kQwen2Regex}},
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
  };
  return table;
}

}  // namespace

Status PreTokenizer::AddRegex(std::string_view pattern, StepKind kind) {
  ASSIGN_OR_RETURN(Regex re, Regex::Compile(pattern));
  steps_.push_back(Step{kind, std::move(re)});
  return OkStatus();
}

StatusOr<PreTokenizer> PreTokenizer::ForGgufPre(std::string_view pre) {
  for (const auto& entry : GgufPreTable()) {
    for (auto name : entry.names) {
      if (name != pre) continue;
      PreTokenizer p;
      for (auto re : entry.regexes) RETURN_IF_ERROR(p.AddRegex(re, StepKind::kIsolate));
      p.has_byte_level_ = true;
      return p;
    }
  }
  return InvalidArgumentError(
      "unsupported tokenizer.ggml.pre '{}' (known: gpt2, llama-bpe, smollm, qwen2, ...)", pre);
}

Status PreTokenizer::AddJsonStep(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return InvalidArgumentError("pre_tokenizer entry without a type: {}", j.dump().substr(0, 120));
  }
  const std::string type = j["type"];
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return InvalidArgumentError("pre_tokenizer Sequence without a 'pretokenizers' list");
    }
    for (const auto& sub : j["pretokenizers"]) RETURN_IF_ERROR(AddJsonStep(sub));
    return OkStatus();
  }
  if (type == "ByteLevel") {
    has_byte_level_ = true;
    if (j.value("add_prefix_space", false)) steps_.push_back(Step{StepKind::kPrefixSpace, Regex()});
    if (j.value("use_regex", true)) return AddRegex(kGpt2Regex, StepKind::kIsolate);
    return OkStatus();
  }
  if (type == "Digits") {
    return AddRegex(j.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", StepKind::kIsolate);
  }
  if (type == "Split") {
    if (j.value("invert", false)) return UnimplementedError("pre_tokenizer Split with invert=true");
    const std::string behavior = j.value("behavior", "");
    StepKind kind;
    if (behavior == "Isolated") {
      kind = StepKind::kIsolate;
    } else if (behavior == "Removed") {
      kind = StepKind::kRemove;
    } else {
      return UnimplementedError("pre_tokenizer Split behavior '{}'", behavior);
    }
    const auto& pat = j.value("pattern", nlohmann::json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      return AddRegex(pat["Regex"].get<std::string>(), kind);
    }
    if (pat.contains("String") && pat["String"].is_string()) {
      std::string quoted = "\\Q" + pat["String"].get<std::string>() + "\\E";
      return AddRegex(quoted, kind);
    }
    return InvalidArgumentError("pre_tokenizer Split without a Regex/String pattern");
  }
  return UnimplementedError("pre_tokenizer type '{}' is not supported for BPE", type);
}

StatusOr<PreTokenizer> PreTokenizer::FromJson(const nlohmann::json& j) {
  PreTokenizer p;
  if (j.is_null()) return p;
  RETURN_IF_ERROR(p.AddJsonStep(j));
  return p;
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string>* pieces) const {
  std::vector<std::string> cur;
  cur.emplace_back(text);
  std::vector<std::string> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const auto& step : steps_) {
    next.clear();
    for (auto& piece : cur) {
      if (step.kind == StepKind::kPrefixSpace) {
        if (!piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
        next.push_back(std::move(piece));
        continue;
      }
      matches.clear();
      step.regex.FindAll(piece, &matches);
      size_t last = 0;
      for (auto [b, e] : matches) {
        if (b > last) next.emplace_back(piece.substr(last, b - last));  // the gap between matches
        if (step.kind == StepKind::kIsolate) next.emplace_back(piece.substr(b, e - b));
        last = e;
      }
      if (last < piece.size()) next.emplace_back(piece.substr(last));
    }
    cur.swap(next);
  }
  for (auto& p : cur) {
    if (!p.empty()) pieces->push_back(std::move(p));
  }
}

}  // namespace stoke::tok
