// Small helpers shared by subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model/factory.h"
#include "tools/precision/calibration.h"

namespace CLI {
class App;
}

namespace stoke {

// `--ids` argument: a JSON array of token ids, or `@FILE` holding one.
StatusOr<std::vector<int32_t>> ParseIdsArg(const std::string& arg);

// The decoder's kernel-choice knobs (DecoderOptions::ggml_compatible_numerics and CudaDecoderTuning,
// engine/model/factory.h, which owns the defaults), shared by serve, generate, score and bench step.
// Documented in docs/api.md "Engine knobs".
struct EngineTuningFlags {
  std::string ggml_numerics = "on";  // on | off
  std::string gemm_cache = CudaDecoderTuning{}.gemm_cache_path;
  int gemv_max_rows = CudaDecoderTuning{}.gemv_max_rows;
  int fp8_gemv_max_rows = CudaDecoderTuning{}.fp8_gemv_max_rows;
  int gemv_split = CudaDecoderTuning{}.gemv_split;
  std::string pdl = CudaDecoderTuning{}.pdl;
  int decode_min_partition = CudaDecoderTuning{}.decode_min_partition;
  int decode_partition = CudaDecoderTuning{}.decode_partition;
  int decode_stages = CudaDecoderTuning{}.decode_stages;
  std::string decode_pipeline = CudaDecoderTuning{}.decode_pipeline ? "on" : "off";
  std::string decode_attention = CudaDecoderTuning{}.decode_attention;
  std::string prefill_attention = CudaDecoderTuning{}.prefill_attention;
  std::string mixed_attention = CudaDecoderTuning{}.mixed_attention;
  std::string kquant_gemv = CudaDecoderTuning{}.kquant_gemv;
  std::string vector_elementwise = CudaDecoderTuning{}.vector_elementwise ? "on" : "off";
  // Not a kernel choice but a precision (DecoderOptions::kv_cache): carried here so that every command with
  // the engine knobs has it. docs/precision.md.
  std::string kv_cache_dtype = "auto";  // auto | bf16 | int8 | fp8
  std::string quantization = "none";    // none | fp8 | int8 (decoders refuse int8; encoders need calibration)
};
void AddEngineTuningFlags(CLI::App* cmd, EngineTuningFlags* flags);
// Copies the flags into `o` (InvalidArgument naming the flag when a value is out of range).
Status ApplyEngineTuningFlags(const EngineTuningFlags& flags, DecoderOptions* o);

// --encoder-attention (BertDeviceOptions::attention), shared by serve and embed.
void AddEncoderAttentionFlag(CLI::App* cmd, std::string* attention);
// --encoder-epilogues (BertDeviceOptions::epilogues), shared by serve and embed.
void AddEncoderEpiloguesFlag(CLI::App* cmd, std::string* epilogues);
// --encoder-cuda-graphs on|off (BertDeviceOptions::cuda_graphs), shared by serve and embed.
void AddEncoderCudaGraphsFlag(CLI::App* cmd, std::string* on_off);

// --calibration-data and --calibration-percentile (encoders at --quantization int8), shared by serve, embed
// and model check.
void AddCalibrationFlags(CLI::App* cmd, precision::Int8CalibrationOptions* calibration);

// --device, --gpu-memory-fraction and --cuda-graphs, shared by serve, generate and score, plus the engine
// tuning flags above.
struct DeviceFlags {
  std::string device = "auto";  // auto | cpu | cuda
  double gpu_memory_fraction = 0.90;
  std::string cuda_graphs = "on";  // on | off
  EngineTuningFlags tuning;
};
void AddDeviceFlags(CLI::App* cmd, DeviceFlags* flags);
// The decoder options the flags ask for (InvalidArgument naming the flag when a value is out of range).
StatusOr<DecoderOptions> DecoderOptionsFromFlags(const DeviceFlags& flags);

}  // namespace stoke
