// stoke bench: a load generator for any server speaking OpenAI or KServe v2 over HTTP, or KServe v2 over gRPC
// (stoke or not).
//
//   stoke bench --url grpc://127.0.0.1:8001 --api kserve-grpc --model minilm --concurrency 1,8
//       --metrics-url http://127.0.0.1:8000 --output-dir out/
//
//   stoke bench --url http://127.0.0.1:8000 --concurrency 1,4,16 --workload short --output-dir out/
//   stoke bench --url http://127.0.0.1:8000 --api openai-completions --rate 2,4,8 --arrival poisson
//       --slo ttft=500ms,tpot=50ms --output-dir out/
//   stoke bench --url http://127.0.0.1:8000 --api kserve-http --model resnet --concurrency 1:64 --output-dir
//   out/ stoke bench compare old/bench.json new/bench.json stoke bench render out/bench.json --output-dir
//   out/     (re-draws report.html from the JSON)
//   stoke bench step --model M --device cuda --json out.json   (engine step times: cmd_bench_step.cc)
//
// Writes bench.json, bench.csv and report.html into --output-dir, prints the summary table on stdout and the
// progress on stderr. Exit codes: 0 ok, 1 error, 2 usage, 3 some point invalid (with --fail-on-invalid).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "apps/stoke/bench_step_cli.h"
#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "tools/bench/bench_runner.h"
#include "tools/bench/compare.h"
#include "tools/bench/html_report.h"
#include "tools/bench/report.h"

namespace stoke {
namespace {

struct BenchCliOptions {
  std::vector<std::string> bytes_input;
  std::string url, model, api = "openai-chat", concurrency, rate, arrival = "poisson", workload = "short";
  std::string input_len, output_len, token_id_range, slo, output_dir, metrics_path = "/metrics", label;
  std::string metrics_url;
  int shared_prefix = 0;
  double duration = 60, warmup = 5, window = 5, stability = 0.10, timeout = 600, drain_timeout = 30;
  double ramp_up = 0;
  double max_send_lag_ms = 10, late_ms = 2, max_cpu = 90;
  int prebuilt = 0;
  int max_connections = 2048;
  uint64_t seed = 1;
  double temperature = -1;
  bool no_stream = false, no_ignore_eos = false, kserve_binary = false, no_scrape = false, quiet = false;
  bool fail_on_invalid = false;
  // compare / render
  std::string a, b, compare_output, render_input;
};

std::string CommandLine() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out;
  size_t start = 0;
  bool first = true;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    std::string arg = raw.substr(start, end - start);
    if (first) {
      arg = "stoke";  // not the build path or a renamed copy
      first = false;
    }
    if (!out.empty()) out += ' ';
    out += arg.find_first_of(" \"'") == std::string::npos ? arg : "'" + arg + "'";
    start = end + 1;
  }
  return out;
}

int Fail(const Status& s, int code = 1) {
  std::fprintf(stderr, "stoke bench: %s\n", s.message().c_str());
  return code;
}

// Builds the run's options from the flags; usage problems come back as InvalidArgument.
StatusOr<bench::BenchOptions> ToBenchOptions(const BenchCliOptions& c) {
  bench::BenchOptions o;
  if (c.url.empty()) return InvalidArgumentError("--url is required");
  if (c.output_dir.empty()) return InvalidArgumentError("--output-dir is required");
  if (c.concurrency.empty() == c.rate.empty())
    return InvalidArgumentError("give exactly one of --concurrency, --rate");
  o.url = c.url;
  o.model = c.model;
  ASSIGN_OR_RETURN(o.api, bench::ParseApi(c.api));
  o.mode = c.concurrency.empty() ? bench::LoadMode::kRate : bench::LoadMode::kConcurrency;
  ASSIGN_OR_RETURN(o.loads, bench::ParseLoadList(o.mode == bench::LoadMode::kRate ? c.rate : c.concurrency,
                                                 o.mode == bench::LoadMode::kConcurrency));
  if (c.arrival == "poisson") {
    o.point.arrival = bench::Arrival::kPoisson;
  } else if (c.arrival == "constant") {
    o.point.arrival = bench::Arrival::kConstant;
  } else {
    return InvalidArgumentError("--arrival '{}': expected poisson or constant", c.arrival);
  }
  ASSIGN_OR_RETURN(o.workload, bench::ParseWorkload(c.workload));
  if (!c.input_len.empty()) {
    ASSIGN_OR_RETURN(o.workload.input, bench::ParseLengthDist(c.input_len));
  }
  if (!c.output_len.empty()) {
    ASSIGN_OR_RETURN(o.workload.output, bench::ParseLengthDist(c.output_len));
  }
  if (!c.token_id_range.empty()) {
    size_t colon = c.token_id_range.find(':');
    if (colon == std::string::npos) return InvalidArgumentError("--token-id-range: expected LO:HI");
    try {
      o.workload.token_id_lo = std::stoi(c.token_id_range.substr(0, colon));
      o.workload.token_id_hi = std::stoi(c.token_id_range.substr(colon + 1));
    } catch (...) {
      return InvalidArgumentError("--token-id-range '{}': expected LO:HI", c.token_id_range);
    }
  }
  if (c.shared_prefix < 0) return InvalidArgumentError("--shared-prefix must be >= 0");
  o.workload.shared_prefix = c.shared_prefix;
  if (!c.slo.empty()) {
    ASSIGN_OR_RETURN(o.point.slo, bench::ParseSlo(c.slo));
  }
  if (c.duration <= 0 || c.window <= 0 || c.warmup < 0 || c.stability < 0 || c.timeout <= 0 ||
      c.drain_timeout < 0) {
    return InvalidArgumentError(
        "--duration, --window and --timeout must be > 0; --warmup, --stability and "
        "--drain-timeout >= 0");
  }
  if (c.max_connections < 1) return InvalidArgumentError("--max-connections must be >= 1");
  if (c.ramp_up < 0 || c.ramp_up > c.warmup) {
    return InvalidArgumentError(
        "--ramp-up {} must be in [0, --warmup {}]: clients still starting would be measured", c.ramp_up,
        c.warmup);
  }
  o.point.ramp_up_s = c.ramp_up;
  o.point.max_duration_s = c.duration;
  o.point.warmup_s = c.warmup;
  o.point.window_s = c.window;
  o.point.stability = c.stability;
  o.point.request_timeout_s = c.timeout;
  o.point.drain_timeout_s = c.drain_timeout;
  o.point.max_connections = c.max_connections;
  o.point.max_send_lag_ms = c.max_send_lag_ms;
  o.point.late_threshold_ms = c.late_ms;
  o.point.max_cpu_percent = c.max_cpu;
  o.point.prebuilt_requests = c.prebuilt;
  o.point.seed = c.seed;
  o.stream = !c.no_stream;
  o.ignore_eos = !c.no_ignore_eos;
  o.temperature = c.temperature;
  o.kserve_binary = c.kserve_binary;
  ASSIGN_OR_RETURN(o.kserve_bytes, bench::ReadBytesInputs(c.bytes_input));
  o.scrape = !c.no_scrape;
  o.metrics_path = c.metrics_path;
  o.metrics_url = c.metrics_url;
  o.label = c.label;
  o.quiet = c.quiet;
  o.command = CommandLine();
  return o;
}

int RunBenchCommand(const BenchCliOptions& c) {
  StatusOr<bench::BenchOptions> o = ToBenchOptions(c);
  if (!o.ok()) return Fail(o.status(), o.status().code() == StatusCode::kInvalidArgument ? 2 : 1);
  bench::ProgressPrinter progress(stderr, o->quiet);
  StatusOr<bench::BenchReport> rep = bench::RunBench(*o, &progress);
  if (!rep.ok()) return Fail(rep.status());
  Status w = bench::WriteReportFiles(*rep, c.output_dir);
  std::fputs(bench::ReportTable(*rep).c_str(), stdout);
  std::fflush(stdout);
  if (!w.ok()) return Fail(w);
  std::fprintf(stderr, "wrote %s/bench.json, bench.csv, report.html\n", c.output_dir.c_str());
  int invalid = 0;
  for (const auto& p : rep->points) invalid += !p.valid;
  if (invalid > 0) {
    std::fprintf(stderr, "stoke bench: %d of %zu points are INVALID (the generator could not drive them)\n",
                 invalid, rep->points.size());
    if (c.fail_on_invalid) return 3;
  }
  return 0;
}

int RunCompare(const BenchCliOptions& c) {
  StatusOr<bench::BenchReport> a = bench::ReadReportFile(c.a);
  if (!a.ok()) return Fail(a.status());
  StatusOr<bench::BenchReport> b = bench::ReadReportFile(c.b);
  if (!b.ok()) return Fail(b.status());
  bench::Comparison cmp = bench::CompareReports(*a, *b);
  std::fputs(bench::ComparisonTable(cmp, c.a, c.b).c_str(), stdout);
  if (!c.compare_output.empty()) {
    Status s = WriteStringToFile(c.compare_output, bench::ComparisonJson(cmp, c.a, c.b).dump(1) + "\n");
    if (!s.ok()) return Fail(s);
  }
  if (cmp.rows.empty()) return Fail(InvalidArgumentError("the two reports have no load point in common"));
  return 0;
}

int RunRender(const BenchCliOptions& c) {
  if (c.output_dir.empty()) return Fail(InvalidArgumentError("--output-dir is required"), 2);
  StatusOr<bench::BenchReport> rep = bench::ReadReportFile(c.render_input);
  if (!rep.ok()) return Fail(rep.status());
  Status s = WriteStringToFile(c.output_dir + "/report.html", bench::RenderHtmlReport(*rep));
  if (!s.ok()) return Fail(s);
  std::fputs(bench::ReportTable(*rep).c_str(), stdout);
  return 0;
}

CommandRun SetupBench(CLI::App* cmd) {
  auto c = std::make_shared<BenchCliOptions>();
  cmd->add_option("--url", c->url,
                  "Server base URL, e.g. http://127.0.0.1:8000 (kserve-grpc: grpc://127.0.0.1:8001)");
  cmd->add_option("--model", c->model, "Model name (default: the first of GET /v1/models)");
  cmd->add_option("--api", c->api,
                  "openai-chat | openai-completions | openai-embeddings | kserve-http | kserve-grpc")
      ->capture_default_str();
  cmd->add_option("--concurrency", c->concurrency,
                  "Closed loop: clients, e.g. 1,4,16 or 1:256 (powers of two)");
  cmd->add_option("--rate", c->rate, "Open loop: requests/s, e.g. 2,4,8");
  cmd->add_option("--arrival", c->arrival, "Open loop arrivals: poisson | constant")->capture_default_str();
  cmd->add_option("--workload", c->workload, "short | standard | long | FILE.jsonl")->capture_default_str();
  cmd->add_option("--input-len", c->input_len, "Prompt tokens: N | uniform:LO:HI | normal:MEAN:STD");
  cmd->add_option("--output-len", c->output_len, "Generated tokens: N | uniform:LO:HI | normal:MEAN:STD");
  cmd->add_option("--shared-prefix", c->shared_prefix, "Tokens every prompt starts with (prefix caching)");
  cmd->add_option("--token-id-range", c->token_id_range,
                  "Synthetic token ids drawn from LO:HI (default 1000:20000)");
  cmd->add_option("--duration", c->duration, "Max measurement seconds per point")->capture_default_str();
  cmd->add_option("--warmup", c->warmup, "Warm-up seconds per point (not measured)")->capture_default_str();
  cmd->add_option("--ramp-up", c->ramp_up,
                  "Closed loop: start the clients one after another over this many seconds of the warm-up "
                  "(client i at i x S / N), so long requests do not run in lockstep waves; at most --warmup")
      ->capture_default_str();
  cmd->add_option("--window", c->window, "Measurement window seconds")->capture_default_str();
  cmd->add_option("--stability", c->stability,
                  "Stop a point when 3 windows agree within this fraction (0: run the full duration)")
      ->capture_default_str();
  cmd->add_option("--slo", c->slo, "Goodput objectives, e.g. ttft=500ms,tpot=50ms,e2e=10s");
  cmd->add_option("--output-dir", c->output_dir, "Where bench.json, bench.csv and report.html go");
  cmd->add_option("--seed", c->seed, "Seed for prompts and arrivals")->capture_default_str();
  cmd->add_option("--max-connections", c->max_connections, "Open loop connection cap")->capture_default_str();
  cmd->add_option("--timeout", c->timeout, "Per-request timeout, seconds")->capture_default_str();
  cmd->add_option("--drain-timeout", c->drain_timeout, "Seconds to wait for in-flight requests after a point")
      ->capture_default_str();
  cmd->add_option("--max-send-lag-ms", c->max_send_lag_ms, "p99 send lag above which a point is invalid")
      ->capture_default_str();
  cmd->add_option("--late-ms", c->late_ms, "A send later than this counts as late")->capture_default_str();
  cmd->add_option(
         "--prebuilt-requests", c->prebuilt,
         "Build (and serialize) N requests before each point and send them in turn (0: build as they "
         "go); they repeat after N, which a server's prefix cache would notice")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--max-generator-cpu", c->max_cpu, "Generator CPU % above which a point is invalid")
      ->capture_default_str();
  cmd->add_flag("--no-stream", c->no_stream, "Chat/completions without streaming (no TTFT/ITL)");
  cmd->add_flag("--no-ignore-eos", c->no_ignore_eos, "Let the model stop early (output lengths vary)");
  cmd->add_option("--temperature", c->temperature,
                  "Sampling temperature sent with chat/completions requests (0 = greedy; default: not sent, "
                  "the server's default applies)");
  cmd->add_flag("--kserve-binary", c->kserve_binary, "Send KServe inputs with the binary tensor extension");
  cmd->add_option("--bytes-input", c->bytes_input,
                  "Files whose contents fill KServe BYTES inputs, one drawn per element (e.g. JPEG photos for an "
                  "image model; default: the prompt text); implies --kserve-binary")
      ->delimiter(',');
  cmd->add_flag("--no-scrape", c->no_scrape, "Don't scrape the server's /metrics");
  cmd->add_option("--metrics-path", c->metrics_path, "Prometheus endpoint to scrape")->capture_default_str();
  cmd->add_option("--metrics-url", c->metrics_url,
                  "HTTP server whose --metrics-path is scraped (default: --url; kserve-grpc needs it)");
  cmd->add_option("--label", c->label, "A note stored in the report");
  cmd->add_flag("--quiet", c->quiet, "No progress on stderr");
  cmd->add_flag("--fail-on-invalid", c->fail_on_invalid, "Exit 3 if any point is invalid");

  CLI::App* compare = cmd->add_subcommand("compare", "Compare two bench.json reports point by point");
  compare->add_option("a", c->a, "Baseline bench.json")->required();
  compare->add_option("b", c->b, "Candidate bench.json")->required();
  compare->add_option("--output", c->compare_output, "Also write the comparison as JSON");
  CLI::App* render = cmd->add_subcommand("render", "Re-draw report.html from a bench.json");
  render->add_option("report", c->render_input, "bench.json")->required();
  render->add_option("--output-dir", c->output_dir, "Where report.html goes")->required();

  CommandRun step_run;
  CLI::App* step = AddBenchStepCommand(cmd, &step_run);

  return [c, compare, render, step, step_run](const Backends& backends) -> int {
    if (step->parsed()) return step_run(backends);
    if (compare->parsed()) return RunCompare(*c);
    if (render->parsed()) return RunRender(*c);
    return RunBenchCommand(*c);
  };
}

CommandRegistrar kBench("bench", "Load-test a server over HTTP: sweeps, percentiles, TTFT/ITL, HTML report",
                        SetupBench);

}  // namespace
}  // namespace stoke
