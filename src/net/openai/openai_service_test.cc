// The service's request path with fakes: a byte tokenizer, an engine that answers on its own thread, and a
// responder that records what would go on the wire.
#include "net/openai/openai_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <nlohmann/json.hpp>
#include <thread>

namespace stoke {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Token id = byte value; "<s>" = 256 is BOS (added for completions), 257 = EOS.
class ByteTokenizer final : public Tokenizer {
 public:
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions& opts) const override {
    std::vector<int32_t> ids;
    if (opts.add_special) ids.push_back(256);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids, bool) const override {
    std::string s;
    for (int32_t id : ids) s += TokenBytes(id);
    return s;
  }
  int vocab_size() const override { return 258; }
  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
};

// Answers each request on its own thread with the tokens of `reply_`, one event per token.
class FakeEngine final : public LlmEngine {
 public:
  ~FakeEngine() override {
    for (auto& t : threads_) t.join();
  }
  Status Submit(GenerationRequest req) override {
    std::lock_guard lock(mu_);
    if (reject_) return ResourceExhaustedError("waiting queue is full (1 requests)");
    last_ = req;
    if (hold_) {
      held_.push_back(std::move(req));
      return OkStatus();
    }
    threads_.emplace_back([this, req = std::move(req)]() mutable { Run(std::move(req)); });
    return OkStatus();
  }
  void Cancel(const std::string& id) override {
    std::lock_guard lock(mu_);
    cancelled_.push_back(id);
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->id == id) {
        GenerationEvent ev;
        ev.finish = FinishReason::kCancelled;
        ev.prompt_tokens = static_cast<int>(it->prompt_ids.size());
        it->on_event(std::move(ev));
        held_.erase(it);
        break;
      }
    }
  }
  int context_length() const override { return 64; }
  int max_sequence_tokens() const override { return kv_capacity_; }

  void Run(GenerationRequest req) {
    const int n = std::min<int>(req.sampling.max_tokens, static_cast<int>(reply_.size()));
    for (int i = 0; i < n; ++i) {
      GenerationEvent ev;
      ev.token_ids = {static_cast<unsigned char>(reply_[i])};
      ev.text = std::string(1, reply_[i]);
      if (req.sampling.logprobs >= 0)
        ev.logprobs.push_back({.token_id = reply_[i], .logprob = -0.25f, .top = {}});
      if (i + 1 == n) {
        ev.finish = n < static_cast<int>(reply_.size()) ? FinishReason::kLength : FinishReason::kStop;
        ev.prompt_tokens = static_cast<int>(req.prompt_ids.size());
        ev.completion_tokens = n;
        ev.cached_prompt_tokens = 2;
        ev.timings.recv = req.recv_time;
        ev.timings.submit = req.recv_time + 10;
        ev.timings.first_scheduled = req.recv_time + 20;
        ev.timings.first_token = req.recv_time + 30;
        ev.timings.inter_token = std::vector<Nanos>(n - 1, 1000);
      }
      req.on_event(std::move(ev));
    }
  }

  std::string reply_ = "Hello";
  bool reject_ = false;
  bool hold_ = false;
  int kv_capacity_ = 64;  // the KV cache, in tokens
  std::mutex mu_;
  GenerationRequest last_;
  std::vector<GenerationRequest> held_;
  std::vector<std::string> cancelled_;
  std::vector<std::thread> threads_;
};

// Records the response; Post runs inline under a lock (the strand's serialisation).
class FakeResponder final : public HttpResponder {
 public:
  void Send(HttpResponse r) override {
    Post([this, r] {
      response_ = r;
      Finish();
    });
  }
  void StartStream(int status, std::string content_type, HttpHeaders) override {
    Post([this, status, content_type] {
      response_.status = status;
      response_.content_type = content_type;
      streaming_ = true;
    });
  }
  void Write(std::string data) override {
    Post([this, data] { response_.body += data; });
  }
  void End() override {
    Post([this] { Finish(); });
  }
  void Post(std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    fn();
  }
  void OnDisconnect(std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    on_disconnect_ = std::move(fn);
  }
  void OnComplete(std::function<void(bool, Nanos)> fn) override {
    std::lock_guard lock(mu_);
    on_complete_ = std::move(fn);
  }
  bool disconnected() const override { return disconnected_; }

  void Disconnect() {
    std::lock_guard lock(mu_);
    disconnected_ = true;
    if (on_disconnect_) on_disconnect_();
    if (on_complete_) std::exchange(on_complete_, nullptr)(false, MonotonicNanos());
  }
  HttpResponse Wait() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return done_; });
    EXPECT_TRUE(done_);
    return response_;
  }

  bool streaming_ = false;

 private:
  void Finish() {
    done_ = true;
    if (on_complete_) std::exchange(on_complete_, nullptr)(true, MonotonicNanos());
    cv_.notify_all();
  }
  std::recursive_mutex mu_;
  std::condition_variable_any cv_;
  HttpResponse response_;
  bool done_ = false;
  std::atomic<bool> disconnected_{false};
  std::function<void()> on_disconnect_;
  std::function<void(bool, Nanos)> on_complete_;
};

class OpenAiServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metrics_ = std::move(ServerMetrics::Create("smol", 64).value());
    engine_ = std::make_shared<FakeEngine>();
    auto tmpl =
        ChatTemplate::FromString("{% for m in messages %}<|im_start|>{{ m.role }}<|im_end|>{% endfor %}", "");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
    auto handle = std::make_shared<DecoderHandle>();
    handle->engine = engine_;
    handle->tokenizer = std::make_shared<ByteTokenizer>();
    handle->chat_template = *tmpl;
    handle->metrics = metrics_.get();
    ASSERT_TRUE(
        repo_
            .Add({.name = "smol",
                  .kind = ModelKind::kDecoder,
                  .aliases = {"/models/smol.gguf"},
                  .load = [handle]() -> StatusOr<LoadedModel> { return LoadedModel{.decoder = handle}; }})
            .ok());
    // An encoder that is never loaded: its name is known, its kind is not a decoder's.
    BatcherConfig c;
    c.max_batch_size = 4;
    ASSERT_TRUE(repo_
                    .Add({.name = "minilm",
                          .kind = ModelKind::kEncoder,
                          .served = {{.name = "minilm", .config = c}},
                          .load = []() -> StatusOr<LoadedModel> { return UnavailableError("not here"); },
                          .load_at_start = false})
                    .ok());
    repo_.Start();
    repo_.WaitIdle();
    ASSERT_TRUE(repo_.ready());
    service_ = std::make_unique<OpenAiService>(OpenAiServiceOptions{.request_log = &log_}, &repo_);
  }

  HttpResponse Call(ApiKind kind, const std::string& body, std::shared_ptr<FakeResponder> r = nullptr,
                    std::map<std::string, std::string> headers = {}) {
    if (r == nullptr) r = std::make_shared<FakeResponder>();
    HttpRequest req;
    req.headers = std::move(headers);
    req.method = "POST";
    req.body = body;
    req.recv_time = MonotonicNanos();
    req.parsed_time = req.recv_time + 5;
    // Handlers run on the connection's strand: engine events posted meanwhile wait for it to return.
    r->Post([&] {
      if (kind == ApiKind::kChat) {
        service_->HandleChatCompletions(req, r);
      } else {
        service_->HandleCompletions(req, r);
      }
    });
    return r->Wait();
  }

  RequestLog log_{16};
  std::unique_ptr<ServerMetrics> metrics_;
  std::shared_ptr<FakeEngine> engine_;
  ModelRepository repo_{{}};
  std::unique_ptr<OpenAiService> service_;
};

TEST_F(OpenAiServiceTest, ChatNonStreaming) {
  HttpResponse res =
      Call(ApiKind::kChat, R"({"model": "smol", "messages": [{"role": "user", "content": "hi"}],
                                              "seed": 7, "temperature": 0})");
  ASSERT_EQ(res.status, 200) << res.body;
  json j = json::parse(res.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_THAT(j["id"].get<std::string>(), ::testing::StartsWith("chatcmpl-"));
  EXPECT_EQ(j["model"], "smol");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // ChatML: "<|im_start|>system..." default? No: this template has no default system; prompt = template
  // bytes.
  const std::string prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(prompt.size()));
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  // What the engine got: no BOS (the template holds the specials), the sampling knobs, the rest of the
  // context.
  std::lock_guard lock(engine_->mu_);
  EXPECT_EQ(engine_->last_.prompt_ids.size(), prompt.size());
  EXPECT_NE(engine_->last_.prompt_ids[0], 256);
  EXPECT_EQ(engine_->last_.sampling.seed, 7u);
  EXPECT_EQ(engine_->last_.sampling.temperature, 0.0f);
  EXPECT_EQ(engine_->last_.sampling.max_tokens, 64 - static_cast<int>(prompt.size()));
}

// A KV cache smaller than the context: a chat without max_tokens asks for the rest of the cache, not of the
// context (which the engine would refuse as past the cache).
TEST_F(OpenAiServiceTest, ChatDefaultMaxTokensIsBoundedByTheKvCache) {
  engine_->kv_capacity_ = 60;  // the prompt is 52 tokens (bytes)
  HttpResponse res = Call(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_EQ(res.status, 200) << res.body;
  const int prompt = json::parse(res.body)["usage"]["prompt_tokens"].get<int>();
  std::lock_guard lock(engine_->mu_);
  EXPECT_EQ(engine_->last_.sampling.max_tokens, 60 - prompt);
}

TEST_F(OpenAiServiceTest, ModelAliasAndOmittedModelAccepted) {
  EXPECT_EQ(Call(ApiKind::kCompletion, R"({"model": "/models/smol.gguf", "prompt": "x"})").status, 200);
  EXPECT_EQ(Call(ApiKind::kCompletion, R"({"prompt": "x"})").status, 200);
}

TEST_F(OpenAiServiceTest, CompletionStreamingWithUsage) {
  auto r = std::make_shared<FakeResponder>();
  HttpResponse res = Call(ApiKind::kCompletion,
                          R"({"prompt": "ab", "max_tokens": 3, "stream": true, "logprobs": 0,
                              "stream_options": {"include_usage": true}})",
                          r);
  EXPECT_TRUE(r->streaming_);
  EXPECT_EQ(res.content_type, "text/event-stream");
  // data: chunks "H", "e", "l", then the finish chunk, the usage chunk, [DONE].
  std::vector<json> chunks;
  size_t pos = 0;
  std::string body = res.body;
  while ((pos = body.find("data: ")) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    body = body.substr(end + 2);
    if (data == "[DONE]") {
      EXPECT_TRUE(body.empty());
      break;
    }
    chunks.push_back(json::parse(data));
  }
  ASSERT_EQ(chunks.size(), 5u) << res.body;
  EXPECT_EQ(chunks[0]["choices"][0]["text"], "H");
  EXPECT_EQ(chunks[0]["choices"][0]["logprobs"]["tokens"], json::array({"H"}));
  EXPECT_EQ(chunks[2]["choices"][0]["logprobs"]["text_offset"], json::array({2}));
  EXPECT_TRUE(chunks[0]["usage"].is_null());
  EXPECT_EQ(chunks[3]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunks[4]["choices"], json::array());
  EXPECT_EQ(chunks[4]["usage"]["prompt_tokens"], 3);  // BOS + "ab"
  EXPECT_EQ(chunks[4]["usage"]["completion_tokens"], 3);
}

// --event-batching on: the same stream through the EventOutbox (the fake engine's events come from its own
// thread, as the engine's do).
TEST_F(OpenAiServiceTest, BatchedEventsGiveTheSameStream) {
  const std::string body = R"({"prompt": "ab", "max_tokens": 3, "stream": true, "logprobs": 0})";
  auto r1 = std::make_shared<FakeResponder>();
  const HttpResponse direct = Call(ApiKind::kCompletion, body, r1);
  service_ = std::make_unique<OpenAiService>(
      OpenAiServiceOptions{.request_log = &log_, .batch_generation_events = true}, &repo_);
  auto r2 = std::make_shared<FakeResponder>();
  const HttpResponse batched = Call(ApiKind::kCompletion, body, r2);
  EXPECT_TRUE(r2->streaming_);
  // Equal but for the request ids and created times: compare the chunks' texts and finish reasons.
  auto texts = [](const std::string& sse) {
    std::vector<std::string> out;
    size_t pos = 0;
    while ((pos = sse.find("data: ", pos)) != std::string::npos) {
      const size_t end = sse.find("\n\n", pos);
      const std::string data = sse.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") break;
      const json j = json::parse(data);
      out.push_back(j["choices"][0]["text"].get<std::string>() + "|" +
                    j["choices"][0]["finish_reason"].dump());
    }
    return out;
  };
  EXPECT_EQ(texts(batched.body), texts(direct.body));
  EXPECT_EQ(texts(batched.body).size(), 4u) << batched.body;
}

TEST_F(OpenAiServiceTest, ChatStreamingStartsWithRole) {
  HttpResponse res =
      Call(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "stream": true})");
  const size_t first_end = res.body.find("\n\n");
  json first = json::parse(res.body.substr(6, first_end - 6));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(first.contains("usage"));
  EXPECT_THAT(res.body, HasSubstr(R"("delta":{"content":"H"})"));
  EXPECT_THAT(res.body, HasSubstr(R"("delta":{},"logprobs":null,"finish_reason":"stop")"));
  EXPECT_THAT(res.body, ::testing::EndsWith("data: [DONE]\n\n"));
}

// X-Stoke-Ledger: 1 adds the ledger (header + body, or the last SSE chunk); without it nothing changes. Every
// finished request lands in the request log.
TEST_F(OpenAiServiceTest, LedgerOnlyWhenAsked) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}]})";
  HttpResponse plain = Call(ApiKind::kChat, chat);
  EXPECT_TRUE(plain.headers.empty());
  EXPECT_FALSE(json::parse(plain.body).contains("ledger"));

  HttpResponse with = Call(ApiKind::kChat, chat, nullptr, {{"x-stoke-ledger", "1"}});
  json body = json::parse(with.body);
  ASSERT_TRUE(body.contains("ledger"));
  double sum = 0;
  std::vector<std::string> names;
  for (const auto& [stage, ms] : body["ledger"]["stages_ms"].items()) {
    sum += ms.get<double>();
    names.push_back(stage);
  }
  EXPECT_NEAR(sum, body["ledger"]["e2e_ms"].get<double>(), 0.01);
  EXPECT_TRUE(std::find(names.begin(), names.end(), "interleave") != names.end());
  ASSERT_EQ(with.headers.size(), 1u);
  EXPECT_EQ(with.headers[0].first, "X-Stoke-Ledger");
  EXPECT_THAT(with.headers[0].second, HasSubstr("decode="));
  body.erase("ledger");
  json expected = json::parse(plain.body);
  EXPECT_EQ(body.size(), expected.size());

  HttpResponse stream =
      Call(ApiKind::kCompletion, R"({"prompt": "x", "stream": true})", nullptr, {{"x-stoke-ledger", "1"}});
  const size_t done = stream.body.rfind("data: [DONE]");
  const size_t last = stream.body.rfind("data: ", done - 1);
  json last_chunk = json::parse(stream.body.substr(last + 6, done - last - 8));
  EXPECT_TRUE(last_chunk.contains("ledger"));
  EXPECT_EQ(stream.body.find("\"ledger\""), stream.body.rfind("\"ledger\""));  // once, in the last chunk

  const auto logged = log_.Find({});
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_EQ(logged[0].api, "completion");
  EXPECT_EQ(logged[1].api, "chat");
  EXPECT_EQ(logged[1].model, "smol");
  EXPECT_EQ(logged[1].ledger.kind, LedgerKind::kGeneration);
  EXPECT_EQ(logged[1].ledger.Attributed() + logged[1].ledger[LedgerStage::kOther], logged[1].ledger.e2e);
}

TEST_F(OpenAiServiceTest, Errors) {
  struct Case {
    ApiKind kind;
    std::string body;
    int status;
    std::string message;
    std::string param;
  };
  const std::vector<Case> cases = {
      {ApiKind::kChat, "{bad json", 400, "not valid JSON", ""},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"})", 404,
       "The model `gpt-4` does not exist (this server serves `smol`, `minilm`).", "model"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "model": "minilm"})", 400,
       "the model `minilm` is an encoder model: it does not serve /v1/chat/completions", "model"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "temperature": "x"})", 400,
       "'temperature' must be a number", "temperature"},
      {ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 70})", 400,
       "maximum context length is 64 tokens. However, you requested 72 tokens (2 in the prompt, 70 in the "
       "completion)",
       "prompt"},
      {ApiKind::kCompletion, std::string(R"({"prompt": ")") + std::string(70, 'a') + R"("})", 400,
       "maximum context length is 64 tokens", "prompt"},
      {ApiKind::kCompletion, R"({"prompt": [1, 300]})", 400,
       "token id 300 in 'prompt' is outside the vocabulary", "prompt"},
      {ApiKind::kCompletion, R"({"prompt": ["a", "b"]})", 400, "a batch of 2 prompts", "prompt"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 3})", 400, "only n=1", "n"},
  };
  for (const auto& c : cases) {
    HttpResponse res = Call(c.kind, c.body);
    EXPECT_EQ(res.status, c.status) << c.body;
    json e = json::parse(res.body);
    EXPECT_THAT(e["error"]["message"].get<std::string>(), HasSubstr(c.message)) << c.body;
    if (c.param.empty()) {
      EXPECT_TRUE(e["error"]["param"].is_null()) << c.body;
    } else {
      EXPECT_EQ(e["error"]["param"], c.param) << c.body;
    }
  }
  EXPECT_EQ(service_->in_flight(), 0);
}

TEST_F(OpenAiServiceTest, QueueFullIs503WithRetryAfter) {
  engine_->reject_ = true;
  HttpResponse res = Call(ApiKind::kCompletion, R"({"prompt": "x"})");
  EXPECT_EQ(res.status, 503);
  bool retry_after = false;
  for (const auto& [k, v] : res.headers) retry_after |= k == "Retry-After";
  EXPECT_TRUE(retry_after);
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "queue_full");
}

TEST_F(OpenAiServiceTest, NotLoadedIs503AndLoadedAgainServes) {
  ASSERT_TRUE(repo_.Unload("smol").ok());
  repo_.WaitIdle();
  HttpResponse res = Call(ApiKind::kCompletion, R"({"prompt": "x"})");
  EXPECT_EQ(res.status, 503);
  EXPECT_EQ(json::parse(res.body)["error"]["code"], "not_ready");
  EXPECT_THAT(json::parse(res.body)["error"]["message"].get<std::string>(), HasSubstr("not loaded"));
  ASSERT_TRUE(repo_.Load("smol").ok());
  repo_.WaitIdle();
  EXPECT_EQ(Call(ApiKind::kCompletion, R"({"prompt": "x"})").status, 200);
}

TEST_F(OpenAiServiceTest, DisconnectCancelsAndCountsAsAbort) {
  engine_->hold_ = true;
  auto r = std::make_shared<FakeResponder>();
  HttpRequest req;
  req.body = R"({"prompt": "hello", "stream": true})";
  req.recv_time = MonotonicNanos();
  service_->HandleCompletions(req, r);
  EXPECT_EQ(service_->in_flight(), 1);
  r->Disconnect();
  {
    std::lock_guard lock(engine_->mu_);
    ASSERT_EQ(engine_->cancelled_.size(), 1u);
    EXPECT_THAT(engine_->cancelled_[0], ::testing::StartsWith("cmpl-"));
  }
  EXPECT_EQ(service_->in_flight(), 0);
  EXPECT_THAT(metrics_->ExposeText(),
              HasSubstr(R"(stoke:request_success_total{finished_reason="abort",model_name="smol"} 1)"));
}

TEST_F(OpenAiServiceTest, MetricsAfterRequests) {
  Call(ApiKind::kCompletion, R"({"prompt": "ab", "max_tokens": 3})");
  Call(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}]})");
  const std::string text = metrics_->ExposeText();
  EXPECT_THAT(text,
              HasSubstr(R"(stoke:request_success_total{finished_reason="length",model_name="smol"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(stoke:request_success_total{finished_reason="stop",model_name="smol"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(stoke:generation_tokens_total{model_name="smol"} 8)"));
  EXPECT_THAT(text, HasSubstr(R"(stoke:time_to_first_token_seconds_count{model_name="smol"} 2)"));
  EXPECT_THAT(text, HasSubstr(R"(stoke:inter_token_latency_seconds_count{model_name="smol"} 6)"));
  for (const char* stage : {"recv", "queue", "preprocess", "compute", "postprocess", "send"}) {
    EXPECT_THAT(text,
                HasSubstr(std::string(R"(stoke:request_stage_seconds_count{model_name="smol",stage=")") +
                          stage + "\"} 2"))
        << stage;
  }
  EXPECT_THAT(text, HasSubstr("# TYPE stoke:e2e_request_latency_seconds histogram"));
}

TEST_F(OpenAiServiceTest, ModelsList) {
  auto r = std::make_shared<FakeResponder>();
  service_->HandleModels(HttpRequest{}, r);
  json j = json::parse(r->Wait().body);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "smol");
  EXPECT_EQ(j["data"][0]["max_model_len"], 64);
  EXPECT_EQ(j["data"][1]["id"], "minilm");
  EXPECT_FALSE(j["data"][1].contains("max_model_len"));
}

}  // namespace
}  // namespace stoke
