// A metrics registry with Prometheus text exposition: counters, gauges and histograms, each a family keyed
// by label values. prometheus-cpp (Debian's libprometheus-cpp-core) does the storage and the text format;
// this header keeps it out of everyone else's includes and turns its exceptions into Status.
//
//   ASSIGN_OR_RETURN(auto req, registry.AddCounter("stoke:requests_total", "Requests received."));
//   req.WithLabels({{"route", "/v1/completions"}}).Inc();
//   std::string text = registry.ExposeText();   // text format 0.0.4, what /metrics serves
//
// Handles (Counter, Gauge, Histogram) are cheap copies pointing into the registry: keep one for a hot path
// instead of calling WithLabels each time (that takes a lock). All operations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace stoke {

using MetricLabels = std::map<std::string, std::string>;

// How family names are spelled on /metrics. Code registers every name in vLLM's style, a prefix and a colon
// ("stoke:time_to_first_token_seconds", like vLLM's "vllm:..."). Prometheus reserves colons for recording
// rules and `promtool check metrics` lints every such name ("metric names should not contain ':'"), so a
// registry made with kPrometheus exposes the same families with each ':' turned into '_'
// ("stoke_time_to_first_token_seconds"). `stoke serve --metric-names vllm|prometheus` picks one.
enum class MetricNaming : uint8_t { kVllm, kPrometheus };
// The one naming rule: `name` as the registry with `naming` exposes it.
std::string MetricName(MetricNaming naming, std::string_view name);
// "vllm" | "prometheus".
StatusOr<MetricNaming> ParseMetricNaming(std::string_view s);

// A default-constructed handle is null: its operations do nothing and read 0.
class Counter {
 public:
  Counter() = default;
  void Inc(double v = 1.0);  // v >= 0; negative increments are ignored (counters never go down)
  double Value() const;

 private:
  friend class CounterFamily;
  explicit Counter(prometheus::Counter* c) : c_(c) {}
  prometheus::Counter* c_ = nullptr;
};

class Gauge {
 public:
  Gauge() = default;
  void Set(double v);
  void Inc(double v = 1.0);
  void Dec(double v = 1.0);
  double Value() const;

 private:
  friend class GaugeFamily;
  explicit Gauge(prometheus::Gauge* g) : g_(g) {}
  prometheus::Gauge* g_ = nullptr;
};

class Histogram {
 public:
  Histogram() = default;
  void Observe(double v);
  // Cumulative counts per bucket (le), the last one +Inf; and the sum. For tests.
  std::vector<uint64_t> CumulativeCounts() const;
  uint64_t Count() const;
  double Sum() const;

 private:
  friend class HistogramFamily;
  explicit Histogram(prometheus::Histogram* h) : h_(h) {}
  prometheus::Histogram* h_ = nullptr;
};

class CounterFamily {
 public:
  CounterFamily() = default;
  // Label names must be valid Prometheus names; an invalid one returns InvalidArgument.
  StatusOr<Counter> TryWithLabels(const MetricLabels& labels) const;
  // For labels known valid at compile time (constants in our code).
  Counter WithLabels(const MetricLabels& labels) const;
  Counter Get() const { return WithLabels({}); }

 private:
  friend class MetricsRegistry;
  explicit CounterFamily(prometheus::Family<prometheus::Counter>* f) : f_(f) {}
  prometheus::Family<prometheus::Counter>* f_ = nullptr;
};

class GaugeFamily {
 public:
  GaugeFamily() = default;
  StatusOr<Gauge> TryWithLabels(const MetricLabels& labels) const;
  Gauge WithLabels(const MetricLabels& labels) const;
  Gauge Get() const { return WithLabels({}); }
  // Drops the series from the exposition; `g` (and every copy of it) must not be used afterwards.
  void Remove(const Gauge& g) const;

 private:
  friend class MetricsRegistry;
  explicit GaugeFamily(prometheus::Family<prometheus::Gauge>* f) : f_(f) {}
  prometheus::Family<prometheus::Gauge>* f_ = nullptr;
};

class HistogramFamily {
 public:
  HistogramFamily() = default;
  StatusOr<Histogram> TryWithLabels(const MetricLabels& labels) const;
  Histogram WithLabels(const MetricLabels& labels) const;
  Histogram Get() const { return WithLabels({}); }
  const std::vector<double>& buckets() const { return *buckets_; }

 private:
  friend class MetricsRegistry;
  HistogramFamily(prometheus::Family<prometheus::Histogram>* f, std::shared_ptr<const std::vector<double>> b)
      : f_(f), buckets_(std::move(b)) {}
  prometheus::Family<prometheus::Histogram>* f_ = nullptr;
  std::shared_ptr<const std::vector<double>> buckets_;  // upper bounds, strictly increasing, +Inf implied
};

class MetricsRegistry {
 public:
  explicit MetricsRegistry(MetricNaming naming = MetricNaming::kVllm);
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Names: [a-zA-Z_:][a-zA-Z0-9_:]*, given in vLLM's style and exposed through MetricName(naming(), name);
  // counters end in "_total" by convention (checked). A name registered twice with a different type is an
  // error; the same type returns the existing family (const_labels must match).
  StatusOr<CounterFamily> AddCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& const_labels = {});
  StatusOr<GaugeFamily> AddGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& const_labels = {});
  // buckets: upper bounds, strictly increasing, finite (+Inf is added).
  StatusOr<HistogramFamily> AddHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> buckets, const MetricLabels& const_labels = {});

  // Runs before each exposition, e.g. to refresh gauges from an engine snapshot. Hooks run under a lock, in
  // the order added, and must not call ExposeText.
  void AddCollectHook(std::function<void()> hook);

  // Prometheus text exposition format 0.0.4 (Content-Type: text/plain; version=0.0.4; charset=utf-8).
  std::string ExposeText() const;
  MetricNaming naming() const { return naming_; }

 private:
  MetricNaming naming_;
  std::unique_ptr<prometheus::Registry> registry_;
  mutable std::mutex mu_;  // guards hooks_ and the name table, serialises expositions
  std::vector<std::function<void()>> hooks_;
  std::map<std::string, char> types_;  // name -> 'c' | 'g' | 'h'
  std::map<std::string, std::shared_ptr<const std::vector<double>>> histogram_buckets_;
};

// Bucket helpers. Exponential: start, start*factor, ... (count values). Linear: start, start+width, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace stoke
