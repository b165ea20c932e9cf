// The models one `stoke serve` process holds, by name: decoders (each an LlmEngine with its tokenizer and
// chat template: continuous batching over its own paged KV) and batched models (encoders, image classifiers,
// synthetic models: each served name a ServedModel with its dynamic batcher and instances), side by side. The
// set of models is fixed when the server starts (flags or the repository folder); each can be unloaded and
// loaded again.
//
//   ModelRepository repo({.registry = &registry});
//   RETURN_IF_ERROR(repo.Add({.name = "smollm2", .kind = ModelKind::kDecoder, .load = load_fn}));
//   RETURN_IF_ERROR(repo.Add({.name = "minilm", .kind = ModelKind::kEncoder,
//                             .served = {{.name = "minilm", .config = c}, {.name = "minilm-ids", .config =
//                             c}}, .load = load_fn}));
//   repo.Start();                                  // the worker thread; models are LOADING until loaded
//   repo.Load("minilm", [](Status s) { ... });     // queued on the worker; `done` runs there
//   const ModelRepository::Entry* e = repo.Find("minilm-ids");   // a request's "model": name or alias
//   repo.Unload("minilm", done);                   // refuses new requests at once, drains, frees
//
// Threads: Find is lock-free (the name table never changes after Start); RepositoryModel::decoder() copies a
// shared_ptr under the model's mutex (as the OpenAI front end always did); ServedModel::Acquire is an atomic
// count. Loads and unloads run one at a time on the worker thread, never on a net thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/status.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "serve/batcher/served_model.h"
#include "serve/llm_engine.h"
#include "telemetry/metrics.h"
#include "telemetry/server_metrics.h"

namespace stoke {

enum class ModelKind { kDecoder, kEncoder, kImage, kSynthetic };
const char* ModelKindName(ModelKind kind);  // "decoder" | "encoder" | "image" | "synthetic"

// KServe's repository-extension states (kserve-v2.md): UNAVAILABLE (not loaded, or its load failed: see
// reason), LOADING, READY, UNLOADING.
enum class ModelState { kUnavailable, kLoading, kReady, kUnloading };
const char* ModelStateName(ModelState state);

// What the OpenAI routes need of a loaded decoder.
struct DecoderHandle {
  std::shared_ptr<LlmEngine> engine;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;  // empty: chat answers 400
  ServerMetrics* metrics = nullptr;           // the model's series (outlives every load); may be null
  // Members added to its GET /v1/models entry: "" or a JSON object as text (the server's loader puts
  // {"precision": {...}} here: tools/precision/serve_gate.h).
  std::string model_fields;
};

// What one load produces.
struct LoadedModel {
  std::shared_ptr<const DecoderHandle> decoder;  // kDecoder
  // Batched kinds: one model per ModelConfig::served entry, in that order.
  std::vector<std::shared_ptr<ClassicModel>> classic;
  // Decoders: called on unload after new requests are refused; waits up to `drain` for in-flight ones.
  std::function<void(std::chrono::milliseconds drain)> drain;
  std::string summary;  // for the "ready" line: "from PATH on DEVICE, ..."
  // Batched kinds: members added to each served name's GET /v1/models entry ("" or a JSON object as text;
  // an encoder's {"precision": {...}}). Decoders carry theirs in DecoderHandle::model_fields.
  std::string model_fields;
};

struct ModelConfig {
  std::string name;  // /v1/models, the repository index, load/unload
  ModelKind kind = ModelKind::kDecoder;
  std::vector<std::string> aliases;  // other names a request's "model" may use (e.g. the --model argument)
  // Batched kinds: the names KServe serves (bert: NAME and NAME-ids; image: NAME and NAME-tensor).
  std::vector<ServedModelSpec> served;
  std::function<StatusOr<LoadedModel>()> load;  // runs on the worker thread
  bool load_at_start = true;
};

class RepositoryModel {
 public:
  explicit RepositoryModel(ModelConfig config);

  const std::string& name() const { return config_.name; }
  ModelKind kind() const { return config_.kind; }
  const std::vector<std::string>& aliases() const { return config_.aliases; }
  ModelState state() const;
  std::string reason() const;  // why it is UNAVAILABLE after a failed load ("" otherwise)
  bool wanted() const;         // loaded at start or by Load, not unloaded since: /health/ready waits for it
  std::string summary() const;
  // A ready decoder's handle (null otherwise). Callers keep the copy for one request's submission.
  std::shared_ptr<const DecoderHandle> decoder() const;
  // A ready batched model's LoadedModel::model_fields ("" otherwise).
  std::string model_fields() const;
  // Batched kinds: the served names (stable for the process's life).
  const std::vector<std::unique_ptr<ServedModel>>& served() const { return served_; }

 private:
  friend class ModelRepository;
  const ModelConfig config_;
  std::vector<std::unique_ptr<ServedModel>> served_;
  mutable std::mutex mu_;
  ModelState state_ = ModelState::kUnavailable;           // guarded by mu_
  std::string reason_;                                    // guarded by mu_
  bool wanted_ = false;                                   // guarded by mu_
  std::string summary_;                                   // guarded by mu_
  std::shared_ptr<const DecoderHandle> decoder_;          // guarded by mu_; set while READY
  std::string model_fields_;                              // guarded by mu_; set while READY
  std::function<void(std::chrono::milliseconds)> drain_;  // worker thread only
};

struct ModelRepositoryOptions {
  MetricsRegistry* registry = nullptr;  // batched models' series (ClassicMetrics); may be null
  std::chrono::milliseconds unload_drain{std::chrono::seconds(10)};  // in-flight requests' time on unload
  // Runs on the worker after each load attempt (the server prints its "ready" line here).
  std::function<void(const RepositoryModel&, const Status&)> on_load;
};

class ModelRepository {
 public:
  explicit ModelRepository(ModelRepositoryOptions options);
  ~ModelRepository();  // Stop()
  ModelRepository(const ModelRepository&) = delete;
  ModelRepository& operator=(const ModelRepository&) = delete;

  // Before Start. Names and served names must be unique (AlreadyExists names the clash); an alias that
  // another model already answers to stays with that model.
  Status Add(ModelConfig config);
  // Starts the worker and queues the load of every model with load_at_start.
  void Start();
  // Unloads everything (each drained for up to `drain`) and joins the worker. Idempotent.
  void Stop(std::chrono::milliseconds drain = std::chrono::milliseconds(0));

  // A name a request may use: a model's name, a served name, or an alias.
  struct Entry {
    RepositoryModel* model = nullptr;
    ServedModel* served =
        nullptr;  // the batched served name it matched (a model name: its first); decoders null
  };
  const Entry* Find(std::string_view name) const;  // null: unknown

  // Queue a load / unload on the worker; `done` runs there with the outcome. NotFound (unknown name) is
  // returned at once and `done` is not called. Loading a READY model, or unloading an UNAVAILABLE one, is OK
  // and changes nothing.
  Status Load(std::string_view name, std::function<void(Status)> done = nullptr);
  Status Unload(std::string_view name, std::function<void(Status)> done = nullptr);
  // Blocks until the worker has nothing queued or running (tests; the server's start-up).
  void WaitIdle();
  bool idle() const;

  const std::vector<std::unique_ptr<RepositoryModel>>& models() const { return models_; }
  // Every served name of the batched models, in Add order (the KServe routes).
  std::vector<ServedModel*> served_models() const;
  // Every model that should be ready (wanted) is READY. False before Start, while the loads Start() queued
  // run, and after one of them failed (the StartupError a server exits on).
  bool ready() const;
  // "a, b, c": the model names, for error messages.
  std::string NameList() const;
  // First failure of a model wanted at start (so the server can exit); OK when none.
  Status StartupError() const;

 private:
  struct Task {
    RepositoryModel* model;
    bool load;
    std::function<void(Status)> done;
    bool startup = false;  // queued by Start()
  };
  Status Enqueue(std::string_view name, bool load, std::function<void(Status)> done);
  void WorkerLoop();
  Status DoLoad(RepositoryModel& m);
  void DoUnload(RepositoryModel& m, std::chrono::milliseconds drain);

  const ModelRepositoryOptions options_;
  std::vector<std::unique_ptr<RepositoryModel>> models_;
  std::map<std::string, Entry, std::less<>> names_;  // fixed after Start

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;  // guarded by mu_
  bool busy_ = false;       // guarded by mu_: a task is running
  bool stopping_ = false;   // guarded by mu_
  std::atomic<bool> started_{false};
  Status startup_error_;  // guarded by mu_
  int startup_pending_ = 0;  // guarded by mu_: loads queued by Start() not finished yet
  std::thread worker_;
};

}  // namespace stoke
