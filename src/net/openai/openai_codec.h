// OpenAI-compatible JSON <-> plain types: request parsing with validation of every supported field (and a
// clear 400 for the ones we don't support), and the exact response, chunk and error shapes of
// /v1/chat/completions and /v1/completions. No I/O, no engine: the service (openai_service.h) wires these to
// the tokenizer and the LlmEngine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/sampling.h"
#include "base/status.h"
#include "engine/tokenizer/chat_template.h"

namespace stoke {

enum class ApiKind : uint8_t { kChat, kCompletion };

struct OpenAiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;                  // "" when omitted (the served model is used)
  std::vector<ChatMessage> messages;  // chat; "developer" is mapped to "system"
  std::string prompt_text;            // completions, prompt given as a string
  std::vector<int32_t> prompt_ids;    // completions, prompt given as token ids
  bool prompt_is_ids = false;
  // max_tokens / max_completion_tokens; unset: chat -> the rest of the context, completions -> 16 (OpenAI's
  // and vLLM's defaults).
  std::optional<int> max_tokens;
  // temperature, top_p, top_k, seed, stop, min_tokens, ignore_eos, logprobs (-1 none, else top-k count).
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int priority = 0;            // extension: higher runs first
};

// Parse + validate. On failure: InvalidArgument naming the field, and *error_param (if given) set to it.
StatusOr<OpenAiRequest> ParseChatCompletionRequest(std::string_view body, std::string* error_param = nullptr);
StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view body, std::string* error_param = nullptr);

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type;   // "" -> from status: 4xx "invalid_request_error", 5xx "server_error"
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};
std::string ErrorJson(const ApiError& e);
// Status code -> HTTP status (InvalidArgument 400, NotFound 404, ResourceExhausted/Unavailable 503, ...).
int HttpStatusFromCode(StatusCode code);
ApiError ApiErrorFromStatus(const Status& s, std::string param = {});
// For HttpServerOptions::error_body (the server's own 404/405/413/400 responses).
std::string OpenAiErrorBody(int status, std::string_view message);

struct ResponseHeader {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

struct UsageCounts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

// One generated token's log-probability, with token text instead of ids (the service looks them up).
struct TokenLogprobText {
  std::string token;  // raw bytes (may be part of a UTF-8 character)
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // best first
};

// finish: kStop -> "stop", kLength -> "length"; kNone -> null.
std::string ChatCompletionJson(const ResponseHeader& h, std::string_view text, FinishReason finish,
                               const std::vector<TokenLogprobText>* logprobs, const UsageCounts& usage);
std::string CompletionJson(const ResponseHeader& h, std::string_view text, FinishReason finish,
                           const std::vector<TokenLogprobText>* logprobs, const UsageCounts& usage);

// Streaming chunks (the JSON only; wrap with SseData). usage_null: add "usage": null (include_usage mode).
// Chat: role set on the first chunk ({"role":"assistant","content":""}); content deltas after; the last one
// with finish set and an empty delta.
std::string ChatChunkJson(const ResponseHeader& h, std::optional<std::string_view> role,
                          std::optional<std::string_view> content,
                          const std::vector<TokenLogprobText>* logprobs, FinishReason finish,
                          bool usage_null);
// text_offset: the offset of this chunk's first token in the completion text (logprobs.text_offset).
std::string CompletionChunkJson(const ResponseHeader& h, std::string_view text,
                                const std::vector<TokenLogprobText>* logprobs, size_t text_offset,
                                FinishReason finish, bool usage_null);
// The final usage chunk of include_usage: "choices": [] plus usage.
std::string UsageChunkJson(const ResponseHeader& h, ApiKind kind, const UsageCounts& usage);

std::string SseData(std::string_view json);  // "data: <json>\n\n"
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by",
// "max_model_len"}]}.
std::string ModelListJson(const std::string& model, int64_t created, int max_model_len);
// Several models; max_model_len 0 is left out (batched models, decoders not loaded).
struct ModelListEntry {
  std::string id;
  int max_model_len = 0;
};
std::string ModelListJson(const std::vector<ModelListEntry>& models, int64_t created);

}  // namespace stoke
