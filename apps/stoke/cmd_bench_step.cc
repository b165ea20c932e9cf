// stoke bench step: decode and prefill step times straight through the engine (DecoderModel::Step), with the
// device's measured copy bandwidth and GEMM rate as the roofline (CUDA). See tools/stepbench/stepbench.h.
//
//   stoke bench step --model DIR --device cuda --decode-batch 1 --context 512 --prefill 2048 --json out.json
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "apps/stoke/bench_step_cli.h"
#include "apps/stoke/cli_util.h"
#include "apps/stoke/make_backends.h"
#include "base/file_util.h"
#include "base/thread_pool.h"
#include "tools/stepbench/stepbench.h"

namespace stoke {
namespace {

struct StepCliOptions {
  stepbench::StepBenchOptions bench;
  std::string json_out;
  int threads = 0;
  std::string cuda_graphs = "on";
  std::string sampling = "device";
  EngineTuningFlags tuning;  // --gemv-max-rows, --decode-pipeline, ... (cli_util.h)
};

std::string CommandLine() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out = "stoke";
  size_t start = raw.find('\0');
  while (start != std::string::npos && start + 1 < raw.size()) {
    const size_t end = raw.find('\0', start + 1);
    out += ' ' + raw.substr(start + 1, (end == std::string::npos ? raw.size() : end) - start - 1);
    start = end;
  }
  return out;
}

int RunStep(StepCliOptions& o, const Backends& backends) {
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  o.bench.command = CommandLine();
  o.bench.decoder.cuda_graphs = o.cuda_graphs == "on";
  if (Status s = ApplyEngineTuningFlags(o.tuning, &o.bench.decoder); !s.ok()) {
    std::fprintf(stderr, "stoke bench step: %s\n", s.ToString().c_str());
    return 2;
  }
  o.bench.device_sampling = o.sampling == "device";
  o.bench.roofline = MakeRooflineProbe();
  auto r = stepbench::RunStepBench(o.bench, backends, stderr);
  if (!r.ok()) {
    std::fprintf(stderr, "stoke bench step: %s\n", r.status().ToString().c_str());
    return r.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  const std::string text = r->dump(2) + "\n";
  if (!o.json_out.empty()) {
    Status s = WriteStringToFile(o.json_out, text);
    if (!s.ok()) {
      std::fprintf(stderr, "stoke bench step: %s\n", s.ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "wrote %s\n", o.json_out.c_str());
  }
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace

CLI::App* AddBenchStepCommand(CLI::App* bench, CommandRun* run) {
  auto o = std::make_shared<StepCliOptions>();
  CLI::App* step = bench->add_subcommand(
      "step", "Engine microbenchmark: decode/prefill step times vs the device's measured roofline");
  auto& b = o->bench;
  step->add_option("--model", b.model, "Model alias, GGUF file or HF folder")->required();
  step->add_option("--device", b.decoder.device, "cpu | cuda | auto")->capture_default_str();
  step->add_option("--gpu-memory-fraction", b.decoder.gpu_memory_fraction, "CUDA: share of GPU memory to use")
      ->capture_default_str();
  step->add_option("--cuda-graphs", o->cuda_graphs, "CUDA: replay decode steps as CUDA graphs (on | off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  AddEngineTuningFlags(step, &o->tuning);
  step->add_option("--sampling", o->sampling,
                   "Decode: draw tokens on the device where the model can, as serve does (device), or copy "
                   "every logits row to the host (host)")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  step->add_option("--decode-batch", b.decode_batch, "Sequences per decode step (0: skip decode)")
      ->capture_default_str();
  step->add_option("--context", b.context, "Tokens already in KV per decode sequence")->capture_default_str();
  step->add_option("--prefill", b.prefill, "Prefill tokens of one sequence (0: skip prefill)")
      ->capture_default_str();
  step->add_option("--chunk", b.chunk, "Max tokens per prefill step")->capture_default_str();
  step->add_option(
          "--mixed", b.mixed,
          "Decode: then as many steps again, each with a fresh prompt of this many tokens behind the "
          "decodes (a mixed step; 0: skip)")
      ->capture_default_str();
  step->add_option("--iters", b.iters, "Timed decode steps (prefill: max(3, iters/4) runs)")
      ->capture_default_str();
  step->add_option("--warmup", b.warmup, "Untimed decode steps first")->capture_default_str();
  step->add_option("--threads", o->threads, "CPU threads (0 = all)")->capture_default_str();
  step->add_option("--json", o->json_out, "Also write the report here");
  *run = [o](const Backends& backends) -> int { return RunStep(*o, backends); };
  return step;
}

}  // namespace stoke
