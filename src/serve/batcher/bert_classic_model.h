// A BERT-family sentence encoder (all-MiniLM-L6-v2 ...) as a classic model, in two input forms that share
// the encoder weights:
//
//   text form:  input  "text"            BYTES [batch, 1]     one UTF-8 sentence per row, tokenised here
//   ids form:   inputs "input_ids"       INT64 [batch, seq]   token ids incl. [CLS]/[SEP], right-padded
//                      "attention_mask"  INT64 [batch, seq]   1 = real token, 0 = padding
//   both:       output "embedding"       FP32  [batch, hidden] mean-pooled, L2-normalised (as `stoke embed`)
//
// Prepared form = one token-id row per sentence; the encoder never pads (bert.h), so a sentence's embedding
// does not depend on its batch. Each instance runs on its own thread pool (threads split across instances),
// or, with a device model (engine/model/bert_backend.h, e.g. the CUDA encoder), on its own device runner: its
// own stream and scratch over the shared weights, with the ledger's h2d / compute / d2h from device events.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/tokenizer/tokenizer.h"
#include "serve/batcher/classic_model.h"

namespace stoke {

enum class BertInputForm { kText, kTokenIds };

class BertClassicModel final : public ClassicModel, public TextEmbedder {
 public:
  // threads: compute threads for all instances together (0: ThreadPool::Default()'s size).
  // device: run on this device model (one runner per instance) instead of the CPU encoder; null = CPU.
  BertClassicModel(std::shared_ptr<const BertEncoder> encoder, std::shared_ptr<const Tokenizer> tokenizer,
                   BertInputForm form, int threads = 0, std::shared_ptr<BertDeviceModel> device = nullptr);

  std::string platform() const override { return "stoke_bert"; }
  const ModelSignature& signature() const override { return signature_; }
  StatusOr<std::unique_ptr<PreparedInput>> Prepare(std::vector<InferTensor> inputs, int64_t rows,
                                                   int64_t* tokens) const override;
  StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(int index, int count) override;

  // For the OpenAI embeddings API: texts -> rows (truncated to max_seq_length), ids checked against the
  // vocabulary. `what` names the input in errors ("input[2]"). *tokens: longest row; *total: sum of rows.
  StatusOr<std::unique_ptr<TokenRows>> TokenizeTexts(const std::vector<std::string>& texts, int64_t* tokens,
                                                     int64_t* total) const override;
  StatusOr<std::unique_ptr<TokenRows>> CheckIds(std::vector<std::vector<int32_t>> rows, int64_t* tokens,
                                                int64_t* total) const override;
  // The text form serves /v1/embeddings.
  const TextEmbedder* text_embedder() const override {
    return form_ == BertInputForm::kText ? this : nullptr;
  }

  int hidden_size() const override { return encoder_->hidden_size(); }
  const BertEncoder& encoder() const { return *encoder_; }
  std::string device_name() const { return device_ ? device_->device_name() : "cpu"; }

 private:
  const std::shared_ptr<const BertEncoder> encoder_;
  const std::shared_ptr<const Tokenizer> tokenizer_;
  const BertInputForm form_;
  const int threads_;
  const std::shared_ptr<BertDeviceModel> device_;
  ModelSignature signature_;
};

}  // namespace stoke
