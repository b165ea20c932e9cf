#include "engine/model/factory.h"

#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"
#include "engine/model/backends.h"
#include "engine/model/llama.h"

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

}  // namespace

std::string ResolveDecoderDevice(const std::string& device, const Backends& backends) {
  if (device != "auto") return device;
  return backends.cuda_usable() ? "cuda" : "cpu";
}

Status ValidateCudaDecoderTuning(const CudaDecoderTuning& t) {
  if (t.gemv_max_rows < 0 || t.gemv_max_rows > 8) {
    return InvalidArgumentError("--gemv-max-rows {} must be in [0, 8]", t.gemv_max_rows);
  }
  if (t.gemv_split != 0 && t.gemv_split != 1 && t.gemv_split != 2 && t.gemv_split != 4 && t.gemv_split != 8) {
    return InvalidArgumentError("--gemv-split {} must be 0 (auto), 1, 2, 4 or 8", t.gemv_split);
  }
  if (t.decode_min_partition < 1 || t.decode_min_partition > 512) {
    return InvalidArgumentError("--decode-min-partition {} must be in [1, 512]", t.decode_min_partition);
  }
  if (t.prefill_attention != "auto" && t.prefill_attention != "warp") {
    return InvalidArgumentError("--prefill-attention '{}': expected auto or warp", t.prefill_attention);
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, const DecoderOptions& options,
                                                    const Backends& backends) {
  RETURN_IF_ERROR(ValidateCudaDecoderTuning(options.cuda));
  const std::string device = ResolveDecoderDevice(options.device, backends);
  if (device != "cpu" && device != "cuda") {
    return InvalidArgumentError("unknown device '{}' (expected cpu, cuda or auto)", options.device);
  }
  if (device == "cuda") {
    const DecoderBackend& b = backends.cuda_decoder;
    if (b.create == nullptr) {
      return FailedPreconditionError("--device cuda: this stoke was built without CUDA (configure with the "
                                     "release-cuda preset on a machine with nvcc)");
    }
    if (b.available != nullptr && !b.available()) {
      return FailedPreconditionError("--device cuda: no CUDA GPU is visible (driver missing or "
                                     "CUDA_VISIBLE_DEVICES empty); use --device cpu");
    }
  }
  ASSIGN_OR_RETURN(LlamaWeights weights, LoadWeights(path));
  if (device == "cuda") return backends.cuda_decoder.create(std::move(weights), options);
  const bool ggml = options.ggml_compatible_numerics && weights.from_gguf;
  ASSIGN_OR_RETURN(std::unique_ptr<CpuLlama> model, CpuLlama::Create(std::move(weights), options.pool, ggml));
  return std::unique_ptr<DecoderModel>(std::move(model));
}

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool) {
  DecoderOptions options;
  options.pool = pool;
  return LoadDecoder(path, options, CpuBackends());
}

}  // namespace stoke
