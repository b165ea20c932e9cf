// libFuzzer target: arbitrary request bodies through both OpenAI request parsers, and the parsed requests
// through every response serialiser. Invariants (a violation traps): no crash; a failure is InvalidArgument
// with a message; a parsed request's knobs are inside their documented ranges; serialised JSON re-parses.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "net/openai/openai_codec.h"

namespace {

using namespace stoke;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CheckParsed(const StatusOr<OpenAiRequest>& r) {
  if (!r.ok()) {
    Check(r.status().code() == StatusCode::kInvalidArgument && !r.status().message().empty());
    return;
  }
  const SamplingParams& s = r->sampling;
  Check(s.temperature >= 0 && s.temperature <= 2);
  Check(s.top_p > 0 && s.top_p <= 1);
  Check(s.top_k >= 0);
  Check(s.logprobs >= -1 && s.logprobs <= 20);
  Check(!r->max_tokens || *r->max_tokens >= 1);
  Check(s.min_tokens >= 0 && (!r->max_tokens || s.min_tokens <= *r->max_tokens));
  for (const auto& stop : s.stop) Check(!stop.empty());
  Check(r->kind == ApiKind::kChat ? !r->messages.empty()
                                  : (r->prompt_is_ids ? !r->prompt_ids.empty() : true));
  Check(!r->include_usage || r->stream);

  // Echo the parsed text through the serialisers: they must always produce valid JSON, even when the text
  // (a prompt here) is not valid UTF-8.
  const std::string& text = r->kind == ApiKind::kChat ? r->messages[0].content : r->prompt_text;
  ResponseHeader h{.id = "x", .created = 1, .model = r->model};
  std::vector<TokenLogprobText> lps = {{.token = text, .logprob = -1.0f, .top = {{text, -1.0f}}}};
  UsageCounts u{.prompt_tokens = 1, .completion_tokens = 1};
  for (const std::string& j :
       {ChatCompletionJson(h, text, FinishReason::kStop, &lps, u),
        CompletionJson(h, text, FinishReason::kLength, &lps, u),
        ChatChunkJson(h, "assistant", text, &lps, FinishReason::kNone, true),
        CompletionChunkJson(h, text, &lps, 3, FinishReason::kNone, false), ErrorJson({.message = text})}) {
    Check(nlohmann::json::accept(j));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  std::string param;
  CheckParsed(ParseChatCompletionRequest(body, &param));
  CheckParsed(ParseCompletionRequest(body, &param));
  return 0;
}
