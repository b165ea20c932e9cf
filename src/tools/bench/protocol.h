// The APIs the bench speaks, as bytes: building one request from a PromptItem, and reading one response as
// its bytes arrive (so every streamed token gets the time it reached the client).
//
//   openai-chat          POST /v1/chat/completions  {"messages", "max_tokens", "stream": true, ...}
//   openai-completions   POST /v1/completions       {"prompt": [ids] | "text", ...}
//   openai-embeddings    POST /v1/embeddings        {"input": "text"}
//   kserve-http          POST /v2/models/{m}/infer  JSON tensors, or the binary tensor extension
//   kserve-grpc          inference.GRPCInferenceService/ModelInfer with raw_input_contents
//
// Streaming requests ask for usage in the last chunk (stream_options.include_usage) so token counts are the
// server's, and by default set ignore_eos with min_tokens = max_tokens (vLLM's extension, which stoke
// supports) so every request generates exactly the lengths the workload asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/workload.h"

namespace inference {
class ModelInferRequest;
}  // namespace inference

namespace stoke::bench {

struct KserveInput {
  std::string name;
  std::string datatype;        // "FP32", "INT64", "BYTES", ...
  std::vector<int64_t> shape;  // -1 (variable) is sent as 1
};

// Inputs from a KServe v2 model metadata response (GET /v2/models/{m}).
StatusOr<std::vector<KserveInput>> ParseKserveMetadata(std::string_view json);

struct ProtocolOptions {
  Api api = Api::kOpenAiChat;
  std::string model;
  std::string base_path;    // URL path prefix ("" or "/prefix")
  bool stream = true;       // chat/completions
  bool ignore_eos = true;   // chat/completions: ignore_eos + min_tokens = max_tokens
  double temperature = -1;  // chat/completions: sent when >= 0 (0 = greedy); < 0 = the server's default
  std::vector<KserveInput> kserve_inputs;
  bool kserve_binary = false;  // the binary tensor extension for inputs
  // BYTES elements: one of these, drawn from the rng per element (e.g. JPEG photos for an image model);
  // empty = the prompt text. Binary only (kserve-http's binary extension or kserve-grpc): JSON strings
  // cannot carry arbitrary bytes. Shared: the options are copied per connection.
  std::shared_ptr<const std::vector<std::string>> kserve_bytes;
};

struct WireRequest {
  std::string method = "POST";
  std::string target;  // path (+ query)
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  int input_tokens = 0;  // the workload's count, used when the server reports no usage
  int max_tokens = 0;
  // kserve-grpc: the message to send (method, target and body are unused). Shared, never modified.
  std::shared_ptr<const inference::ModelInferRequest> grpc;
  // HTTP, when pre-built: the whole request as it goes on the wire (request line, headers, body), written as
  // is (SerializeHttpRequest, http_client.h). Shared, never modified.
  std::shared_ptr<const std::string> wire;
};

// KServe inputs are filled with random data (floats in [0, 1), integers in [0, 100), the prompt text for
// BYTES, or one of kserve_bytes) drawn from `rng`. kserve-grpc sends them as raw_input_contents (little-endian elements; BYTES as a
// u32 length then the bytes), exactly the bytes kserve-http's binary extension sends.
StatusOr<WireRequest> BuildRequest(const ProtocolOptions& opts, const PromptItem& item, std::mt19937_64& rng);

// Reads one response. Feed it the status, then the body bytes as they arrive, then End(); then Finish()
// writes what it found into the record (tokens, usage, first-token time, inter-token gaps, error).
class ResponseReader {
 public:
  ResponseReader(Api api, bool stream) : api_(api), stream_(stream && ApiStreamsTokens(api)) {}

  // json_length: the Inference-Header-Content-Length of a KServe binary response (-1 if absent).
  void OnStatus(int status, int64_t json_length = -1) {
    status_ = status;
    json_length_ = json_length;
  }
  void OnBody(std::string_view bytes, Nanos t);
  void End(Nanos t);
  void Finish(RequestRecord* r) const;

  int status() const { return status_; }
  int tokens_seen() const { return tokens_; }

 private:
  void OnSseEvent(std::string_view data, Nanos t);
  void OnToken(Nanos t);
  void Fail(std::string kind, std::string detail);

  Api api_;
  bool stream_;
  int status_ = 0;
  int64_t json_length_ = -1;
  std::string buffer_;  // SSE: an incomplete event; otherwise the whole body (capped)
  bool done_marker_ = false;
  int tokens_ = 0;
  Nanos first_token_ = 0, last_token_ = 0, end_ = 0;
  std::vector<float> itl_ms_;
  int usage_prompt_ = -1, usage_completion_ = -1;
  std::string error_, error_detail_;
};

}  // namespace stoke::bench
