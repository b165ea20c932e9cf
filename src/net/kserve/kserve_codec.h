// KServe v2 (Open Inference Protocol) REST codec: infer requests in JSON, with the binary tensor data
// extension, and responses in the form the client asked for (kserve-v2.md §2-4).
//
// Request body = JSON header [+ binary tensors]. With binary data the header's length comes from the
// Inference-Header-Content-Length HTTP header; the binary inputs follow in the order they appear in the JSON
// (only those with parameters.binary_data_size). JSON `data` may be flat or nested; its element count must
// equal the shape's. Every error is InvalidArgument naming the input and what is wrong.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "serve/batcher/classic_model.h"
#include "serve/batcher/infer_tensor.h"

namespace stoke {

struct RequestedOutput {
  std::string name;
  std::optional<bool> binary;  // parameters.binary_data; unset = the request's binary_data_output
};

struct RestInferRequest {
  std::optional<std::string> id;
  std::vector<InferTensor> inputs;
  std::vector<RequestedOutput> outputs;  // empty = every output
  bool binary_data_output = false;       // parameters.binary_data_output
  int priority = 0;                      // parameters.priority
  int64_t timeout_us = 0;                // parameters.timeout
};

// `header_length`: the Inference-Header-Content-Length value when the header is present.
StatusOr<RestInferRequest> ParseRestInferRequest(std::string_view body, std::optional<size_t> header_length);

// The raw binary form (Inference-Header-Content-Length: 0): the body is the single input's data, batch 1,
// shape inferred from the byte count; every output comes back binary. Only for single-input models whose
// shape has at most one variable dim (BYTES: the shape must be [1]).
StatusOr<RestInferRequest> ParseRawBinaryRequest(std::string_view body, const ModelSignature& sig,
                                                 int max_batch_size);

// Parses the Inference-Header-Content-Length header value; nullopt when absent ("").
StatusOr<std::optional<size_t>> ParseHeaderLength(std::string_view value);

struct RestInferResponse {
  std::string body;
  std::optional<size_t> header_length;  // set when binary outputs follow the JSON
};

// Selects and orders the outputs as requested (unknown name: InvalidArgument) and encodes them.
StatusOr<RestInferResponse> EncodeRestInferResponse(const std::string& model_name, const std::string& version,
                                                    const RestInferRequest& request,
                                                    std::vector<InferTensor> outputs);

// JSON `data` of a tensor as a flat array text ("[1,2,3]"), used by the response encoder; floats are written
// in their shortest round-trip form. FP16/BF16 have no JSON form (InvalidArgument).
StatusOr<std::string> TensorDataJson(const InferTensor& t);

// {"error": "<message>"}
std::string KserveErrorBody(std::string_view message);
// Status -> HTTP status, Triton's mapping (kserve-v2.md §1).
int HttpStatusFor(const Status& s);

}  // namespace stoke
