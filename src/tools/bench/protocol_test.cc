#include "tools/bench/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <nlohmann/json.hpp>

#include "net/grpc/grpc_service.pb.h"
#include "tools/bench/grpc_client.h"
#include "tools/bench/http_client.h"

namespace stoke::bench {
namespace {

using nlohmann::json;

std::string Chunk(const std::string& text) {
  return "data: " + json{{"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}}.dump() +
         "\n\n";
}

TEST(Protocol, CompletionsRequestCarriesIdsAndFixedLength) {
  ProtocolOptions o;
  o.api = Api::kOpenAiCompletions;
  o.model = "m";
  PromptItem item;
  item.ids = {5, 6, 7};
  item.input_tokens = 3;
  item.max_tokens = 9;
  std::mt19937_64 rng(1);
  auto w = BuildRequest(o, item, rng);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->target, "/v1/completions");
  json j = json::parse(w->body);
  EXPECT_EQ(j["prompt"], json::array({5, 6, 7}));
  EXPECT_EQ(j["max_tokens"], 9);
  EXPECT_EQ(j["min_tokens"], 9);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["model"], "m");
  EXPECT_FALSE(j.contains("temperature"));  // not sent unless asked: the server's default applies
  o.temperature = 0;
  w = BuildRequest(o, item, rng);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(json::parse(w->body)["temperature"], 0.0);
  o.temperature = -1;

  o.api = Api::kOpenAiChat;
  o.ignore_eos = false;
  o.stream = false;
  o.base_path = "/p";
  item.ids.clear();
  item.text = "hi there";
  w = BuildRequest(o, item, rng);
  j = json::parse(w->body);
  EXPECT_EQ(w->target, "/p/v1/chat/completions");
  EXPECT_EQ(j["messages"][0]["content"], "hi there");
  EXPECT_FALSE(j.contains("ignore_eos"));
  EXPECT_FALSE(j.contains("stream"));
}

TEST(Protocol, StreamTimesEachTokenAsItArrivesEvenWhenEventsSplitAcrossReads) {
  ResponseReader r(Api::kOpenAiCompletions, true);
  r.OnStatus(200);
  std::string s = Chunk("a") + Chunk("b");
  const Nanos ms = 1000000;
  r.OnBody(s.substr(0, 10), 100 * ms);  // half an event: no token yet
  EXPECT_EQ(r.tokens_seen(), 0);
  r.OnBody(s.substr(10), 130 * ms);  // the rest: two tokens at 130 ms
  r.OnBody(Chunk("c").substr(0, 5), 150 * ms);
  r.OnBody(Chunk("c").substr(5) + Chunk(""), 170 * ms);  // empty text is not a token
  r.OnBody("data: " +
               json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 42}, {"completion_tokens", 3}}}}
                   .dump() +
               "\r\n\r\ndata: [DONE]\r\n\r\n",
           180 * ms);
  r.End(181 * ms);
  RequestRecord rec;
  rec.input_tokens = 7;
  r.Finish(&rec);
  EXPECT_EQ(rec.error, "");
  EXPECT_EQ(rec.first_token, 130 * ms);
  EXPECT_EQ(rec.done, 181 * ms);
  EXPECT_EQ(rec.output_tokens, 3);
  EXPECT_EQ(rec.input_tokens, 42);  // usage wins over the workload's count
  ASSERT_EQ(rec.itl_ms.size(), 2u);
  EXPECT_FLOAT_EQ(rec.itl_ms[0], 0);
  EXPECT_FLOAT_EQ(rec.itl_ms[1], 40);
}

TEST(Protocol, ChatDeltasCountOnlyContent) {
  ResponseReader r(Api::kOpenAiChat, true);
  r.OnStatus(200);
  auto ev = [](json delta) {
    return "data: " + json{{"choices", {{{"index", 0}, {"delta", delta}}}}}.dump() + "\n\n";
  };
  r.OnBody(ev({{"role", "assistant"}, {"content", ""}}), 1);
  r.OnBody(ev({{"content", "Hel"}}), 2);
  r.OnBody(ev({{"content", "lo"}}) + ev(json::object()) + "data: [DONE]\n\n", 5);
  r.End(6);
  RequestRecord rec;
  r.Finish(&rec);
  EXPECT_EQ(rec.output_tokens, 2);
  EXPECT_EQ(rec.first_token, 2);
}

TEST(Protocol, ErrorsAreClassified) {
  {
    ResponseReader r(Api::kOpenAiChat, true);
    r.OnStatus(503);
    r.OnBody(R"({"error": {"message": "queue full", "type": "server_error"}})", 1);
    r.End(2);
    RequestRecord rec;
    r.Finish(&rec);
    EXPECT_EQ(rec.error, "http_503");
    EXPECT_EQ(rec.error_detail, "queue full");
  }
  {
    ResponseReader r(Api::kOpenAiCompletions, true);
    r.OnStatus(200);
    r.OnBody(Chunk("x"), 1);
    r.End(2);  // no [DONE]
    RequestRecord rec;
    r.Finish(&rec);
    EXPECT_EQ(rec.error, "no_done");
  }
  {
    ResponseReader r(Api::kOpenAiCompletions, true);
    r.OnStatus(200);
    r.OnBody("data: {\"error\": {\"message\": \"boom\"}}\n\ndata: [DONE]\n\n", 1);
    r.End(2);
    RequestRecord rec;
    r.Finish(&rec);
    EXPECT_EQ(rec.error, "stream_error");
    EXPECT_EQ(rec.error_detail, "boom");
  }
  {
    ResponseReader r(Api::kOpenAiEmbeddings, false);
    r.OnStatus(200);
    r.OnBody(R"({"data": []})", 1);
    r.End(2);
    RequestRecord rec;
    r.Finish(&rec);
    EXPECT_EQ(rec.error, "bad_response");
  }
}

TEST(Protocol, NonStreamingCompletionUsesUsage) {
  ResponseReader r(Api::kOpenAiCompletions, false);
  r.OnStatus(200);
  r.OnBody(R"({"choices": [{"text": "abc"}], "usage": {"prompt_tokens": 4, "completion_tokens": 12}})", 10);
  r.End(11);
  RequestRecord rec;
  r.Finish(&rec);
  EXPECT_EQ(rec.error, "");
  EXPECT_EQ(rec.output_tokens, 12);
  EXPECT_EQ(rec.first_token, 11);  // without streaming the first token is the whole response
}

TEST(Protocol, KserveJsonAndBinaryRequests) {
  auto meta = ParseKserveMetadata(
      R"({"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 4]},
                                  {"name": "S", "datatype": "BYTES", "shape": [1]}]})");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  ProtocolOptions o;
  o.api = Api::kKserveHttp;
  o.model = "m";
  o.kserve_inputs = *meta;
  PromptItem item;
  item.text = "hello";
  std::mt19937_64 rng(3);
  auto w = BuildRequest(o, item, rng);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->target, "/v2/models/m/infer");
  EXPECT_EQ(w->input_tokens, 0);  // tensors carry no tokens
  json j = json::parse(w->body);
  EXPECT_EQ(j["inputs"][0]["shape"], json::array({1, 4}));
  EXPECT_EQ(j["inputs"][0]["data"].size(), 4u);
  EXPECT_EQ(j["inputs"][1]["data"][0], "hello");

  o.kserve_binary = true;
  w = BuildRequest(o, item, rng);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->headers.size(), 1u);
  EXPECT_EQ(w->headers[0].first, "Inference-Header-Content-Length");
  size_t hlen = std::stoul(w->headers[0].second);
  json h = json::parse(w->body.substr(0, hlen));
  EXPECT_EQ(h["inputs"][0]["parameters"]["binary_data_size"], 16);
  EXPECT_EQ(h["inputs"][1]["parameters"]["binary_data_size"], 4 + 5);
  EXPECT_EQ(w->body.size(), hlen + 16 + 9);
  uint32_t len = 0;
  std::memcpy(&len, w->body.data() + hlen + 16, 4);
  EXPECT_EQ(len, 5u);
  EXPECT_EQ(w->body.substr(hlen + 20), "hello");

  // BYTES from files (--bytes-input): each element is one of them, whole, never the prompt text.
  const std::vector<std::string> files = {std::string("\xff\xd8jpeg-one", 10), std::string("\x89PNG-two-2")};
  o.kserve_bytes = std::make_shared<const std::vector<std::string>>(files);
  std::set<std::string> seen;
  for (int i = 0; i < 16; ++i) {
    w = BuildRequest(o, item, rng);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    hlen = std::stoul(w->headers[0].second);
    std::memcpy(&len, w->body.data() + hlen + 16, 4);
    const std::string elem = w->body.substr(hlen + 20);
    EXPECT_EQ(elem.size(), len);
    EXPECT_TRUE(elem == files[0] || elem == files[1]) << elem;
    seen.insert(elem);
  }
  EXPECT_EQ(seen.size(), 2u);  // both files are drawn
  o.kserve_binary = false;     // JSON strings cannot carry them: a clear error, not mangled bytes
  w = BuildRequest(o, item, rng);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("binary tensor extension"), std::string::npos);
  o.kserve_bytes = nullptr;

  EXPECT_FALSE(ParseKserveMetadata(R"({"inputs": [{"name": "X"}]})").ok());
}

// Responses are judged by their top-level members without a DOM: nesting and strings followed exactly.
TEST(Protocol, ResponsesAreCheckedByTheirTopLevelMembers) {
  auto read = [](Api api, const std::string& body) {
    ResponseReader r(api, false);
    r.OnStatus(200);
    r.OnBody(body, 1);
    r.End(2);
    RequestRecord rec;
    r.Finish(&rec);
    return rec;
  };
  EXPECT_EQ(read(Api::kKserveHttp, R"({"model_name": "m", "outputs": [{"name": "Y", "data": [1, 2.5e3, -3],
      "shape": [1, 3], "parameters": {"s": "a \"}\" b"}}]} )")
                .error,
            "");
  EXPECT_EQ(read(Api::kKserveHttp, R"({"outputs": [{"data": [1, 2)").error, "bad_json");  // cut short
  EXPECT_EQ(read(Api::kKserveHttp, R"({"outputs": [1]]})").error, "bad_json");            // unbalanced
  EXPECT_EQ(read(Api::kKserveHttp, R"({"outputs": []} x)").error, "bad_json");            // trailing
  EXPECT_EQ(read(Api::kKserveHttp, "not json").error, "bad_json");
  EXPECT_EQ(read(Api::kKserveHttp, R"({"model_name": "m"})").error, "bad_response");  // no outputs
  EXPECT_EQ(read(Api::kKserveHttp, R"({"error": "boom", "outputs": []})").error, "bad_response");
  EXPECT_EQ(read(Api::kOpenAiChat, R"({"choices": []})").error, "bad_response");
  RequestRecord c = read(Api::kOpenAiChat, R"({"choices": [ {"message": {"content": "}"}} ],
      "usage": {"prompt_tokens": 7, "completion_tokens": 3}})");
  EXPECT_EQ(c.error, "");
  EXPECT_EQ(c.output_tokens, 3);
  EXPECT_EQ(c.input_tokens, 7);
}

TEST(Protocol, SerializedRequestIsTheWholeHttpMessage) {
  WireRequest w;
  w.target = "/v2/models/m/infer";
  w.body = R"({"inputs": []})";
  w.headers.emplace_back("Inference-Header-Content-Length", "14");
  EXPECT_EQ(
      SerializeHttpRequest(w, "127.0.0.1:8000"),
      "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: stoke-bench\r\n"
      "Content-Type: application/json\r\nContent-Length: 14\r\nInference-Header-Content-Length: 14\r\n\r\n"
      R"({"inputs": []})");
}

TEST(Protocol, KserveBinaryResponseReadsTheJsonHeaderOnly) {
  ResponseReader r(Api::kKserveHttp, false);
  std::string js = R"({"outputs": [{"name": "Y", "parameters": {"binary_data_size": 4}}]})";
  r.OnStatus(200, static_cast<int64_t>(js.size()));
  r.OnBody(js + std::string("\x01\x02\x03\x04", 4), 5);
  r.End(6);
  RequestRecord rec;
  r.Finish(&rec);
  EXPECT_EQ(rec.error, "");
}

TEST(Protocol, KserveGrpcRequestCarriesRawInputs) {
  ProtocolOptions o;
  o.api = Api::kKserveGrpc;
  o.model = "minilm-ids";
  o.kserve_inputs = {{"input_ids", "INT64", {-1, 3}}, {"text", "BYTES", {-1, 1}}};
  PromptItem item;
  item.text = "hello";
  std::mt19937_64 rng(3);
  auto w = BuildRequest(o, item, rng);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_NE(w->grpc, nullptr);
  const inference::ModelInferRequest& m = *w->grpc;
  EXPECT_EQ(m.model_name(), "minilm-ids");
  ASSERT_EQ(m.inputs_size(), 2);
  ASSERT_EQ(m.raw_input_contents_size(), 2);  // one raw entry per input, in order
  EXPECT_EQ(m.inputs(0).name(), "input_ids");
  EXPECT_EQ(m.inputs(0).datatype(), "INT64");
  ASSERT_EQ(m.inputs(0).shape_size(), 2);
  EXPECT_EQ(m.inputs(0).shape(0), 1);  // -1 is sent as 1
  EXPECT_EQ(m.inputs(0).shape(1), 3);
  ASSERT_EQ(m.raw_input_contents(0).size(), 3 * 8u);
  for (int i = 0; i < 3; ++i) {
    int64_t v = -1;
    std::memcpy(&v, m.raw_input_contents(0).data() + 8 * i, 8);
    EXPECT_GE(v, 0);
    EXPECT_LT(v, 100);
  }
  const std::string& text = m.raw_input_contents(1);
  ASSERT_EQ(text.size(), 4 + 5u);
  uint32_t len = 0;
  std::memcpy(&len, text.data(), 4);
  EXPECT_EQ(len, 5u);
  EXPECT_EQ(text.substr(4), "hello");
  EXPECT_EQ(m.inputs_size(), 2);
  EXPECT_EQ(w->input_tokens, 0);

  o.model.clear();
  EXPECT_FALSE(BuildRequest(o, item, rng).ok());
}

TEST(Protocol, GrpcErrorKindsNameTheStatusCode) {
  EXPECT_EQ(GrpcErrorKind(14), "grpc_unavailable");
  EXPECT_EQ(GrpcErrorKind(8), "grpc_resource_exhausted");
  EXPECT_EQ(GrpcErrorKind(4), "grpc_deadline_exceeded");
  EXPECT_EQ(GrpcErrorKind(99), "grpc_99");
}

TEST(Protocol, KserveGrpcSuccessNeedsNoBody) {
  ResponseReader r(Api::kKserveGrpc, false);
  r.OnStatus(200);
  r.End(6);
  RequestRecord rec;
  r.Finish(&rec);
  EXPECT_EQ(rec.error, "");
  EXPECT_EQ(rec.done, 6);
}

}  // namespace
}  // namespace stoke::bench
