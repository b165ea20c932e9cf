// Builds the right decoder for a model path: a GGUF file or an HF folder holding a Llama-family model.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model/decoder.h"

namespace stoke {

// `path` is a GGUF file or an HF folder (already resolved: see loader/model_registry.h ResolveModel).
// The model computes on `pool` (null = ThreadPool::Default()). Errors name the file and what is wrong.
StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool = nullptr);

}  // namespace stoke
