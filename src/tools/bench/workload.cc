#include "tools/bench/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "base/file_util.h"

namespace stoke::bench {
namespace {

// Frequent English words; with a leading space each is a single token in GPT-2-style byte-level BPE
// vocabularies (SmolLM2, Llama 3, Qwen2), so n words make about n tokens.
constexpr const char* kWords[] = {
    "the",   "of",      "and",     "to",      "in",       "is",       "that",   "for",   "it",    "as",
    "was",   "with",    "be",      "by",      "on",       "not",      "he",     "this",  "are",   "or",
    "his",   "from",    "at",      "which",   "but",      "have",     "an",     "had",   "they",  "you",
    "were",  "their",   "one",     "all",     "we",       "can",      "her",    "has",   "there", "been",
    "if",    "more",    "when",    "will",    "would",    "who",      "so",     "no",    "time",  "people",
    "year",  "way",     "day",     "man",     "thing",    "woman",    "life",   "child", "world", "school",
    "state", "family",  "student", "group",   "country",  "problem",  "hand",   "part",  "place", "case",
    "week",  "company", "system",  "program", "question", "work",     "number", "night", "point", "home",
    "water", "room",    "mother",  "area",    "money",    "story",    "fact",   "month", "lot",   "right",
    "study", "book",    "eye",     "job",     "word",     "business", "issue",  "side",  "kind",  "head",
    "house", "service", "friend",  "father",  "power",    "hour",     "game",   "line",  "end",   "member",
    "law",   "car",     "city",    "name",    "team",     "minute",   "idea",   "body",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

StatusOr<double> ParseNumber(std::string_view s, std::string_view what) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) {
    return InvalidArgumentError("{}: '{}' is not a number", what, s);
  }
  return v;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

StatusOr<PromptItem> ParseJsonlLine(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgumentError("{}: expected a JSON object", where);
  PromptItem item;
  if (auto it = j.find("prompt"); it != j.end()) {
    if (!it->is_string()) return InvalidArgumentError("{}: 'prompt' must be a string", where);
    item.text = it->get<std::string>();
  } else if (auto it = j.find("input"); it != j.end()) {
    if (!it->is_string()) return InvalidArgumentError("{}: 'input' must be a string", where);
    item.text = it->get<std::string>();
  } else if (auto it = j.find("prompt_ids"); it != j.end()) {
    if (!it->is_array() || it->empty())
      return InvalidArgumentError("{}: 'prompt_ids' must be a non-empty array", where);
    for (const auto& e : *it) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) {
        return InvalidArgumentError("{}: 'prompt_ids' must hold non-negative integers", where);
      }
      item.ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    item.input_tokens = static_cast<int>(item.ids.size());
  } else if (auto it = j.find("messages"); it != j.end()) {
    if (!it->is_array() || it->empty())
      return InvalidArgumentError("{}: 'messages' must be a non-empty array", where);
    item.messages_json = it->dump();
  } else {
    return InvalidArgumentError("{}: needs one of 'prompt', 'input', 'prompt_ids', 'messages'", where);
  }
  if (auto it = j.find("max_tokens"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 24)) {
      return InvalidArgumentError("{}: 'max_tokens' must be a positive integer", where);
    }
    item.max_tokens = static_cast<int>(it->get<int64_t>());
  }
  return item;
}

}  // namespace

int LengthDist::Sample(std::mt19937_64& rng) const {
  double v = a;
  switch (kind) {
    case Kind::kFixed:
      break;
    case Kind::kUniform:
      v = std::uniform_int_distribution<int64_t>(static_cast<int64_t>(a), static_cast<int64_t>(b))(rng);
      break;
    case Kind::kNormal:
      v = std::lround(std::normal_distribution<double>(a, b)(rng));
      break;
  }
  return std::max(1, static_cast<int>(v));
}

double LengthDist::Mean() const {
  return kind == Kind::kUniform ? (a + b) / 2 : a;
}

std::string LengthDist::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return fmt::format("{}", a);
    case Kind::kUniform:
      return fmt::format("uniform:{}:{}", a, b);
    case Kind::kNormal:
      return fmt::format("normal:{}:{}", a, b);
  }
  return "";
}

StatusOr<LengthDist> ParseLengthDist(std::string_view spec) {
  std::vector<std::string_view> parts = Split(spec, ':');
  LengthDist d;
  auto positive_int = [&](std::string_view s) -> StatusOr<double> {
    ASSIGN_OR_RETURN(double v, ParseNumber(s, fmt::format("length '{}'", spec)));
    if (v < 1 || v > (1 << 24) || v != std::floor(v)) {
      return InvalidArgumentError("length '{}': {} must be a whole number >= 1", spec, s);
    }
    return v;
  };
  if (parts.size() == 1) {
    ASSIGN_OR_RETURN(d.a, positive_int(parts[0]));
    return d;
  }
  if (parts.size() == 3 && parts[0] == "uniform") {
    d.kind = LengthDist::Kind::kUniform;
    ASSIGN_OR_RETURN(d.a, positive_int(parts[1]));
    ASSIGN_OR_RETURN(d.b, positive_int(parts[2]));
    if (d.b < d.a) return InvalidArgumentError("length '{}': uniform needs lo <= hi", spec);
    return d;
  }
  if (parts.size() == 3 && parts[0] == "normal") {
    d.kind = LengthDist::Kind::kNormal;
    ASSIGN_OR_RETURN(d.a, positive_int(parts[1]));
    ASSIGN_OR_RETURN(d.b, ParseNumber(parts[2], fmt::format("length '{}'", spec)));
    if (d.b < 0) return InvalidArgumentError("length '{}': stddev must be >= 0", spec);
    return d;
  }
  return InvalidArgumentError("length '{}': expected N, uniform:LO:HI or normal:MEAN:STDDEV", spec);
}

std::string WorkloadSpec::Describe() const {
  std::string s =
      file.empty() ? fmt::format("{} (input {}, output {} tokens", name, input.ToString(), output.ToString())
                   : fmt::format("{} (output {} tokens unless the file says", file, output.ToString());
  if (shared_prefix > 0) s += fmt::format(", shared prefix {}", shared_prefix);
  return s + ")";
}

StatusOr<WorkloadSpec> ParseWorkload(std::string_view name) {
  WorkloadSpec w;
  w.name = std::string(name);
  if (name == "short") {
    w.input = {LengthDist::Kind::kFixed, 128, 0};
    w.output = {LengthDist::Kind::kFixed, 128, 0};
  } else if (name == "standard") {
    w.input = {LengthDist::Kind::kFixed, 512, 0};
    w.output = {LengthDist::Kind::kFixed, 256, 0};
  } else if (name == "long") {
    w.input = {LengthDist::Kind::kFixed, 2000, 0};
    w.output = {LengthDist::Kind::kFixed, 512, 0};
  } else if (name.ends_with(".jsonl")) {
    w.file = std::string(name);
  } else {
    return InvalidArgumentError("--workload '{}': expected short, standard, long or a FILE.jsonl", name);
  }
  return w;
}

StatusOr<PromptSource> PromptSource::Create(const WorkloadSpec& spec, Api api, uint64_t seed) {
  PromptSource src;
  src.spec_ = spec;
  src.rng_.seed(seed);
  src.use_ids_ = api == Api::kOpenAiCompletions;
  if (spec.token_id_lo < 0 || spec.token_id_hi <= spec.token_id_lo) {
    return InvalidArgumentError("token id range [{}, {}) is empty", spec.token_id_lo, spec.token_id_hi);
  }
  if (!spec.file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(spec.file));
    int line_no = 0;
    for (std::string_view line : Split(text, '\n')) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      std::string where = fmt::format("{}:{}", spec.file, line_no);
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return InvalidArgumentError("{}: not valid JSON", where);
      ASSIGN_OR_RETURN(PromptItem item, ParseJsonlLine(j, where));
      if (!item.messages_json.empty() && api != Api::kOpenAiChat) {
        return InvalidArgumentError("{}: 'messages' needs --api openai-chat", where);
      }
      if (!item.ids.empty() && api != Api::kOpenAiCompletions) {
        return InvalidArgumentError("{}: 'prompt_ids' needs --api openai-completions", where);
      }
      src.file_items_.push_back(std::move(item));
    }
    if (src.file_items_.empty()) return InvalidArgumentError("{}: no requests in the file", spec.file);
    return src;
  }
  if (spec.shared_prefix > 0) {
    std::uniform_int_distribution<int32_t> id(spec.token_id_lo, spec.token_id_hi - 1);
    for (int i = 0; i < spec.shared_prefix; ++i) src.prefix_ids_.push_back(id(src.rng_));
    src.prefix_text_ = SyntheticText(spec.shared_prefix, src.rng_);
  }
  return src;
}

std::string PromptSource::SyntheticText(int n, std::mt19937_64& rng) {
  std::string s;
  std::uniform_int_distribution<int> pick(0, kNumWords - 1);
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

PromptItem PromptSource::Next() {
  if (!file_items_.empty()) {
    PromptItem item = file_items_[next_file_item_];
    next_file_item_ = (next_file_item_ + 1) % file_items_.size();
    if (item.max_tokens == 0) item.max_tokens = spec_.output.Sample(rng_);
    return item;
  }
  PromptItem item;
  int n = std::max(spec_.input.Sample(rng_), spec_.shared_prefix);
  item.max_tokens = spec_.output.Sample(rng_);
  item.input_tokens = n;
  int rest = n - spec_.shared_prefix;
  if (use_ids_) {
    item.ids = prefix_ids_;
    std::uniform_int_distribution<int32_t> id(spec_.token_id_lo, spec_.token_id_hi - 1);
    for (int i = 0; i < rest; ++i) item.ids.push_back(id(rng_));
  } else {
    item.text = prefix_text_;
    if (rest > 0) {
      if (!item.text.empty()) item.text += ' ';
      item.text += SyntheticText(rest, rng_);
    }
  }
  return item;
}

}  // namespace stoke::bench
