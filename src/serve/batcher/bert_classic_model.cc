#include "serve/batcher/bert_classic_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/thread_pool.h"

namespace stoke {
namespace {

// The batch's token rows, in request order (each request may hold several rows).
void GatherRows(std::span<const PreparedInput* const> inputs, std::vector<std::vector<int32_t>>* batch) {
  batch->clear();
  for (const PreparedInput* in : inputs) {
    for (const auto& r : static_cast<const TokenRows*>(in)->rows) batch->push_back(r);
  }
}

// Cuts the batch's [total_rows, hidden] embeddings back into one "embedding" tensor per request.
void SplitEmbeddings(const std::vector<float>& embeddings, int64_t hidden, std::span<const int64_t> rows,
                     std::vector<std::vector<InferTensor>>* outputs) {
  size_t row = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    InferTensor t;
    t.name = "embedding";
    t.type = TensorType::kFp32;
    t.shape = {rows[i], hidden};
    const size_t bytes = static_cast<size_t>(rows[i] * hidden) * sizeof(float);
    t.data.resize(bytes);
    std::memcpy(t.data.data(), embeddings.data() + row * hidden, bytes);
    row += static_cast<size_t>(rows[i]);
    (*outputs)[i].push_back(std::move(t));
  }
}

Nanos Now() {
  return MonotonicNanos();
}

class BertInstance final : public ModelInstance {
 public:
  BertInstance(std::shared_ptr<const BertEncoder> encoder, int threads)
      : encoder_(std::move(encoder)), pool_(threads) {}

  Status Execute(std::span<const PreparedInput* const> inputs, std::span<const int64_t> rows,
                 std::vector<std::vector<InferTensor>>* outputs, ExecTimes* times) override {
    const Nanos t0 = Now();
    GatherRows(inputs, &batch_);
    const Nanos t1 = Now();
    RETURN_IF_ERROR(encoder_->Embed(batch_, &embeddings_, pool_));
    const Nanos t2 = Now();
    SplitEmbeddings(embeddings_, encoder_->hidden_size(), rows, outputs);
    times->preprocess = t1 - t0;
    times->compute = t2 - t1;
    times->postprocess = Now() - t2;
    return OkStatus();
  }

 private:
  std::shared_ptr<const BertEncoder> encoder_;
  ThreadPool pool_;
  std::vector<std::vector<int32_t>> batch_;  // scratch, reused across batches
  std::vector<float> embeddings_;
};

// An instance on a device: the batch's rows go through its own runner (stream + scratch).
class BertDeviceInstance final : public ModelInstance {
 public:
  BertDeviceInstance(int64_t hidden, std::unique_ptr<BertRunner> runner)
      : hidden_(hidden), runner_(std::move(runner)) {}

  Status Execute(std::span<const PreparedInput* const> inputs, std::span<const int64_t> rows,
                 std::vector<std::vector<InferTensor>>* outputs, ExecTimes* times) override {
    const Nanos t0 = Now();
    GatherRows(inputs, &batch_);
    const Nanos t1 = Now();
    EmbedTimes et;
    RETURN_IF_ERROR(runner_->Embed(batch_, &embeddings_, &et));
    const Nanos t2 = Now();
    SplitEmbeddings(embeddings_, hidden_, rows, outputs);
    // Host staging counts as preprocess, copying out of pinned memory as postprocess; the device stages are
    // the runner's event timings.
    times->preprocess = (t1 - t0) + et.prepare_ns;
    times->h2d = et.h2d_ns;
    times->compute = et.compute_ns;
    times->d2h = et.d2h_ns;
    times->postprocess = et.finish_ns + (Now() - t2);
    return OkStatus();
  }

 private:
  const int64_t hidden_;
  std::unique_ptr<BertRunner> runner_;
  std::vector<std::vector<int32_t>> batch_;
  std::vector<float> embeddings_;
};

int64_t ReadInt64(const std::string& data, int64_t i) {
  int64_t v;
  std::memcpy(&v, data.data() + i * 8, 8);
  return v;
}

}  // namespace

BertClassicModel::BertClassicModel(std::shared_ptr<const BertEncoder> encoder,
                                   std::shared_ptr<const Tokenizer> tokenizer, BertInputForm form,
                                   int threads, std::shared_ptr<BertDeviceModel> device)
    : encoder_(std::move(encoder)),
      tokenizer_(std::move(tokenizer)),
      form_(form),
      threads_(threads > 0 ? threads : ThreadPool::Default().num_threads()),
      device_(std::move(device)) {
  if (form_ == BertInputForm::kText) {
    signature_.inputs = {{"text", TensorType::kBytes, {1}}};
  } else {
    signature_.inputs = {{"input_ids", TensorType::kInt64, {-1}},
                         {"attention_mask", TensorType::kInt64, {-1}}};
  }
  signature_.outputs = {{"embedding", TensorType::kFp32, {encoder_->hidden_size()}}};
}

StatusOr<std::unique_ptr<ModelInstance>> BertClassicModel::CreateInstance(int index, int count) {
  if (device_) {
    ASSIGN_OR_RETURN(std::unique_ptr<BertRunner> runner, device_->CreateRunner());
    return std::unique_ptr<ModelInstance>(new BertDeviceInstance(encoder_->hidden_size(), std::move(runner)));
  }
  const int threads = std::max(1, threads_ / std::max(1, count));
  return std::unique_ptr<ModelInstance>(new BertInstance(encoder_, threads));
}

StatusOr<std::unique_ptr<TokenRows>> BertClassicModel::TokenizeTexts(const std::vector<std::string>& texts,
                                                                     int64_t* tokens, int64_t* total) const {
  auto out = std::make_unique<TokenRows>();
  out->rows.reserve(texts.size());
  EncodeOptions eo;
  eo.add_special = true;
  eo.max_length = encoder_->max_seq_length();
  *tokens = 0;
  *total = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = tokenizer_->Encode(texts[i], eo);
    if (!ids.ok()) return InvalidArgumentError("text {}: {}", i, ids.status().message());
    *tokens = std::max<int64_t>(*tokens, ids->size());
    *total += static_cast<int64_t>(ids->size());
    out->rows.push_back(std::move(ids).value());
  }
  return out;
}

StatusOr<std::unique_ptr<TokenRows>> BertClassicModel::CheckIds(std::vector<std::vector<int32_t>> rows,
                                                                int64_t* tokens, int64_t* total) const {
  const int vocab = encoder_->config().vocab_size;
  *tokens = 0;
  *total = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].empty()) return InvalidArgumentError("row {} has no tokens", i);
    for (int32_t id : rows[i]) {
      if (id < 0 || id >= vocab)
        return InvalidArgumentError("row {}: token id {} is outside [0, {})", i, id, vocab);
    }
    // The encoder truncates longer rows the same way (keeping the final [SEP]).
    const int64_t n = std::min<int64_t>(rows[i].size(), encoder_->max_seq_length());
    *tokens = std::max(*tokens, n);
    *total += n;
  }
  auto out = std::make_unique<TokenRows>();
  out->rows = std::move(rows);
  return out;
}

StatusOr<std::unique_ptr<PreparedInput>> BertClassicModel::Prepare(std::vector<InferTensor> inputs,
                                                                   int64_t rows, int64_t* tokens) const {
  int64_t total = 0;
  if (form_ == BertInputForm::kText) {
    std::vector<std::string> texts;
    for (std::string_view s : SplitBytesElements(inputs[0].data)) texts.emplace_back(s);
    auto r = TokenizeTexts(texts, tokens, &total);
    if (!r.ok()) return r.status().WithContext("input 'text'");
    return std::unique_ptr<PreparedInput>(std::move(r).value());
  }
  const InferTensor* ids = nullptr;
  const InferTensor* mask = nullptr;
  for (const InferTensor& t : inputs) (t.name == "input_ids" ? ids : mask) = &t;
  if (ids->shape != mask->shape) {
    return InvalidArgumentError("input 'attention_mask': shape {} differs from input 'input_ids' {}",
                                ShapeString(mask->shape), ShapeString(ids->shape));
  }
  const int64_t seq = ids->shape[1];
  std::vector<std::vector<int32_t>> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < seq; ++j) {
      const int64_t m = ReadInt64(mask->data, r * seq + j);
      if (m != 0 && m != 1) {
        return InvalidArgumentError("input 'attention_mask': element [{}, {}] is {}; must be 0 or 1", r, j,
                                    m);
      }
      if (m == 0) continue;
      const int64_t id = ReadInt64(ids->data, r * seq + j);
      if (id < 0 || id >= encoder_->config().vocab_size) {
        return InvalidArgumentError(
            "input 'input_ids': element [{}, {}] = {} is outside the vocabulary [0, {})", r, j, id,
            encoder_->config().vocab_size);
      }
      out[r].push_back(static_cast<int32_t>(id));
    }
    if (out[r].empty()) return InvalidArgumentError("input 'attention_mask': row {} has no real tokens", r);
  }
  auto checked = CheckIds(std::move(out), tokens, &total);
  if (!checked.ok()) return checked.status();
  return std::unique_ptr<PreparedInput>(std::move(checked).value());
}

}  // namespace stoke
