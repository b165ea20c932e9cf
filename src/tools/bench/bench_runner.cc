#include "tools/bench/bench_runner.h"

#include <fmt/format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/file_util.h"
#include "tools/bench/grpc_client.h"
#include "tools/bench/http_client.h"
#include "tools/bench/metrics_scraper.h"

namespace stoke::bench {
namespace {

std::vector<std::string_view> SplitComma(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t p = s.find(',', start);
    if (p == std::string_view::npos) p = s.size();
    out.push_back(s.substr(start, p - start));
    start = p + 1;
  }
  return out;
}

StatusOr<double> Number(std::string_view s, std::string_view what) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) {
    return InvalidArgumentError("{}: '{}' is not a number", what, s);
  }
  return v;
}

StatusOr<std::string> DiscoverModel(const HttpEndpoint& ep) {
  ASSIGN_OR_RETURN(SimpleResponse r, HttpFetch(ep, "GET", ep.base_path + "/v1/models", "", 10));
  if (r.status != 200) return UnavailableError("GET /v1/models: HTTP {}; pass --model", r.status);
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    return UnavailableError("GET /v1/models: no model listed; pass --model");
  }
  return j["data"][0]["id"].get<std::string>();
}

StatusOr<std::vector<KserveInput>> FetchKserveInputs(const HttpEndpoint& ep, const std::string& model) {
  std::string target = fmt::format("{}/v2/models/{}", ep.base_path, model);
  ASSIGN_OR_RETURN(SimpleResponse r, HttpFetch(ep, "GET", target, "", 10));
  if (r.status != 200) return UnavailableError("GET {}: HTTP {}", target, r.status);
  StatusOr<std::vector<KserveInput>> inputs = ParseKserveMetadata(r.body);
  if (!inputs.ok()) return inputs.status().WithContext("GET " + target);
  return inputs;
}

}  // namespace

std::string NowIso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

StatusOr<std::vector<double>> ParseLoadList(std::string_view spec, bool powers_of_two_ranges) {
  if (spec == "sweep" && powers_of_two_ranges) spec = "1:256";
  std::vector<double> out;
  for (std::string_view part : SplitComma(spec)) {
    size_t colon = part.find(':');
    if (colon != std::string_view::npos && powers_of_two_ranges) {
      ASSIGN_OR_RETURN(double lo, Number(part.substr(0, colon), "load range"));
      ASSIGN_OR_RETURN(double hi, Number(part.substr(colon + 1), "load range"));
      if (lo < 1 || hi < lo || hi > 1e6)
        return InvalidArgumentError("load range '{}': need 1 <= lo <= hi", part);
      for (double v = lo; v <= hi; v *= 2) out.push_back(v);
      continue;
    }
    ASSIGN_OR_RETURN(double v, Number(part, "load"));
    if (v <= 0) return InvalidArgumentError("load '{}' must be > 0", part);
    if (powers_of_two_ranges && v != std::floor(v)) {
      return InvalidArgumentError("concurrency '{}' must be a whole number", part);
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgumentError("empty load list '{}'", spec);
  return out;
}

StatusOr<Slo> ParseSlo(std::string_view spec) {
  Slo slo;
  for (std::string_view part : SplitComma(spec)) {
    if (part.empty()) continue;
    size_t eq = part.find('=');
    if (eq == std::string_view::npos) return InvalidArgumentError("--slo '{}': expected name=value", part);
    std::string_view name = part.substr(0, eq), value = part.substr(eq + 1);
    double scale = 1;
    if (value.ends_with("ms")) {
      value.remove_suffix(2);
    } else if (value.ends_with("us")) {
      value.remove_suffix(2);
      scale = 1e-3;
    } else if (value.ends_with("s")) {
      value.remove_suffix(1);
      scale = 1e3;
    }
    ASSIGN_OR_RETURN(double v, Number(value, fmt::format("--slo {}", name)));
    if (v <= 0) return InvalidArgumentError("--slo {}: must be > 0", name);
    if (name == "ttft") {
      slo.ttft_ms = v * scale;
    } else if (name == "tpot") {
      slo.tpot_ms = v * scale;
    } else if (name == "e2e") {
      slo.e2e_ms = v * scale;
    } else {
      return InvalidArgumentError("--slo: unknown objective '{}' (ttft, tpot, e2e)", name);
    }
  }
  return slo;
}

StatusOr<std::shared_ptr<const std::vector<std::string>>> ReadBytesInputs(const std::vector<std::string>& paths) {
  if (paths.empty()) return std::shared_ptr<const std::vector<std::string>>();
  auto out = std::make_shared<std::vector<std::string>>();
  for (const std::string& p : paths) {
    StatusOr<std::string> b = ReadFileToString(p, size_t{64} << 20);
    if (!b.ok()) return b.status().WithContext("--bytes-input");
    if (b->empty()) return InvalidArgumentError("--bytes-input {}: the file is empty", p);
    out->push_back(std::move(b).value());
  }
  return std::shared_ptr<const std::vector<std::string>>(std::move(out));
}

StatusOr<Api> ParseApi(std::string_view name) {
  for (Api a : kAllApis) {
    if (name == ApiName(a)) return a;
  }
  return InvalidArgumentError(
      "--api '{}': expected openai-chat, openai-completions, openai-embeddings, kserve-http or kserve-grpc",
      name);
}

StatusOr<HttpEndpoint> ParseGrpcUrl(std::string_view url) {
  std::string_view rest = url;
  if (rest.starts_with("grpc://")) rest.remove_prefix(7);
  if (rest.starts_with("http://") || rest.starts_with("https://")) {
    return InvalidArgumentError("--url '{}': kserve-grpc wants grpc://HOST:PORT (or HOST:PORT)", url);
  }
  ASSIGN_OR_RETURN(HttpEndpoint ep, ParseHttpUrl(rest));
  if (!ep.base_path.empty()) return InvalidArgumentError("--url '{}': a gRPC address has no path", url);
  if (rest.find(':') == std::string_view::npos) {
    return InvalidArgumentError("--url '{}': give the gRPC port (grpc://HOST:PORT)", url);
  }
  return ep;
}

std::string DescribeHost() {
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.starts_with("model name")) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  utsname u{};
  uname(&u);
  return fmt::format("{}: {} CPUs ({}), {} {}", host, std::thread::hardware_concurrency(), cpu, u.sysname,
                     u.release);
}

std::string GitCommit() {
  FILE* f = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
  if (f == nullptr) return "";
  char buf[64] = {0};
  std::string out;
  if (std::fgets(buf, sizeof(buf), f) != nullptr) out = buf;
  pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (out.empty()) return out;
  FILE* d = popen("git status --porcelain --untracked-files=no 2>/dev/null", "r");
  if (d != nullptr) {
    if (std::fgets(buf, sizeof(buf), d) != nullptr) out += "-dirty";
    pclose(d);
  }
  return out;
}

StatusOr<BenchReport> RunBench(const BenchOptions& opts, ProgressPrinter* progress) {
  const bool use_grpc = opts.api == Api::kKserveGrpc;
  ASSIGN_OR_RETURN(HttpEndpoint ep, use_grpc ? ParseGrpcUrl(opts.url) : ParseHttpUrl(opts.url));
  BenchReport rep;
  RunInfo& run = rep.run;
  run.command = opts.command;
  run.url = opts.url;
  run.api = opts.api;
  run.mode = opts.mode;
  run.arrival = opts.point.arrival;
  run.workload = opts.workload.Describe();
  run.stream = opts.stream;
  run.slo = opts.point.slo;
  run.label = opts.label;
  run.started_at = NowIso8601();
  run.git_commit = GitCommit();
  run.host = DescribeHost();
  run.window_s = std::min(opts.point.window_s, opts.point.max_duration_s);
  run.warmup_s = opts.point.warmup_s;
  run.ramp_up_s = opts.point.ramp_up_s;
  run.max_duration_s = opts.point.max_duration_s;
  run.stability = opts.point.stability;
  run.seed = opts.point.seed;

  ProtocolOptions proto;
  proto.api = opts.api;
  proto.base_path = ep.base_path;
  proto.stream = opts.stream;
  proto.ignore_eos = opts.ignore_eos;
  proto.temperature = opts.temperature;
  proto.kserve_binary = opts.kserve_binary || (opts.kserve_bytes != nullptr && !opts.kserve_bytes->empty());
  proto.kserve_bytes = opts.kserve_bytes;
  proto.model = opts.model;
  if (proto.model.empty()) {
    if (opts.api == Api::kKserveHttp || use_grpc) {
      return InvalidArgumentError("--api {} needs --model", ApiName(opts.api));
    }
    ASSIGN_OR_RETURN(proto.model, DiscoverModel(ep));
  }
  run.model = proto.model;
  if (opts.api == Api::kKserveHttp) {
    ASSIGN_OR_RETURN(proto.kserve_inputs, FetchKserveInputs(ep, proto.model));
  } else if (use_grpc) {
    ASSIGN_OR_RETURN(proto.kserve_inputs, FetchGrpcModelInputs(ep.HostHeader(), proto.model, 10));
  }

  ASSIGN_OR_RETURN(PromptSource prompts, PromptSource::Create(opts.workload, opts.api, opts.point.seed));
  LoadGenerator gen(ep, proto, &prompts);

  const Nanos run_start = MonotonicNanos();
  std::unique_ptr<MetricsScraper> scraper;
  // /metrics is HTTP: on the --url server, or --metrics-url's (the only way for a gRPC run).
  std::optional<HttpEndpoint> metrics_ep;
  if (!opts.metrics_url.empty()) {
    ASSIGN_OR_RETURN(metrics_ep, ParseHttpUrl(opts.metrics_url));
  } else if (!use_grpc) {
    metrics_ep = ep;
  }
  if (!opts.scrape) {
    rep.server.note = "--no-scrape";
  } else if (!metrics_ep) {
    rep.server.note = "a gRPC run scrapes /metrics only with --metrics-url http://HOST:PORT";
  } else {
    scraper = std::make_unique<MetricsScraper>(*metrics_ep, opts.metrics_path, opts.scrape_interval_s);
    scraper->Start(run_start);
  }
  for (size_t i = 0; i < opts.loads.size(); ++i) {
    PointOptions po = opts.point;
    po.mode = opts.mode;
    po.load = opts.loads[i];
    po.seed = opts.point.seed + i;
    if (progress != nullptr)
      progress->BeginPoint(static_cast<int>(i), static_cast<int>(opts.loads.size()),
                           LoadLabel(po.mode, po.load));
    const Nanos t_start = MonotonicNanos();
    StatusOr<PointResult> p = gen.RunPoint(po, [progress](const ProgressEvent& e) {
      if (progress != nullptr) progress->OnEvent(e);
    });
    if (!p.ok()) {
      if (scraper) scraper->Stop();
      return p.status().WithContext(fmt::format("point {}", LoadLabel(po.mode, po.load)));
    }
    p->t_start_s = (t_start - run_start) * 1e-9;
    p->t_end_s = (MonotonicNanos() - run_start) * 1e-9;
    rep.points.push_back(std::move(p).value());
  }
  if (scraper) {
    scraper->Stop();
    rep.server = scraper->Take();
  }
  return rep;
}

}  // namespace stoke::bench
