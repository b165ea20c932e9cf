#include "serve/repository/model_repository.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/logging.h"

namespace stoke {

const char* ModelKindName(ModelKind kind) {
  switch (kind) {
    case ModelKind::kDecoder:
      return "decoder";
    case ModelKind::kEncoder:
      return "encoder";
    case ModelKind::kImage:
      return "image";
    case ModelKind::kSynthetic:
      return "synthetic";
  }
  return "unknown";
}

const char* ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kUnavailable:
      return "UNAVAILABLE";
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kReady:
      return "READY";
    case ModelState::kUnloading:
      return "UNLOADING";
  }
  return "UNKNOWN";
}

RepositoryModel::RepositoryModel(ModelConfig config) : config_(std::move(config)) {
  for (const ServedModelSpec& s : config_.served) served_.push_back(std::make_unique<ServedModel>(s));
}

ModelState RepositoryModel::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

std::string RepositoryModel::reason() const {
  std::lock_guard lock(mu_);
  return reason_;
}

bool RepositoryModel::wanted() const {
  std::lock_guard lock(mu_);
  return wanted_;
}

std::string RepositoryModel::summary() const {
  std::lock_guard lock(mu_);
  return summary_;
}

std::shared_ptr<const DecoderHandle> RepositoryModel::decoder() const {
  std::lock_guard lock(mu_);
  return decoder_;
}

std::string RepositoryModel::model_fields() const {
  std::lock_guard lock(mu_);
  return model_fields_;
}

ModelRepository::ModelRepository(ModelRepositoryOptions options) : options_(std::move(options)) {}

ModelRepository::~ModelRepository() {
  Stop();
}

Status ModelRepository::Add(ModelConfig config) {
  if (started_) return FailedPreconditionError("models are added before the repository starts");
  if (config.name.empty()) return InvalidArgumentError("a model needs a name");
  if (!config.load) return InvalidArgumentError("model '{}': nothing to load it with", config.name);
  const bool batched = config.kind != ModelKind::kDecoder;
  if (batched && config.served.empty())
    return InvalidArgumentError("model '{}': a batched model serves at least one name", config.name);
  if (!batched && !config.served.empty())
    return InvalidArgumentError("model '{}': a decoder has no batched names", config.name);
  for (const ServedModelSpec& s : config.served) {
    RETURN_IF_ERROR(s.config.Validate().WithContext(s.name));
  }
  // Every name a request may use, and what it finds.
  std::vector<std::string> names = {config.name};
  for (const ServedModelSpec& s : config.served) {
    if (s.name != config.name) names.push_back(s.name);
  }
  for (const std::string& n : names) {
    if (names_.count(n) != 0) return AlreadyExistsError("model name '{}' is used twice", n);
  }
  // An alias another model already answers to (two models from one source) stays that model's.
  for (const std::string& a : config.aliases) {
    if (std::find(names.begin(), names.end(), a) == names.end() && names_.count(a) == 0) names.push_back(a);
  }
  auto m = std::make_unique<RepositoryModel>(std::move(config));
  RepositoryModel* p = m.get();
  const size_t num_served = p->config_.served.size();
  for (const std::string& n : names) {
    Entry e{.model = p, .served = num_served > 0 ? p->served_[0].get() : nullptr};
    for (size_t i = 0; i < num_served; ++i) {
      if (p->served_[i]->name() == n) e.served = p->served_[i].get();
    }
    names_.emplace(n, e);
  }
  models_.push_back(std::move(m));
  return OkStatus();
}

void ModelRepository::Start() {
  if (started_) return;
  started_ = true;
  {
    std::lock_guard lock(mu_);
    for (auto& m : models_) {
      if (!m->config_.load_at_start) continue;
      {
        std::lock_guard ml(m->mu_);
        m->wanted_ = true;
        m->state_ = ModelState::kLoading;
      }
      tasks_.push_back({.model = m.get(), .load = true, .done = nullptr, .startup = true});
      ++startup_pending_;
    }
  }
  worker_ = std::thread([this] { WorkerLoop(); });
}

void ModelRepository::Stop(std::chrono::milliseconds drain) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    // Queued operations never run; their callers hear so.
    for (Task& t : tasks_) {
      if (t.done) t.done(UnavailableError("the server is stopping"));
    }
    tasks_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (auto& m : models_) DoUnload(*m, drain);
}

const ModelRepository::Entry* ModelRepository::Find(std::string_view name) const {
  auto it = names_.find(name);
  return it == names_.end() ? nullptr : &it->second;
}

Status ModelRepository::Load(std::string_view name, std::function<void(Status)> done) {
  return Enqueue(name, /*load=*/true, std::move(done));
}

Status ModelRepository::Unload(std::string_view name, std::function<void(Status)> done) {
  return Enqueue(name, /*load=*/false, std::move(done));
}

Status ModelRepository::Enqueue(std::string_view name, bool load, std::function<void(Status)> done) {
  const Entry* e = Find(name);
  if (e == nullptr) {
    return NotFoundError("no model '{}' in the repository (it holds: {})", name, NameList());
  }
  std::lock_guard lock(mu_);
  if (stopping_) return UnavailableError("the server is stopping");
  if (!started_) return FailedPreconditionError("the repository has not started");
  tasks_.push_back({.model = e->model, .load = load, .done = std::move(done)});
  cv_.notify_all();
  return OkStatus();
}

void ModelRepository::WaitIdle() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return stopping_ || (tasks_.empty() && !busy_); });
}

bool ModelRepository::idle() const {
  std::lock_guard lock(mu_);
  return tasks_.empty() && !busy_;
}

void ModelRepository::WorkerLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (stopping_) return;
    Task t = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    lock.unlock();
    Status s = OkStatus();
    if (t.load) {
      s = DoLoad(*t.model);
      if (options_.on_load) options_.on_load(*t.model, s);
    } else {
      DoUnload(*t.model, options_.unload_drain);
    }
    if (t.done) t.done(s);
    lock.lock();
    if (!s.ok() && t.load && startup_error_.ok() && !t.done) startup_error_ = s;
    if (t.startup) --startup_pending_;
    busy_ = false;
    cv_.notify_all();
  }
}

Status ModelRepository::DoLoad(RepositoryModel& m) {
  {
    std::lock_guard lock(m.mu_);
    m.wanted_ = true;
    if (m.state_ == ModelState::kReady) return OkStatus();
    m.state_ = ModelState::kLoading;
    m.reason_.clear();
  }
  auto fail = [&](Status s) {
    s = s.WithContext(fmt::format("model '{}'", m.name()));
    std::lock_guard lock(m.mu_);
    m.state_ = ModelState::kUnavailable;
    m.wanted_ = false;  // a failed load is not waited for by /health/ready; its reason says why
    m.reason_ = std::string(s.message());
    return s;
  };
  StatusOr<LoadedModel> loaded = m.config_.load ? m.config_.load() : InternalError("no loader");
  if (!loaded.ok()) return fail(loaded.status());
  if (m.kind() == ModelKind::kDecoder) {
    if (loaded->decoder == nullptr || loaded->decoder->engine == nullptr)
      return fail(InternalError("the loader returned no engine"));
  } else {
    if (loaded->classic.size() != m.served_.size()) {
      return fail(InternalError("the loader returned {} models for {} served names", loaded->classic.size(),
                                m.served_.size()));
    }
    for (size_t i = 0; i < m.served_.size(); ++i) {
      if (Status s = m.served_[i]->Start(loaded->classic[i], options_.registry); !s.ok()) {
        for (size_t k = 0; k < i; ++k) m.served_[k]->Stop(std::chrono::milliseconds(0));
        return fail(s);
      }
    }
  }
  std::lock_guard lock(m.mu_);
  m.decoder_ = std::move(loaded->decoder);
  m.drain_ = std::move(loaded->drain);
  m.summary_ = std::move(loaded->summary);
  m.model_fields_ = std::move(loaded->model_fields);
  m.state_ = ModelState::kReady;
  return OkStatus();
}

void ModelRepository::DoUnload(RepositoryModel& m, std::chrono::milliseconds drain) {
  std::shared_ptr<const DecoderHandle> decoder;
  {
    std::lock_guard lock(m.mu_);
    m.wanted_ = false;
    if (m.state_ != ModelState::kReady) return;
    m.state_ = ModelState::kUnloading;
    decoder = std::move(m.decoder_);  // new requests now find no engine (503)
    m.model_fields_.clear();
  }
  for (auto& s : m.served_) s->Stop(drain);
  if (m.drain_) m.drain_(drain);
  m.drain_ = nullptr;
  decoder.reset();  // the engine goes with the last reference (a request being submitted may hold one)
  std::lock_guard lock(m.mu_);
  m.state_ = ModelState::kUnavailable;
  m.reason_ = "unloaded";
}

std::vector<ServedModel*> ModelRepository::served_models() const {
  std::vector<ServedModel*> out;
  for (const auto& m : models_) {
    for (const auto& s : m->served()) out.push_back(s.get());
  }
  return out;
}

bool ModelRepository::ready() const {
  if (!started_) return false;
  {
    // A load at start that failed ends the server (StartupError): from the moment its model stops being
    // wanted until the process exits, it must not look ready (a prober would find it gone a moment later).
    std::lock_guard lock(mu_);
    if (startup_pending_ > 0 || !startup_error_.ok()) return false;
  }
  for (const auto& m : models_) {
    std::lock_guard lock(m->mu_);
    if (m->wanted_ && m->state_ != ModelState::kReady) return false;
  }
  return true;
}

std::string ModelRepository::NameList() const {
  std::string out;
  for (const auto& m : models_) {
    if (!out.empty()) out += ", ";
    out += m->name();
  }
  return out;
}

Status ModelRepository::StartupError() const {
  std::lock_guard lock(mu_);
  return startup_error_;
}

}  // namespace stoke
