// One served name of a batched (classic) model: its signature and batcher config, and while it is loaded, its
// ClassicModel and DynamicBatcher. One version ("1"). The front ends (KServe REST and gRPC, /v1/embeddings)
// reach it through the server's model repository (serve/repository/model_repository.h) and use it like this:
//
//   ServedModel::Use use = m->Acquire();          // null when not ready (unloaded, loading): answer 503
//   if (!use) return UnavailableError(...);
//   use->signature() ...                           // the model stays loaded while `use` lives
//   RETURN_IF_ERROR(m->Infer(std::move(inputs), opts, done));   // validate, prepare, submit
//
// Loading and unloading (the repository's worker thread):
//   RETURN_IF_ERROR(m->Start(model, &registry));  // metrics once per name, a new batcher -> ready
//   m->Stop(drain);                                // not ready; waits out users; drains; frees the batcher
//
// A Use is one atomic increment and decrement (no lock): Stop() clears `ready` and then waits until no Use is
// held, so nothing reads the model or the batcher while they are swapped. Requests already queued are drained
// (up to the drain time) and then answered Unavailable; their done callbacks may still use the ServedModel
// (name, metrics), which lives as long as the repository.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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
  BatcherConfig config;
};

class ServedModel {
 public:
  explicit ServedModel(ServedModelSpec spec) : spec_(std::move(spec)) {}
  ~ServedModel() { Stop(std::chrono::milliseconds(0)); }
  ServedModel(const ServedModel&) = delete;
  ServedModel& operator=(const ServedModel&) = delete;

  // Holds the model loaded while it lives; false when the model was not ready.
  class Use {
   public:
    Use() = default;
    explicit Use(const ServedModel* m) : m_(m) {}
    Use(Use&& o) noexcept : m_(std::exchange(o.m_, nullptr)) {}
    Use& operator=(Use&& o) noexcept {
      if (this != &o) {
        Release();
        m_ = std::exchange(o.m_, nullptr);
      }
      return *this;
    }
    ~Use() { Release(); }
    explicit operator bool() const { return m_ != nullptr; }
    ClassicModel* operator->() const { return m_->model_.get(); }
    ClassicModel& operator*() const { return *m_->model_; }

   private:
    void Release() {
      if (m_ != nullptr) m_->users_.fetch_sub(1);
      m_ = nullptr;
    }
    const ServedModel* m_ = nullptr;
  };
  Use Acquire() const;

  const std::string& name() const { return spec_.name; }
  const std::string& version() const { return version_; }
  const BatcherConfig& config() const { return spec_.config; }
  bool ready() const { return ready_.load(); }
  // Created by the first Start and kept across unloads (the registry keeps its series); may be null.
  ClassicMetrics* metrics() const { return metrics_.get(); }

  // Validates the tensors (400 naming the input), prepares them (tokenises), and submits. `done` is called
  // once, on an instance thread, unless this returns an error. Unavailable when not ready or the queue is
  // full.
  Status Infer(std::vector<InferTensor> inputs, const InferOptions& opts,
               std::function<void(InferResult)> done);
  // Submits an already prepared input (the OpenAI embeddings path).
  Status Submit(std::unique_ptr<PreparedInput> input, int64_t rows, int64_t tokens, const InferOptions& opts,
                std::function<void(InferResult)> done);

  // Zero while not loaded.
  ModelStats Stats() const;

  // Loads: the model's metrics in `registry` (null: none; once per name), a batcher -> ready.
  // FailedPrecondition when already started.
  Status Start(std::shared_ptr<ClassicModel> model, MetricsRegistry* registry);
  // Unloads: no new requests; waits until none is being submitted, lets queued and running batches finish for
  // up to `drain`, then stops the batcher (the rest get Unavailable) and drops the model. Idempotent.
  void Stop(std::chrono::milliseconds drain);

 private:
  // Submit with a Use already held by the caller.
  Status SubmitHeld(std::unique_ptr<PreparedInput> input, int64_t rows, int64_t tokens,
                    const InferOptions& opts, std::function<void(InferResult)> done);

  ServedModelSpec spec_;
  std::string version_ = "1";
  std::unique_ptr<ClassicMetrics> metrics_;
  // Written only by Start/Stop, while ready_ is false and no Use is held.
  std::shared_ptr<ClassicModel> model_;
  std::unique_ptr<DynamicBatcher> batcher_;
  std::atomic<bool> ready_{false};
  mutable std::atomic<int> users_{0};
};

}  // namespace stoke
