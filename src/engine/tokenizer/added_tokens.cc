#include "engine/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

namespace stoke::tok {

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty() || t.id < 0; });
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

namespace {
bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
}  // namespace

void AddedTokenMatcher::Split(std::string_view text, bool parse_special, std::vector<Segment>* out) const {
  size_t text_start = 0;  // start of the pending ordinary text
  size_t i = 0;
  while (i < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<uint8_t>(text[i])];
    const AddedToken* hit = nullptr;
    for (uint32_t idx : bucket) {
      const AddedToken& t = tokens_[idx];
      if (t.special && !parse_special) continue;
      if (t.content.size() <= text.size() - i &&
          std::memcmp(text.data() + i, t.content.data(), t.content.size()) == 0) {
        hit = &t;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t text_end = i;
    if (hit->lstrip) {
      while (text_end > text_start && IsAsciiSpace(text[text_end - 1])) --text_end;
    }
    if (text_end > text_start) out->push_back({text.substr(text_start, text_end - text_start), -1});
    out->push_back({std::string_view(), hit->id});
    i += hit->content.size();
    if (hit->rstrip) {
      while (i < text.size() && IsAsciiSpace(text[i])) ++i;
    }
    text_start = i;
  }
  if (text_start < text.size()) out->push_back({text.substr(text_start), -1});
}

namespace {

Status AppendWrapJson(const nlohmann::json& j, const std::function<int32_t(const std::string&)>& lookup,
                      SpecialWrap* wrap) {
  if (j.is_null()) return OkStatus();
  const std::string type = j.value("type", "");
  if (type == "ByteLevel") return OkStatus();  // offsets only
  if (type == "Sequence") {
    for (const auto& p : j.value("processors", nlohmann::json::array()))
      RETURN_IF_ERROR(AppendWrapJson(p, lookup, wrap));
    return OkStatus();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]
    const auto& cls = j.at("cls");
    const auto& sep = j.at("sep");
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2) {
      return InvalidArgumentError("{} needs cls/sep as [token, id]", type);
    }
    wrap->prefix.push_back(cls[1].get<int32_t>());
    wrap->suffix.insert(wrap->suffix.begin(), sep[1].get<int32_t>());
    return OkStatus();
  }
  if (type == "TemplateProcessing") {
    const auto& single = j.value("single", nlohmann::json::array());
    const auto& specials = j.value("special_tokens", nlohmann::json::object());
    bool seen_seq = false;
    for (const auto& piece : single) {
      if (piece.contains("Sequence")) {
        seen_seq = true;
        continue;
      }
      if (!piece.contains("SpecialToken"))
        return InvalidArgumentError("TemplateProcessing piece {}", piece.dump());
      const std::string name = piece["SpecialToken"].value("id", "");
      std::vector<int32_t> ids;
      if (specials.contains(name) && specials[name].contains("ids")) {
        ids = specials[name]["ids"].get<std::vector<int32_t>>();
      } else {
        const int32_t id = lookup(name);
        if (id < 0) return InvalidArgumentError("TemplateProcessing names unknown token '{}'", name);
        ids.push_back(id);
      }
      auto& dst = seen_seq ? wrap->suffix : wrap->prefix;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
    return OkStatus();
  }
  return UnimplementedError("post_processor type '{}'", type);
}

}  // namespace

StatusOr<SpecialWrap> SpecialWrapFromJson(const nlohmann::json& j,
                                          const std::function<int32_t(const std::string&)>& lookup) {
  SpecialWrap wrap;
  try {
    RETURN_IF_ERROR(AppendWrapJson(j, lookup, &wrap));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("post_processor: {}", e.what());
  }
  return wrap;
}

std::vector<int32_t> WrapAndTruncate(const SpecialWrap& wrap, bool add_special, std::vector<int32_t> body,
                                     int max_length) {
  const size_t extra = add_special ? wrap.prefix.size() + wrap.suffix.size() : 0;
  if (max_length > 0) {
    const size_t room = static_cast<size_t>(max_length) > extra ? max_length - extra : 0;
    if (body.size() > room) body.resize(room);
  }
  if (!add_special) return body;
  std::vector<int32_t> out;
  out.reserve(body.size() + extra);
  out.insert(out.end(), wrap.prefix.begin(), wrap.prefix.end());
  out.insert(out.end(), body.begin(), body.end());
  out.insert(out.end(), wrap.suffix.begin(), wrap.suffix.end());
  return out;
}

}  // namespace stoke::tok
