// GET /v1/debug/requests: the last N finished requests with their time ledgers (telemetry/request_log.h), for
// every serving path (the LLM server and the classic KServe/embeddings server register it alike).
//
//   GET /v1/debug/requests                     newest first, every request the ring holds
//   GET /v1/debug/requests?model=NAME          one model's
//   GET /v1/debug/requests?slowest=10          the 10 slowest by e2e, slowest first
//   GET /v1/debug/requests?limit=20            at most 20
// A bad parameter is 400; with the log disabled (--debug-requests 0) the route answers 404.
#pragma once

#include "net/http/http_server.h"
#include "telemetry/request_log.h"

namespace stoke {

// `log` (may be null: nothing registered) outlives the server.
void RegisterDebugRequests(HttpServer& server, const RequestLog* log);

}  // namespace stoke
