// ModelInferRequest/Response <-> stoke tensors, and the repository's metadata, config and statistics as
// protobuf messages. Errors are InvalidArgument naming the input.
#pragma once

#include <vector>

#include "base/status.h"
#include "net/grpc/grpc_service.pb.h"
#include "serve/batcher/infer_tensor.h"
#include "serve/batcher/served_model.h"

namespace stoke {

struct GrpcInferOptions {
  int priority = 0;
  int64_t timeout_us = 0;
};

// Inputs from typed contents or raw_input_contents (all-or-nothing; FP16/BF16 raw only); element counts and
// byte sizes are checked against the shapes.
StatusOr<std::vector<InferTensor>> DecodeGrpcInputs(const inference::ModelInferRequest& req);
// priority / timeout parameters (int64, uint64 or numeric string); sequence and shared-memory ones are
// Unimplemented.
StatusOr<GrpcInferOptions> DecodeGrpcParameters(const inference::ModelInferRequest& req);

// Fills outputs (+ raw_output_contents) with the requested outputs in request order (all when none
// requested); an unknown requested name is InvalidArgument.
Status EncodeGrpcOutputs(const inference::ModelInferRequest& req, std::vector<InferTensor> outputs,
                         inference::ModelInferResponse* resp);

// `model`: m's loaded model (ServedModel::Acquire).
void FillModelMetadata(const ServedModel& m, const ClassicModel& model,
                       inference::ModelMetadataResponse* resp);
void FillModelConfig(const ServedModel& m, const ClassicModel& model, inference::ModelConfig* config);
void FillModelStatistics(const ServedModel& m, inference::ModelStatistics* stats);

}  // namespace stoke
