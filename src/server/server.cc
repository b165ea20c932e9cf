#include "server/server.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "base/thread_pool.h"
#include "net/grpc/grpc_server.h"
#include "net/http/http_server.h"
#include "net/http/trace_endpoint.h"
#include "net/kserve/kserve_codec.h"
#include "net/kserve/kserve_service.h"
#include "net/openai/debug_requests.h"
#include "net/openai/embeddings_service.h"
#include "net/openai/openai_codec.h"
#include "net/openai/openai_service.h"
#include "serve/repository/model_repository.h"
#include "server/model_loader.h"
#include "server/repository_folder.h"
#include "telemetry/gpu_telemetry.h"
#include "telemetry/metrics.h"
#include "telemetry/request_log.h"
#include "telemetry/server_metrics.h"

namespace stoke {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

HttpResponse Json(int status, std::string body, HttpHeaders headers = {}) {
  return {.status = status, .content_type = "application/json", .body = std::move(body), .headers = headers};
}

// Routes of the lifecycle itself: health, metrics, GPU snapshot.
void RegisterServerRoutes(HttpServer& server, const ModelRepository* repo, const MetricsRegistry* registry,
                          const GpuTelemetry* gpu) {
  server.Handle("GET", "/health/live", [](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->Send(Json(200, R"({"status":"live"})"));
  });
  for (const char* path : {"/health/ready", "/health"}) {
    server.Handle("GET", path, [repo](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
      if (repo->ready()) {
        r->Send(Json(200, R"({"status":"ready"})"));
      } else {
        r->Send(Json(503, R"({"status":"loading"})", {{"Retry-After", "1"}}));
      }
    });
  }
  server.Handle("GET", "/metrics", [registry](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->Send({.status = 200, .content_type = kPrometheusContentType, .body = registry->ExposeText()});
  });
  server.Handle("GET", "/v1/gpu", [gpu](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->Send({.body = gpu->SnapshotJson()});
  });
}

// The models: --model arguments and the repository folder's, with --served-model-name applied.
StatusOr<std::vector<ModelSettings>> CollectModels(const ServerOptions& o) {
  std::vector<ModelSettings> models = o.models;
  if (!o.model_repository.empty()) {
    ASSIGN_OR_RETURN(std::vector<ModelSettings> folder, ReadRepositoryFolder(o.model_repository));
    models.insert(models.end(), folder.begin(), folder.end());
  }
  if (models.empty()) {
    return InvalidArgumentError(
        "--model or --model-repository is required (on the command line or in --config)");
  }
  return models;
}

}  // namespace

int RunServer(const ServerOptions& o, const Backends& backends) {
  auto settings = CollectModels(o);
  if (!settings.ok()) {
    fmt::print(stderr, "stoke serve: {}\n", settings.status().message());
    return 2;
  }
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);

  // One registry for every model's series (each labelled with its model_name) and the GPU's.
  MetricsRegistry registry(o.metric_naming);
  std::vector<std::unique_ptr<ServerMetrics>>
      decoder_metrics;  // outlive the repository (engines' step hooks)
  std::string url;      // set once listening
  std::atomic<bool> started{false};
  ModelRepository repo({.registry = &registry,
                        .unload_drain = Millis(o.drain_seconds),
                        .on_load = [&url, &started](const RepositoryModel& m, const Status& s) {
                          if (!s.ok()) {
                            if (started) fmt::print(stderr, "stoke serve: {}\n", s.message());
                            return;
                          }
                          fmt::print(stderr, "stoke serve: {} {} ({})\n", started ? "loaded on" : "ready on",
                                     url, m.summary());
                        }});
  bool any_batched = false, any_decoder = false;
  std::vector<std::string> sources;
  for (const ModelSettings& s : *settings) {
    auto config = MakeModelConfig(s, o, backends, &registry, &decoder_metrics);
    Status added = config.ok() ? OkStatus() : config.status();
    if (config.ok()) {
      any_batched |= config->kind != ModelKind::kDecoder;
      any_decoder |= config->kind == ModelKind::kDecoder;
      added = repo.Add(std::move(*config));
    }
    if (!added.ok()) {
      fmt::print(stderr, "stoke serve: {}\n", added.message());
      return 2;
    }
    sources.push_back(s.source);
  }

  // GPU telemetry on /metrics (DCGM_FI_* names) and GET /v1/gpu; without NVML only an info line.
  std::unique_ptr<GpuTelemetry> gpu = GpuTelemetry::Create(
      {.enabled = o.gpu_telemetry, .interval = std::chrono::milliseconds(o.gpu_telemetry_interval_ms)},
      &registry);
  gpu->Start();

  HttpServerOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.threads = o.http_threads;
  ho.max_body_bytes = o.max_body_bytes;
  ho.max_header_bytes = o.max_header_bytes;
  ho.max_connections = o.max_connections;
  ho.idle_timeout = Millis(o.idle_timeout_seconds);
  ho.request_timeout = Millis(o.request_timeout_seconds);
  // Checked before any route is looked up, so every front end (OpenAI, KServe, repository, debug) and every
  // model is behind it; a second SIGINT/SIGTERM during the drain exits 128+signo (second_signal_exits).
  ho.api_key = o.api_key;
  ho.metrics_require_key = o.metrics_require_key;
  if (any_decoder) {
    ho.error_body = OpenAiErrorBody;
  } else {
    ho.error_body = [](int, std::string_view message) { return KserveErrorBody(message); };
  }
  // Before the server: its connections' completion callbacks write into it.
  RequestLog request_log(static_cast<size_t>(std::max(0, o.debug_requests)));
  TraceEndpoint trace;  // POST /v1/debug/trace; declared before the server, which calls into it
  HttpServer server(ho);
  trace.Register(server);
  OpenAiService openai({.request_log = &request_log,
                        .record_ledger = o.record_ledger,
                        .batch_generation_events = o.batch_generation_events},
                       &repo);
  openai.RegisterRoutes(server);
  EmbeddingsService embeddings({.request_log = &request_log, .record_ledger = o.record_ledger}, &repo);
  bool any_encoder = false;
  for (const auto& m : repo.models()) any_encoder |= m->kind() == ModelKind::kEncoder;
  if (any_encoder) embeddings.RegisterRoutes(server);
  KserveService kserve({.request_log = &request_log, .record_ledger = o.record_ledger}, &repo);
  kserve.RegisterRoutes(server);
  RegisterDebugRequests(server, &request_log);
  RegisterServerRoutes(server, &repo, &registry, gpu.get());
  if (Status s = server.Start(); !s.ok()) {
    fmt::print(stderr, "stoke serve: {}\n", s.message());
    return 1;
  }
  url = fmt::format("http://{}:{}", o.host, server.port());
  fmt::print(stderr, "stoke serve: listening on {} (loading {})\n", url, fmt::join(sources, ", "));

  std::unique_ptr<GrpcInferenceServer> grpc;
  if (any_batched && o.grpc_port >= 0) {
    grpc = std::make_unique<GrpcInferenceServer>(
        GrpcServerOptions{.host = o.host,
                          .port = o.grpc_port,
                          .extensions = KserveExtensions(),
                          .request_log = &request_log,
                          .record_ledger = o.record_ledger,
                          .max_message_bytes = static_cast<int>(std::min<size_t>(o.max_body_bytes, INT_MAX)),
                          .api_key = o.api_key},
        &repo);
    if (Status s = grpc->Start(); !s.ok()) {
      fmt::print(stderr, "stoke serve: {}\n", s.message());
      server.Shutdown(std::chrono::milliseconds(0));
      return 1;
    }
    fmt::print(stderr, "stoke serve: gRPC listening on {}:{}\n", o.host, grpc->port());
  } else if (!any_batched && o.grpc_port_set) {
    LOG_WARN(
        "serve: --grpc-port {} is ignored: decoders are served over HTTP only (the KServe v2 gRPC endpoint "
        "serves encoders and model files)",
        o.grpc_port);
  }

  // Load on the repository's worker so a signal during a long load (or fetch) still stops the process.
  repo.Start();
  int early_signal = 0;
  while (!repo.idle()) {
    if (const int sig = server.WaitForSignal(std::chrono::milliseconds(50)); sig != 0) {
      // Every model is READY (and may be serving: "ready on" is printed from the worker before it goes
      // idle), so this signal drains like any other.
      if (repo.ready()) {
        early_signal = sig;
        break;
      }
      // Nothing is in flight yet; the load can't be interrupted cleanly, so leave without unwinding it.
      fmt::print(stderr, "stoke serve: interrupted while loading the model\n");
      if (grpc) grpc->Shutdown(std::chrono::milliseconds(0));
      server.Shutdown(std::chrono::milliseconds(0));
      std::fflush(stderr);
      std::_Exit(0);
    }
  }
  if (Status s = repo.StartupError(); !s.ok()) {
    fmt::print(stderr, "stoke serve: cannot load {}\n", s.message());
    if (grpc) grpc->Shutdown(std::chrono::milliseconds(0));
    server.Shutdown(std::chrono::milliseconds(0));
    repo.Stop();
    return 1;
  }
  started = true;

  const int signo = early_signal != 0 ? early_signal : server.WaitForSignal();
  fmt::print(stderr, "stoke serve: {} received; draining (up to {} s)\n",
             signo == SIGTERM ? "SIGTERM" : "SIGINT", o.drain_seconds);
  const auto drain = Millis(o.drain_seconds);
  trace.Finish();  // a trace in progress answers now rather than holding the drain up
  // Both front ends drain at once: each closes its listener first, so new clients are refused on both ports
  // from the first signal on (a gRPC stream left open would otherwise keep HTTP accepting for the whole
  // drain), and the drain takes --drain-seconds, not twice that.
  std::thread grpc_drain;
  if (grpc) grpc_drain = std::thread([&grpc, drain] { grpc->Shutdown(drain); });
  server.Shutdown(drain);
  if (grpc_drain.joinable()) grpc_drain.join();
  // Nothing calls into the models any more: unload them (engine threads join; leftover callbacks only
  // queue onto the stopped servers). The metrics go after (the engines' step hooks use them).
  repo.Stop();
  fmt::print(stderr, "stoke serve: stopped\n");
  return 0;
}

}  // namespace stoke
