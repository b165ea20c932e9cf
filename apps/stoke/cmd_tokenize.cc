// stoke tokenize: text -> token ids with a model's own tokenizer (and chat template), as the server does.
//
//   stoke tokenize --model M TEXT                  ids of TEXT as a JSON array (with BOS/[CLS].. if the model
//   adds them) stoke tokenize --model M --chat TEXT           TEXT as one user message, rendered by the chat
//   template; the
//                                                  markers in the template output become control tokens
//   stoke tokenize --model M --no-special TEXT     no BOS/[CLS]/[SEP]
//   stoke tokenize --model M --file F --jsonl      one JSON array per line of F (the line without its '\n')
//   stoke tokenize --model M --file F --jsonl --input-json   each line of F is a JSON string (texts with
//   newlines) stoke tokenize --model M --decode '[1, 2, 3]'  ids -> text
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
  auto encode = [&](const std::string& text) -> StatusOr<std::vector<int32_t>> {
    if (!tmpl) return t.Encode(text, enc);
    ASSIGN_OR_RETURN(std::string prompt, tmpl->Apply({{"user", text}}));
    ASSIGN_OR_RETURN(auto ids, t.Encode(prompt, enc));
    return DropDoubleBos(t, std::move(ids));
  };

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
      cmd->add_flag("--decode", o->decode, "decode the JSON id array TEXT instead");
      cmd->add_flag("--keep-special", o->keep_special, "with --decode: print special tokens");
      return [o]() { return Run(*o); };
    });

}  // namespace
}  // namespace stoke
