#include "serve/batcher/served_model.h"

#include <thread>

namespace stoke {

ServedModel::Use ServedModel::Acquire() const {
  // Dekker-style with Stop(): increment, then check ready_ (both seq_cst). Either Stop() sees the user, or
  // the user sees ready_ false.
  users_.fetch_add(1);
  if (!ready_.load()) {
    users_.fetch_sub(1);
    return Use();
  }
  return Use(this);
}

Status ServedModel::Infer(std::vector<InferTensor> inputs, const InferOptions& opts,
                          std::function<void(InferResult)> done) {
  Use use = Acquire();
  if (!use) return UnavailableError("model '{}' is not ready", name());
  ASSIGN_OR_RETURN(int64_t rows, ValidateInputs(use->signature(), config().max_batch_size, inputs));
  int64_t tokens = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedInput> prepared, use->Prepare(std::move(inputs), rows, &tokens));
  return SubmitHeld(std::move(prepared), rows, tokens, opts, std::move(done));
}

Status ServedModel::Submit(std::unique_ptr<PreparedInput> input, int64_t rows, int64_t tokens,
                           const InferOptions& opts, std::function<void(InferResult)> done) {
  Use use = Acquire();
  if (!use) return UnavailableError("model '{}' is not ready", name());
  return SubmitHeld(std::move(input), rows, tokens, opts, std::move(done));
}

Status ServedModel::SubmitHeld(std::unique_ptr<PreparedInput> input, int64_t rows, int64_t tokens,
                               const InferOptions& opts, std::function<void(InferResult)> done) {
  auto req = std::make_unique<ClassicRequest>();
  req->input = std::move(input);
  req->rows = rows;
  req->tokens = tokens;
  req->priority = opts.priority;
  req->timeout_us = opts.timeout_us;
  req->arrival = opts.arrival;
  req->done = std::move(done);
  return batcher_->Submit(std::move(req));
}

ModelStats ServedModel::Stats() const {
  Use use = Acquire();
  return use ? batcher_->Stats() : ModelStats{};
}

Status ServedModel::Start(std::shared_ptr<ClassicModel> model, MetricsRegistry* registry) {
  if (ready_.load() || batcher_ != nullptr)
    return FailedPreconditionError("model '{}' is already serving", name());
  if (model == nullptr) return InvalidArgumentError("model '{}': no model to serve", name());
  if (registry != nullptr && metrics_ == nullptr) {
    ASSIGN_OR_RETURN(metrics_, ClassicMetrics::Create(registry, name(), config().instance_count));
  }
  ASSIGN_OR_RETURN(
      batcher_,
      DynamicBatcher::Create({.model_name = name(), .config = config(), .metrics = metrics_.get()}, model));
  model_ = std::move(model);
  ready_ = true;
  return OkStatus();
}

void ServedModel::Stop(std::chrono::milliseconds drain) {
  ready_ = false;
  while (users_.load() != 0) std::this_thread::yield();  // a Use lasts one handler's call, microseconds
  if (batcher_ == nullptr) return;
  const auto deadline = std::chrono::steady_clock::now() + drain;
  while ((batcher_->queued() > 0 || batcher_->busy_instances() > 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  batcher_->Shutdown();  // what is still queued gets Unavailable; running batches finish
  batcher_.reset();
  model_.reset();
}

}  // namespace stoke
