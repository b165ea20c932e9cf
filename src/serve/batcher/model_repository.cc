#include "serve/batcher/model_repository.h"

namespace stoke {

Status ServedModel::Infer(std::vector<InferTensor> inputs, const InferOptions& opts,
                          std::function<void(InferResult)> done) {
  if (!ready()) return UnavailableError("model '{}' is not ready", name());
  ASSIGN_OR_RETURN(int64_t rows, ValidateInputs(model().signature(), config().max_batch_size, inputs));
  int64_t tokens = 0;
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedInput> prepared,
                   model().Prepare(std::move(inputs), rows, &tokens));
  return Submit(std::move(prepared), rows, tokens, opts, std::move(done));
}

Status ServedModel::Submit(std::unique_ptr<PreparedInput> input, int64_t rows, int64_t tokens,
                           const InferOptions& opts, std::function<void(InferResult)> done) {
  if (!ready() || batcher_ == nullptr) return UnavailableError("model '{}' is not ready", name());
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
  return batcher_ ? batcher_->Stats() : ModelStats{};
}

Status ModelRepository::Add(ServedModelSpec spec) {
  for (const ServedModel& m : models_) {
    if (m.name() == spec.name) return AlreadyExistsError("model '{}' is already served", spec.name);
  }
  RETURN_IF_ERROR(spec.config.Validate().WithContext(spec.name));
  models_.emplace_back(std::move(spec));
  return OkStatus();
}

Status ModelRepository::SetModel(std::string_view name, std::shared_ptr<ClassicModel> model) {
  for (ServedModel& m : models_) {
    if (m.name() != name) continue;
    if (m.ready()) return FailedPreconditionError("model '{}' is already serving", name);
    m.spec_.model = std::move(model);
    return OkStatus();
  }
  return NotFoundError("unknown model '{}'", name);
}

Status ModelRepository::StartAll(MetricsRegistry* registry) {
  for (ServedModel& m : models_) {
    if (m.spec_.model == nullptr) return FailedPreconditionError("model '{}' has not been loaded", m.name());
    if (registry != nullptr) {
      ASSIGN_OR_RETURN(m.metrics_, ClassicMetrics::Create(registry, m.name(), m.config().instance_count));
    }
    ASSIGN_OR_RETURN(
        m.batcher_,
        DynamicBatcher::Create({.model_name = m.name(), .config = m.config(), .metrics = m.metrics_.get()},
                               m.spec_.model));
    m.ready_ = true;
  }
  return OkStatus();
}

void ModelRepository::StopAll() {
  for (ServedModel& m : models_) {
    m.ready_ = false;
    if (m.batcher_) m.batcher_->Shutdown();
  }
}

StatusOr<ServedModel*> ModelRepository::Find(std::string_view name, std::string_view version) const {
  for (const ServedModel& m : models_) {
    if (m.name() != name) continue;
    if (!version.empty() && version != m.version()) {
      return NotFoundError("model '{}' has no version '{}' (served: '{}')", name, version, m.version());
    }
    return const_cast<ServedModel*>(&m);
  }
  return NotFoundError("unknown model '{}'", name);
}

std::vector<ServedModel*> ModelRepository::models() const {
  std::vector<ServedModel*> out;
  for (const ServedModel& m : models_) out.push_back(const_cast<ServedModel*>(&m));
  return out;
}

bool ModelRepository::ready() const {
  if (models_.empty()) return false;
  for (const ServedModel& m : models_) {
    if (!m.ready()) return false;
  }
  return true;
}

}  // namespace stoke
