#include "apps/stoke/cli_util.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/file_util.h"

namespace stoke {

StatusOr<std::vector<int32_t>> ParseIdsArg(const std::string& arg) {
  std::string text = arg;
  if (!arg.empty() && arg[0] == '@') {
    ASSIGN_OR_RETURN(text, ReadFileToString(arg.substr(1)));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return InvalidArgumentError("--ids: expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer()) return InvalidArgumentError("--ids: every element must be an integer");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

void AddDeviceFlags(CLI::App* cmd, DeviceFlags* flags) {
  cmd->add_option("--device", flags->device,
                  "auto (cuda when this build has CUDA and a GPU is visible, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--gpu-memory-fraction", flags->gpu_memory_fraction,
                  "cuda: fraction of the GPU's memory for weights, activations and the KV cache")
      ->capture_default_str();
  cmd->add_option("--cuda-graphs", flags->cuda_graphs, "cuda: replay decode steps as CUDA graphs (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  AddEngineTuningFlags(cmd, &flags->tuning);
}

void AddEngineTuningFlags(CLI::App* cmd, EngineTuningFlags* flags) {
  cmd->add_option(
         "--ggml-numerics", flags->ggml_numerics,
         "cpu, GGUF: compute in ggml's order and precision, logits equal to llama.cpp's (on|off; off: "
         "stoke's own, slightly faster kernels)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option(
      "--gemm-cache", flags->gemm_cache,
      "cuda: cuBLASLt algorithm cache file, read at start and written as shapes are tuned (empty: "
      "in memory only)");
  cmd->add_option(
         "--gemv-max-rows", flags->gemv_max_rows,
         "cuda: steps of at most this many tokens use the GEMV (bf16, fp8 or GGUF Q8_0 weights) instead of "
         "cuBLASLt (0..8; 0: always cuBLASLt)")
      ->capture_default_str();
  cmd->add_option("--fp8-gemv-max-rows", flags->fp8_gemv_max_rows,
                  "cuda, --quantization fp8: steps of at most this many tokens run the layers' projections "
                  "through the fp8 GEMV (tensor cores at 2-8 rows) instead of quantising the activations for "
                  "cuBLASLt's FP8 GEMM (0..8; 0: never; the lm_head follows --gemv-max-rows)")
      ->capture_default_str();
  cmd->add_option("--gemv-split", flags->gemv_split,
                  "cuda: warps per output row in the one-token GEMVs (0: auto, 1, 2, 4, 8)")
      ->capture_default_str();
  cmd->add_option(
         "--pdl", flags->pdl,
         "cuda: launch the decode step's kernels (GEMVs, norms, RoPE + cache write, decode attention "
         "and its merge) with programmatic dependent launch: auto (in steps of at most --gemv-max-rows "
         "tokens, with fp8 weights --fp8-gemv-max-rows when larger: the GEMV steps), on (every step) or off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--decode-min-partition", flags->decode_min_partition,
                  "cuda: fewest context positions per split of decode attention (1..512; the tensor-core "
                  "kernel, the default, takes at least 64)")
      ->capture_default_str();
  cmd->add_option("--decode-partition", flags->decode_partition,
                  "cuda: most context positions per split of decode attention at large batch "
                  "(--decode-min-partition..65536)")
      ->capture_default_str();
  cmd->add_option("--decode-pipeline", flags->decode_pipeline,
                  "cuda: decode attention prefetches the next position's K/V (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option(
         "--decode-attention", flags->decode_attention,
         "cuda: decode attention kernel: tiled (tensor cores, a GQA group's query heads as one tile's "
         "rows; over an 8-bit cache each warp converts its own keys' codes straight into registers), "
         "tiled-smem (the same, but the block widens an 8-bit cache's codes to bf16 in shared memory: "
         "slower, for A/B; a bf16 cache runs tiled) or warp (a warp per position, CUDA cores)")
      ->check(CLI::IsMember({"warp", "tiled", "tiled-smem"}))
      ->capture_default_str();
  cmd->add_option(
         "--decode-stages", flags->decode_stages,
         "cuda: tiles of 16 keys per warp in the cp.async pipeline of the tiled decode attention over "
         "an 8-bit KV cache (2, 3 or 4; 2: double buffering, more: more KV bytes in flight for more "
         "shared memory)")
      ->capture_default_str();
  cmd->add_option(
         "--prefill-attention", flags->prefill_attention,
         "cuda: prefill attention kernel: auto (tensor-core tiled where it applies) or warp (simple, "
         "slow)")
      ->check(CLI::IsMember({"auto", "warp"}))
      ->capture_default_str();
  cmd->add_option("--mixed-attention", flags->mixed_attention,
                  "cuda: a step of decodes and prefill chunks: split (the decodes' attention in the decode "
                  "kernel, the chunks in the prefill kernel) or prefill (every sequence in the prefill "
                  "kernel, for A/B)")
      ->check(CLI::IsMember({"split", "prefill"}))
      ->capture_default_str();
  cmd->add_option(
         "--kquant-gemv", flags->kquant_gemv,
         "cuda, GGUF Q4_K / Q6_K weights, 1-token steps: fp32 (each weight an exact fp32 times the bf16 "
         "activations), int8 (activations quantised per 32 values as the CPU engine and llama.cpp do, "
         "integer block dots) or auto (int8 for Q4_K and for Q6_K matrices of >= 8192 rows, fp32 for the "
         "other Q6_K ones: the faster per shape on an H200)")
      ->check(CLI::IsMember({"auto", "fp32", "int8"}))
      ->capture_default_str();
  cmd->add_option(
         "--vector-elementwise", flags->vector_elementwise,
         "cuda: the SwiGLU and the fp8 activation quantiser move 8 values per thread access "
         "(16-byte loads) instead of one, the RoPE + cache write takes a warp per head "
         "instead of a block: the same values (on|off; on: 3 % less model time per step at c=512 on an H200)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option(
         "--kv-cache-dtype", flags->kv_cache_dtype,
         "KV cache storage: auto (fp32 on cpu, bf16 on cuda), bf16, int8 or fp8 (8 bits with a scale per "
         "token and KV head; docs/precision.md)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8"}))
      ->capture_default_str();
  cmd->add_option(
         "--quantization", flags->quantization,
         "Weight precision: none (the checkpoint's: bf16 on cuda, fp32 on cpu), fp8 (E4M3, one scale "
         "per output channel) or int8 (encoders only, with --calibration-data; docs/precision.md)")
      ->check(CLI::IsMember({"none", "fp8", "int8"}))
      ->capture_default_str();
}

Status ApplyEngineTuningFlags(const EngineTuningFlags& flags, DecoderOptions* o) {
  for (const auto& [name, value] : {std::pair{"--ggml-numerics", &flags.ggml_numerics},
                                    std::pair{"--decode-pipeline", &flags.decode_pipeline},
                                    std::pair{"--vector-elementwise", &flags.vector_elementwise}}) {
    if (*value != "on" && *value != "off")
      return InvalidArgumentError("{} {}: expected on or off", name, *value);
  }
  o->ggml_compatible_numerics = flags.ggml_numerics == "on";
  ASSIGN_OR_RETURN(o->kv_cache.dtype, ParseKvCacheDtype(flags.kv_cache_dtype));
  ASSIGN_OR_RETURN(o->quantization, ParseWeightQuantization(flags.quantization));
  CudaDecoderTuning& t = o->cuda;
  t.gemm_cache_path = flags.gemm_cache;
  t.gemv_max_rows = flags.gemv_max_rows;
  t.fp8_gemv_max_rows = flags.fp8_gemv_max_rows;
  t.gemv_split = flags.gemv_split;
  t.pdl = flags.pdl;
  t.decode_min_partition = flags.decode_min_partition;
  t.decode_partition = flags.decode_partition;
  t.decode_pipeline = flags.decode_pipeline == "on";
  t.decode_attention = flags.decode_attention;
  t.decode_stages = flags.decode_stages;
  t.prefill_attention = flags.prefill_attention;
  t.mixed_attention = flags.mixed_attention;
  t.kquant_gemv = flags.kquant_gemv;
  t.vector_elementwise = flags.vector_elementwise == "on";
  return ValidateCudaDecoderTuning(t);
}

void AddEncoderAttentionFlag(CLI::App* cmd, std::string* attention) {
  cmd->add_option("--encoder-attention", *attention,
                  "cuda, encoders: attention kernel: auto (the first of tensor, vectorized that agrees with "
                  "simple at load; tensor with 32 query rows per warp for large calls), tensor32 (tensor "
                  "cores, 32 query rows per warp; head_dim <= 64), tensor, "
                  "vectorized or simple")
      ->check(CLI::IsMember({"auto", "tensor32", "tensor", "vectorized", "simple"}))
      ->capture_default_str();
}

void AddEncoderEpiloguesFlag(CLI::App* cmd, std::string* epilogues) {
  cmd->add_option(
         "--encoder-epilogues", *epilogues,
         "cuda, encoders: fused-tanh (biases and the FFN's GELU in cuBLASLt's epilogue, GELU's tanh "
         "approximation; bf16 residual, residual + LayerNorm one kernel), fused (the same with BERT's "
         "exact erf GELU as a kernel) or separate (bias, GELU, LayerNorm kernels after each GEMM, fp32 "
         "residual)")
      ->check(CLI::IsMember({"fused", "fused-tanh", "separate"}))
      ->capture_default_str();
}

void AddEncoderCudaGraphsFlag(CLI::App* cmd, std::string* on_off) {
  cmd->add_option("--encoder-cuda-graphs", *on_off,
                  "cuda, encoders: replay a CUDA graph for a batch shape (tokens, sequences) seen before instead "
                  "of launching each kernel: on or off (on: 1.8x at batch 1 on BERT-base, the same from batch 32; docs/cuda.md)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

void AddCalibrationFlags(CLI::App* cmd, precision::Int8CalibrationOptions* calibration) {
  cmd->add_option(
      "--calibration-data", calibration->data,
      "Encoders at --quantization int8: a text file of representative samples, one per line, that "
      "the unquantised encoder runs over to measure the int8 activations' smoothing factors (and static "
      "scales) (docs/precision.md)");
  cmd->add_option("--calibration-percentile", calibration->percentile,
                  "--calibration-data with --int8-activations static: each activation scale clips |x| at "
                  "this percentile of the values calibration saw (100 = their maximum)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option(
         "--calibration-smoothing", calibration->smoothing_alpha,
         "--calibration-data: SmoothQuant's alpha, how much of each activation channel's range moves "
         "into the weights before the int8 scales are taken (0 = none)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--int8-activations",
         [calibration](const std::string& s) { calibration->activations = *ParseInt8Activations(s); },
         "Encoders at --quantization int8: per-token (each GEMM input row quantised with its own scale "
         "at run time, the GELU output centred on its range; passes the gate on all-MiniLM-L6-v2) or static "
         "(one scale per "
         "GEMM input from --calibration-percentile; fails it there) (docs/precision.md)")
      ->check(CLI::IsMember({"per-token", "static"}))
      ->default_str(std::string(Int8ActivationsName(calibration->activations)));
}

StatusOr<DecoderOptions> DecoderOptionsFromFlags(const DeviceFlags& flags) {
  if (!(flags.gpu_memory_fraction > 0.0 && flags.gpu_memory_fraction <= 1.0)) {
    return InvalidArgumentError("--gpu-memory-fraction {} must be in (0, 1]", flags.gpu_memory_fraction);
  }
  if (flags.device != "auto" && flags.device != "cpu" && flags.device != "cuda") {
    return InvalidArgumentError("--device {}: expected auto, cpu or cuda", flags.device);
  }
  DecoderOptions o;
  o.device = flags.device;
  o.gpu_memory_fraction = flags.gpu_memory_fraction;
  o.cuda_graphs = flags.cuda_graphs != "off";
  RETURN_IF_ERROR(ApplyEngineTuningFlags(flags.tuning, &o));
  return o;
}

}  // namespace stoke
