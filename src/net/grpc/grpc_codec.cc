#include "net/grpc/grpc_codec.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <limits>

namespace stoke {
namespace {

template <typename To, typename From>
Status PackInts(const google::protobuf::RepeatedField<From>& v, std::string* out, std::string_view what) {
  out->reserve(v.size() * sizeof(To));
  for (From x : v) {
    if constexpr (std::numeric_limits<To>::max() < std::numeric_limits<From>::max() ||
                  std::numeric_limits<To>::min() > std::numeric_limits<From>::min()) {
      if (x > static_cast<From>(std::numeric_limits<To>::max()) ||
          (std::numeric_limits<From>::is_signed && x < static_cast<From>(std::numeric_limits<To>::min()))) {
        return InvalidArgumentError("{}: {} is out of range", what, x);
      }
    }
    const To y = static_cast<To>(x);
    out->append(reinterpret_cast<const char*>(&y), sizeof(To));
  }
  return OkStatus();
}

// Typed contents -> packed bytes; *count = elements found in the field matching the type.
Status PackContents(const inference::InferTensorContents& c, TensorType type, std::string* out,
                    int64_t* count, std::string_view what) {
  switch (type) {
    case TensorType::kBool:
      *count = c.bool_contents_size();
      for (bool b : c.bool_contents()) out->push_back(b ? 1 : 0);
      return OkStatus();
    case TensorType::kInt8:
      *count = c.int_contents_size();
      return PackInts<int8_t>(c.int_contents(), out, what);
    case TensorType::kInt16:
      *count = c.int_contents_size();
      return PackInts<int16_t>(c.int_contents(), out, what);
    case TensorType::kInt32:
      *count = c.int_contents_size();
      return PackInts<int32_t>(c.int_contents(), out, what);
    case TensorType::kInt64:
      *count = c.int64_contents_size();
      return PackInts<int64_t>(c.int64_contents(), out, what);
    case TensorType::kUint8:
      *count = c.uint_contents_size();
      return PackInts<uint8_t>(c.uint_contents(), out, what);
    case TensorType::kUint16:
      *count = c.uint_contents_size();
      return PackInts<uint16_t>(c.uint_contents(), out, what);
    case TensorType::kUint32:
      *count = c.uint_contents_size();
      return PackInts<uint32_t>(c.uint_contents(), out, what);
    case TensorType::kUint64:
      *count = c.uint64_contents_size();
      return PackInts<uint64_t>(c.uint64_contents(), out, what);
    case TensorType::kFp32:
      *count = c.fp32_contents_size();
      out->append(reinterpret_cast<const char*>(c.fp32_contents().data()), c.fp32_contents_size() * 4);
      return OkStatus();
    case TensorType::kFp64:
      *count = c.fp64_contents_size();
      out->append(reinterpret_cast<const char*>(c.fp64_contents().data()), c.fp64_contents_size() * 8);
      return OkStatus();
    case TensorType::kBytes:
      *count = c.bytes_contents_size();
      for (const std::string& s : c.bytes_contents()) AppendBytesElement(s, out);
      return OkStatus();
    case TensorType::kFp16:
    case TensorType::kBf16:
      break;
  }
  return InvalidArgumentError("{}: {} must be sent in raw_input_contents", what, TensorTypeName(type));
}

StatusOr<int64_t> ParamInt(const inference::InferParameter& p, std::string_view name) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      return p.int64_param();
    case inference::InferParameter::kUint64Param:
      if (p.uint64_param() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) break;
      return static_cast<int64_t>(p.uint64_param());
    case inference::InferParameter::kStringParam: {
      const std::string& s = p.string_param();
      int64_t v = 0;
      auto [e, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec == std::errc() && e == s.data() + s.size()) return v;
      break;
    }
    default:
      break;
  }
  return InvalidArgumentError("parameter '{}' must be an integer", name);
}

void SetDuration(const DurationStat& d, inference::StatisticDuration* out) {
  out->set_count(d.count);
  out->set_ns(d.ns);
}

inference::DataType ConfigType(TensorType t) {
  switch (t) {
    case TensorType::kBool:
      return inference::TYPE_BOOL;
    case TensorType::kUint8:
      return inference::TYPE_UINT8;
    case TensorType::kUint16:
      return inference::TYPE_UINT16;
    case TensorType::kUint32:
      return inference::TYPE_UINT32;
    case TensorType::kUint64:
      return inference::TYPE_UINT64;
    case TensorType::kInt8:
      return inference::TYPE_INT8;
    case TensorType::kInt16:
      return inference::TYPE_INT16;
    case TensorType::kInt32:
      return inference::TYPE_INT32;
    case TensorType::kInt64:
      return inference::TYPE_INT64;
    case TensorType::kFp16:
      return inference::TYPE_FP16;
    case TensorType::kFp32:
      return inference::TYPE_FP32;
    case TensorType::kFp64:
      return inference::TYPE_FP64;
    case TensorType::kBytes:
      return inference::TYPE_STRING;
    case TensorType::kBf16:
      return inference::TYPE_BF16;
  }
  return inference::TYPE_INVALID;
}

void FillPolicy(const QueuePolicy& p, inference::ModelQueuePolicy* out) {
  out->set_timeout_action(p.timeout_action == TimeoutAction::kReject ? inference::ModelQueuePolicy::REJECT
                                                                     : inference::ModelQueuePolicy::DELAY);
  out->set_default_timeout_microseconds(static_cast<uint64_t>(p.default_timeout_us));
  out->set_allow_timeout_override(p.allow_timeout_override);
  out->set_max_queue_size(static_cast<uint32_t>(p.max_queue_size));
}

}  // namespace

StatusOr<std::vector<InferTensor>> DecodeGrpcInputs(const inference::ModelInferRequest& req) {
  const bool raw = req.raw_input_contents_size() > 0;
  if (raw && req.raw_input_contents_size() != req.inputs_size()) {
    return InvalidArgumentError(
        "raw_input_contents has {} entries but there are {} inputs (raw is all or none)",
        req.raw_input_contents_size(), req.inputs_size());
  }
  std::vector<InferTensor> out;
  out.reserve(req.inputs_size());
  for (int i = 0; i < req.inputs_size(); ++i) {
    const auto& in = req.inputs(i);
    InferTensor t;
    t.name = in.name();
    const std::string what = fmt::format("input '{}'", t.name);
    auto type = ParseTensorType(in.datatype());
    if (!type) return InvalidArgumentError("{}: unknown datatype '{}'", what, in.datatype());
    t.type = *type;
    for (int64_t d : in.shape()) {
      if (d < 0) return InvalidArgumentError("{}: shape has a negative dim", what);
      t.shape.push_back(d);
    }
    const int64_t count = ShapeElementCount(t.shape);
    if (count < 0) return InvalidArgumentError("{}: shape {} is too large", what, ShapeString(t.shape));
    if (raw) {
      if (in.has_contents()) {
        return InvalidArgumentError("{}: has contents although raw_input_contents is used", what);
      }
      t.data = req.raw_input_contents(i);
      RETURN_IF_ERROR(CheckTensorBytes(t.type, t.data, count, what));
    } else {
      int64_t found = 0;
      RETURN_IF_ERROR(PackContents(in.contents(), t.type, &t.data, &found, what));
      if (found != count) {
        return InvalidArgumentError("{}: contents has {} {} elements but shape {} needs {}", what, found,
                                    TensorTypeName(t.type), ShapeString(t.shape), count);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

StatusOr<GrpcInferOptions> DecodeGrpcParameters(const inference::ModelInferRequest& req) {
  GrpcInferOptions o;
  for (const auto& [key, p] : req.parameters()) {
    if (key == "priority") {
      ASSIGN_OR_RETURN(int64_t v, ParamInt(p, key));
      if (v < 0 || v > (1 << 20)) return InvalidArgumentError("parameter 'priority' {} is out of range", v);
      o.priority = static_cast<int>(v);
    } else if (key == "timeout") {
      ASSIGN_OR_RETURN(int64_t v, ParamInt(p, key));
      if (v < 0) return InvalidArgumentError("parameter 'timeout' must be >= 0 microseconds");
      o.timeout_us = v;
    } else if (key == "sequence_id" || key == "sequence_start" || key == "sequence_end") {
      return UnimplementedError("parameter '{}': sequence batching is not supported", key);
    }
  }
  for (const auto& in : req.inputs()) {
    for (const auto& [key, p] : in.parameters()) {
      if (key.starts_with("shared_memory_")) {
        return UnimplementedError("input '{}': shared memory is not supported", in.name());
      }
    }
  }
  return o;
}

Status EncodeGrpcOutputs(const inference::ModelInferRequest& req, std::vector<InferTensor> outputs,
                         inference::ModelInferResponse* resp) {
  std::vector<InferTensor*> chosen;
  if (req.outputs_size() == 0) {
    for (InferTensor& t : outputs) chosen.push_back(&t);
  } else {
    for (const auto& o : req.outputs()) {
      InferTensor* found = nullptr;
      for (InferTensor& t : outputs) {
        if (t.name == o.name()) found = &t;
      }
      if (found == nullptr) return InvalidArgumentError("unexpected inference output '{}'", o.name());
      chosen.push_back(found);
    }
  }
  for (InferTensor* t : chosen) {
    auto* out = resp->add_outputs();
    out->set_name(t->name);
    out->set_datatype(std::string(TensorTypeName(t->type)));
    for (int64_t d : t->shape) out->add_shape(d);
    *resp->add_raw_output_contents() = std::move(t->data);
  }
  return OkStatus();
}

void FillModelMetadata(const ServedModel& m, const ClassicModel& model,
                       inference::ModelMetadataResponse* resp) {
  resp->set_name(m.name());
  resp->add_versions(m.version());
  resp->set_platform(model.platform());
  auto fill = [&](const TensorSpec& s, inference::ModelMetadataResponse::TensorMetadata* t) {
    t->set_name(s.name);
    t->set_datatype(std::string(TensorTypeName(s.type)));
    if (m.config().max_batch_size > 0) t->add_shape(-1);
    for (int64_t d : s.dims) t->add_shape(d);
  };
  for (const TensorSpec& s : model.signature().inputs) fill(s, resp->add_inputs());
  for (const TensorSpec& s : model.signature().outputs) fill(s, resp->add_outputs());
}

void FillModelConfig(const ServedModel& m, const ClassicModel& model, inference::ModelConfig* c) {
  const BatcherConfig& b = m.config();
  c->set_name(m.name());
  c->set_platform(model.platform());
  c->set_backend("stoke");
  c->mutable_version_policy()->mutable_latest()->set_num_versions(1);
  c->set_max_batch_size(b.max_batch_size);
  for (const TensorSpec& s : model.signature().inputs) {
    auto* in = c->add_input();
    in->set_name(s.name);
    in->set_data_type(ConfigType(s.type));
    for (int64_t d : s.dims) in->add_dims(d);
  }
  for (const TensorSpec& s : model.signature().outputs) {
    auto* out = c->add_output();
    out->set_name(s.name);
    out->set_data_type(ConfigType(s.type));
    for (int64_t d : s.dims) out->add_dims(d);
  }
  auto* g = c->add_instance_group();
  g->set_name("instance");
  g->set_kind(inference::ModelInstanceGroup::KIND_CPU);
  g->set_count(b.instance_count);
  if (b.dynamic_batching) {
    const DynamicBatchingOptions& d = *b.dynamic_batching;
    auto* db = c->mutable_dynamic_batching();
    for (int p : d.preferred_batch_sizes) db->add_preferred_batch_size(p);
    db->set_max_queue_delay_microseconds(static_cast<uint64_t>(d.max_queue_delay_us));
    db->set_priority_levels(static_cast<uint64_t>(d.priority_levels));
    db->set_default_priority_level(static_cast<uint64_t>(d.default_priority_level));
    FillPolicy(d.default_queue_policy, db->mutable_default_queue_policy());
    for (const auto& [level, p] : d.priority_queue_policy) {
      FillPolicy(p, &(*db->mutable_priority_queue_policy())[static_cast<uint64_t>(level)]);
    }
  }
  c->mutable_model_transaction_policy()->set_decoupled(false);
  c->mutable_response_cache()->set_enable(false);
}

void FillModelStatistics(const ServedModel& m, inference::ModelStatistics* out) {
  const ModelStats s = m.Stats();
  out->set_name(m.name());
  out->set_version(m.version());
  out->set_last_inference(s.last_inference_ms);
  out->set_inference_count(s.inference_count);
  out->set_execution_count(s.execution_count);
  auto* is = out->mutable_inference_stats();
  SetDuration(s.success, is->mutable_success());
  SetDuration(s.fail, is->mutable_fail());
  SetDuration(s.queue, is->mutable_queue());
  SetDuration(s.compute_input, is->mutable_compute_input());
  SetDuration(s.compute_infer, is->mutable_compute_infer());
  SetDuration(s.compute_output, is->mutable_compute_output());
  SetDuration(s.cache_hit, is->mutable_cache_hit());
  SetDuration(s.cache_miss, is->mutable_cache_miss());
  for (const auto& [rows, b] : s.batch_stats) {
    auto* bs = out->add_batch_stats();
    bs->set_batch_size(static_cast<uint64_t>(rows));
    SetDuration(b.compute_input, bs->mutable_compute_input());
    SetDuration(b.compute_infer, bs->mutable_compute_infer());
    SetDuration(b.compute_output, bs->mutable_compute_output());
  }
}

}  // namespace stoke
