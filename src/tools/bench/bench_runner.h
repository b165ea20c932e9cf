// A whole `stoke bench` run: discover the model, fetch KServe metadata (REST or gRPC), scrape /metrics
// alongside, run each load point in turn, and return the report. Also the parsers for the command's option
// values.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/load_generator.h"
#include "tools/bench/report.h"
#include "tools/bench/workload.h"

namespace stoke::bench {

struct BenchOptions {
  std::string url;          // http://HOST:PORT[/prefix]; kserve-grpc: grpc://HOST:PORT or HOST:PORT
  std::string metrics_url;  // where /metrics is scraped ("" = url; needed for kserve-grpc)
  std::string model;        // "" = the first of GET /v1/models (OpenAI APIs)
  Api api = Api::kOpenAiChat;
  LoadMode mode = LoadMode::kConcurrency;
  std::vector<double> loads;
  WorkloadSpec workload;
  PointOptions point;  // everything but mode/load, which come per point
  bool stream = true;
  bool ignore_eos = true;
  double temperature = -1;  // >= 0: sent with every chat/completions request
  bool kserve_binary = false;
  // BYTES inputs drawn from these contents (--bytes-input files; e.g. JPEG photos); implies kserve_binary.
  std::shared_ptr<const std::vector<std::string>> kserve_bytes;
  bool scrape = true;
  std::string metrics_path = "/metrics";
  double scrape_interval_s = 1;
  std::string label;
  std::string command;
  bool quiet = false;
};

// "1,2,4" | "1:256" (powers of two from 1 to 256) | "sweep" (1:256). Rates: "5,10,20.5".
StatusOr<std::vector<double>> ParseLoadList(std::string_view spec, bool powers_of_two_ranges);
// "ttft=200ms,tpot=50ms,e2e=2s"; units ms (default), s, us.
StatusOr<Slo> ParseSlo(std::string_view spec);
StatusOr<Api> ParseApi(std::string_view name);
// --bytes-input: each file's whole contents (an encoded image, a document), at most 64 MiB each; an empty
// list is nullptr. A missing or empty file is an error naming it.
StatusOr<std::shared_ptr<const std::vector<std::string>>> ReadBytesInputs(const std::vector<std::string>& paths);
// The gRPC server of --api kserve-grpc: "grpc://HOST:PORT" or "HOST:PORT" (no path).
StatusOr<HttpEndpoint> ParseGrpcUrl(std::string_view url);

StatusOr<BenchReport> RunBench(const BenchOptions& opts, ProgressPrinter* progress);

// "host: 2 CPUs (model name), Linux 6.1"; "" parts are skipped.
std::string DescribeHost();
// Now, UTC, as 2026-12-03T17:00:00Z (reports' started_at).
std::string NowIso8601();
// The short commit of the git checkout in the working directory, or "".
std::string GitCommit();

}  // namespace stoke::bench
