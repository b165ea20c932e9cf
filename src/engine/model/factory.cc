#include "engine/model/factory.h"

#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"
#include "engine/model/llama.h"

namespace stoke {

StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool) {
  ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(path));
  LlamaWeights weights;
  if (format == ModelFormat::kGguf) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
    ASSIGN_OR_RETURN(weights, LoadLlamaWeights(std::shared_ptr<const GgufFile>(std::move(gguf))));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<HfFolder> folder, HfFolder::Open(path));
    ASSIGN_OR_RETURN(weights, LoadLlamaWeights(std::shared_ptr<const HfFolder>(std::move(folder))));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CpuLlama> model, CpuLlama::Create(std::move(weights), pool));
  return std::unique_ptr<DecoderModel>(std::move(model));
}

}  // namespace stoke
