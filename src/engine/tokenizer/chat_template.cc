#include "engine/tokenizer/chat_template.h"

#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/file_util.h"
#include "engine/loader/gguf_reader.h"
#include "engine/tokenizer/unicode_util.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;

// A short, single-line excerpt of a template for error messages.
std::string Snippet(std::string_view t) {
  std::string s;
  for (char c : t.substr(0, 80)) s += c == '\n' ? std::string("\\n") : std::string(1, c);
  return t.size() > 80 ? s + "..." : s;
}

// Jinja's `trim` (Python str.strip()): Unicode whitespace at both ends.
std::string Trim(std::string_view s) {
  auto is_space = [](uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
  };
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t pos = begin;
    uint32_t cp;
    if (!tok::DecodeUtf8(s, &pos, &cp) || !is_space(cp)) break;
    begin = pos;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    uint32_t cp;
    if (!tok::DecodeUtf8(s, &pos, &cp) || pos != end || !is_space(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

// The ChatML default system message: a self-contained string literal '<|im_start|>system\n...<|im_end|>' in
// the template (SmolLM2, Qwen2.5). Returns the text between the newline and <|im_end|>, unescaped.
std::string FindDefaultSystem(const std::string& t) {
  const std::string_view kOpen = "<|im_start|>system";
  for (size_t at = t.find(kOpen); at != std::string::npos; at = t.find(kOpen, at + 1)) {
    if (at == 0) continue;
    const char quote = t[at - 1];
    if (quote != '\'' && quote != '"') continue;
    size_t i = at + kOpen.size();
    if (t.compare(i, 1, "\n") == 0) {
      i += 1;
    } else if (t.compare(i, 2, "\\n") == 0) {
      i += 2;
    } else {
      continue;
    }
    std::string text;
    bool ok = false;
    while (i < t.size()) {
      if (t.compare(i, 10, "<|im_end|>") == 0) {
        ok = true;
        break;
      }
      const char c = t[i];
      if (c == quote) break;  // the literal ends before <|im_end|>: content comes from a variable
      if (c == '\\' && i + 1 < t.size()) {
        const char e = t[i + 1];
        text += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        i += 2;
        continue;
      }
      text += c;
      ++i;
    }
    if (ok && !text.empty()) return text;
  }
  return "";
}

std::string TodayDate() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
  return buf;
}

// `set date_string = "26 Jul 2024"` in Llama-3.1 templates.
std::optional<std::string> TemplateDefaultDate(const std::string& t) {
  const size_t at = t.find("date_string = \"");
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + 15;
  const size_t end = t.find('"', begin);
  if (end == std::string::npos) return std::nullopt;
  return t.substr(begin, end - begin);
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::FromString(const std::string& t, const std::string& bos_token) {
  ChatTemplate ct;
  if (t.find("<|im_start|>") != std::string::npos && t.find("<|im_end|>") != std::string::npos) {
    ct.kind_ = Kind::kChatMl;
    ct.default_system_ = FindDefaultSystem(t);
    return ct;
  }
  if (t.find("<|start_header_id|>") != std::string::npos && t.find("<|eot_id|>") != std::string::npos) {
    ct.kind_ = Kind::kLlama3;
    ct.bos_token_ = bos_token;
    ct.llama31_knowledge_block_ = t.find("Cutting Knowledge Date") != std::string::npos;
    if (auto date = TemplateDefaultDate(t)) {
      ct.date_string_ = *date;
    } else if (t.find("strftime_now") != std::string::npos) {
      ct.date_string_ = TodayDate();
    }
    return ct;
  }
  return InvalidArgumentError("unrecognised chat template (known: ChatML, Llama-3): \"{}\"", Snippet(t));
}

StatusOr<ChatTemplate> ChatTemplate::FromModel(const std::string& model_path) {
  try {  // a JSON value of the wrong type in tokenizer_config.json is a user error, never an abort
    return FromModelUnchecked(model_path);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("{}: {}", model_path, e.what());
  }
}

StatusOr<ChatTemplate> ChatTemplate::FromModelUnchecked(const std::string& model_path) {
  std::error_code ec;
  const fs::path p(model_path);
  std::string text, bos = "<|begin_of_text|>";
  if (fs::is_directory(p, ec)) {
    // Newer repos keep the template in chat_template.jinja; older ones in tokenizer_config.json.
    if (fs::is_regular_file(p / "chat_template.jinja", ec)) {
      ASSIGN_OR_RETURN(text, ReadFileToString((p / "chat_template.jinja").string()));
    }
    if (fs::is_regular_file(p / "tokenizer_config.json", ec)) {
      ASSIGN_OR_RETURN(std::string raw, ReadFileToString((p / "tokenizer_config.json").string()));
      auto j = nlohmann::json::parse(raw, nullptr, false);
      if (j.is_discarded())
        return InvalidArgumentError("{}/tokenizer_config.json: not valid JSON", model_path);
      if (text.empty() && j.contains("chat_template")) {
        const auto& c = j["chat_template"];
        if (c.is_string()) text = c.get<std::string>();
        if (c.is_array()) {  // [{"name": "default", "template": "..."}, ...]
          for (const auto& e : c) {
            if (e.is_object() && e.value("name", "") == "default" && e.contains("template"))
              text = e.value("template", "");
          }
        }
      }
      if (j.contains("bos_token")) {
        const auto& b = j["bos_token"];
        if (b.is_string()) bos = b.get<std::string>();
        if (b.is_object() && b.contains("content") && b["content"].is_string())
          bos = b["content"].get<std::string>();
      }
    }
  } else {
    ASSIGN_OR_RETURN(auto gguf, GgufFile::Open(model_path));
    if (gguf->Has("tokenizer.chat_template")) {
      auto t = gguf->GetString("tokenizer.chat_template");
      if (!t.ok()) return t.status().WithContext(model_path);
      text = std::move(*t);
    }
    if (gguf->Has("tokenizer.ggml.bos_token_id") && gguf->Has("tokenizer.ggml.tokens")) {
      auto id = gguf->GetInt("tokenizer.ggml.bos_token_id");
      auto tokens = gguf->GetStringArray("tokenizer.ggml.tokens");
      if (id.ok() && tokens.ok() && *id >= 0 && *id < static_cast<int64_t>(tokens->size()))
        bos = (*tokens)[*id];
    }
  }
  if (text.empty()) {
    return FailedPreconditionError(
        "{}: the model has no chat template (tokenizer.chat_template / chat_template)", model_path);
  }
  auto ct = FromString(text, bos);
  if (!ct.ok()) return ct.status().WithContext(model_path);
  return ct;
}

std::string_view ChatTemplate::name() const {
  return kind_ == Kind::kChatMl ? "chatml" : "llama3";
}

StatusOr<std::string> ChatTemplate::Apply(const std::vector<ChatMessage>& msgs,
                                          bool add_generation_prompt) const {
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].role.empty()) return InvalidArgumentError("message {} has no role", i);
  }
  std::string out;
  if (kind_ == Kind::kChatMl) {
    if (!msgs.empty() && msgs[0].role != "system" && !default_system_.empty()) {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  // Llama-3.
  auto header = [](const std::string& role) {
    return "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
  };
  size_t first = 0;
  if (llama31_knowledge_block_) {
    std::string system;
    if (!msgs.empty() && msgs[0].role == "system") {
      system = Trim(msgs[0].content);
      first = 1;
    }
    out += bos_token_ + header("system") +
           "Cutting Knowledge Date: December 2023\nToday Date: " + date_string_ + "\n\n" + system +
           "<|eot_id|>";
  } else if (!msgs.empty()) {
    out += bos_token_;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    if (llama31_knowledge_block_ && (m.role == "tool" || m.role == "ipython")) {
      return UnimplementedError("Llama-3.1 tool messages (role '{}') are not supported", m.role);
    }
    out += header(m.role) + Trim(m.content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += header("assistant");
  return out;
}

}  // namespace stoke
