#include "engine/model/factory.h"

#include <cstdlib>
#include <cstring>

#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"
#include "engine/model/llama.h"

namespace stoke {
namespace {

DecoderBackend& CudaBackend() {
  static DecoderBackend backend;
  return backend;
}

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

void RegisterCudaDecoderBackend(DecoderBackend backend) { CudaBackend() = backend; }

std::string ResolveDecoderDevice(const std::string& device) {
  if (device != "auto") return device;
  const DecoderBackend& b = CudaBackend();
  return b.create != nullptr && b.available != nullptr && b.available() ? "cuda" : "cpu";
}

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, const DecoderOptions& options) {
  const std::string device = ResolveDecoderDevice(options.device);
  if (device != "cpu" && device != "cuda") {
    return InvalidArgumentError("unknown device '{}' (expected cpu, cuda or auto)", options.device);
  }
  if (device == "cuda") {
    const DecoderBackend& b = CudaBackend();
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
  if (device == "cuda") return CudaBackend().create(std::move(weights), options);
  const char* env = std::getenv("STOKE_GGML_NUMERICS");
  const bool ggml = options.ggml_compatible_numerics && weights.from_gguf &&
                    !(env != nullptr && std::strcmp(env, "0") == 0);
  ASSIGN_OR_RETURN(std::unique_ptr<CpuLlama> model, CpuLlama::Create(std::move(weights), options.pool, ggml));
  return std::unique_ptr<DecoderModel>(std::move(model));
}

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool) {
  DecoderOptions options;
  options.pool = pool;
  return LoadDecoder(path, options);
}

}  // namespace stoke
