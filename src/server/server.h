// `stoke serve`'s one lifecycle, for every kind of model: the model repository, one metrics registry, GPU
// telemetry, the request log, the HTTP listener (OpenAI routes, KServe v2 REST with the repository extension,
// /health, /metrics, /v1/debug/requests, /v1/debug/trace, /v1/gpu), the KServe gRPC listener, signals and
// drain. The front ends (net/openai, net/kserve, net/grpc) only register routes; each route finds its model
// by name in the repository.
//
// Start-up: listen (/health/live answers, /health/ready is 503), then load the models one by one on the
// repository's worker; a model that fails to load at start stops the server (exit 1, naming it). Each
// loaded model prints "stoke serve: ready on URL (...)". SIGINT/SIGTERM: stop accepting, let in-flight
// responses finish (drain_seconds), unload everything, exit 0.
//
// gRPC listens when a batched model (encoder, synthetic) is among the models and grpc_port >= 0; a server of
// decoders only has none (they infer over the OpenAI routes). HTTP-level errors (404 route, 413, 400 framing)
// have KServe's body when every model is batched, else OpenAI's.
#pragma once

#include "engine/model/backends.h"
#include "server/server_options.h"

namespace stoke {

// Runs the server until SIGINT/SIGTERM; returns the process exit code (2: bad options, 1: could not start
// or load). `backends` outlives the call.
int RunServer(const ServerOptions& options, const Backends& backends);

}  // namespace stoke
