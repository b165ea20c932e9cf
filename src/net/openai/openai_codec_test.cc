#include "net/openai/openai_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace stoke {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kMsgs = R"("messages": [{"role": "user", "content": "hi"}])";

StatusOr<OpenAiRequest> Chat(const std::string& extra, std::string* param = nullptr) {
  return ParseChatCompletionRequest(std::string("{") + kMsgs + (extra.empty() ? "" : ", " + extra) + "}",
                                    param);
}

StatusOr<OpenAiRequest> Completion(const std::string& body, std::string* param = nullptr) {
  return ParseCompletionRequest(body, param);
}

TEST(OpenAiCodecTest, ChatDefaults) {
  auto r = Chat("");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, ApiKind::kChat);
  EXPECT_EQ(r->model, "");
  ASSERT_EQ(r->messages.size(), 1u);
  EXPECT_EQ(r->messages[0].role, "user");
  EXPECT_EQ(r->messages[0].content, "hi");
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_FLOAT_EQ(r->sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 1.0f);
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_FALSE(r->sampling.seed.has_value());
  EXPECT_EQ(r->sampling.logprobs, -1);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->include_usage);
}

TEST(OpenAiCodecTest, ChatEveryField) {
  auto r = Chat(R"("model": "m", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -3,
                   "stop": ["a", "bc"], "stream": true, "stream_options": {"include_usage": true},
                   "logprobs": true, "top_logprobs": 3, "n": 1, "ignore_eos": true, "min_tokens": 2,
                   "priority": 5, "presence_penalty": 0, "frequency_penalty": 0.0, "user": "u",
                   "response_format": {"type": "text"}, "stop_token_ids": [5, 6], "unknown_field": {"x": 1})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);
  EXPECT_EQ(r->sampling.top_k, 40);
  EXPECT_EQ(r->sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r->sampling.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r->sampling.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->sampling.logprobs, 3);
  EXPECT_TRUE(r->sampling.ignore_eos);
  EXPECT_EQ(r->sampling.min_tokens, 2);
  EXPECT_EQ(r->priority, 5);
}

TEST(OpenAiCodecTest, ChatMessagesForms) {
  auto r = ParseChatCompletionRequest(R"({"messages": [
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "q", "name": "bob"}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "a\nb");
  EXPECT_EQ(r->messages[2].content, "");
}

TEST(OpenAiCodecTest, MaxCompletionTokensWins) {
  auto r = Chat(R"("max_tokens": 5, "max_completion_tokens": 9)");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_tokens, 9);
  EXPECT_EQ(Chat(R"("top_logprobs": null)")->sampling.logprobs, -1);  // null == absent
  EXPECT_EQ(Chat(R"("logprobs": true)")->sampling.logprobs, 0);
  EXPECT_EQ(Chat(R"("top_k": -1)")->sampling.top_k, 0);
  EXPECT_EQ(Chat(R"("stop": "x")")->sampling.stop, (std::vector<std::string>{"x"}));
}

struct BadCase {
  std::string body;  // fields added to a valid chat request
  std::string param;
  std::string message;
};

TEST(OpenAiCodecTest, ChatBadFieldsNameTheField) {
  const std::vector<BadCase> cases = {
      {R"("model": 5)", "model", "'model' must be a string, got number"},
      {R"("model": "")", "model", "must not be empty"},
      {R"("max_tokens": "10")", "max_tokens", "'max_tokens' must be an integer, got string"},
      {R"("max_tokens": 0)", "max_tokens", "must be in [1,"},
      {R"("max_tokens": 1.5)", "max_tokens", "must be an integer"},
      {R"("max_tokens": 99999999999999999999)", "max_tokens", "must be an integer"},
      {R"("max_completion_tokens": -1)", "max_completion_tokens", "must be in"},
      {R"("temperature": "hot")", "temperature", "'temperature' must be a number, got string"},
      {R"("temperature": 2.5)", "temperature", "must be in [0, 2]"},
      {R"("temperature": -0.1)", "temperature", "must be in"},
      {R"("top_p": 0)", "top_p", "must be in (0, 1]"},
      {R"("top_p": 1.1)", "top_p", "must be in"},
      {R"("top_k": 1.5)", "top_k", "must be an integer"},
      {R"("top_k": -2)", "top_k", "must be in"},
      {R"("seed": "x")", "seed", "must be an integer"},
      {R"("stop": 5)", "stop", "'stop' must be a string or a list of strings, got number"},
      {R"("stop": ["a", 1])", "stop", "must be a string or a list of strings"},
      {R"("stop": [""])", "stop", "must not be empty"},
      {R"("stream": "yes")", "stream", "'stream' must be a boolean, got string"},
      {R"("stream_options": {"include_usage": true})", "stream_options",
       "only allowed when 'stream' is true"},
      {R"("stream": true, "stream_options": 3)", "stream_options", "must be an object"},
      {R"("stream": true, "stream_options": {"include_usage": 1})", "stream_options.include_usage",
       "must be a boolean"},
      {R"("logprobs": 1)", "logprobs", "'logprobs' must be a boolean, got number"},
      {R"("top_logprobs": 2)", "top_logprobs", "requires 'logprobs': true"},
      {R"("logprobs": true, "top_logprobs": 21)", "top_logprobs", "must be in [0, 20]"},
      {R"("n": 2)", "n", "only n=1 is supported"},
      {R"("n": "1")", "n", "must be an integer"},
      {R"("ignore_eos": 1)", "ignore_eos", "must be a boolean"},
      {R"("min_tokens": -1)", "min_tokens", "must be in"},
      {R"("max_tokens": 3, "min_tokens": 4)", "min_tokens", "must not exceed 'max_tokens'"},
      {R"("priority": "high")", "priority", "must be an integer"},
      {R"("presence_penalty": 0.5)", "presence_penalty", "not supported"},
      {R"("frequency_penalty": 3)", "frequency_penalty", "must be in"},
      {R"("logit_bias": {"5": 1})", "logit_bias", "not supported"},
      {R"("tools": [{"type": "function"}])", "tools", "not supported"},
      {R"("tool_choice": "auto")", "tool_choice", "not supported"},
      {R"("response_format": {"type": "json_object"})", "response_format", "only response_format"},
      {R"("stop_token_ids": [-1])", "stop_token_ids", "non-negative"},
      {R"("user": 3)", "user", "must be a string"},
  };
  for (const auto& c : cases) {
    std::string param;
    auto r = Chat(c.body, &param);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(param, c.param) << c.body;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.body;
  }
}

TEST(OpenAiCodecTest, ChatBadMessages) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "'messages' is required"},
      {R"({"messages": "hi"})", "'messages' must be a list of messages, got string"},
      {R"({"messages": []})", "must not be empty"},
      {R"({"messages": [3]})", "messages[0] must be an object"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role must be a string"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "role 'tool' is not supported"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})",
       "content must be a string or a list of content parts"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "only {\"type\": \"text\""},
      {R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]})",
       "tool_calls is not supported"},
  };
  for (const auto& [body, message] : cases) {
    std::string param;
    auto r = ParseChatCompletionRequest(body, &param);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(param, "messages") << body;
    EXPECT_THAT(r.status().message(), HasSubstr(message)) << body;
  }
}

TEST(OpenAiCodecTest, InvalidJsonAndNonObjects) {
  auto r = ParseChatCompletionRequest("{\"messages\": [");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseChatCompletionRequest("[1]").status().message(),
              HasSubstr("must be a JSON object, got array"));
  EXPECT_THAT(ParseChatCompletionRequest("").status().message(), HasSubstr("not valid JSON"));
  // A number beyond a double's range is an out_of_range error inside the JSON library, not a crash.
  EXPECT_THAT(ParseCompletionRequest(R"({"prompt": 1e999})").status().message(), HasSubstr("not valid JSON"));
  std::string deep(100, '[');
  EXPECT_THAT(ParseCompletionRequest("{\"prompt\": " + deep).status().message(), HasSubstr("deeper than"));
  // Brackets inside strings don't count as nesting.
  auto ok = ParseCompletionRequest(R"({"prompt": ")" + deep + R"("})");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->prompt_text, deep);
}

TEST(OpenAiCodecTest, CompletionPrompts) {
  auto r = Completion(R"({"prompt": "hello", "max_tokens": 4, "logprobs": 2, "echo": false})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, ApiKind::kCompletion);
  EXPECT_EQ(r->prompt_text, "hello");
  EXPECT_FALSE(r->prompt_is_ids);
  EXPECT_EQ(r->sampling.logprobs, 2);
  EXPECT_EQ(r->max_tokens, 4);

  r = Completion(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->prompt_is_ids);
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  r = Completion(R"({"prompt": [[4, 5]]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{4, 5}));
  r = Completion(R"({"prompt": ["only one"]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_text, "only one");
  EXPECT_EQ(Completion(R"({"prompt": "x"})")->sampling.logprobs, -1);
}

TEST(OpenAiCodecTest, CompletionBadPrompts) {
  const std::vector<BadCase> cases = {
      {R"({})", "prompt", "'prompt' is required"},
      {R"({"prompt": 5})", "prompt", "must be a string, a list of token ids"},
      {R"({"prompt": []})", "prompt", "must not be empty"},
      {R"({"prompt": ["a", "b"]})", "prompt", "a batch of 2 prompts is not supported"},
      {R"({"prompt": [[1], [2]]})", "prompt", "a batch of 2 prompts"},
      {R"({"prompt": [1, "a"]})", "prompt", "non-negative integers"},
      {R"({"prompt": [1, -1]})", "prompt", "non-negative integers"},
      {R"({"prompt": [[]]})", "prompt", "must not be empty"},
      {R"({"prompt": [{}]})", "prompt", "must be a string, a list of token ids"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs", "must be an integer"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs", "must be in [0, 20]"},
      {R"({"prompt": "x", "echo": true})", "echo", "not supported"},
      {R"({"prompt": "x", "suffix": "y"})", "suffix", "not supported"},
      {R"({"prompt": "x", "best_of": 2})", "best_of", "only best_of=1"},
      {R"({"prompt": "x", "max_tokens": null, "n": 3})", "n", "only n=1"},
  };
  for (const auto& c : cases) {
    std::string param;
    auto r = Completion(c.body, &param);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(param, c.param) << c.body;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.body;
  }
}

TEST(OpenAiCodecTest, ErrorShapeAndStatusMapping) {
  json e = json::parse(ErrorJson({.status = 400, .message = "bad \"x\"", .param = "temperature"}));
  EXPECT_EQ(e["error"]["message"], "bad \"x\"");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "temperature");
  EXPECT_TRUE(e["error"]["code"].is_null());
  e = json::parse(ErrorJson({.status = 503, .message = "full", .code = "queue_full"}));
  EXPECT_EQ(e["error"]["type"], "server_error");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_EQ(e["error"]["code"], "queue_full");
  EXPECT_EQ(HttpStatusFromCode(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFromCode(StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFromCode(StatusCode::kResourceExhausted), 503);
  EXPECT_EQ(HttpStatusFromCode(StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFromCode(StatusCode::kInternal), 500);
  ApiError a = ApiErrorFromStatus(InvalidArgumentError("too long"), "prompt");
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(a.param, "prompt");
  e = json::parse(OpenAiErrorBody(413, "too big"));
  EXPECT_EQ(e["error"]["code"], "request_too_large");
}

const ResponseHeader kHeader{.id = "chatcmpl-1", .created = 1700000000, .model = "smol"};

TEST(OpenAiCodecTest, ChatCompletionShape) {
  std::vector<TokenLogprobText> lps = {
      {.token = "Hi", .logprob = -0.5f, .top = {{"Hi", -0.5f}, {"Yo", -1.5f}}},
      {.token = "\xe2\x82", .logprob = -1e30f * 1e30f, .top = {}}};
  json j = json::parse(ChatCompletionJson(kHeader, "Hi there", FinishReason::kStop, &lps,
                                          {.prompt_tokens = 10, .completion_tokens = 2, .cached_tokens = 8}));
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hi there");
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_EQ(c["logprobs"]["content"][0]["token"], "Hi");
  EXPECT_DOUBLE_EQ(c["logprobs"]["content"][0]["logprob"].get<double>(), -0.5);
  EXPECT_EQ(c["logprobs"]["content"][0]["bytes"], json::array({72, 105}));
  EXPECT_EQ(c["logprobs"]["content"][0]["top_logprobs"][1]["token"], "Yo");
  // A partial UTF-8 token: bytes are exact, the string is made valid; -inf becomes a finite floor.
  EXPECT_EQ(c["logprobs"]["content"][1]["bytes"], json::array({0xe2, 0x82}));
  EXPECT_DOUBLE_EQ(c["logprobs"]["content"][1]["logprob"].get<double>(), -9999.0);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  // Without logprobs: null.
  j = json::parse(ChatCompletionJson(kHeader, "x", FinishReason::kLength, nullptr, {}));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiCodecTest, CompletionShape) {
  std::vector<TokenLogprobText> lps = {
      {.token = "a", .logprob = -0.1f, .top = {{"a", -0.1f}, {"b", -2.f}}},
      {.token = "bc", .logprob = -0.2f, .top = {{"bc", -0.2f}, {"d", -3.f}}}};
  json j =
      json::parse(CompletionJson({.id = "cmpl-1", .created = 5, .model = "m"}, "abc", FinishReason::kLength,
                                 &lps, {.prompt_tokens = 3, .completion_tokens = 2}));
  EXPECT_EQ(j["object"], "text_completion");
  const json& c = j["choices"][0];
  EXPECT_EQ(c["text"], "abc");
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["tokens"], json::array({"a", "bc"}));
  EXPECT_EQ(c["logprobs"]["text_offset"], json::array({0, 1}));
  EXPECT_NEAR(c["logprobs"]["top_logprobs"][1]["d"].get<double>(), -3.0, 1e-6);
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
}

TEST(OpenAiCodecTest, StreamingChunks) {
  json j = json::parse(ChatChunkJson(kHeader, "assistant", "", nullptr, FinishReason::kNone, true));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(j.contains("usage") && j["usage"].is_null());
  j = json::parse(ChatChunkJson(kHeader, std::nullopt, "tok", nullptr, FinishReason::kNone, false));
  EXPECT_EQ(j["choices"][0]["delta"], json({{"content", "tok"}}));
  EXPECT_FALSE(j.contains("usage"));
  j = json::parse(ChatChunkJson(kHeader, std::nullopt, std::nullopt, nullptr, FinishReason::kStop, false));
  EXPECT_EQ(j["choices"][0]["delta"], json::object());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  j = json::parse(UsageChunkJson(kHeader, ApiKind::kChat, {.prompt_tokens = 4, .completion_tokens = 1}));
  EXPECT_EQ(j["choices"], json::array());
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  std::vector<TokenLogprobText> lps = {{.token = "x", .logprob = -1.f}};
  j = json::parse(CompletionChunkJson(kHeader, "x", &lps, 7, FinishReason::kNone, false));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "x");
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({7}));
  EXPECT_EQ(SseData("{}"), "data: {}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(OpenAiCodecTest, ModelList) {
  json j = json::parse(ModelListJson("smol", 42, 8192));
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "smol");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 8192);
}

TEST(OpenAiCodecTest, ModelListExtraFields) {
  json j = json::parse(ModelListJson(
      {{.id = "smol", .max_model_len = 8192, .extra_fields = R"({"precision": {"kv_cache_dtype": "int8"}})"},
       {.id = "minilm"}},
      42));
  EXPECT_EQ(j["data"][0]["precision"]["kv_cache_dtype"], "int8");
  EXPECT_EQ(j["data"][0]["id"], "smol");
  EXPECT_FALSE(j["data"][1].contains("precision"));
  j = json::parse(ModelListJson({{.id = "smol", .extra_fields = "not json"}}, 42));  // ignored, never broken
  EXPECT_FALSE(j["data"][0].contains("precision"));
}

}  // namespace
}  // namespace stoke
