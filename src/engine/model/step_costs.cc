#include "engine/model/step_costs.h"

#include <algorithm>
#include <vector>

#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"

namespace stoke {

bool CudaGemvReadsBlocks(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_1 || t == DType::kQ4_K || t == DType::kQ6_K;
}

StatusOr<double> FileBytesPerParam(const std::string& path, bool cuda_decode) {
  ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  double bytes = 0, params = 0;
  auto add = [&](const std::vector<TensorRef>& ts) {
    for (const TensorRef& t : ts) {
      if (t.shape.size() != 2) continue;
      const double n = static_cast<double>(t.numel());
      bytes += !cuda_decode || CudaGemvReadsBlocks(t.dtype) ? static_cast<double>(t.nbytes) : 2.0 * n;
      params += n;
    }
  };
  if (format == ModelFormat::kGguf) {
    ASSIGN_OR_RETURN(auto g, GgufFile::Open(path));
    add(g->tensors());
  } else {
    ASSIGN_OR_RETURN(auto hf, HfFolder::Open(path));
    add(hf->tensors());
  }
  if (params == 0) return InvalidArgumentError("{}: no 2-D weight tensors", path);
  return bytes / params;
}

StatusOr<DecoderStepCosts> ComputeDecoderStepCosts(const DecoderModel& model, const std::string& path) {
  const LlamaConfig& c = model.config();
  const int64_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, L = c.num_layers;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  DecoderStepCosts k;
  k.matmul_params = L * (H * qd + 2 * H * kvd + qd * H + 3 * H * F);
  k.other_params = L * (2 * H + (c.attention_bias ? qd + 2 * kvd : 0)) + H;
  k.lm_head_params = V * H;

  const bool cuda = model.device_name().rfind("cuda", 0) == 0;
  const bool fp8 = model.quantization_name() == "fp8";
  k.bytes_per_param = k.lm_head_bytes_per_param = 2.0;
  if (cuda && fp8) {
    k.bytes_per_param = 1.0;
  } else if (!cuda && fp8) {
    k.bytes_per_param = k.lm_head_bytes_per_param = 4.0;
  } else {
    ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
    if (!cuda || format == ModelFormat::kGguf) {
      ASSIGN_OR_RETURN(double file_bytes, FileBytesPerParam(path, /*cuda_decode=*/cuda));
      k.bytes_per_param = k.lm_head_bytes_per_param = file_bytes;
    }
  }
  k.lm_head_bytes = k.lm_head_bytes_per_param * static_cast<double>(k.lm_head_params);
  k.weight_bytes = k.bytes_per_param * static_cast<double>(k.matmul_params) + k.lm_head_bytes +
                   4.0 * static_cast<double>(k.other_params);
  k.kv_bytes_per_token = model.KvBytesPerToken();
  k.attention_flops_per_pair = 4.0 * static_cast<double>(L) * c.num_heads * c.head_dim;
  return k;
}

}  // namespace stoke
