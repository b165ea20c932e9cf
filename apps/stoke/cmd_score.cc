// stoke score: teacher-forced logits of every position of a token sequence (golden tests against
// llama.cpp). Runs the sequence through the paged KV in prefill chunks of --chunk tokens (Logits::kAll).
//
//   stoke score --model m.gguf --ids '[1, 422, 33]' --out logits.f32   (raw float32 [n, vocab], row-major)
//   stoke score --model m.gguf --text "Hello there"                    (stdout: JSON array of top-1 ids)
//
// With --out, stdout gets one JSON line {"tokens": n, "vocab": V}. --verbose prints timing on stderr.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/stoke/cli_util.h"
#include "apps/stoke/command.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/model_registry.h"
#include "engine/model/factory.h"
#include "engine/runner/generate.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {
namespace {

struct ScoreCmdOptions {
  std::string model;
  std::optional<std::string> ids;  // JSON array, or @file holding one
  std::optional<std::string> text;
  std::string out;
  int chunk = 512;
  int threads = 0;
  bool verbose = false;
  DeviceFlags device;
};

Status RunScore(const ScoreCmdOptions& o, const Backends& backends) {
  if (o.ids.has_value() == o.text.has_value())
    return InvalidArgumentError("give exactly one of --ids and --text");
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  ASSIGN_OR_RETURN(std::string path, ResolveModel(o.model));
  std::vector<int32_t> ids;
  if (o.ids) {
    ASSIGN_OR_RETURN(ids, ParseIdsArg(*o.ids));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
    ASSIGN_OR_RETURN(ids, tok->Encode(*o.text));
  }
  ASSIGN_OR_RETURN(DecoderOptions dopts, DecoderOptionsFromFlags(o.device));
  dopts.max_step_tokens = std::max(dopts.max_step_tokens, o.chunk);
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model, LoadDecoder(path, dopts, backends));
  const int vocab = model->config().vocab_size;
  const Nanos start = MonotonicNanos();
  ASSIGN_OR_RETURN(std::vector<float> logits, ScoreLogits(*model, ids, o.chunk));
  const double ms = (MonotonicNanos() - start) / 1e6;
  if (o.verbose) {
    fmt::print(stderr, "score: {} tokens in {:.2f} ms ({:.2f} tok/s), chunk {}, device {}\n", ids.size(), ms,
               ids.size() / (ms / 1e3), o.chunk, model->device_name());
  }
  if (!o.out.empty()) {
    RETURN_IF_ERROR(WriteStringToFile(o.out, std::string_view(reinterpret_cast<const char*>(logits.data()),
                                                              logits.size() * sizeof(float))));
    fmt::print("{{\"tokens\": {}, \"vocab\": {}}}\n", ids.size(), vocab);
    return OkStatus();
  }
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* row = logits.data() + i * vocab;
    top.push_back(std::max_element(row, row + vocab) - row);  // first maximum: ties to the lowest id
  }
  fmt::print("{}\n", top.dump());
  return OkStatus();
}

CommandRegistrar kScore("score", "Teacher-forced logits of every position (golden tests)", [](CLI::App* cmd) {
  auto o = std::make_shared<ScoreCmdOptions>();
  cmd->add_option("--model", o->model, "model alias, GGUF file or HF folder")->required();
  cmd->add_option("--ids", o->ids, "token ids as a JSON array (or @file)");
  cmd->add_option("--text", o->text, "text, tokenized as the model does for a plain prompt");
  cmd->add_option("--out", o->out, "write raw float32 [n, vocab] logits here");
  cmd->add_option("--chunk", o->chunk, "tokens per prefill step")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_flag("--verbose", o->verbose, "timing on stderr");
  AddDeviceFlags(cmd, &o->device);
  return [o](const Backends& backends) -> int {
    Status st = RunScore(*o, backends);
    if (!st.ok()) {
      fmt::print(stderr, "stoke score: {}\n", st.ToString());
      return st.code() == StatusCode::kInvalidArgument && st.message().find("--") != std::string::npos ? 2
                                                                                                       : 1;
    }
    return 0;
  };
});

}  // namespace
}  // namespace stoke
