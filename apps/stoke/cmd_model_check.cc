// stoke model check: is the model at a lower precision consistent with the same model at its reference
// precision, on the same device? (tools/precision/gate.h; thresholds and metrics in docs/precision.md)
//
//   stoke model check --model M [--kv-cache-dtype auto|bf16|int8|fp8] [--quantization none|fp8|int8]
//       [--reference R] [--calibration-data FILE] [--data FILE] [--device cpu|cuda] [--tokens N]
//       [--greedy-prompts N] [--greedy-tokens N] [--json FILE]
//
// --reference R (decoders): the reference is another file, R at its own precision (a pre-quantised FP8
// checkpoint against the bf16 checkpoint it came from), and M may be at its own precision too.
//
// Decoders: teacher-forced top-1 agreement, mean KL, perplexity of both and greedy-text agreement over the
// first N tokens of the text (default the GPL-3 licence text; N default 256 on the CPU, 4096 on CUDA).
// Encoders: cosine of the embeddings of the text's sentences, the encoder on --device at --quantization
// against the CPU's fp32 one. Exit 0 pass, 1 fail (or the gate could not run), 2 usage.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/stoke/cli_util.h"
#include "apps/stoke/model_check_cli.h"
#include "base/file_util.h"
#include "base/thread_pool.h"
#include "engine/loader/model_registry.h"
#include "engine/model/backends.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/model/factory.h"
#include "engine/model/fp8_checkpoint.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/precision/encoder_gate.h"
#include "tools/precision/gate.h"
#include "tools/precision/text_chunker.h"

namespace stoke {
namespace {

struct CheckCliOptions {
  std::string model;
  std::string reference;              // "" = --model at its reference precision
  std::string data;                   // "" = precision::kDefaultGateText
  int tokens = 0;                     // 0 = 256 on the CPU, 4096 on CUDA
  int greedy_prompts = precision::DecoderGateOptions{}.greedy_prompts;
  int greedy_tokens = precision::DecoderGateOptions{}.greedy_tokens;
  int sentences = precision::EncoderGateOptions{}.sentences;
  int threads = 0;
  std::string json_out;
  DeviceFlags device;  // --device and the engine knobs, --kv-cache-dtype and --quantization among them
  precision::Int8CalibrationOptions calibration;  // encoders at --quantization int8
};

bool IsEncoderFolder(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return false;
  auto text = ReadFileToString((std::filesystem::path(dir) / "config.json").string());
  if (!text.ok()) return false;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object()) return false;
  if (j.value("model_type", "") == "bert") return true;
  if (j.contains("architectures") && j["architectures"].is_array()) {
    for (const auto& a : j["architectures"]) {
      if (a.is_string() && a.get<std::string>().starts_with("Bert")) return true;
    }
  }
  return false;
}

// `o` with --quantization none: what is left to compare on a pre-quantised FP8 checkpoint (its KV cache).
DecoderOptions ReferenceOptionsKeepingKv(DecoderOptions o) {
  o.quantization = WeightQuantization::kNone;
  return o;
}

StatusOr<precision::GateReport> CheckDecoder(const CheckCliOptions& o, const std::string& path,
                                             const std::string& text, const Backends& backends) {
  if (!o.calibration.data.empty()) {
    return InvalidArgumentError(
        "--calibration-data: {} is a decoder; calibration is for encoders at "
        "--quantization int8",
        path);
  }
  ASSIGN_OR_RETURN(DecoderOptions cand, DecoderOptionsFromFlags(o.device));
  cand.device = ResolveDecoderDevice(cand.device, backends);
  const DecoderOptions ref = precision::ReferenceOptions(cand);
  std::string ref_path = path;
  if (!o.reference.empty()) {
    ASSIGN_OR_RETURN(ref_path, ResolveModel(o.reference));
  } else if (IsFp8CheckpointFolder(path) && !precision::DiffersFromReference(
                                                ReferenceOptionsKeepingKv(cand), cand.device)) {
    return InvalidArgumentError(
        "nothing to compare: {} is a pre-quantised FP8 checkpoint, which loads as fp8 at every --quantization; "
        "compare it with the model it came from (--reference ORIGINAL), or give a --kv-cache-dtype",
        path);
  } else if (!precision::DiffersFromReference(cand, cand.device)) {
    return InvalidArgumentError(
        "nothing to compare: --quantization none with --kv-cache-dtype {} is the reference precision on {} "
        "(give --quantization fp8, --kv-cache-dtype bf16, int8 or fp8, or --reference MODEL)",
        KvCacheDtypeName(cand.kv_cache.dtype), cand.device);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  precision::DecoderGateOptions g;
  g.tokens = o.tokens > 0 ? o.tokens : (cand.device == "cuda" ? 4096 : 256);
  g.greedy_prompts = o.greedy_prompts;
  g.greedy_tokens = o.greedy_tokens;
  if (cand.device == "cuda") g.chunk = 512;
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> reference, LoadDecoder(ref_path, ref, backends));
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> candidate, LoadDecoder(path, cand, backends));
  ASSIGN_OR_RETURN(precision::GateReport report,
                   precision::RunDecoderGate(*reference, *candidate, *tok, text, g));
  if (ref_path != path) {  // two files: the labels say which
    report.reference = fmt::format("{}: {}", std::filesystem::path(ref_path).filename().string(), report.reference);
    report.candidate = fmt::format("{}: {}", std::filesystem::path(path).filename().string(), report.candidate);
  }
  return report;
}

// Reference: the CPU's fp32 encoder. Candidate: the encoder on --device at --quantization (cpu + fp8: the
// CPU encoder with its weights' fp8 round trip; cpu + int8: the int8 GEMMs with scales calibrated on
// --calibration-data; cuda: the device encoder, bf16 or fp8 weights; cpu + none: the reference itself, cosine
// 1).
StatusOr<precision::GateReport> CheckEncoder(const CheckCliOptions& o, const std::string& path,
                                             const std::string& text, const Backends& backends) {
  if (o.device.tuning.kv_cache_dtype != "auto") {
    return InvalidArgumentError("--kv-cache-dtype: {} is an encoder, which has no KV cache", path);
  }
  if (!o.reference.empty()) {
    return InvalidArgumentError(
        "--reference: {} is an encoder, whose reference is always its own fp32 weights on the CPU", path);
  }
  BertDeviceOptions dev;
  dev.device = o.device.device;
  ASSIGN_OR_RETURN(dev.quantization, ParseWeightQuantization(o.device.tuning.quantization));
  if (!o.calibration.data.empty() && dev.quantization != WeightQuantization::kInt8) {
    return InvalidArgumentError("--calibration-data applies to --quantization int8 (not {})",
                                WeightQuantizationName(dev.quantization));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> loaded, BertEncoder::Load(path));
  // int8: the activation scales measured on --calibration-data by the fp32 encoder (refused without).
  RETURN_IF_ERROR(precision::CalibrateForInt8(*loaded, *tok, o.calibration, &dev));
  ASSIGN_OR_RETURN(precision::EncoderAtPrecision cand,
                   precision::EncoderAtPrecisionFrom(std::move(loaded), dev, backends));
  std::shared_ptr<const BertEncoder> reference = cand.encoder;
  if (reference->quantization() != WeightQuantization::kNone) {
    ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> fp32, BertEncoder::Load(path));
    reference = std::move(fp32);
  }
  precision::EncoderGateOptions g;
  g.sentences = o.sentences;
  return precision::CheckEncoderPrecision(reference, cand, *tok, text, g);
}

int RunCheck(const CheckCliOptions& o, const Backends& backends) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "stoke model check: {}\n", s.ToString());
    const StatusCode c = s.code();
    return c == StatusCode::kInvalidArgument || c == StatusCode::kNotFound || c == StatusCode::kUnimplemented
               ? 2
               : 1;
  };
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  if (o.tokens < 0 || o.greedy_prompts < 0 || o.greedy_tokens < 0 || o.sentences < 1) {
    return fail(
        InvalidArgumentError("--tokens, --greedy-prompts, --greedy-tokens must be >= 0, --sentences >= 1"));
  }
  auto path = ResolveModel(o.model);
  if (!path.ok()) return fail(path.status());
  auto text = precision::ReadGateText(o.data);
  if (!text.ok()) return fail(text.status());
  auto report = IsEncoderFolder(*path) ? CheckEncoder(o, *path, *text, backends)
                                       : CheckDecoder(o, *path, *text, backends);
  if (!report.ok()) return fail(report.status());
  fmt::print("{}", precision::ReportToText(*report));
  if (!o.json_out.empty()) {
    nlohmann::ordered_json j = precision::ReportToJson(*report);
    j["model"] = *path;
    j["data"] = o.data.empty() ? precision::kDefaultGateText : o.data;
    if (Status s = WriteStringToFile(o.json_out, j.dump(2) + "\n"); !s.ok()) return fail(s);
  }
  return report->pass() ? 0 : 1;
}

}  // namespace

CLI::App* AddModelCheckCommand(CLI::App* model, CommandRun* run) {
  auto o = std::make_shared<CheckCliOptions>();
  o->device.device = "cpu";
  CLI::App* cmd = model->add_subcommand(
      "check", "Output-consistency gate: the model at a lower precision against its reference precision");
  cmd->add_option("--model", o->model, "Alias, GGUF file or HF folder (decoder or BERT encoder)")->required();
  cmd->add_option("--reference", o->reference,
                  "Decoders: compare against this model (alias, GGUF or HF folder) at its own precision instead "
                  "of --model's reference precision; e.g. a pre-quantised FP8 checkpoint against its bf16 "
                  "original. Same tokenizer expected");
  cmd->add_option("--data", o->data,
                  std::string("English text to compare on (default: ") + precision::kDefaultGateText + ")");
  cmd->add_option("--tokens", o->tokens, "Decoders: teacher-forced tokens (0: 256 on cpu, 4096 on cuda)")
      ->capture_default_str();
  cmd->add_option("--greedy-prompts", o->greedy_prompts, "Decoders: prompts for the greedy-text comparison")
      ->capture_default_str();
  cmd->add_option("--greedy-tokens", o->greedy_tokens, "Decoders: new tokens per greedy prompt")
      ->capture_default_str();
  cmd->add_option("--sentences", o->sentences, "Encoders: sentences embedded by both")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_option("--json", o->json_out, "Also write the report here");
  AddDeviceFlags(cmd, &o->device);
  AddCalibrationFlags(cmd, &o->calibration);
  *run = [o](const Backends& backends) -> int { return RunCheck(*o, backends); };
  return cmd;
}

}  // namespace stoke
