// The repository with fake models: states through load and unload, lookup by name / served name / alias,
// a model that fails to load leaves the others serving with its reason, an unload drains its own queued
// requests and leaves another model's in flight, /health-style readiness.
#include "serve/repository/model_repository.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

namespace stoke {
namespace {

using namespace std::chrono_literals;

struct Row : PreparedInput {
  int64_t value = 0;
};

// Each execution answers y = x + 1; blocks while `hold` is set, so tests control what is in flight.
class FakeModel : public ClassicModel {
 public:
  std::string platform() const override { return "fake"; }
  const ModelSignature& signature() const override { return sig_; }
  StatusOr<std::unique_ptr<PreparedInput>> Prepare(std::vector<InferTensor>, int64_t,
                                                   int64_t*) const override {
    return UnimplementedError("not used");
  }
  StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(int, int) override {
    return std::unique_ptr<ModelInstance>(new Inst(this));
  }
  void Hold(bool on) {
    std::lock_guard l(mu_);
    hold_ = on;
    cv_.notify_all();
  }
  bool WaitStarted(int n) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, 60s, [&] { return started_ >= n; });
  }

 private:
  struct Inst : ModelInstance {
    explicit Inst(FakeModel* m) : m(m) {}
    Status Execute(std::span<const PreparedInput* const> inputs, std::span<const int64_t> rows,
                   std::vector<std::vector<InferTensor>>* outputs, ExecTimes*) override {
      {
        std::unique_lock l(m->mu_);
        m->started_++;
        m->cv_.notify_all();
        m->cv_.wait(l, [&] { return !m->hold_; });
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        const int64_t y = static_cast<const Row*>(inputs[i])->value + 1;
        InferTensor t{.name = "y", .type = TensorType::kInt64, .shape = {rows[i], 1}};
        t.data.append(reinterpret_cast<const char*>(&y), 8);
        (*outputs)[i].push_back(std::move(t));
      }
      return OkStatus();
    }
    FakeModel* m;
  };
  ModelSignature sig_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  int started_ = 0;
};

class FakeEngine final : public LlmEngine {
 public:
  Status Submit(GenerationRequest) override { return OkStatus(); }
  void Cancel(const std::string&) override {}
  int context_length() const override { return 32; }
};

BatcherConfig Config() {
  BatcherConfig c;
  c.max_batch_size = 4;
  c.dynamic_batching = DynamicBatchingOptions{};
  return c;
}

// A batched model whose loads each make a new FakeModel (kept in `made` for the test to drive).
ModelConfig Batched(const std::string& name, std::vector<std::shared_ptr<FakeModel>>* made,
                    std::atomic<int>* loads) {
  return {.name = name,
          .kind = ModelKind::kEncoder,
          .aliases = {"/models/" + name},
          .served = {{.name = name, .config = Config()}, {.name = name + "-ids", .config = Config()}},
          .load = [made, loads]() -> StatusOr<LoadedModel> {
            ++*loads;
            auto a = std::make_shared<FakeModel>(), b = std::make_shared<FakeModel>();
            made->push_back(a);
            return LoadedModel{.classic = {a, b}, .summary = "fake"};
          }};
}

ModelConfig Decoder(const std::string& name, bool fail) {
  return {.name = name, .kind = ModelKind::kDecoder, .load = [fail]() -> StatusOr<LoadedModel> {
            if (fail) return NotFoundError("no such file: /nowhere.gguf");
            auto h = std::make_shared<DecoderHandle>();
            h->engine = std::make_shared<FakeEngine>();
            return LoadedModel{.decoder = h};
          }};
}

// Submits x to `m`; the future gets y or the error.
std::future<StatusOr<int64_t>> Infer(ServedModel* m, int64_t x, Status* submitted) {
  auto p = std::make_shared<std::promise<StatusOr<int64_t>>>();
  auto f = p->get_future();
  auto in = std::make_unique<Row>();
  in->value = x;
  *submitted = m->Submit(std::move(in), 1, 1, {}, [p](InferResult r) {
    if (!r.status.ok()) return p->set_value(r.status);
    int64_t y;
    std::memcpy(&y, r.outputs.at(0).data.data(), 8);
    p->set_value(y);
  });
  if (!submitted->ok()) p->set_value(*submitted);
  return f;
}

TEST(ModelRepositoryTest, LookupByNameServedNameAndAlias) {
  std::vector<std::shared_ptr<FakeModel>> made;
  std::atomic<int> loads{0};
  ModelRepository repo({});
  ASSERT_TRUE(repo.Add(Batched("minilm", &made, &loads)).ok());
  ASSERT_TRUE(repo.Add(Decoder("smol", false)).ok());
  const auto* e = repo.Find("minilm");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->model->name(), "minilm");
  EXPECT_EQ(e->served->name(), "minilm");
  EXPECT_EQ(repo.Find("minilm-ids")->served->name(), "minilm-ids");
  EXPECT_EQ(repo.Find("/models/minilm")->served->name(), "minilm");  // an alias finds the first served name
  EXPECT_EQ(repo.Find("smol")->served, nullptr);
  EXPECT_EQ(repo.Find("smol")->model->kind(), ModelKind::kDecoder);
  EXPECT_EQ(repo.Find("gpt-4"), nullptr);
  EXPECT_EQ(repo.NameList(), "minilm, smol");
  EXPECT_EQ(repo.served_models().size(), 2u);
  // A name used twice (here a served name of another model) is refused, naming it.
  Status dup = repo.Add(Decoder("minilm-ids", false));
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(dup.message().find("minilm-ids"), std::string_view::npos);
}

TEST(ModelRepositoryTest, StatesThroughLoadUnloadLoad) {
  std::vector<std::shared_ptr<FakeModel>> made;
  std::atomic<int> loads{0};
  ModelRepository repo({});
  ASSERT_TRUE(repo.Add(Batched("minilm", &made, &loads)).ok());
  RepositoryModel* m = repo.Find("minilm")->model;
  EXPECT_EQ(m->state(), ModelState::kUnavailable);
  EXPECT_FALSE(repo.ready());  // not started
  repo.Start();
  repo.WaitIdle();
  EXPECT_EQ(m->state(), ModelState::kReady);
  EXPECT_TRUE(repo.ready());
  EXPECT_EQ(loads.load(), 1);
  ServedModel* text = repo.Find("minilm")->served;
  Status submitted;
  EXPECT_EQ(*Infer(text, 41, &submitted).get(), 42);

  std::promise<Status> unloaded;
  ASSERT_TRUE(repo.Unload("minilm-ids", [&](Status s) { unloaded.set_value(s); }).ok());  // acts on the model
  EXPECT_TRUE(unloaded.get_future().get().ok());
  EXPECT_EQ(m->state(), ModelState::kUnavailable);
  EXPECT_EQ(m->reason(), "unloaded");
  EXPECT_FALSE(text->ready());
  EXPECT_FALSE(repo.Find("minilm-ids")->served->ready());
  EXPECT_TRUE(repo.ready());  // nothing that should be ready is not
  auto refused = Infer(text, 1, &submitted);
  EXPECT_EQ(submitted.code(), StatusCode::kUnavailable);

  std::promise<Status> loaded;
  ASSERT_TRUE(repo.Load("minilm", [&](Status s) { loaded.set_value(s); }).ok());
  EXPECT_TRUE(loaded.get_future().get().ok());
  EXPECT_EQ(m->state(), ModelState::kReady);
  EXPECT_EQ(loads.load(), 2);
  EXPECT_EQ(*Infer(text, 9, &submitted).get(), 10);
  // Loading a ready model changes nothing; unknown names are NotFound at once, naming what is there.
  ASSERT_TRUE(repo.Load("minilm").ok());
  repo.WaitIdle();
  EXPECT_EQ(loads.load(), 2);
  Status unknown = repo.Load("bert-large");
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("minilm"), std::string_view::npos);
}

TEST(ModelRepositoryTest, FailedLoadLeavesOthersServingWithItsReason) {
  std::vector<std::shared_ptr<FakeModel>> made;
  std::atomic<int> loads{0};
  ModelRepository repo({});
  ASSERT_TRUE(repo.Add(Batched("minilm", &made, &loads)).ok());
  ModelConfig broken = Decoder("broken", /*fail=*/true);
  broken.load_at_start = false;
  ASSERT_TRUE(repo.Add(std::move(broken)).ok());
  repo.Start();
  repo.WaitIdle();
  EXPECT_TRUE(repo.StartupError().ok());
  std::promise<Status> done;
  ASSERT_TRUE(repo.Load("broken", [&](Status s) { done.set_value(s); }).ok());
  Status s = done.get_future().get();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model 'broken'"), std::string_view::npos);
  RepositoryModel* b = repo.Find("broken")->model;
  EXPECT_EQ(b->state(), ModelState::kUnavailable);
  EXPECT_NE(b->reason().find("/nowhere.gguf"), std::string::npos);
  EXPECT_EQ(b->decoder(), nullptr);
  // The other model still serves, and the server is ready (a failed load is not waited for).
  Status submitted;
  EXPECT_EQ(*Infer(repo.Find("minilm")->served, 1, &submitted).get(), 2);
  EXPECT_TRUE(repo.ready());
}

TEST(ModelRepositoryTest, FailedLoadAtStartIsTheStartupError) {
  ModelRepository repo({});
  ASSERT_TRUE(repo.Add(Decoder("broken", /*fail=*/true)).ok());
  repo.Start();
  repo.WaitIdle();
  EXPECT_EQ(repo.StartupError().code(), StatusCode::kNotFound);
  EXPECT_FALSE(repo.ready() && repo.Find("broken")->model->state() == ModelState::kReady);
}

TEST(ModelRepositoryTest, UnloadDrainsItsOwnRequestsAndLeavesAnotherModelsInFlight) {
  std::vector<std::shared_ptr<FakeModel>> made;
  std::atomic<int> loads{0};
  ModelRepository repo({.unload_drain = 60s});
  ASSERT_TRUE(repo.Add(Batched("a", &made, &loads)).ok());
  ASSERT_TRUE(repo.Add(Batched("b", &made, &loads)).ok());
  repo.Start();
  repo.WaitIdle();
  ASSERT_EQ(made.size(), 2u);
  std::shared_ptr<FakeModel> a = made[0], b = made[1];
  a->Hold(true);
  b->Hold(true);
  Status sa, sb;
  auto fa = Infer(repo.Find("a")->served, 1, &sa);
  auto fb = Infer(repo.Find("b")->served, 10, &sb);
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_TRUE(a->WaitStarted(1));
  ASSERT_TRUE(b->WaitStarted(1));
  // Unloading a waits for its in-flight request (drain), while b's stays in flight untouched.
  std::promise<Status> unloaded;
  ASSERT_TRUE(repo.Unload("a", [&](Status s) { unloaded.set_value(s); }).ok());
  auto u = unloaded.get_future();
  while (repo.Find("a")->model->state() != ModelState::kUnloading) std::this_thread::yield();
  EXPECT_EQ(u.wait_for(0s), std::future_status::timeout);
  Status refused;
  Infer(repo.Find("a")->served, 2, &refused);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);  // new requests are refused at once
  a->Hold(false);
  EXPECT_EQ(*fa.get(), 2);  // drained, not dropped
  EXPECT_TRUE(u.get().ok());
  EXPECT_EQ(fb.wait_for(0s), std::future_status::timeout);  // b's request is still running
  b->Hold(false);
  EXPECT_EQ(*fb.get(), 11);
  EXPECT_EQ(repo.Find("b")->model->state(), ModelState::kReady);
}

TEST(ModelRepositoryTest, DecoderHandleComesAndGoes) {
  ModelRepository repo({});
  ASSERT_TRUE(repo.Add(Decoder("smol", false)).ok());
  repo.Start();
  repo.WaitIdle();
  RepositoryModel* m = repo.Find("smol")->model;
  auto h = m->decoder();
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->engine->context_length(), 32);
  ASSERT_TRUE(repo.Unload("smol").ok());
  repo.WaitIdle();
  EXPECT_EQ(m->decoder(), nullptr);
  EXPECT_EQ(m->state(), ModelState::kUnavailable);
  EXPECT_NE(h->engine, nullptr);  // a request that held the handle keeps its engine until it lets go
}

TEST(ModelRepositoryTest, AddChecksItsConfig) {
  ModelRepository repo({});
  EXPECT_EQ(repo.Add({.name = "", .load = [] { return StatusOr<LoadedModel>(LoadedModel{}); }}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(repo.Add({.name = "x",
                      .kind = ModelKind::kEncoder,
                      .load = [] { return StatusOr<LoadedModel>(LoadedModel{}); }})
                .code(),
            StatusCode::kInvalidArgument);  // a batched model with no served names
  EXPECT_EQ(repo.Add({.name = "y", .kind = ModelKind::kDecoder}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoke
