#include "engine/model/factory.h"

#include "base/logging.h"
#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"
#include "engine/model/backends.h"
#include "engine/model/device_choice.h"
#include "engine/model/llama.h"
#include "engine/model/weight_quant.h"

namespace stoke {
namespace {

StatusOr<LlamaWeights> LoadWeights(const std::string& path) {
  ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  if (format == ModelFormat::kGguf) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    return LoadLlamaWeights(std::shared_ptr<const GgufFile>(std::move(gguf)));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HfFolder> folder, HfFolder::Open(path));
  return LoadLlamaWeights(std::shared_ptr<const HfFolder>(std::move(folder)));
}

// --quantization fp8 on the CPU (weight_quant.h): the matrices become F32, which every CPU matmul takes, so
// ggml-compatible numerics stay on for the rest of the model (norms, RoPE, attention); the matmuls then run
// stoke's fp32 kernel instead of ggml's quantised-activation ones.
Status QuantizeCpuWeightsFp8(LlamaWeights* weights, const DecoderOptions& options) {
  RETURN_IF_ERROR(QuantizeLlamaWeightsFp8(weights, {.pool = options.pool}));
  LOG_INFO(
      "cpu: --quantization fp8: projections and lm_head rounded to E4M3 with a scale per output row, "
      "held as fp32 ({} layers){}",
      weights->layers.size(),
      weights->from_gguf && options.ggml_compatible_numerics ? "; their matmuls leave ggml's numerics" : "");
  return OkStatus();
}

}  // namespace

std::string ResolveDecoderDevice(const std::string& device, const Backends& backends) {
  if (device != "auto") return device;
  return backends.cuda_usable() ? "cuda" : "cpu";
}

Status ValidateCudaDecoderTuning(const CudaDecoderTuning& t) {
  if (t.gemv_max_rows < 0 || t.gemv_max_rows > 8) {
    return InvalidArgumentError("--gemv-max-rows {} must be in [0, 8]", t.gemv_max_rows);
  }
  if (t.fp8_gemv_max_rows < 0 || t.fp8_gemv_max_rows > 8) {
    return InvalidArgumentError("--fp8-gemv-max-rows {} must be in [0, 8]", t.fp8_gemv_max_rows);
  }
  if (t.gemv_split != 0 && t.gemv_split != 1 && t.gemv_split != 2 && t.gemv_split != 4 && t.gemv_split != 8) {
    return InvalidArgumentError("--gemv-split {} must be 0 (auto), 1, 2, 4 or 8", t.gemv_split);
  }
  if (t.decode_min_partition < 1 || t.decode_min_partition > 512) {
    return InvalidArgumentError("--decode-min-partition {} must be in [1, 512]", t.decode_min_partition);
  }
  if (t.decode_partition < t.decode_min_partition || t.decode_partition > 65536) {
    return InvalidArgumentError("--decode-partition {} must be in [--decode-min-partition {}, 65536]",
                                t.decode_partition, t.decode_min_partition);
  }
  if (t.pdl != "auto" && t.pdl != "on" && t.pdl != "off") {
    return InvalidArgumentError("--pdl '{}': expected auto, on or off", t.pdl);
  }
  if (t.decode_stages < 2 || t.decode_stages > 4) {
    return InvalidArgumentError("--decode-stages {} must be 2, 3 or 4", t.decode_stages);
  }
  if (t.decode_attention != "warp" && t.decode_attention != "tiled" && t.decode_attention != "tiled-smem") {
    return InvalidArgumentError("--decode-attention '{}': expected tiled, tiled-smem or warp",
                                t.decode_attention);
  }
  if (t.prefill_attention != "auto" && t.prefill_attention != "warp") {
    return InvalidArgumentError("--prefill-attention '{}': expected auto or warp", t.prefill_attention);
  }
  if (t.mixed_attention != "split" && t.mixed_attention != "prefill") {
    return InvalidArgumentError("--mixed-attention '{}': expected split or prefill", t.mixed_attention);
  }
  if (t.kquant_gemv != "auto" && t.kquant_gemv != "fp32" && t.kquant_gemv != "int8") {
    return InvalidArgumentError("--kquant-gemv '{}': expected auto, fp32 or int8", t.kquant_gemv);
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, const DecoderOptions& options,
                                                    const Backends& backends) {
  RETURN_IF_ERROR(ValidateCudaDecoderTuning(options.cuda));
  if (options.quantization == WeightQuantization::kInt8) {
    return UnimplementedError(
        "--quantization int8 is for BERT-family encoders; a decoder's weights can be none or fp8 "
        "(--quantization fp8), and its KV cache int8 or fp8 (--kv-cache-dtype int8|fp8)");
  }
  const DecoderBackend& b = backends.cuda_decoder;
  ASSIGN_OR_RETURN(const std::string device, ResolveBackendDevice(options.device, b.create != nullptr,
                                                                  b.available, "--device cuda:", "--device cpu"));
  ASSIGN_OR_RETURN(LlamaWeights weights, LoadWeights(path));
  // A pre-quantised FP8 checkpoint runs as fp8 whatever --quantization says: its weights are fp8 values.
  DecoderOptions opts = options;
  const LlamaWeights::Fp8Checkpoint& ck = weights.fp8_checkpoint;
  if (ck.total() > 0) {
    const std::string what = fmt::format(
        "{}: pre-quantised FP8 checkpoint{}: {} fp8 matrices ({} per-tensor, {} per-channel, {} per-block scales)",
        path, ck.method.empty() ? "" : " (" + ck.method + ")", ck.total(), ck.matrices[0], ck.matrices[1],
        ck.matrices[2]);
    if (device != "cuda") {
      LOG_INFO("{}; the CPU multiplies their values in fp32", what);
    } else if (ck.matrices[2] == 0) {
      LOG_INFO("{}; their codes and scales go to the device as they are", what);
    } else {  // per-block scales: dequantised at load, then one scale per output row on the device
      LOG_WARN(
          "{}; the device keeps one scale per output row, so the {} per-block matrices are dequantised and "
          "round a second time (docs/precision.md)",
          what, ck.matrices[2]);
    }
    opts.quantization = WeightQuantization::kFp8;
  }
  // The CUDA engine quantises its own device copies (options.quantization); the CPU rounds the weights here.
  if (device == "cuda") return backends.cuda_decoder.create(std::move(weights), opts);
  const bool ggml = options.ggml_compatible_numerics && weights.from_gguf;
  if (options.quantization == WeightQuantization::kFp8 && ck.total() == 0)
    RETURN_IF_ERROR(QuantizeCpuWeightsFp8(&weights, options));
  ASSIGN_OR_RETURN(std::unique_ptr<CpuLlama> model,
                   CpuLlama::Create(std::move(weights), options.pool, ggml, options.kv_cache));
  return std::unique_ptr<DecoderModel>(std::move(model));
}

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool) {
  DecoderOptions options;
  options.pool = pool;
  return LoadDecoder(path, options, CpuBackends());
}

}  // namespace stoke
