// The served classic models, by name, shared by the KServe REST and gRPC front ends: each has a signature,
// a batcher config, and once loaded, a DynamicBatcher. One version ("1") per model.
//
//   ModelRepository repo;
//   repo.Add({.name = "minilm", .model = bert, .config = cfg});   // before serving; not ready yet
//   RETURN_IF_ERROR(repo.StartAll(&registry));                    // creates the batchers -> ready
//   ASSIGN_OR_RETURN(ServedModel* m, repo.Find("minilm", ""));    // "" or "1"; NotFound names the model
//   RETURN_IF_ERROR(m->Infer(std::move(inputs), opts, done));      // validate, prepare, submit
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "serve/batcher/batcher_config.h"
#include "serve/batcher/classic_metrics.h"
#include "serve/batcher/classic_model.h"
#include "serve/batcher/dynamic_batcher.h"
#include "telemetry/metrics.h"

namespace stoke {

// Per-request options from the protocol's parameters (kserve-v2.md §8).
struct InferOptions {
  int priority = 0;        // 0 = the model's default level
  int64_t timeout_us = 0;  // 0 = the queue policy's
  Nanos arrival = 0;       // first byte received (monotonic)
};

struct ServedModelSpec {
  std::string name;
  std::shared_ptr<ClassicModel> model;  // may be set later (SetModel), before StartAll
  BatcherConfig config;
};

class ServedModel {
 public:
  explicit ServedModel(ServedModelSpec spec) : spec_(std::move(spec)) {}

  const std::string& name() const { return spec_.name; }
  const std::string& version() const { return version_; }
  // Only once ready() (or after SetModel).
  ClassicModel& model() const { return *spec_.model; }
  const BatcherConfig& config() const { return spec_.config; }
  bool ready() const { return ready_.load(); }
  ClassicMetrics* metrics() const { return metrics_.get(); }
  DynamicBatcher* batcher() const { return batcher_.get(); }

  // Validates the tensors (400 naming the input), prepares them (tokenises), and submits. `done` is called
  // once, on an instance thread, unless this returns an error. Unavailable when not ready or the queue is
  // full.
  Status Infer(std::vector<InferTensor> inputs, const InferOptions& opts,
               std::function<void(InferResult)> done);
  // Submits an already prepared input (the OpenAI embeddings path).
  Status Submit(std::unique_ptr<PreparedInput> input, int64_t rows, int64_t tokens, const InferOptions& opts,
                std::function<void(InferResult)> done);

  ModelStats Stats() const;

 private:
  friend class ModelRepository;
  ServedModelSpec spec_;
  std::string version_ = "1";
  std::unique_ptr<ClassicMetrics> metrics_;
  std::unique_ptr<DynamicBatcher> batcher_;
  std::atomic<bool> ready_{false};
};

class ModelRepository {
 public:
  // Before StartAll. Names must be unique.
  Status Add(ServedModelSpec spec);
  // The loaded model of an added entry (when routes were registered before loading). Before StartAll.
  Status SetModel(std::string_view name, std::shared_ptr<ClassicModel> model);
  // Registers each model's metrics in `registry` (may be null) and creates its batcher; models become ready.
  Status StartAll(MetricsRegistry* registry);
  // Stops every batcher (queued requests get Unavailable); models stop being ready.
  void StopAll();

  // NotFound names the model (or version). version "" = the only one, "1".
  StatusOr<ServedModel*> Find(std::string_view name, std::string_view version) const;
  std::vector<ServedModel*> models() const;
  bool ready() const;  // every model is ready (and there is at least one)

 private:
  std::deque<ServedModel> models_;  // stable addresses
};

}  // namespace stoke
