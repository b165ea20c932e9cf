// stoke generate: text from a prompt with a Llama-family model (CPU or --device cuda), streamed to stdout as
// produced.
//
//   stoke generate --model smollm2-135m-instruct --prompt "Tell me a joke" --chat --temperature 0
//   stoke generate --model /path/model.gguf --ids '[1, 422, 33]' --max-tokens 64 --ignore-eos --verbose
//
// stdout: only the generated text (no trailing newline unless stdout is a terminal). stderr: errors, with
// --print-ids one JSON line {"prompt": [...], "generated": [...]} (golden tests), and with --verbose one
// timing line:
//   generate: prompt 256 tokens, prefill 812.30 ms (315.16 tok/s), decode 127 tokens in 1234.50 ms
//   (102.88 tok/s), finish length, cpu prefill 1580.20 ms decode 2400.10 ms
// (prefill = start to first token sampled; decode = the remaining tokens; cpu = process CPU time, all
// threads)
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/stoke/cli_util.h"
#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/model_registry.h"
#include "engine/model/factory.h"
#include "engine/runner/generate.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {
namespace {

struct GenerateCmdOptions {
  std::string model;
  std::optional<std::string> prompt;
  std::optional<std::string> ids;  // JSON array, or @file holding one
  int max_tokens = 128;
  float temperature = 0.7f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  bool chat = false;
  bool ignore_eos = false;
  bool verbose = false;
  bool print_ids = false;
  int threads = 0;
  int prefill_chunk = 512;
  DeviceFlags device;
};


StatusOr<std::vector<int32_t>> PromptIds(const GenerateCmdOptions& o, const std::string& path,
                                         const Tokenizer& tok) {
  if (o.ids) return ParseIdsArg(*o.ids);
  if (o.chat) {
    ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromModel(path));
    ASSIGN_OR_RETURN(std::string rendered, tmpl.Apply({ChatMessage{"user", *o.prompt}}, true));
    // The template writes its own BOS where the model wants one (Llama-3); adding another would double it.
    EncodeOptions eo;
    eo.add_special = false;
    eo.parse_special = true;
    return tok.Encode(rendered, eo);
  }
  EncodeOptions eo;
  eo.add_special = true;  // BOS only when the model asks for it (tokenizer.ggml.add_bos_token)
  return tok.Encode(*o.prompt, eo);
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void WriteOut(const std::string& s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

Status RunGenerate(const GenerateCmdOptions& o, const Backends& backends) {
  if (o.prompt.has_value() == o.ids.has_value()) {
    return InvalidArgumentError("give exactly one of --prompt and --ids");
  }
  if (o.chat && o.ids) return InvalidArgumentError("--chat needs --prompt");
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  ASSIGN_OR_RETURN(std::string path, ResolveModel(o.model));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  ASSIGN_OR_RETURN(DecoderOptions dopts, DecoderOptionsFromFlags(o.device));
  dopts.max_step_tokens = std::max(dopts.max_step_tokens, o.prefill_chunk);
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model, LoadDecoder(path, dopts, backends));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds(o, path, *tok));

  GenerateOptions go;
  go.sampling.max_tokens = o.max_tokens;
  go.sampling.temperature = o.temperature;
  go.sampling.top_p = o.top_p;
  go.sampling.top_k = o.top_k;
  go.sampling.seed = o.seed;
  go.sampling.ignore_eos = o.ignore_eos;
  go.prefill_chunk = o.prefill_chunk;
  go.eos_ids = model->config().eos_token_ids;
  for (int32_t id : tok->eos_ids()) {
    if (std::find(go.eos_ids.begin(), go.eos_ids.end(), id) == go.eos_ids.end()) go.eos_ids.push_back(id);
  }

  StreamDecoder stream(*tok);
  // Process CPU time (all threads) at the start and at the first token, for --verbose under contention.
  const double cpu_start = CpuSeconds();
  double cpu_first = 0;
  ASSIGN_OR_RETURN(GenerateResult r, Generate(*model, prompt, go, [&](int32_t id) {
                     if (cpu_first == 0) cpu_first = CpuSeconds();
                     WriteOut(stream.Push(id));
                     return true;
                   }));
  const double cpu_end = CpuSeconds();
  WriteOut(stream.Flush());
  if (isatty(fileno(stdout))) WriteOut("\n");
  if (o.print_ids) {
    nlohmann::json ids = {{"prompt", prompt}, {"generated", r.tokens}};
    fmt::print(stderr, "{}\n", ids.dump());
  }
  if (o.verbose) {
    const double prefill_ms = r.prefill_ns / 1e6, decode_ms = r.decode_ns / 1e6;
    fmt::print(stderr,
               "generate: prompt {} tokens, prefill {:.2f} ms ({:.2f} tok/s), decode {} tokens in {:.2f} ms "
               "({:.2f} tok/s), finish {}, cpu prefill {:.2f} ms decode {:.2f} ms, device {}\n",
               r.prompt_tokens, prefill_ms, prefill_ms > 0 ? r.prompt_tokens / (prefill_ms / 1e3) : 0.0,
               r.decode_steps, decode_ms, decode_ms > 0 ? r.decode_steps / (decode_ms / 1e3) : 0.0,
               FinishReasonName(r.finish), (cpu_first - cpu_start) * 1e3,
               (cpu_first > 0 ? cpu_end - cpu_first : 0.0) * 1e3, model->device_name());
  }
  return OkStatus();
}

CommandRegistrar kGenerate(
    "generate", "Generate text from a prompt (Llama-family model, CPU)", [](CLI::App* cmd) {
      auto o = std::make_shared<GenerateCmdOptions>();
      cmd->add_option("--model", o->model, "model alias, GGUF file or HF folder")->required();
      cmd->add_option("--prompt", o->prompt, "prompt text");
      cmd->add_option("--ids", o->ids, "prompt as a JSON array of token ids (or @file)");
      cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate at most")->capture_default_str();
      cmd->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
      cmd->add_option("--top-p", o->top_p, "nucleus mass in (0, 1]")->capture_default_str();
      cmd->add_option("--top-k", o->top_k, "0 = off")->capture_default_str();
      cmd->add_option("--seed", o->seed, "sampling seed (default: random)");
      cmd->add_flag("--chat", o->chat, "wrap the prompt in the model's chat template as one user message");
      cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past EOS");
      cmd->add_flag("--verbose", o->verbose, "timing summary on stderr");
      cmd->add_flag("--print-ids", o->print_ids,
                    "print {\"prompt\": [ids], \"generated\": [ids]} as one JSON line on stderr");
      cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->capture_default_str();
      cmd->add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per prefill step")
          ->capture_default_str();
      AddDeviceFlags(cmd, &o->device);
      return [o](const Backends& backends) -> int {
        Status st = RunGenerate(*o, backends);
        if (!st.ok()) {
          fmt::print(stderr, "stoke generate: {}\n", st.ToString());
          return st.code() == StatusCode::kInvalidArgument && st.message().find("--") != std::string::npos
                     ? 2
                     : 1;
        }
        return 0;
      };
    });

}  // namespace
}  // namespace stoke
