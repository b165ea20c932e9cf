// A Hugging Face model folder: config.json, model.safetensors (or shards listed by
// model.safetensors.index.json), tokenizer.json and friends. Tensors of every shard are visible through one
// name table.
//
// BERT names are normalised (model-formats.md §4): a leading "bert." is stripped and LayerNorm.gamma/.beta
// become LayerNorm.weight/.bias; FindTensor accepts both the normalised and the original names.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/loader/safetensors_reader.h"
#include "engine/loader/tensor.h"

namespace stoke {

// "bert.encoder.layer.0.output.LayerNorm.gamma" -> "encoder.layer.0.output.LayerNorm.weight"; others
// unchanged.
std::string NormalizeHfTensorName(std::string_view name);

// Parses a JSON file; syntax errors name the file, line and column.
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

class HfFolder {
 public:
  static StatusOr<std::unique_ptr<HfFolder>> Open(const std::string& dir);

  const nlohmann::json& config() const { return config_; }  // config.json
  const std::string& dir() const { return dir_; }
  // Every tensor of every shard, normalised names; shard order, then file order within a shard.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const TensorRef* FindTensor(std::string_view name) const;  // normalised or original name; nullptr if absent
  std::string FilePath(std::string_view name) const;         // dir + "/" + name, e.g. "tokenizer.json"
  bool HasFile(std::string_view name) const;
  // sentence_bert_config.json max_seq_length, if that file exists and has it.
  std::optional<int> SentenceMaxSeqLength() const;
  // The opened shards (one for a single model.safetensors), for sizes and diagnostics.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  HfFolder() = default;
  Status LoadWeights();
  Status AddShard(std::unique_ptr<SafetensorsFile> shard, const std::vector<std::string>* expected);

  std::string dir_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<TensorRef> tensors_;
  std::unordered_map<std::string, size_t> index_;  // normalised and original names -> position in tensors_
};

}  // namespace stoke
