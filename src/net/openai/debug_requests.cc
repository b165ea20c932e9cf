#include "net/openai/debug_requests.h"

#include "net/openai/openai_codec.h"

namespace stoke {

void RegisterDebugRequests(HttpServer& server, const RequestLog* log) {
  if (log == nullptr || !log->enabled()) return;
  server.Handle("GET", "/v1/debug/requests", [log](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    StatusOr<RequestLog::Query> q = RequestLog::ParseQuery(req.query);
    if (!q.ok()) {
      r->Send({.status = 400, .body = ErrorJson(ApiErrorFromStatus(q.status()))});
      return;
    }
    r->Send({.body = log->Json(*q)});
  });
}

}  // namespace stoke
