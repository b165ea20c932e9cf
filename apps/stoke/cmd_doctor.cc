// stoke doctor: attach to a running server, drive (or watch) load for a few seconds, and name the
// bottleneck with its evidence and the next knob to turn. Rules: src/tools/doctor/rules.h; docs/doctor.md.
//
//   stoke doctor --url http://127.0.0.1:8000                       # auto: c=1 then c=8, 10 s
//   stoke doctor --url http://127.0.0.1:8000 --load none --duration 30 --json d.json --html d.html
//
// Exit codes: 0 a verdict was printed, 1 error (server unreachable, ...), 2 usage.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "tools/bench/bench_runner.h"
#include "tools/bench/workload.h"
#include "tools/doctor/doctor_runner.h"
#include "tools/doctor/render.h"

namespace stoke {
namespace {

struct DoctorCliOptions {
  std::string url, model, api, load = "auto", concurrency = "1,8", json_path, html_path;
  std::string input_len, output_len, trace = "auto";
  double duration = 10, interval = 0.5, trace_seconds = 2, hbm_gbps = 0, tensor_tflops = 0;
  bool kserve_binary = false, quiet = false;
  std::vector<std::string> bytes_input;
};

int Fail(const Status& s, int code) {
  std::fprintf(stderr, "stoke doctor: %s\n", s.message().c_str());
  return code;
}

StatusOr<doctor::DoctorOptions> ToOptions(const DoctorCliOptions& c) {
  doctor::DoctorOptions o;
  if (c.url.empty()) return InvalidArgumentError("--url is required");
  if (c.duration <= 0) return InvalidArgumentError("--duration must be > 0 (got {})", c.duration);
  if (c.interval < 0.1)
    return InvalidArgumentError("--scrape-interval must be >= 0.1 s (got {})", c.interval);
  if (c.load != "auto" && c.load != "none")
    return InvalidArgumentError("--load '{}': expected auto or none", c.load);
  o.url = c.url;
  o.model = c.model;
  if (!c.api.empty()) {
    RETURN_IF_ERROR(bench::ParseApi(c.api).status());
    if (c.api == "kserve-grpc") return InvalidArgumentError("--api kserve-grpc: the doctor drives HTTP only");
  }
  o.api = c.api;
  o.duration_s = c.duration;
  o.drive_load = c.load == "auto";
  ASSIGN_OR_RETURN(o.concurrency, bench::ParseLoadList(c.concurrency, /*powers_of_two_ranges=*/true));
  ASSIGN_OR_RETURN(o.workload, bench::ParseWorkload("short"));
  if (!c.input_len.empty()) {
    ASSIGN_OR_RETURN(o.workload.input, bench::ParseLengthDist(c.input_len));
  }
  if (!c.output_len.empty()) {
    ASSIGN_OR_RETURN(o.workload.output, bench::ParseLengthDist(c.output_len));
  }
  o.kserve_binary = c.kserve_binary;
  ASSIGN_OR_RETURN(o.kserve_bytes, bench::ReadBytesInputs(c.bytes_input));
  o.scrape_interval_s = c.interval;
  if (c.trace != "auto" && c.trace != "on" && c.trace != "off")
    return InvalidArgumentError("--trace '{}': expected auto, on or off", c.trace);
  if (c.trace_seconds <= 0) return InvalidArgumentError("--trace-seconds must be > 0");
  o.trace = c.trace;
  o.trace_seconds = c.trace_seconds;
  if (c.hbm_gbps < 0 || c.tensor_tflops < 0)
    return InvalidArgumentError("--hbm-gbps and --tensor-tflops must be >= 0 (0: not known)");
  o.hbm_gbps = c.hbm_gbps;
  o.tensor_tflops = c.tensor_tflops;
  o.progress = c.quiet ? nullptr : stderr;
  return o;
}

int RunDoctorCommand(const DoctorCliOptions& c) {
  StatusOr<doctor::DoctorOptions> o = ToOptions(c);
  if (!o.ok()) return Fail(o.status(), 2);
  StatusOr<doctor::DoctorReport> rep = doctor::RunDoctor(*o);
  if (!rep.ok()) return Fail(rep.status(), 1);
  std::fputs(doctor::ReportText(*rep).c_str(), stdout);
  std::fflush(stdout);
  if (!c.json_path.empty()) {
    Status s = WriteStringToFile(c.json_path, doctor::ReportJson(*rep).dump(1) + "\n");
    if (!s.ok()) return Fail(s, 1);
  }
  if (!c.html_path.empty()) {
    Status s = WriteStringToFile(c.html_path, doctor::ReportHtml(*rep));
    if (!s.ok()) return Fail(s, 1);
  }
  return 0;
}

CommandRun SetupDoctor(CLI::App* cmd) {
  auto c = std::make_shared<DoctorCliOptions>();
  cmd->footer(
      "Reads only the server's public endpoints: /metrics (ledger stage histograms, batcher and engine "
      "stats), "
      "/v1/gpu (NVML/GPM), /v2/models/M/config, /v1/debug/requests, and a short trace (/v1/debug/trace: "
      "kernels per request, kernel durations, gaps).\n"
      "Verdicts: under_fed, queue_bound, host_bound, copy_bound, launch_bound, bandwidth_bound, "
      "compute_bound, "
      "kv_capacity_bound, throttled, none. Each comes with its evidence (value beside the rule's threshold), "
      "a "
      "confidence and the next knob. Rules and thresholds: docs/doctor.md.\n"
      "Example: stoke doctor --url http://127.0.0.1:8000 --json doctor.json --html doctor.html");
  cmd->add_option("--url", c->url, "Server base URL, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option(
         "--duration", c->duration,
         "Seconds of measurement: with --load auto the sweep's last point gets 70%, the others share 30%")
      ->capture_default_str();
  cmd->add_option("--load", c->load,
                  "auto: drive a short closed-loop sweep (--concurrency) and diagnose its last point; none: "
                  "observe existing traffic only")
      ->capture_default_str();
  cmd->add_option("--concurrency", c->concurrency, "The --load auto sweep, e.g. 1,8 or 1,8,32")
      ->capture_default_str();
  cmd->add_option("--model", c->model, "Model to drive and diagnose (default: the first of GET /v1/models)");
  cmd->add_option(
      "--api", c->api,
      "How to drive it: openai-chat | openai-completions | openai-embeddings | kserve-http (default: "
      "kserve-http when /v2/models/M/config exists, else openai-completions)");
  cmd->add_option("--input-len", c->input_len,
                  "LLM prompt tokens for the driven load (bench's syntax; default 128)");
  cmd->add_option("--output-len", c->output_len, "LLM generated tokens for the driven load (default 128)");
  cmd->add_flag("--kserve-binary", c->kserve_binary, "Send KServe inputs with the binary tensor extension");
  cmd->add_option("--bytes-input", c->bytes_input,
                  "Files whose contents fill KServe BYTES inputs of the driven load, one drawn per element (an "
                  "image model: JPEG/PNG photos; default: the prompt text, which an image model refuses); "
                  "implies --kserve-binary")
      ->delimiter(',');
  cmd->add_option("--scrape-interval", c->interval, "Seconds between /metrics and /v1/gpu scrapes")
      ->capture_default_str();
  cmd->add_option("--trace", c->trace,
                  "GPU timeline: auto (take a short trace inside the window when the server has "
                  "/v1/debug/trace), on (the same, and say why when it cannot), off")
      ->capture_default_str();
  cmd->add_option("--trace-seconds", c->trace_seconds,
                  "Length of that trace (at most half the diagnosed window)")
      ->capture_default_str();
  cmd->add_option("--hbm-gbps", c->hbm_gbps,
                  "LLM step split: the device's streaming bandwidth in GB/s (stoke bench step prints it as "
                  "device_roofline.d2d_gbps; ~4200 measured on an H200). With it the split says how long a "
                  "step's weight and KV reads take at that rate (default 0: bytes only)");
  cmd->add_option(
      "--tensor-tflops", c->tensor_tflops,
      "LLM step split: the device's bf16 GEMM rate in TFLOP/s (bench step's device_roofline "
      "gemms; ~700 on an H200): how long the step's matmul and attention math takes at that rate");
  cmd->add_option("--json", c->json_path, "Write the verdicts, evidence and every signal as JSON here");
  cmd->add_option("--html", c->html_path, "Write a self-contained HTML page here");
  cmd->add_flag("--quiet", c->quiet, "No progress lines on stderr");
  return [c](const Backends&) -> int { return RunDoctorCommand(*c); };
}

CommandRegistrar kDoctor("doctor",
                         "Name a running server's bottleneck, with evidence and the next knob to turn",
                         SetupDoctor);

}  // namespace
}  // namespace stoke
