// stoke tune: walk a model's serving knobs one at a time under latency SLOs (batched models: p99; decoders:
// p99, TTFT p99, TPOT p99), with stoke serve started per point and stoke bench measuring it; writes
// DIR/stoke.toml, DIR/tune.json, DIR/report.html. --url: measure a running server and name the next flag.
// docs/tune.md.
//
//   stoke tune --model synth.json --slo-p99-ms 100 --concurrency 16 --budget-min 10 --out tune/
//   stoke tune --model llama/ --slo-tpot-ms 50 --workload standard --concurrency 32 --out tune/
//   stoke serve --config tune/stoke.toml
//
// Exit codes: 0 done, 1 error (the baseline could not be measured, the output not written), 2 usage.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "tools/bench/bench_runner.h"
#include "tools/bench/http_client.h"
#include "tools/bench/workload.h"
#include "tools/tune/server_process.h"
#include "tools/tune/tune_output.h"
#include "tools/tune/tuner.h"

namespace stoke {
namespace {

struct TuneCli {
  std::string model, device, workload = "short", out, url, input_len, output_len, serve_args, calibration_data;
  std::string batch_sizes = "1,2,4,8,16,32", delays = "1000,0,5000", instances = "1,2,4,8";
  std::string seqs = "8,16,32,64,128,256", tokens = "512,1024,2048,4096,8192";
  double slo = 0, slo_ttft = 0, slo_tpot = 0, budget_min = 30, concurrency = 0, rate = 0, window = 5,
         warmup = 2, min_gain = 5;
  int windows = 1, confirm_rounds = 3, prebuilt = 0;
  bool grid = false, no_doctor = false, quiet = false;
};

int Usage(const std::string& msg) {
  fmt::print(stderr, "stoke tune: {}\n", msg);
  return 2;
}

template <typename T>
StatusOr<std::vector<T>> IntList(const std::string& flag, const std::string& spec, int64_t lo) {
  std::vector<T> v;
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at);
    try {
      size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size() || x < lo) throw std::invalid_argument(item);
      v.push_back(static_cast<T>(x));
    } catch (const std::exception&) {
      return InvalidArgumentError("{} '{}': expected integers >= {} separated by commas", flag, spec, lo);
    }
    at = comma + 1;
  }
  return v;
}

int RunTuneCommand(const TuneCli& c) {
  if (c.model.empty() && c.url.empty()) return Usage("--model is required (or --url for a running server)");
  if (!c.url.empty()) {
    if (auto ep = bench::ParseHttpUrl(c.url); !ep.ok())
      return Usage(fmt::format("--url: {}", ep.status().message()));
  }
  if (c.out.empty()) return Usage("--out DIR is required");
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--slo-p99-ms", c.slo},
                                {"--slo-ttft-ms", c.slo_ttft},
                                {"--slo-tpot-ms", c.slo_tpot}}) {
    if (v < 0 || !std::isfinite(v)) return Usage(fmt::format("{} {}: must be > 0 (milliseconds)", flag, v));
  }
  if (c.slo <= 0 && c.slo_ttft <= 0 && c.slo_tpot <= 0)
    return Usage(
        "give an SLO: --slo-p99-ms (end-to-end p99, every model) and/or --slo-ttft-ms / --slo-tpot-ms (p99, "
        "decoders)");
  if (c.prebuilt < -1) return Usage("--prebuilt-requests must be -1 (off), 0 (tune's default) or > 0");
  if (c.concurrency > 0 && c.rate > 0) return Usage("give --concurrency or --rate, not both");
  if (c.concurrency < 0 || c.rate < 0) return Usage("--concurrency and --rate must be > 0");
  if (c.window <= 0 || c.warmup < 0 || c.windows < 1)
    return Usage("--window > 0, --warmup >= 0, --windows >= 1");
  if (c.budget_min <= 0) return Usage("--budget-min must be > 0");
  if (c.confirm_rounds < 1) return Usage("--confirm-rounds must be >= 1");
  if (c.min_gain <= 0) return Usage("--min-gain must be > 0 (percent)");
  if (!c.device.empty() && c.device != "cpu" && c.device != "cuda" && c.device != "auto")
    return Usage(fmt::format("--device '{}': expected cpu, cuda or auto", c.device));
  tune::TuneOptions o;
  o.model = c.model;
  o.url = c.url;
  o.device = c.device;
  o.stoke_exe = tune::SelfExe();
  o.slos = {.p99_ms = c.slo, .ttft_ms = c.slo_ttft, .tpot_ms = c.slo_tpot};
  o.prebuilt_requests = c.prebuilt;
  if (c.rate > 0) {
    o.mode = bench::LoadMode::kRate;
    o.load = c.rate;
  } else {
    o.load = c.concurrency > 0 ? c.concurrency : 16;
  }
  auto w = bench::ParseWorkload(c.workload);
  if (!w.ok()) return Usage(fmt::format("--workload: {}", w.status().message()));
  o.workload = *w;
  for (const auto& [flag, spec, dist] : {std::tuple{"--input-len", &c.input_len, &o.workload.input},
                                         std::tuple{"--output-len", &c.output_len, &o.workload.output}}) {
    if (spec->empty()) continue;
    auto d = bench::ParseLengthDist(*spec);
    if (!d.ok()) return Usage(fmt::format("{}: {}", flag, d.status().message()));
    *dist = *d;
  }
  o.warmup_s = c.warmup;
  o.window_s = c.window;
  o.windows = c.windows;
  o.budget_s = c.budget_min * 60;
  o.min_gain = c.min_gain / 100;
  auto bs = IntList<int>("--batch-sizes", c.batch_sizes, 1);
  auto ds = IntList<int64_t>("--queue-delays-us", c.delays, 0);
  auto is = IntList<int>("--instance-counts", c.instances, 1);
  auto ns = IntList<int>("--max-num-seqs-values", c.seqs, 1);
  auto nt = IntList<int>("--max-num-batched-tokens-values", c.tokens, 1);
  for (const Status& s : {bs.status(), ds.status(), is.status(), ns.status(), nt.status()})
    if (!s.ok()) return Usage(s.message());
  o.batch_sizes = *bs;
  o.queue_delays_us = *ds;
  o.instance_counts = *is;
  o.max_num_seqs = *ns;
  o.max_num_batched_tokens = *nt;
  o.confirm_rounds = c.confirm_rounds;
  o.grid = c.grid;
  o.doctor = !c.no_doctor;
  o.out_dir = c.out;
  for (size_t at = 0; at < c.serve_args.size();) {  // whitespace-separated, passed to every stoke serve
    const size_t start = c.serve_args.find_first_not_of(" \t", at);
    if (start == std::string::npos) break;
    const size_t end = std::min(c.serve_args.find_first_of(" \t", start), c.serve_args.size());
    o.serve_args.push_back(c.serve_args.substr(start, end - start));
    at = end;
  }
  if (!o.serve_args.empty() && !c.url.empty())
    return Usage("--serve-args needs servers tune starts, not --url");
  if (!c.calibration_data.empty()) {
    if (!c.url.empty()) return Usage("--calibration-data needs servers tune starts, not --url");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(c.calibration_data, ec))
      return Usage(fmt::format("--calibration-data {}: no such file", c.calibration_data));
    // Absolute: the servers and the stoke.toml written may run from another directory.
    o.calibration_data = std::filesystem::absolute(c.calibration_data, ec).string();
  }
  o.progress = c.quiet ? nullptr : stderr;
  StatusOr<tune::TuneResult> r = tune::RunTune(o);
  if (!r.ok()) {
    fmt::print(stderr, "stoke tune: {}\n", r.status().message());
    return r.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::vector<std::pair<std::string, std::string>> files = {
      {"tune.json", tune::TuneJson(o, *r).dump(1) + "\n"}, {"report.html", tune::TuneHtml(o, *r)}};
  if (r->mode != "url") files.emplace_back("stoke.toml", tune::TuneToml(o, *r));  // --url: no model to name
  for (const auto& [name, text] : files) {
    if (Status s = WriteStringToFile(c.out + "/" + name, text); !s.ok()) {
      fmt::print(stderr, "stoke tune: {}\n", s.message());
      return 1;
    }
  }
  std::fputs(tune::TuneText(o, *r).c_str(), stdout);
  fmt::print(stdout, "  wrote {0}/tune.json, {0}/report.html{1}\n", c.out,
             r->mode != "url" ? fmt::format(", {}/stoke.toml", c.out) : "");
  return 0;
}

CommandRun SetupTune(CLI::App* cmd) {
  auto c = std::make_shared<TuneCli>();
  cmd->footer(
      "The walk, one knob at a time (docs/tune.md):\n"
      "  batched models (bert encoders, synthetic model files): baseline -> max batch size (--batch-sizes, "
      "with "
      "the first --queue-delays-us) -> queue delay -> instances (--instance-counts) -> precision (encoders: "
      "--quantization fp8, and int8 with --calibration-data; each server gates its precision at load)\n"
      "  decoders (GGUF / HF Llama-family): baseline -> --max-num-seqs (--max-num-seqs-values) -> "
      "--max-num-batched-tokens (--max-num-batched-tokens-values) -> chunked prefill off -> --target-step-ms "
      "at 0.8 of --slo-tpot-ms (with that SLO only) -> CUDA graphs "
      "(--device cuda only) -> --kv-cache-dtype int8, fp8 (each server runs the consistency gate at load and "
      "refuses a failing precision) -> --quantization fp8 (weights; gated at load the same way)\n"
      "  -> confirmation: baseline and best alternated --confirm-rounds times; a gain within the spread is "
      "\"no gain\".\n"
      "Each point is a fresh `stoke serve` child (this binary) on a free port, measured by stoke bench's "
      "load "
      "generator (KServe HTTP, or streamed chat completions for decoders) for --warmup + --windows x "
      "--window "
      "seconds, with stoke doctor watching; the doctor's verdict on the point a step starts from can rule "
      "values "
      "out. goodput = requests/s meeting every SLO; a point whose p99 (e2e, TTFT, TPOT) exceeds its SLO is "
      "rejected. A step stops when the next value gains less than --min-gain % goodput.\n"
      "--url URL: measure a server started elsewhere (tune cannot restart it), ask the doctor, and name the "
      "next flag to try; the walk needs servers tune starts itself.\n"
      "Output in --out: stoke.toml (stoke serve --config DIR/stoke.toml), tune.json, report.html, logs/.\n"
      "Example: stoke tune --model synth.json --slo-p99-ms 100 --concurrency 16 --budget-min 5 --out tune/");
  cmd->add_option("--model", c->model,
                  "Model to tune (as stoke serve --model: encoder alias/folder or model file)");
  cmd->add_option("--device", c->device,
                  "cpu | cuda | auto, passed to stoke serve (default: the model's own)");
  cmd->add_option("--slo-p99-ms", c->slo, "p99 end-to-end latency target (ms); points above it are rejected");
  cmd->add_option("--slo-ttft-ms", c->slo_ttft, "Decoders: p99 time-to-first-token target (ms)");
  cmd->add_option("--slo-tpot-ms", c->slo_tpot, "Decoders: p99 time-per-output-token target (ms)");
  cmd->add_option("--workload", c->workload, "short | standard | long | FILE.jsonl (bench's workloads)")
      ->capture_default_str();
  cmd->add_option("--input-len", c->input_len,
                  "Prompt tokens, overriding the workload's: N | uniform:LO:HI | ...");
  cmd->add_option("--output-len", c->output_len, "Generated tokens, overriding the workload's");
  cmd->add_option("--budget-min", c->budget_min, "Wall-clock budget in minutes; the walk stops when spent")
      ->capture_default_str();
  cmd->add_option("--concurrency", c->concurrency, "Closed-loop clients per point (default 16)");
  cmd->add_option("--rate", c->rate, "Open-loop requests/s per point instead of --concurrency");
  cmd->add_option("--window", c->window, "Seconds per measurement window")->capture_default_str();
  cmd->add_option("--windows", c->windows, "Windows measured per point")->capture_default_str();
  cmd->add_option("--warmup", c->warmup, "Warm-up seconds per point (not counted)")->capture_default_str();
  cmd->add_option("--min-gain", c->min_gain, "Percent goodput a step's next value must gain to go on")
      ->capture_default_str();
  cmd->add_option("--batch-sizes", c->batch_sizes, "max_batch_size values")->capture_default_str();
  cmd->add_option("--queue-delays-us", c->delays, "max_queue_delay_us values; the first is the batch step's")
      ->capture_default_str();
  cmd->add_option("--instance-counts", c->instances, "instance counts")->capture_default_str();
  cmd->add_option("--max-num-seqs-values", c->seqs, "Decoders: --max-num-seqs values")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens-values", c->tokens, "Decoders: --max-num-batched-tokens values")
      ->capture_default_str();
  cmd->add_option(
         "--prebuilt-requests", c->prebuilt,
         "Requests built before each point and sent in turn (0: 512 batched, 2048 decoders; -1: off)")
      ->capture_default_str();
  cmd->add_option("--confirm-rounds", c->confirm_rounds, "Baseline/best rounds of the confirmation run")
      ->capture_default_str();
  cmd->add_option(
      "--serve-args", c->serve_args,
      "Extra flags for every stoke serve tune starts, e.g. \"--gemm-cache g.json --threads 4\" (not "
      "written to stoke.toml)");
  cmd->add_flag("--grid", c->grid,
                "Measure every combination of the knob values instead of walking (comparison)");
  cmd->add_flag("--no-doctor", c->no_doctor, "Do not ask the doctor about each point");
  cmd->add_option("--calibration-data", c->calibration_data,
                  "Encoders: the precision step also tries int8 weights (per-token activations) calibrated on "
                  "this file of samples, one per line, gated at load as fp8 (docs/precision.md)");
  cmd->add_option("--out", c->out, "Output directory");
  cmd->add_option("--url", c->url,
                  "A server started elsewhere: measure it, ask the doctor, name the next flag (no walk)");
  cmd->add_flag("--quiet", c->quiet, "No progress lines on stderr");
  return [c](const Backends&) -> int { return RunTuneCommand(*c); };
}

CommandRegistrar kTune("tune", "Tune a model's serving knobs under latency SLOs (docs/tune.md)", SetupTune);

}  // namespace
}  // namespace stoke
