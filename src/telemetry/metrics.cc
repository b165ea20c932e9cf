#include "telemetry/metrics.h"

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <exception>

namespace stoke {
namespace {

Status CheckLabels(const MetricLabels& labels) {
  for (const auto& [name, value] : labels) {
    // "__" names are reserved for Prometheus itself; "le"/"quantile" would clash with histogram series.
    if (!prometheus::CheckLabelName(name) || name == "le" || name == "quantile") {
      return InvalidArgumentError("invalid metric label name '{}'", name);
    }
  }
  return OkStatus();
}

template <typename T, typename... Args>
StatusOr<T*> AddToFamily(prometheus::Family<T>* f, const MetricLabels& labels, Args&&... args) {
  if (f == nullptr) return FailedPreconditionError("metric family is not registered");
  RETURN_IF_ERROR(CheckLabels(labels));
  try {
    return &f->Add(labels, std::forward<Args>(args)...);
  } catch (const std::exception& e) {
    return InvalidArgumentError("metric {}: {}", f->GetName(), e.what());
  }
}

}  // namespace

void Counter::Inc(double v) {
  if (c_ != nullptr && v > 0) c_->Increment(v);
}
double Counter::Value() const {
  return c_ ? c_->Value() : 0.0;
}

void Gauge::Set(double v) {
  if (g_) g_->Set(v);
}
void Gauge::Inc(double v) {
  if (g_) g_->Increment(v);
}
void Gauge::Dec(double v) {
  if (g_) g_->Decrement(v);
}
double Gauge::Value() const {
  return g_ ? g_->Value() : 0.0;
}

void Histogram::Observe(double v) {
  if (h_ != nullptr && !std::isnan(v)) h_->Observe(v);
}
std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out;
  if (h_ == nullptr) return out;
  for (const auto& b : h_->Collect().histogram.bucket) out.push_back(b.cumulative_count);
  return out;
}
uint64_t Histogram::Count() const {
  return h_ ? h_->Collect().histogram.sample_count : 0;
}
double Histogram::Sum() const {
  return h_ ? h_->Collect().histogram.sample_sum : 0.0;
}

StatusOr<Counter> CounterFamily::TryWithLabels(const MetricLabels& labels) const {
  ASSIGN_OR_RETURN(prometheus::Counter * c, AddToFamily(f_, labels));
  return Counter(c);
}
Counter CounterFamily::WithLabels(const MetricLabels& labels) const {
  auto c = TryWithLabels(labels);
  return c.ok() ? *c : Counter();
}

StatusOr<Gauge> GaugeFamily::TryWithLabels(const MetricLabels& labels) const {
  ASSIGN_OR_RETURN(prometheus::Gauge * g, AddToFamily(f_, labels));
  return Gauge(g);
}
Gauge GaugeFamily::WithLabels(const MetricLabels& labels) const {
  auto g = TryWithLabels(labels);
  return g.ok() ? *g : Gauge();
}
void GaugeFamily::Remove(const Gauge& g) const {
  if (f_ != nullptr && g.g_ != nullptr) f_->Remove(g.g_);
}

StatusOr<Histogram> HistogramFamily::TryWithLabels(const MetricLabels& labels) const {
  if (buckets_ == nullptr) return FailedPreconditionError("metric family is not registered");
  ASSIGN_OR_RETURN(prometheus::Histogram * h, AddToFamily(f_, labels, *buckets_));
  return Histogram(h);
}
Histogram HistogramFamily::WithLabels(const MetricLabels& labels) const {
  auto h = TryWithLabels(labels);
  return h.ok() ? *h : Histogram();
}

std::string MetricName(MetricNaming naming, std::string_view name) {
  std::string out(name);
  if (naming == MetricNaming::kPrometheus) std::replace(out.begin(), out.end(), ':', '_');
  return out;
}

StatusOr<MetricNaming> ParseMetricNaming(std::string_view s) {
  if (s == "vllm") return MetricNaming::kVllm;
  if (s == "prometheus") return MetricNaming::kPrometheus;
  return InvalidArgumentError("metric names '{}': expected vllm or prometheus", s);
}

MetricsRegistry::MetricsRegistry(MetricNaming naming)
    : naming_(naming), registry_(std::make_unique<prometheus::Registry>()) {}
MetricsRegistry::~MetricsRegistry() = default;

namespace {

Status CheckFamily(const std::string& name, const MetricLabels& const_labels, char type,
                   std::map<std::string, char>* types) {
  if (!prometheus::CheckMetricName(name)) return InvalidArgumentError("invalid metric name '{}'", name);
  if (type == 'c' && !(name.size() > 6 && name.ends_with("_total"))) {
    return InvalidArgumentError("counter '{}' must end in _total", name);
  }
  RETURN_IF_ERROR(CheckLabels(const_labels));
  auto it = types->find(name);
  if (it != types->end() && it->second != type) {
    return AlreadyExistsError("metric '{}' already registered with another type", name);
  }
  (*types)[name] = type;
  return OkStatus();
}

}  // namespace

StatusOr<CounterFamily> MetricsRegistry::AddCounter(const std::string& given, const std::string& help,
                                                    const MetricLabels& const_labels) {
  const std::string name = MetricName(naming_, given);
  std::lock_guard lock(mu_);
  RETURN_IF_ERROR(CheckFamily(name, const_labels, 'c', &types_));
  try {
    return CounterFamily(
        &prometheus::BuildCounter().Name(name).Help(help).Labels(const_labels).Register(*registry_));
  } catch (const std::exception& e) {
    return InvalidArgumentError("metric {}: {}", name, e.what());
  }
}

StatusOr<GaugeFamily> MetricsRegistry::AddGauge(const std::string& given, const std::string& help,
                                                const MetricLabels& const_labels) {
  const std::string name = MetricName(naming_, given);
  std::lock_guard lock(mu_);
  RETURN_IF_ERROR(CheckFamily(name, const_labels, 'g', &types_));
  try {
    return GaugeFamily(
        &prometheus::BuildGauge().Name(name).Help(help).Labels(const_labels).Register(*registry_));
  } catch (const std::exception& e) {
    return InvalidArgumentError("metric {}: {}", name, e.what());
  }
}

StatusOr<HistogramFamily> MetricsRegistry::AddHistogram(const std::string& given, const std::string& help,
                                                        std::vector<double> buckets,
                                                        const MetricLabels& const_labels) {
  const std::string name = MetricName(naming_, given);
  if (buckets.empty()) return InvalidArgumentError("histogram '{}' needs at least one bucket", name);
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i]) || (i > 0 && buckets[i] <= buckets[i - 1])) {
      return InvalidArgumentError("histogram '{}': buckets must be finite and strictly increasing", name);
    }
  }
  std::lock_guard lock(mu_);
  auto existing = histogram_buckets_.find(name);
  if (existing != histogram_buckets_.end() && *existing->second != buckets) {
    return AlreadyExistsError("histogram '{}' already registered with other buckets", name);
  }
  RETURN_IF_ERROR(CheckFamily(name, const_labels, 'h', &types_));
  try {
    auto& family =
        prometheus::BuildHistogram().Name(name).Help(help).Labels(const_labels).Register(*registry_);
    auto b = existing != histogram_buckets_.end()
                 ? existing->second
                 : std::make_shared<const std::vector<double>>(std::move(buckets));
    histogram_buckets_[name] = b;
    return HistogramFamily(&family, b);
  } catch (const std::exception& e) {
    return InvalidArgumentError("metric {}: {}", name, e.what());
  }
}

void MetricsRegistry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard lock(mu_);
  hooks_.push_back(std::move(hook));
}

std::string MetricsRegistry::ExposeText() const {
  std::lock_guard lock(mu_);
  for (const auto& hook : hooks_) hook();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start + width * i);
  return b;
}

}  // namespace stoke
