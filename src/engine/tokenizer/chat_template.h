// Chat templates rendered natively (no Jinja engine): the template string a model ships (GGUF
// tokenizer.chat_template or tokenizer_config.json "chat_template") is recognised by its markers and rendered
// by C++ that reproduces its output byte for byte. Unknown templates are refused rather than guessed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kChatMl, kLlama3 };

  // Reads the model's template; a model without one or with an unknown one -> error naming the model/snippet.
  static StatusOr<ChatTemplate> FromModel(const std::string& model_path);
  // Recognises a template string (exposed for tests and for tokenizer_config.json sources). `bos_token` is
  // the text the template's {{ bos_token }} prints (Llama-3: "<|begin_of_text|>").
  static StatusOr<ChatTemplate> FromString(const std::string& template_text,
                                           const std::string& bos_token = "<|begin_of_text|>");

  StatusOr<std::string> Apply(const std::vector<ChatMessage>& msgs, bool add_generation_prompt = true) const;
  std::string_view name() const;  // "chatml", "llama3"

  // Llama-3.1-style templates print "Today Date: ...". Default: the template's own default ("26 Jul 2024"),
  // or today's date for templates that call strftime_now (3.2); pin it for reproducible prompts and prefix
  // caching.
  void set_date_string(std::string date) { date_string_ = std::move(date); }
  const std::string& date_string() const { return date_string_; }
  Kind kind() const { return kind_; }
  // ChatML: the system message injected when the first message isn't "system" ("" = none).
  const std::string& default_system() const { return default_system_; }

 private:
  static StatusOr<ChatTemplate> FromModelUnchecked(const std::string& model_path);

  Kind kind_ = Kind::kChatMl;
  std::string default_system_;
  bool llama31_knowledge_block_ = false;  // "Cutting Knowledge Date" block in the system header
  std::string bos_token_;                 // printed first by Llama-3 templates
  std::string date_string_ = "26 Jul 2024";
};

}  // namespace stoke
