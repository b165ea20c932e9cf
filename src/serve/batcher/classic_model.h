// The interface between the classic serving path (dynamic batcher + instances) and a stateless model
// (an encoder, the synthetic model, later any Triton-style backend).
//
// A request's life, and who owns what:
//   net thread:      tensors from the wire -> ValidateInputs (signature, shapes, bytes) -> model.Prepare()
//                    -> a ClassicRequest (owns the PreparedInput) -> DynamicBatcher::Submit (takes it)
//   batcher thread:  the launch rule closes a batch of requests -> the first free instance
//   instance thread: ModelInstance::Execute(batch) writes each request's outputs -> request.done(result)
// A batch's outputs are split back per request; a request's result never depends on what it was batched
// with (each model checks this in its tests).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "serve/batcher/infer_tensor.h"
#include "serve/batcher/launch_rule.h"

namespace stoke {

struct TensorSpec {
  std::string name;
  TensorType type = TensorType::kFp32;
  std::vector<int64_t> dims;  // without the batch dim; -1 = any size
};

struct ModelSignature {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

// What a request's inputs become after Prepare (token ids, decoded bytes...): model-specific.
class PreparedInput {
 public:
  virtual ~PreparedInput() = default;
};

// Time an execution spent in each device-side stage of the ledger, ns (h2d/d2h stay 0 on the CPU).
struct ExecTimes {
  Nanos preprocess = 0;  // assemble the batch's inputs (pinned staging on a GPU)
  Nanos h2d = 0;
  Nanos compute = 0;
  Nanos d2h = 0;
  Nanos postprocess = 0;  // split/format outputs
};

// One model instance: its own scratch (a thread pool, later a CUDA stream and buffers). Execute runs on the
// instance's thread only.
class ModelInstance {
 public:
  virtual ~ModelInstance() = default;
  // inputs[i] has rows[i] rows; outputs->at(i) gets request i's output tensors (shapes with its rows).
  virtual Status Execute(std::span<const PreparedInput* const> inputs, std::span<const int64_t> rows,
                         std::vector<std::vector<InferTensor>>* outputs, ExecTimes* times) = 0;
};

// Token-id rows, one per sentence (e.g. [CLS] ... [SEP]): the prepared input of text models.
struct TokenRows : PreparedInput {
  std::vector<std::vector<int32_t>> rows;
};

// What /v1/embeddings (net/openai/embeddings_service.h) needs of a model that turns text into one vector per
// row: tokenising on the net thread, then its TokenRows go to the model's batcher like any request.
class TextEmbedder {
 public:
  virtual ~TextEmbedder() = default;
  virtual int hidden_size() const = 0;
  // Texts -> rows (truncated to the model's length); ids checked against the vocabulary. *tokens: the
  // longest row; *total: the sum of rows. InvalidArgument names the input ("input[2]").
  virtual StatusOr<std::unique_ptr<TokenRows>> TokenizeTexts(const std::vector<std::string>& texts,
                                                             int64_t* tokens, int64_t* total) const = 0;
  virtual StatusOr<std::unique_ptr<TokenRows>> CheckIds(std::vector<std::vector<int32_t>> rows,
                                                        int64_t* tokens, int64_t* total) const = 0;
};

class ClassicModel {
 public:
  virtual ~ClassicModel() = default;
  virtual std::string platform() const = 0;  // model metadata "platform", e.g. "stoke_bert"
  virtual const ModelSignature& signature() const = 0;
  // Tensors already checked against the signature (ValidateInputs); rows = the batch dim (1 when the model
  // does not batch). Sets *tokens to the longest row's token count when it matters for max_batch_tokens.
  // Runs on a net thread: must be cheap (tokenising a few sentences is; decoding an image would not be).
  virtual StatusOr<std::unique_ptr<PreparedInput>> Prepare(std::vector<InferTensor> inputs, int64_t rows,
                                                           int64_t* tokens) const = 0;
  // Called once per instance before serving; index in [0, count).
  virtual StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(int index, int count) = 0;
  // How the host side of its copies is allocated, for the timeline: "pinned" | "pageable" | "" (no copies,
  // or not known).
  virtual const char* copy_memory() const { return ""; }
  // Non-null for models /v1/embeddings can serve (text in, one vector per row out).
  virtual const TextEmbedder* text_embedder() const { return nullptr; }

  // Extra facts its KServe model metadata ("parameters": {"quantization": "fp8", ...}) and model config
  // (Triton's "parameters": {"quantization": {"string_value": "fp8"}}) carry: the loader sets them before
  // the model serves (an encoder's weight precision and its consistency gate's verdict: docs/precision.md).
  void set_parameters(std::map<std::string, std::string> p) { parameters_ = std::move(p); }
  const std::map<std::string, std::string>& parameters() const { return parameters_; }

 private:
  std::map<std::string, std::string> parameters_;
};

// Checks `inputs` against the signature: every input present once, no unknown ones, datatype, rank and
// fixed dims, batch dim in [1, max_batch_size] and equal across inputs, byte counts. Errors are
// InvalidArgument naming the input. Returns the batch dim (1 when max_batch_size == 0).
StatusOr<int64_t> ValidateInputs(const ModelSignature& sig, int max_batch_size,
                                 const std::vector<InferTensor>& inputs);

// Where a request's time went (monotonic ns), filled by the batcher for the done callback.
struct RequestTimes {
  Nanos enqueue = 0;   // Submit
  Nanos dispatch = 0;  // its batch closed and went to an instance
  Nanos start = 0;     // the instance began executing its batch (end of the ledger's `queue`)
  Nanos done = 0;      // outputs ready (before the net layer serialises)
  ExecTimes exec;      // its batch's execution stages
  int64_t batch_rows = 0;
  CloseReason close_reason = CloseReason::kImmediate;
  int instance = -1;
};

struct InferResult {
  Status status;
  std::vector<InferTensor> outputs;
  RequestTimes times;
};

struct ClassicRequest {
  std::unique_ptr<PreparedInput> input;
  int64_t rows = 1;
  int64_t tokens = 0;
  int priority = 0;  // 0 = the model's default level; 1 = highest
  int64_t timeout_us =
      0;              // requested queue timeout; 0 = the policy's (applies only if overrides are allowed)
  Nanos arrival = 0;  // first byte received (for the statistics' request duration); 0 = at Submit
  // Called exactly once: with the outputs on an instance thread, or with an error (timeout in the queue,
  // shutdown) on the batcher thread. Never called for a request Submit refused.
  std::function<void(InferResult)> done;
};

}  // namespace stoke
