// stoke trace: records a timeline on a running server (POST /v1/debug/trace) and writes it for Perfetto.
//
//   stoke trace --url http://127.0.0.1:8000 --seconds 5 -o trace.json
//   stoke trace --url http://127.0.0.1:8000 --seconds 2 --max-events 200000 -o trace.json
//   stoke trace --summarize trace.json          (the summary of a file already taken; no server)
//
// The server records for N seconds (drive load meanwhile: `stoke bench`, your clients) and answers with
// Chrome trace-event JSON; open it at https://ui.perfetto.dev or chrome://tracing. A summary goes to stdout:
// events, tracks, dropped events, spans per process and, where the trace has GPU kernel records, the GPU's
// idle gaps. Exit codes: 0 ok, 1 error (server unreachable, 409 a trace already running, ...), 2 usage.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "tools/bench/http_client.h"
#include "tools/trace/trace_summary.h"

namespace stoke {
namespace {

struct TraceCliOptions {
  std::string url, output = "trace.json", summarize;
  double seconds = 5;
  int64_t max_events = 0;  // 0: the server's default
};

int Summarize(const std::string& text) {
  StatusOr<TraceSummary> s = SummarizeTrace(text);
  if (!s.ok()) {
    fmt::print(stderr, "stoke trace: {}\n", s.status().message());
    return 1;
  }
  fmt::print("{}", FormatTraceSummary(*s));
  return 0;
}

int RunTrace(const TraceCliOptions& o) {
  if (!o.summarize.empty()) {
    StatusOr<std::string> text = ReadFileToString(o.summarize);
    if (!text.ok()) {
      fmt::print(stderr, "stoke trace: {}\n", text.status().message());
      return 1;
    }
    return Summarize(*text);
  }
  if (o.url.empty()) {
    fmt::print(stderr, "stoke trace: --url is required (or --summarize FILE)\n");
    return 2;
  }
  StatusOr<bench::HttpEndpoint> ep = bench::ParseHttpUrl(o.url);
  if (!ep.ok()) {
    fmt::print(stderr, "stoke trace: --url: {}\n", ep.status().message());
    return 2;
  }
  std::string target = fmt::format("{}/v1/debug/trace?seconds={}", ep->base_path, o.seconds);
  if (o.max_events > 0) target += fmt::format("&max_events={}", o.max_events);
  fmt::print(stderr, "stoke trace: recording {} s on {}\n", o.seconds, o.url);
  StatusOr<bench::SimpleResponse> r = bench::HttpFetch(*ep, "POST", target, "", o.seconds + 60);
  if (!r.ok()) {
    fmt::print(stderr, "stoke trace: {}\n", r.status().message());
    return 1;
  }
  if (r->status != 200) {
    fmt::print(stderr, "stoke trace: the server answered {}: {}\n", r->status, r->body);
    return 1;
  }
  if (Status s = WriteStringToFile(o.output, r->body); !s.ok()) {
    fmt::print(stderr, "stoke trace: {}\n", s.message());
    return 1;
  }
  fmt::print(stderr, "stoke trace: wrote {} ({} bytes); open it at https://ui.perfetto.dev\n", o.output,
             r->body.size());
  return Summarize(r->body);
}

CommandRegistrar kTrace(
    "trace", "Record a timeline on a running server (Perfetto / chrome://tracing JSON) and summarise it",
    [](CLI::App* cmd) {
      auto o = std::make_shared<TraceCliOptions>();
      cmd->add_option("--url", o->url, "Server base URL, e.g. http://127.0.0.1:8000");
      cmd->add_option("--seconds", o->seconds, "How long the server records (it caps this; 60 s by default)")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
      cmd->add_option("-o,--output", o->output, "Where to write the trace JSON")->capture_default_str();
      cmd->add_option("--max-events", o->max_events,
                      "Event budget of this trace (0: the server's default); events past it are counted as "
                      "dropped")
          ->check(CLI::NonNegativeNumber);
      cmd->add_option("--summarize", o->summarize, "Summarise a trace file already written (no server)");
      return [o](const Backends&) -> int { return RunTrace(*o); };
    });

}  // namespace
}  // namespace stoke
