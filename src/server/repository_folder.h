// `stoke serve --model-repository DIR`: one folder per model, read once at start-up.
//
//   DIR/
//     chat/                       served as "chat" (the folder's name, unless stoke.toml says `name`)
//       model.gguf                the model: one *.gguf file, a model file model.json, one *.onnx file, or
//       stoke.toml                an HF folder's files (config.json ...), in that order; or `source` in
//     minilm/                     stoke.toml (an alias or a path, relative paths from the folder)
//       stoke.toml                source = "all-minilm-l6-v2"
//
// stoke.toml keys (all optional; `-` and `_` are the same in names):
//   name = "chat"                 served name
//   source = "all-minilm-l6-v2"   alias or path of the model (default: the folder's own files)
//   kind = "decoder"              decoder | encoder | image | synthetic (default: from the model)
//   device = "cuda"               auto | cpu | cuda
//   gpu_memory_fraction = 0.4     decoders on CUDA: this model's share of the GPU's memory
//   kv_cache_bytes = 268435456    decoders: the KV cache's budget
//   kv_cache_dtype = "int8"       decoders: auto | bf16 | int8 | fp8 (checked at load: docs/precision.md)
//   quantization = "fp8"          weights none | fp8 (decoders, encoders) | int8 (encoders; checked at load:
//                                 docs/precision.md)
//   calibration_data = "calib.txt"  encoders at int8: calibration samples, one per line (relative: from the
//                                 folder)
//   instances = 2                 batched models: instances
//   max_batch_size = 16           batched models: largest batch
//   max_queue_delay_us = 500      batched models: dynamic batching's delay
//   load = false                  not loaded at start (POST /v2/repository/models/NAME/load loads it)
// Folders whose name starts with '.' are skipped; any other key is an error that names the file.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "server/server_options.h"

namespace stoke {

// The models of `dir`, in folder-name order. InvalidArgument names the folder or file at fault.
StatusOr<std::vector<ModelSettings>> ReadRepositoryFolder(const std::string& dir);

}  // namespace stoke
