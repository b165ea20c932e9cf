// From a model's settings (a --model argument or a repository folder) to the repository's ModelConfig: its
// kind and served names decided now (model files are read, nothing heavy), its loading as a function the
// repository runs on its worker:
//   decoder    ResolveModel, LoadTokenizer, ChatTemplate, LoadDecoder, LlmLoop (continuous batching, paged
//   KV) encoder    ResolveModel, BertEncoder::Load, LoadTokenizer, LoadBertOnDevice, two BertClassicModels:
//              NAME (BYTES "text", also /v1/embeddings) and NAME-ids (INT64 input_ids + attention_mask)
//   synthetic  SyntheticConfig from the model file, SyntheticClassicModel
// A model file (*.json) names the kind and Triton-named batching keys:
//   {"type": "bert", "model": "all-minilm-l6-v2", "name": "minilm", "max_batch_size": 32,
//    "dynamic_batching": {"max_queue_delay_microseconds": 500}, "instance_group": [{"count": 2}],
//    "device": "cuda"}
//   {"type": "synthetic", "name": "synth", ... synthetic.h keys ..., "max_batch_size": 8}
// "model" may be relative to the file's folder. Without a file an encoder gets max_batch_size 32 and dynamic
// batching with max_queue_delay 0; in a file, as in Triton, no "dynamic_batching" key means batching off.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model/backends.h"
#include "serve/repository/model_repository.h"
#include "server/server_options.h"
#include "telemetry/metrics.h"
#include "telemetry/server_metrics.h"

namespace stoke {

// True for a .json model file or a BERT-family HF folder / known encoder alias (decided without fetching).
bool IsBatchedModelSource(const std::string& source);

// "smollm2-135m-instruct" stays; "/x/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct.Q4_1".
std::string DefaultModelName(const std::string& source);

// The model's config for the repository. A decoder's metrics are created here in `registry` and kept in
// `*keep` (they outlive every load of the model). `backends` must outlive the repository.
StatusOr<ModelConfig> MakeModelConfig(const ModelSettings& settings, const ServerOptions& server,
                                      const Backends& backends, MetricsRegistry* registry,
                                      std::vector<std::unique_ptr<ServerMetrics>>* keep);

}  // namespace stoke
