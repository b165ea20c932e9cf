#include "serve/batcher/dynamic_batcher.h"

#include <fmt/format.h>

#include <chrono>

#include "base/logging.h"
#include "serve/batcher/batch_trace.h"
#include "telemetry/trace.h"

namespace stoke {
namespace {

uint64_t UnixMillis() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(DynamicBatcherOptions options,
                                                                 std::shared_ptr<ClassicModel> model) {
  if (Status s = options.config.Validate(); !s.ok()) return s.WithContext(options.model_name);
  std::unique_ptr<DynamicBatcher> b(new DynamicBatcher(std::move(options), std::move(model)));
  const int n = b->options_.config.instance_count;
  for (int i = 0; i < n; ++i) {
    auto inst = std::make_unique<Instance>();
    auto m = b->model_->CreateInstance(i, n);
    if (!m.ok()) return m.status().WithContext(fmt::format("{}: instance {}", b->options_.model_name, i));
    inst->model = std::move(m).value();
    b->instances_.push_back(std::move(inst));
  }
  b->stats_.instance_executions.assign(n, 0);
  b->stats_.instance_busy_ns.assign(n, 0);
  for (int i = 0; i < n; ++i)
    b->instances_[i]->thread = std::thread([p = b.get(), i] { p->InstanceLoop(i); });
  b->batcher_thread_ = std::thread([p = b.get()] { p->BatcherLoop(); });
  return b;
}

DynamicBatcher::DynamicBatcher(DynamicBatcherOptions options, std::shared_ptr<ClassicModel> model)
    : options_(std::move(options)),
      model_(std::move(model)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      queue_(options_.config) {}

DynamicBatcher::~DynamicBatcher() {
  Shutdown();
}

Status DynamicBatcher::Submit(std::unique_ptr<ClassicRequest> request) {
  const int64_t max_rows = std::max(1, options_.config.max_batch_size);
  if (request->rows < 1 || request->rows > max_rows) {
    return InvalidArgumentError("batch size {} is outside [1, {}]", request->rows, max_rows);
  }
  const Nanos now = clock_->Now();
  if (request->arrival == 0) request->arrival = now;
  size_t depth;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return UnavailableError("model '{}' is shutting down", options_.model_name);
    if (Status s = queue_.Enqueue(std::move(request), now); !s.ok()) {
      if (options_.metrics != nullptr && s.code() == StatusCode::kUnavailable)
        options_.metrics->OnFailure("REJECTED");
      return s;
    }
    depth = queue_.size();
  }
  if (options_.metrics != nullptr) options_.metrics->SetPending(depth);
  cv_.notify_one();
  return OkStatus();
}

void DynamicBatcher::BatcherLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const Nanos now = clock_->Now();
    std::vector<QueueEntry> expired = queue_.TakeExpired(now);
    if (!expired.empty()) {
      lock.unlock();
      if (options_.metrics != nullptr) {
        for (size_t i = 0; i < expired.size(); ++i) options_.metrics->OnFailure("REJECTED");
      }
      Finish(expired, UnavailableError("request timed out in the queue of model '{}'", options_.model_name));
      lock.lock();
      continue;
    }
    int free = -1;
    for (size_t i = 0; i < instances_.size(); ++i) {
      if (!instances_[i]->busy) {
        free = static_cast<int>(i);
        break;
      }
    }
    Nanos wake_at = 0;
    if (!queue_.empty()) {
      if (free >= 0) {
        const LaunchDecision d = queue_.Decide(now);
        if (d.launch) {
          const size_t depth = queue_.size();
          Instance& inst = *instances_[free];
          inst.batch = queue_.Pop(d);
          inst.busy = true;
          inst.reason = d.reason;
          inst.dispatch = now;
          if (options_.metrics != nullptr) {
            options_.metrics->OnBatch(d.rows, d.reason, depth);
            options_.metrics->SetPending(queue_.size());
          }
          inst.cv.notify_one();
          continue;
        }
        wake_at = d.wake_at;
      } else {
        wake_at = queue_.NextDeadline();
      }
    }
    if (wake_at == 0) {
      cv_.wait(lock);
    } else if (wake_at > now) {
      cv_.wait_for(lock, std::chrono::nanoseconds(wake_at - now));
    }
  }
}

void DynamicBatcher::InstanceLoop(int index) {
  Instance& inst = *instances_[index];
  std::unique_lock lock(mu_);
  while (true) {
    inst.cv.wait(lock, [&] { return !inst.batch.empty() || (stopping_ && !inst.busy); });
    if (inst.batch.empty()) return;  // stopping, nothing handed over
    std::vector<QueueEntry> batch = std::move(inst.batch);
    inst.batch.clear();
    const CloseReason reason = inst.reason;
    const Nanos dispatch = inst.dispatch;
    lock.unlock();

    std::vector<const PreparedInput*> inputs;
    std::vector<int64_t> rows;
    int64_t total_rows = 0;
    for (const QueueEntry& e : batch) {
      inputs.push_back(e.request->input.get());
      rows.push_back(e.request->rows);
      total_rows += e.request->rows;
    }
    std::vector<std::vector<InferTensor>> outputs(batch.size());
    ExecTimes exec;
    const Nanos start = clock_->Now();
    Status st = inst.model->Execute(inputs, rows, &outputs, &exec);
    const Nanos end = clock_->Now();

    if (st.ok() && options_.config.max_batch_size == 0) {
      // The model does not batch: its tensors have no batch dim; instances still write [1, ...].
      for (auto& outs : outputs) {
        for (InferTensor& t : outs) {
          if (!t.shape.empty() && t.shape[0] == 1) t.shape.erase(t.shape.begin());
        }
      }
    }
    std::vector<InferResult> results(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      InferResult& r = results[i];
      r.status = st;
      if (st.ok()) r.outputs = std::move(outputs[i]);
      r.times.enqueue = batch[i].enqueue;
      r.times.dispatch = dispatch;
      r.times.start = start;
      r.times.done = end;
      r.times.exec = exec;
      r.times.batch_rows = total_rows;
      r.times.close_reason = reason;
      r.times.instance = index;
    }
    RecordStats(batch, results, total_rows, reason, index, end - start);
    if (TraceRecorder::Global().on()) {
      TraceBatch({.model = options_.model_name,
                  .instance = index,
                  .dispatch = dispatch,
                  .start = start,
                  .end = end,
                  .rows = total_rows,
                  .requests = static_cast<int64_t>(batch.size()),
                  .reason = reason,
                  .exec = exec,
                  .copy_memory = model_->copy_memory(),
                  .ok = st.ok()});
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].request->done) batch[i].request->done(std::move(results[i]));
    }
    batch.clear();  // frees the prepared inputs outside the lock

    lock.lock();
    inst.busy = false;
    cv_.notify_one();
  }
}

void DynamicBatcher::RecordStats(const std::vector<QueueEntry>& batch,
                                 const std::vector<InferResult>& results, int64_t rows, CloseReason reason,
                                 int instance, Nanos busy) {
  const ExecTimes& x = results.empty() ? ExecTimes{} : results[0].times.exec;
  const Nanos in = x.preprocess + x.h2d;
  const Nanos infer = x.compute;
  const Nanos out = x.d2h + x.postprocess;
  const bool ok = results.empty() || results[0].status.ok();
  {
    std::lock_guard lock(stats_mu_);
    ModelStats& s = stats_;
    s.last_inference_ms = UnixMillis();
    s.instance_executions[instance]++;
    s.instance_busy_ns[instance] += busy;
    s.close_reasons[static_cast<int>(reason)]++;
    for (size_t i = 0; i < batch.size(); ++i) {
      const RequestTimes& t = results[i].times;
      s.queue.Add(t.dispatch - t.enqueue);
      if (ok) {
        s.success.Add(t.done - batch[i].request->arrival);
        s.compute_input.Add(in);
        s.compute_infer.Add(infer);
        s.compute_output.Add(out);
      } else {
        s.fail.Add(t.done - batch[i].request->arrival);
      }
    }
    if (ok) {
      s.inference_count += static_cast<uint64_t>(rows);
      s.execution_count++;
      BatchSizeStat& b = s.batch_stats[rows];
      b.compute_input.Add(in);
      b.compute_infer.Add(infer);
      b.compute_output.Add(out);
    }
  }
  if (options_.metrics != nullptr) {
    options_.metrics->OnExecution(instance, busy);
    for (size_t i = 0; i < batch.size(); ++i) {
      const RequestTimes& t = results[i].times;
      if (ok) {
        options_.metrics->OnSuccess(t.done - batch[i].request->arrival, t.dispatch - t.enqueue, in, infer,
                                    out);
      } else {
        options_.metrics->OnFailure("BACKEND");
      }
    }
  }
  if (!ok)
    LOG_WARN("{}: batch of {} rows failed: {}", options_.model_name, rows, results[0].status.message());
}

void DynamicBatcher::Finish(std::vector<QueueEntry>& entries, Status status) {
  const Nanos now = clock_->Now();
  {
    std::lock_guard lock(stats_mu_);
    for (const QueueEntry& e : entries) stats_.fail.Add(now - e.request->arrival);
  }
  for (QueueEntry& e : entries) {
    InferResult r;
    r.status = status;
    r.times.enqueue = e.enqueue;
    r.times.dispatch = now;
    r.times.done = now;
    if (e.request->done) e.request->done(std::move(r));
  }
  entries.clear();
}

void DynamicBatcher::Shutdown() {
  std::lock_guard shutdown_lock(shutdown_mu_);
  if (stopped_) return;
  stopped_ = true;
  std::vector<QueueEntry> left;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    left = queue_.TakeAll();
  }
  cv_.notify_all();
  if (batcher_thread_.joinable()) batcher_thread_.join();
  Finish(left, UnavailableError("model '{}' is shutting down", options_.model_name));
  {
    std::lock_guard lock(mu_);
    for (auto& inst : instances_) inst->cv.notify_all();
  }
  for (auto& inst : instances_) {
    if (inst->thread.joinable()) inst->thread.join();
  }
}

ModelStats DynamicBatcher::Stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

int DynamicBatcher::busy_instances() const {
  std::lock_guard lock(mu_);
  int n = 0;
  for (const auto& inst : instances_) n += inst->busy ? 1 : 0;
  return n;
}

size_t DynamicBatcher::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

}  // namespace stoke
