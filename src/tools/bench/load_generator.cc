#include "tools/bench/load_generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cmath>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "tools/bench/aggregate.h"
#include "tools/bench/grpc_client.h"
#include "tools/bench/stats.h"

namespace stoke::bench {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kReadyAhead = 8;         // wire requests built ahead so building never delays a send
constexpr int kGrpcSlotsPerChannel = 64;  // calls in flight per HTTP/2 connection before another is opened
constexpr int kMaxGrpcChannels = 16;
constexpr double kGrpcConnectTimeoutS = 10;

using ConnectionFactory = std::function<std::shared_ptr<Connection>()>;

asio::steady_timer::time_point AtNanos(Nanos t) {
  return asio::steady_timer::time_point(std::chrono::nanoseconds(t));
}
Nanos Seconds(double s) {
  return static_cast<Nanos>(s * 1e9);
}

// The state of one point; lives on the stack of RunPoint while its io_context runs.
class PointRun {
 public:
  // `address` names the server in messages ("http://host:port"); helper_cpu (optional) reads the CPU
  // seconds of a thread that works for the generator besides the io thread (the gRPC poller).
  // http_host: the Host header of HTTP requests ("" over gRPC), written into pre-built requests.
  PointRun(asio::io_context& io, ConnectionFactory factory, std::string address, std::string http_host,
           const ProtocolOptions& protocol, PromptSource* prompts, const PointOptions& opts,
           const ProgressFn& progress, std::function<double()> helper_cpu)
      : io_(io),
        factory_(std::move(factory)),
        address_(std::move(address)),
        http_host_(std::move(http_host)),
        helper_cpu_(std::move(helper_cpu)),
        protocol_(protocol),
        prompts_(prompts),
        opts_(opts),
        progress_(progress),
        arrival_timer_(io),
        window_timer_(io),
        drain_timer_(io),
        rng_(opts.seed),
        request_rng_(opts.seed ^ 0x9e3779b97f4a7c15ULL) {}

  Status Run(PointResult* out);

 private:
  Status Prepare();
  Status BuildPool();
  void Begin();
  std::shared_ptr<Connection> NewConnection();
  std::shared_ptr<const WireRequest> TakeReady();
  void Refill();
  void Issue(const std::shared_ptr<Connection>& conn, size_t idx);
  size_t NewRecord(Nanos scheduled);
  void OnComplete(size_t idx, const std::shared_ptr<Connection>& conn, const std::string& error,
                  const std::string& detail, Nanos t);
  double NextGapSeconds();
  void ArmArrival();
  void OnArrival();
  void Dispatch(Nanos scheduled);
  void ArmWindow();
  void OnWindow();
  void Stop(Nanos at);
  void OnDrainTimeout();
  void Finish();
  void Report(ProgressEvent::Phase phase, const WindowStats* w, bool stable);
  PointResult Result(double cpu_s, double wall_s);
  std::string NoSuccessReason() const;
  // A request counts in the point when it was scheduled inside the measured window, after the warm-up.
  bool Measured(const RequestRecord& r) const {
    return !r.warmup && r.scheduled >= measure_start_ && r.scheduled < measure_end_;
  }

  asio::io_context& io_;
  ConnectionFactory factory_;
  std::string address_;
  std::string http_host_;
  std::function<double()> helper_cpu_;
  const ProtocolOptions& protocol_;
  PromptSource* prompts_;
  const PointOptions& opts_;
  const ProgressFn& progress_;
  asio::steady_timer arrival_timer_, window_timer_, drain_timer_;
  std::mt19937_64 rng_;          // arrivals
  std::mt19937_64 request_rng_;  // request payloads
  Status setup_status_;

  std::vector<std::shared_ptr<Connection>> conns_;
  std::vector<std::shared_ptr<Connection>> idle_;  // open loop
  std::deque<size_t> pending_;                     // open loop: records waiting for a connection
  std::vector<RequestRecord> records_;
  std::unordered_map<size_t, std::unique_ptr<ResponseReader>> readers_;
  std::deque<std::shared_ptr<const WireRequest>> ready_;
  bool refill_posted_ = false;
  std::vector<std::shared_ptr<const WireRequest>> pool_;  // pre-built requests, sent in turn
  size_t pool_next_ = 0;
  int64_t reused_ = 0;  // sends of a pool entry already sent once

  Nanos t0_ = 0, measure_start_ = 0, measure_end_ = 0, next_arrival_ = 0;
  int windows_closed_ = 0;
  std::vector<WindowStats> windows_;
  bool stable_ = false, stopping_ = false, drain_cut_ = false, finished_ = false;
  int in_flight_ = 0;
};

std::shared_ptr<Connection> PointRun::NewConnection() {
  std::shared_ptr<Connection> c = factory_();
  conns_.push_back(c);
  return c;
}

std::shared_ptr<const WireRequest> PointRun::TakeReady() {
  if (!pool_.empty()) {
    if (pool_next_ >= pool_.size()) ++reused_;
    return pool_[pool_next_++ % pool_.size()];
  }
  if (ready_.empty()) Refill();
  std::shared_ptr<const WireRequest> w = std::move(ready_.front());
  ready_.pop_front();
  if (!refill_posted_) {
    refill_posted_ = true;
    asio::post(io_, [this] {
      refill_posted_ = false;
      if (!finished_) Refill();
    });
  }
  return w;
}

void PointRun::Refill() {
  while (ready_.size() < kReadyAhead) {
    StatusOr<WireRequest> w = BuildRequest(protocol_, prompts_->Next(), request_rng_);
    if (!w.ok()) {  // validated on the first request; a later failure is reported per request
      auto bad = std::make_shared<WireRequest>();
      bad->method = "";
      bad->body = w.status().message();
      ready_.push_back(std::move(bad));
    } else {
      ready_.push_back(std::make_shared<const WireRequest>(std::move(w).value()));
    }
  }
}

// Builds (and, over HTTP, serializes) opts_.prebuilt_requests requests before the point starts.
Status PointRun::BuildPool() {
  pool_.reserve(static_cast<size_t>(opts_.prebuilt_requests));
  for (int i = 0; i < opts_.prebuilt_requests; ++i) {
    StatusOr<WireRequest> w = BuildRequest(protocol_, prompts_->Next(), request_rng_);
    if (!w.ok()) return w.status();
    if (!http_host_.empty())
      w->wire = std::make_shared<const std::string>(SerializeHttpRequest(*w, http_host_));
    pool_.push_back(std::make_shared<const WireRequest>(std::move(w).value()));
  }
  return OkStatus();
}

size_t PointRun::NewRecord(Nanos scheduled) {
  RequestRecord r;
  r.scheduled = scheduled;
  r.warmup = scheduled < measure_start_;
  records_.push_back(std::move(r));
  return records_.size() - 1;
}

void PointRun::Issue(const std::shared_ptr<Connection>& conn, size_t idx) {
  std::shared_ptr<const WireRequest> req = TakeReady();
  if (req->method.empty()) {
    records_[idx].error = "build";
    records_[idx].error_detail = req->body;
    records_[idx].done = MonotonicNanos();
    if (opts_.mode == LoadMode::kRate) idle_.push_back(conn);
    return;
  }
  records_[idx].input_tokens = req->input_tokens;
  auto reader = std::make_unique<ResponseReader>(protocol_.api, protocol_.stream);
  ResponseReader* rd = reader.get();
  readers_[idx] = std::move(reader);
  ++in_flight_;
  ResponseHandlers h;
  h.on_sent = [this, idx](Nanos t) { records_[idx].sent = t; };
  h.on_status = [rd](int status, int64_t json_length) { rd->OnStatus(status, json_length); };
  h.on_body = [rd](std::string_view bytes, Nanos t) { rd->OnBody(bytes, t); };
  h.on_complete = [this, idx, conn](const std::string& error, const std::string& detail, Nanos t) {
    OnComplete(idx, conn, error, detail, t);
  };
  conn->Start(*req, std::move(h), Seconds(opts_.request_timeout_s));
}

void PointRun::OnComplete(size_t idx, const std::shared_ptr<Connection>& conn, const std::string& error,
                          const std::string& detail, Nanos t) {
  --in_flight_;
  RequestRecord& r = records_[idx];
  auto it = readers_.find(idx);
  if (error.empty()) {
    it->second->End(t);
    it->second->Finish(&r);
  } else {
    it->second->Finish(&r);
    r.done = t;
    r.error = drain_cut_ ? kIncompleteError : error;
    r.error_detail = drain_cut_ ? "still running when the drain timed out" : detail;
  }
  readers_.erase(it);
  if (finished_) return;
  if (!stopping_) {
    if (opts_.mode == LoadMode::kConcurrency && (r.error == "connect" || r.error == "grpc_unavailable")) {
      // A refused connection fails at once: back off a little instead of spinning.
      auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(10));
      timer->async_wait([this, timer, conn](const boost::system::error_code& ec) {
        if (!ec && !stopping_ && !finished_) Issue(conn, NewRecord(MonotonicNanos()));
      });
    } else if (opts_.mode == LoadMode::kConcurrency) {
      // Closed loop: the next request is due the moment the generator learns this one ended. Over HTTP that
      // is `t` (read on this thread); over gRPC `t` is the poller's timestamp, and the hop to this thread
      // (a wake-up, long on a loaded machine) is the client's think time, not a late send.
      Issue(conn, NewRecord(protocol_.api == Api::kKserveGrpc ? MonotonicNanos() : t));
    } else if (!pending_.empty()) {
      size_t next = pending_.front();
      pending_.pop_front();
      Issue(conn, next);
    } else {
      idle_.push_back(conn);
    }
  } else if (opts_.mode == LoadMode::kRate && !pending_.empty() && !drain_cut_) {
    size_t next = pending_.front();
    pending_.pop_front();
    Issue(conn, next);
  }
  if (stopping_ && in_flight_ == 0 && pending_.empty()) Finish();
}

double PointRun::NextGapSeconds() {
  if (opts_.arrival == Arrival::kConstant) return 1.0 / opts_.load;
  return std::exponential_distribution<double>(opts_.load)(rng_);
}

void PointRun::ArmArrival() {
  arrival_timer_.expires_at(AtNanos(next_arrival_));
  arrival_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) OnArrival();
  });
}

void PointRun::OnArrival() {
  if (stopping_) return;
  const Nanos now = MonotonicNanos();
  while (next_arrival_ <= now) {
    Dispatch(next_arrival_);
    next_arrival_ += Seconds(NextGapSeconds());
  }
  ArmArrival();
}

void PointRun::Dispatch(Nanos scheduled) {
  size_t idx = NewRecord(scheduled);
  if (!idle_.empty()) {
    auto conn = idle_.back();
    idle_.pop_back();
    Issue(conn, idx);
  } else if (static_cast<int>(conns_.size()) < opts_.max_connections) {
    Issue(NewConnection(), idx);
  } else {
    pending_.push_back(idx);  // sent when a connection frees up; its lag shows in the health numbers
  }
}

void PointRun::ArmWindow() {
  window_timer_.expires_at(AtNanos(measure_start_ + Seconds(opts_.window_s) * (windows_closed_ + 1)));
  window_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) OnWindow();
  });
}

void PointRun::OnWindow() {
  const Nanos start = measure_start_ + Seconds(opts_.window_s) * windows_closed_;
  const Nanos end = start + Seconds(opts_.window_s);
  ++windows_closed_;
  windows_.push_back(WindowOf(records_, start, end, t0_));
  stable_ = opts_.stability > 0 && WindowsStable(windows_, opts_.stable_windows, opts_.stability);
  Report(ProgressEvent::Phase::kWindow, &windows_.back(), stable_);
  if (stable_ || windows_closed_ * opts_.window_s >= opts_.max_duration_s - 1e-9) {
    Stop(end);
  } else {
    ArmWindow();
  }
}

void PointRun::Stop(Nanos at) {
  stopping_ = true;
  measure_end_ = at;
  if (opts_.mode == LoadMode::kRate) {
    // Arrivals due before the end whose timer has not fired yet still go out.
    while (next_arrival_ < at) {
      Dispatch(next_arrival_);
      next_arrival_ += Seconds(NextGapSeconds());
    }
    arrival_timer_.cancel();
  }
  Report(ProgressEvent::Phase::kDrain, nullptr, stable_);
  if (in_flight_ == 0 && pending_.empty()) return Finish();
  drain_timer_.expires_after(std::chrono::nanoseconds(Seconds(opts_.drain_timeout_s)));
  drain_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) OnDrainTimeout();
  });
}

void PointRun::OnDrainTimeout() {
  drain_cut_ = true;
  const Nanos now = MonotonicNanos();
  for (size_t idx : pending_) {
    records_[idx].error = "dropped";
    records_[idx].error_detail = "never sent: no connection was free before the drain timed out";
    records_[idx].done = now;
  }
  pending_.clear();
  for (auto& c : conns_) {
    if (c->busy()) c->Close();  // their completions arrive as "incomplete"
  }
  if (in_flight_ == 0) Finish();
}

void PointRun::Finish() {
  if (finished_) return;
  finished_ = true;
  arrival_timer_.cancel();
  window_timer_.cancel();
  drain_timer_.cancel();
  for (auto& c : conns_) c->Close();
  Report(ProgressEvent::Phase::kDone, nullptr, stable_);
}

void PointRun::Report(ProgressEvent::Phase phase, const WindowStats* w, bool stable) {
  if (!progress_) return;
  ProgressEvent e;
  e.phase = phase;
  e.elapsed_s = (MonotonicNanos() - measure_start_) * 1e-9;
  e.max_s = opts_.max_duration_s;
  e.windows = windows_closed_;
  e.window = w;
  e.stable = stable;
  e.in_flight = in_flight_;
  progress_(e);
}

void PointRun::Begin() {
  t0_ = MonotonicNanos();
  measure_start_ = t0_ + Seconds(opts_.warmup_s);
  Report(ProgressEvent::Phase::kWarmup, nullptr, false);
  if (opts_.mode == LoadMode::kConcurrency) {
    for (size_t i = 0; i < conns_.size(); ++i) {
      const Nanos due = t0_ + static_cast<Nanos>(Seconds(opts_.ramp_up_s) * static_cast<double>(i) /
                                                 static_cast<double>(conns_.size()));
      if (due <= t0_) {
        Issue(conns_[i], NewRecord(t0_));
        continue;
      }
      // The client's first request is due at its slot (send lag counts from there).
      auto timer = std::make_shared<asio::steady_timer>(io_);
      timer->expires_at(AtNanos(due));
      timer->async_wait([this, timer, conn = conns_[i], due](const boost::system::error_code& ec) {
        if (!ec && !stopping_ && !finished_) Issue(conn, NewRecord(due));
      });
    }
  } else {
    idle_ = conns_;  // the pre-opened connections
    next_arrival_ = t0_ + Seconds(NextGapSeconds());
    ArmArrival();
  }
  ArmWindow();
}

Status PointRun::Prepare() {
  if (opts_.prebuilt_requests > 0) {
    RETURN_IF_ERROR(BuildPool());
  } else {
    // The first request is built now so a workload the API can't carry fails before any load is sent.
    StatusOr<WireRequest> first = BuildRequest(protocol_, prompts_->Next(), request_rng_);
    if (!first.ok()) return first.status();
    ready_.push_back(std::make_shared<const WireRequest>(std::move(first).value()));
    Refill();
  }
  int want = opts_.mode == LoadMode::kConcurrency ? static_cast<int>(opts_.load)
                                                  : std::min(opts_.max_connections, 8);
  for (int i = 0; i < want; ++i) NewConnection();
  auto remaining = std::make_shared<int>(want);
  auto failures = std::make_shared<int>(0);
  for (auto& c : conns_) {
    c->Connect([this, remaining, failures](bool ok) {
      if (!ok) ++*failures;
      if (--*remaining > 0) return;
      if (*failures > 0) {
        setup_status_ = UnavailableError("cannot connect to {} ({} of {} connections failed)", address_,
                                         *failures, conns_.size());
        for (auto& conn : conns_) conn->Close();
        return;
      }
      Begin();
    });
  }
  return OkStatus();
}

Status PointRun::Run(PointResult* out) {
  RETURN_IF_ERROR(Prepare());
  const double cpu0 = ThreadCpuSeconds();
  const double helper0 = helper_cpu_ ? helper_cpu_() : 0;
  const Nanos wall0 = MonotonicNanos();
  io_.run();
  // The busier of the io thread and the helper thread: either one saturated limits the generator.
  const double cpu_s = std::max(ThreadCpuSeconds() - cpu0, helper_cpu_ ? helper_cpu_() - helper0 : 0.0);
  const double wall_s = (MonotonicNanos() - wall0) * 1e-9;
  RETURN_IF_ERROR(setup_status_);
  *out = Result(cpu_s, wall_s);
  return OkStatus();
}

PointResult PointRun::Result(double cpu_s, double wall_s) {
  PointResult p;
  p.mode = opts_.mode;
  p.load = opts_.load;
  p.stable = stable_;
  p.warmup_s = opts_.warmup_s;
  p.windows = windows_;
  AggregatePoint(records_, measure_start_, measure_end_, opts_.slo, &p);

  GeneratorHealth& g = p.generator;
  g.late_threshold_ms = opts_.late_threshold_ms;
  std::vector<double> lags;
  for (const RequestRecord& r : records_) {
    if (!Measured(r)) continue;
    if (r.error == "dropped") {
      ++g.dropped_sends;
      continue;
    }
    if (r.sent == 0) continue;
    double lag = (r.sent - r.scheduled) * 1e-6;
    lags.push_back(lag);
    if (lag > opts_.late_threshold_ms) ++g.late_sends;
  }
  g.send_lag_ms = Summarize(lags);
  g.cpu_percent = wall_s > 0 ? 100.0 * cpu_s / wall_s : 0;
  g.reused_requests = reused_;

  if (g.send_lag_ms.p99 > opts_.max_send_lag_ms) {
    p.invalid_reasons.push_back(
        fmt::format("send lag p99 {:.2f} ms > {:.2f} ms: the generator could not keep the schedule",
                    g.send_lag_ms.p99, opts_.max_send_lag_ms));
  }
  if (g.dropped_sends > 0) {
    p.invalid_reasons.push_back(fmt::format("{} scheduled requests were never sent", g.dropped_sends));
  }
  if (g.cpu_percent > opts_.max_cpu_percent) {
    p.invalid_reasons.push_back(fmt::format("the generator's thread was {:.0f}% busy (limit {:.0f}%)",
                                            g.cpu_percent, opts_.max_cpu_percent));
  }
  if (p.succeeded == 0) p.invalid_reasons.push_back(NoSuccessReason());
  p.valid = p.invalid_reasons.empty();
  p.t_start_s = 0;  // set by the caller relative to the run
  p.t_end_s = 0;
  return p;
}

// Why a point had no success, and what to change when its requests outlast the window: the requests sent
// inside it still running at the drain's end, and how long the requests that did finish (warm-up ones,
// typically) took.
std::string PointRun::NoSuccessReason() const {
  int sent = 0, incomplete = 0;
  std::vector<double> finished_s;
  for (const RequestRecord& r : records_) {
    if (r.error.empty() && r.done > 0 && r.sent > 0) finished_s.push_back((r.done - r.sent) * 1e-9);
    if (!Measured(r) || r.sent == 0) continue;
    ++sent;
    incomplete += r.error == kIncompleteError;
  }
  std::string why = "no request succeeded";
  if (incomplete == 0) return why;
  why += fmt::format(": {} of the {} sent in the measured window were still running when the drain ended",
                     incomplete, sent);
  const double window_s = (measure_end_ - measure_start_) * 1e-9;
  if (finished_s.empty()) {
    return why + fmt::format(
                     " and none finished in the whole run: a request outlasts the warm-up, the {:.0f} s "
                     "window and the drain; lengthen --duration",
                     window_s);
  }
  std::sort(finished_s.begin(), finished_s.end());
  const double median = PercentileSorted(finished_s, 50);
  return why + fmt::format(
                   "; the {} that finished (in the warm-up or after the window) took a median {:.1f} s, "
                   "so the {:.0f} s window cannot hold a whole request: --duration {:.0f} or more (a closed "
                   "loop's clients send in waves as long as a request)",
                   finished_s.size(), median, window_s, std::ceil(2 * median));
}

}  // namespace

LoadGenerator::LoadGenerator(HttpEndpoint endpoint, ProtocolOptions protocol, PromptSource* prompts)
    : endpoint_(std::move(endpoint)), protocol_(std::move(protocol)), prompts_(prompts) {}

StatusOr<PointResult> LoadGenerator::RunPoint(const PointOptions& in, const ProgressFn& progress) {
  PointOptions opts = in;
  if (opts.load <= 0) return InvalidArgumentError("load must be > 0 (got {})", opts.load);
  if (opts.mode == LoadMode::kConcurrency) {
    if (opts.load != std::floor(opts.load)) return InvalidArgumentError("concurrency must be a whole number");
    if (opts.load > opts.max_connections) {
      return InvalidArgumentError("concurrency {} exceeds --max-connections {}", opts.load,
                                  opts.max_connections);
    }
  }
  if (opts.prebuilt_requests < 0 || opts.prebuilt_requests > 1'000'000)
    return InvalidArgumentError("prebuilt requests {} must be in [0, 1000000]", opts.prebuilt_requests);
  if (opts.window_s <= 0 || opts.max_duration_s <= 0) {
    return InvalidArgumentError("window and duration must be > 0");
  }
  opts.window_s = std::min(opts.window_s, opts.max_duration_s);
  asio::io_context io(1);
  PointResult result;
  if (protocol_.api == Api::kKserveGrpc) {
    // Slots = the most calls in flight: the concurrency, or the open-loop cap on connections.
    const int slots =
        opts.mode == LoadMode::kConcurrency ? static_cast<int>(opts.load) : opts.max_connections;
    const int channels =
        std::clamp((slots + kGrpcSlotsPerChannel - 1) / kGrpcSlotsPerChannel, 1, kMaxGrpcChannels);
    const std::string target = endpoint_.HostHeader();
    GrpcClient client(io, target, channels);  // outlives the run: its poller delivers into `io`
    RETURN_IF_ERROR(client.WaitConnected(kGrpcConnectTimeoutS));
    PointRun run(
        io, [&client] { return client.NewConnection(); }, "grpc://" + target, "", protocol_, prompts_, opts,
        progress, [&client] { return client.PollerCpuSeconds(); });
    RETURN_IF_ERROR(run.Run(&result));
    return result;
  }
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(endpoint_.host, endpoint_.port, ec);
  if (ec) return UnavailableError("resolve {}: {}", endpoint_.host, ec.message());
  {
    const std::string host_header = endpoint_.HostHeader();
    PointRun run(
        io,
        [&io, endpoints, host_header] {
          return std::make_shared<HttpConnection>(io, endpoints, host_header);
        },
        "http://" + host_header, host_header, protocol_, prompts_, opts, progress, nullptr);
    RETURN_IF_ERROR(run.Run(&result));
  }
  return result;
}

}  // namespace stoke::bench
