#include "telemetry/request_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <iterator>
#include <nlohmann/json.hpp>

namespace stoke {
namespace {

using nlohmann::json;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string UrlDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

StatusOr<size_t> ParseCount(std::string_view key, std::string_view v) {
  size_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size()) {
    return InvalidArgumentError("'{}' must be a non-negative integer, got '{}'", key, v);
  }
  return n;
}

}  // namespace

int64_t UnixMillisAt(Nanos monotonic) {
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return now_ms - (MonotonicNanos() - monotonic) / 1000000;
}

RequestLog::RequestLog(size_t capacity) : capacity_(capacity) {}

void RequestLog::Add(RequestLogEntry e) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  ++recorded_;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(e));
    return;
  }
  ring_[next_] = std::move(e);
  next_ = (next_ + 1) % capacity_;
}

uint64_t RequestLog::recorded() const {
  std::lock_guard lock(mu_);
  return recorded_;
}

std::vector<RequestLogEntry> RequestLog::Find(const Query& q) const {
  std::vector<RequestLogEntry> out;
  {
    std::lock_guard lock(mu_);
    out.reserve(ring_.size());
    // Newest first: the slot before next_ backwards, wrapping.
    for (size_t k = 0; k < ring_.size(); ++k) {
      const size_t i = (next_ + ring_.size() - 1 - k) % ring_.size();
      if (q.model.empty() || ring_[i].model == q.model) out.push_back(ring_[i]);
    }
  }
  if (q.slowest > 0) {
    std::stable_sort(out.begin(), out.end(), [](const RequestLogEntry& a, const RequestLogEntry& b) {
      return a.ledger.e2e > b.ledger.e2e;
    });
    if (out.size() > q.slowest) out.resize(q.slowest);
  }
  if (q.limit > 0 && out.size() > q.limit) out.resize(q.limit);
  return out;
}

StatusOr<RequestLog::Query> RequestLog::ParseQuery(std::string_view query) {
  Query q;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    const std::string key = UrlDecode(part.substr(0, eq));
    const std::string value = eq == std::string_view::npos ? "" : UrlDecode(part.substr(eq + 1));
    if (key == "model") {
      q.model = value;
    } else if (key == "slowest") {
      ASSIGN_OR_RETURN(q.slowest, ParseCount(key, value));
    } else if (key == "limit") {
      ASSIGN_OR_RETURN(q.limit, ParseCount(key, value));
    } else {
      return InvalidArgumentError("unknown query parameter '{}' (model, slowest, limit)", key);
    }
  }
  return q;
}

std::string RequestLogEntryJson(const RequestLogEntry& e) {
  // By hand: milliseconds with 3 decimals (a JSON library prints 0.41500000000000004); strings escaped.
  auto str = [](const std::string& v) { return json(v).dump(); };
  auto ms = [](Nanos ns) { return fmt::format("{:.3f}", static_cast<double>(ns) * 1e-6); };
  std::string out = fmt::format(R"({{"id":{},"model":{},"api":{},"status":{},)", str(e.id), str(e.model),
                                str(e.api), e.status);
  if (!e.finish.empty()) fmt::format_to(std::back_inserter(out), R"("finish_reason":{},)", str(e.finish));
  fmt::format_to(std::back_inserter(out), R"("start_unix_ms":{},"e2e_ms":{},"stages_ms":{{)", e.start_unix_ms,
                 ms(e.ledger.e2e));
  bool first = true;
  for (LedgerStage s : LedgerStages(e.ledger.kind)) {
    fmt::format_to(std::back_inserter(out), R"({}"{}":{})", first ? "" : ",", LedgerStageName(s),
                   ms(e.ledger[s]));
    first = false;
  }
  fmt::format_to(std::back_inserter(out), R"(}},"tokens_in":{},"tokens_out":{})", e.tokens_in, e.tokens_out);
  if (e.ledger.kind == LedgerKind::kGeneration) {
    fmt::format_to(std::back_inserter(out), R"(,"ttft_ms":{},"tpot_ms":{})",
                   e.ttft >= 0 ? ms(e.ttft) : "null", e.tpot >= 0 ? ms(e.tpot) : "null");
  }
  out += '}';
  return out;
}

std::string RequestLog::Json(const Query& q) const {
  const std::vector<RequestLogEntry> found = Find(q);
  std::string out = fmt::format(R"({{"capacity":{},"recorded":{},"requests":[)", capacity_, recorded());
  for (size_t i = 0; i < found.size(); ++i) {
    if (i) out += ',';
    out += RequestLogEntryJson(found[i]);
  }
  out += "]}";
  return out;
}

}  // namespace stoke
