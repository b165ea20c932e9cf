// The dynamic batcher and instance group of one stateless model: a batcher thread applies the launch rule
// (launch_rule.h) to the queue (batch_queue.h) whenever an instance is free, and hands each closed batch to
// the first free instance; every instance has its own thread and its own ModelInstance state.
//
//   ASSIGN_OR_RETURN(auto b, DynamicBatcher::Create({.model_name = "minilm", .config = cfg}, model));
//   auto req = std::make_unique<ClassicRequest>();  req->input = ...;  req->done = [](InferResult r) {...};
//   Status s = b->Submit(std::move(req));   // Unavailable (503): queue full or shutting down
//   ...
//   b->Shutdown();   // queued requests get Unavailable; running batches finish; threads joined
//
// The batcher waits for a free instance before it forms a batch (no prefetching), so a batch is formed from
// everything that queued while the instances were busy: batching grows with load by itself.
// Thread-safety: Submit, Stats and Shutdown may be called from any thread.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "serve/batcher/batch_queue.h"
#include "serve/batcher/batcher_config.h"
#include "serve/batcher/classic_metrics.h"
#include "serve/batcher/classic_model.h"

namespace stoke {

// Cumulative statistics in the shape of Triton's statistics extension (kserve-v2.md §6).
struct DurationStat {
  uint64_t count = 0;
  uint64_t ns = 0;
  void Add(Nanos d) {
    ++count;
    ns += static_cast<uint64_t>(d > 0 ? d : 0);
  }
};

struct BatchSizeStat {
  DurationStat compute_input, compute_infer, compute_output;
};

struct ModelStats {
  uint64_t last_inference_ms = 0;  // unix ms of the last request answered
  uint64_t inference_count = 0;    // rows
  uint64_t execution_count = 0;    // batches
  DurationStat success, fail, queue, compute_input, compute_infer, compute_output, cache_hit, cache_miss;
  std::map<int64_t, BatchSizeStat> batch_stats;  // by rows
  std::array<uint64_t, kNumCloseReasons> close_reasons{};
  std::vector<uint64_t> instance_executions;
  std::vector<Nanos> instance_busy_ns;
};

struct DynamicBatcherOptions {
  std::string model_name;
  BatcherConfig config;
  Clock* clock = nullptr;             // null: Clock::Real(); must be a real-time clock (waits are real)
  ClassicMetrics* metrics = nullptr;  // optional; must outlive the batcher
};

class DynamicBatcher {
 public:
  // Validates the config, creates the model's instances and starts the threads.
  static StatusOr<std::unique_ptr<DynamicBatcher>> Create(DynamicBatcherOptions options,
                                                          std::shared_ptr<ClassicModel> model);
  ~DynamicBatcher();  // Shutdown()
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Takes the request (rows must be in [1, max(1, max_batch_size)]). Refused: InvalidArgument (priority,
  // rows), Unavailable (queue full, shutting down); then done is never called.
  Status Submit(std::unique_ptr<ClassicRequest> request);

  void Shutdown();

  ModelStats Stats() const;
  size_t queued() const;
  int busy_instances() const;
  const BatcherConfig& config() const { return options_.config; }
  const std::string& model_name() const { return options_.model_name; }
  ClassicModel& model() const { return *model_; }

 private:
  struct Instance {
    std::unique_ptr<ModelInstance> model;
    std::thread thread;
    std::condition_variable cv;
    std::vector<QueueEntry> batch;  // guarded by mu_; non-empty = work handed over
    bool busy = false;              // guarded by mu_
    CloseReason reason = CloseReason::kImmediate;
    Nanos dispatch = 0;
  };

  DynamicBatcher(DynamicBatcherOptions options, std::shared_ptr<ClassicModel> model);
  void BatcherLoop();
  void InstanceLoop(int index);
  void Finish(std::vector<QueueEntry>& entries, Status status);  // answers without running (errors)
  void RecordStats(const std::vector<QueueEntry>& batch, const std::vector<InferResult>& results,
                   int64_t rows, CloseReason reason, int instance, Nanos busy);

  const DynamicBatcherOptions options_;
  const std::shared_ptr<ClassicModel> model_;
  Clock* const clock_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // the batcher thread waits on it: arrivals, free instances, stop
  BatchQueue queue_;            // guarded by mu_
  std::vector<std::unique_ptr<Instance>> instances_;
  bool stopping_ = false;  // guarded by mu_
  bool stopped_ = false;   // Shutdown ran (guarded by shutdown_mu_)
  std::mutex shutdown_mu_;
  std::thread batcher_thread_;

  mutable std::mutex stats_mu_;
  ModelStats stats_;  // guarded by stats_mu_
};

}  // namespace stoke
