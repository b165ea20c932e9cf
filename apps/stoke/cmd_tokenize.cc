// stoke tokenize: text -> token ids with a model's own tokenizer (and chat template), as the server does.
//
//   stoke tokenize --model M TEXT              ids as a JSON array (with BOS or [CLS]..[SEP] if added)
//   stoke tokenize --model M --no-special TEXT without BOS / [CLS] / [SEP]
//   stoke tokenize --model M --chat TEXT       TEXT as one user message rendered by the chat template; the
//                                              template's markers become control tokens
//     --chat --messages '[{"role": "system", "content": "..."}, ...]'  a whole conversation
//     --chat --print-prompt                    print the rendered prompt instead of ids
//   stoke tokenize --model M --file F --jsonl  one JSON array per line of F (the line without its '\n');
//                                              with --input-json each line is a JSON string (may hold '\n')
//   stoke tokenize --model M --decode '[1, 2]' ids -> text
//
// Data goes to stdout, errors to stderr; exit 1 on errors, 2 on usage errors.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "base/status.h"
#include "engine/loader/model_registry.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool chat = false;
  bool no_special = false;
  bool parse_special = false;
  bool jsonl = false;
  bool input_json = false;
  bool decode = false;
  bool keep_special = false;
  bool messages = false;
  bool print_prompt = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "stoke tokenize: %s\n", s.ToString().c_str());
  return 1;
}

void AppendIds(const std::vector<int32_t>& ids, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{}", ids[i]);
  }
  out->append("]\n");
}

// The chat template prints BOS itself (Llama-3); don't add a second one (the double-BOS trap).
std::vector<int32_t> DropDoubleBos(const Tokenizer& tok, std::vector<int32_t> ids) {
  if (ids.size() >= 2 && tok.bos_id() >= 0 && ids[0] == tok.bos_id() && ids[1] == tok.bos_id()) {
    ids.erase(ids.begin());
  }
  return ids;
}

int Run(const TokenizeOptions& o) {
  if (o.text.empty() && o.file.empty() && !o.decode) {
    std::fprintf(stderr, "stoke tokenize: give TEXT or --file (see --help)\n");
    return 2;
  }
  if (o.jsonl && o.file.empty()) {
    std::fprintf(stderr, "stoke tokenize: --jsonl needs --file\n");
    return 2;
  }
  auto path = ResolveModel(o.model);
  if (!path.ok()) return Fail(path.status());
  auto tok = LoadTokenizer(*path);
  if (!tok.ok()) return Fail(tok.status());
  const Tokenizer& t = **tok;

  if (o.decode) {
    auto j = nlohmann::json::parse(o.text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      std::fprintf(stderr, "stoke tokenize: --decode wants a JSON array of ids, e.g. '[1, 2, 3]'\n");
      return 2;
    }
    std::vector<int32_t> ids;
    for (const auto& e : j) {
      if (!e.is_number_integer())
        return Fail(InvalidArgumentError("--decode: {} is not an integer id", e.dump()));
      ids.push_back(e.get<int32_t>());
    }
    std::string text = t.Decode(ids, /*skip_special=*/!o.keep_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }

  EncodeOptions enc;
  enc.add_special = !o.no_special;
  enc.parse_special = o.parse_special;
  std::optional<ChatTemplate> tmpl;
  if (o.chat) {
    auto ct = ChatTemplate::FromModel(*path);
    if (!ct.ok()) return Fail(ct.status());
    tmpl = std::move(*ct);
    enc.parse_special = true;  // the markers are the template's, not the user's
  }
  if ((o.messages || o.print_prompt) && !tmpl) {
    std::fprintf(stderr, "stoke tokenize: --messages and --print-prompt need --chat\n");
    return 2;
  }
  // TEXT -> the conversation to render: one user message, or a JSON list of {role, content} with --messages.
  auto conversation = [&](const std::string& text) -> StatusOr<std::vector<ChatMessage>> {
    if (!o.messages) return std::vector<ChatMessage>{{"user", text}};
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array())
      return InvalidArgumentError("--messages wants a JSON list of messages");
    std::vector<ChatMessage> msgs;
    for (const auto& m : j) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string()) {
        return InvalidArgumentError("--messages: {} is not {{\"role\": str, \"content\": str}}", m.dump());
      }
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return msgs;
  };
  auto encode = [&](const std::string& text) -> StatusOr<std::vector<int32_t>> {
    if (!tmpl) return t.Encode(text, enc);
    ASSIGN_OR_RETURN(auto msgs, conversation(text));
    ASSIGN_OR_RETURN(std::string prompt, tmpl->Apply(msgs));
    ASSIGN_OR_RETURN(auto ids, t.Encode(prompt, enc));
    return DropDoubleBos(t, std::move(ids));
  };
  if (o.print_prompt) {
    auto msgs = conversation(o.text);
    if (!msgs.ok()) return Fail(msgs.status());
    auto prompt = tmpl->Apply(*msgs);
    if (!prompt.ok()) return Fail(prompt.status());
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    return 0;
  }

  std::string out;
  if (!o.jsonl) {
    std::string text = o.text;
    if (!o.file.empty()) {
      auto content = ReadFileToString(o.file);
      if (!content.ok()) return Fail(content.status());
      text = std::move(*content);
    }
    auto ids = encode(text);
    if (!ids.ok()) return Fail(ids.status());
    AppendIds(*ids, &out);
  } else {
    auto content = ReadFileToString(o.file);
    if (!content.ok()) return Fail(content.status());
    const std::string& s = *content;
    size_t start = 0, line_no = 0;
    while (start < s.size()) {
      size_t end = s.find('\n', start);
      if (end == std::string::npos) end = s.size();
      ++line_no;
      std::string line = s.substr(start, end - start);
      start = end + 1;
      if (o.input_json) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_string()) {
          return Fail(InvalidArgumentError("{}:{}: not a JSON string", o.file, line_no));
        }
        line = j.get<std::string>();
      }
      auto ids = encode(line);
      if (!ids.ok()) return Fail(ids.status().WithContext(fmt::format("{}:{}", o.file, line_no)));
      AppendIds(*ids, &out);
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

CommandRegistrar kTokenize(
    "tokenize", "Print the token ids of a text (or decode ids) with a model's tokenizer", [](CLI::App* cmd) {
      auto o = std::make_shared<TokenizeOptions>();
      cmd->add_option("--model", o->model, "alias, GGUF file or HF folder")->required();
      cmd->add_option("text", o->text, "text to tokenize (with --decode: a JSON id array)");
      cmd->add_option("--file", o->file, "read the text from a file");
      cmd->add_flag("--chat", o->chat, "wrap TEXT as one user message in the chat template");
      cmd->add_flag("--no-special", o->no_special, "don't add BOS / [CLS] ... [SEP]");
      cmd->add_flag("--parse-special", o->parse_special,
                    "match special-token strings in the text (off: they stay text)");
      cmd->add_flag("--jsonl", o->jsonl, "with --file: one JSON array per input line");
      cmd->add_flag("--input-json", o->input_json, "with --jsonl: each input line is a JSON string");
      cmd->add_flag("--messages", o->messages,
                    "with --chat: TEXT (or each line) is a JSON list of {role, content}");
      cmd->add_flag("--print-prompt", o->print_prompt,
                    "with --chat: print the rendered prompt instead of ids");
      cmd->add_flag("--decode", o->decode, "decode the JSON id array TEXT instead");
      cmd->add_flag("--keep-special", o->keep_special, "with --decode: print special tokens");
      return [o](const Backends&) { return Run(*o); };
    });

}  // namespace
}  // namespace stoke
