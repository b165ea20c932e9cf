// Test helper: a small random BERT written as an HF folder (F32 safetensors + config.json), for encoder tests
// that need a real folder (the CUDA encoder, the classic serving path). Header-only; tests only.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace stoke::testing {

struct RandomBertShape {
  int vocab = 512, hidden = 128, heads = 2, layers = 2, inter = 256, max_pos = 160;
};

// Folders removed when the test process exits (so runs leave nothing in the temp directory).
inline void RemoveAtExit(const std::filesystem::path& dir) {
  struct Dirs {
    std::vector<std::filesystem::path> paths;
    ~Dirs() {
      std::error_code ec;
      for (const auto& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Dirs dirs;
  dirs.paths.push_back(dir);
}

// A random BERT as an HF folder (F32 safetensors): weights N(0, 1/in) so activations stay O(1) and softmax
// is neither flat nor one-hot; norms 1 +- 0.1. The folder goes when the process exits.
inline std::filesystem::path WriteRandomBert(const RandomBertShape& sh, uint32_t seed,
                                             const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("random_bert_" + name + "_" + std::to_string(seed) + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  RemoveAtExit(dir);
  std::mt19937 rng(seed);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float stddev, float mean = 0.f) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::normal_distribution<float> dist(mean, stddev);
    const size_t begin = data.size();
    for (int64_t i = 0; i < count; ++i) {
      const float x = dist(rng);
      data.append(reinterpret_cast<const char*>(&x), 4);
    }
    header[n] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  };
  const int h = sh.hidden;
  add("embeddings.word_embeddings.weight", {sh.vocab, h}, 0.5f);
  add("embeddings.position_embeddings.weight", {sh.max_pos, h}, 0.5f);
  add("embeddings.token_type_embeddings.weight", {2, h}, 0.5f);
  add("embeddings.LayerNorm.weight", {h}, 0.1f, 1.f);
  add("embeddings.LayerNorm.bias", {h}, 0.1f);
  for (int l = 0; l < sh.layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* m : {"query", "key", "value"}) {
      add(p + "attention.self." + m + ".weight", {h, h}, 1.f / std::sqrt(float(h)));
      add(p + "attention.self." + m + ".bias", {h}, 0.1f);
    }
    add(p + "attention.output.dense.weight", {h, h}, 1.f / std::sqrt(float(h)));
    add(p + "attention.output.dense.bias", {h}, 0.1f);
    add(p + "attention.output.LayerNorm.weight", {h}, 0.1f, 1.f);
    add(p + "attention.output.LayerNorm.bias", {h}, 0.1f);
    add(p + "intermediate.dense.weight", {sh.inter, h}, 1.f / std::sqrt(float(h)));
    add(p + "intermediate.dense.bias", {sh.inter}, 0.1f);
    add(p + "output.dense.weight", {h, sh.inter}, 1.f / std::sqrt(float(sh.inter)));
    add(p + "output.dense.bias", {h}, 0.1f);
    add(p + "output.LayerNorm.weight", {h}, 0.1f, 1.f);
    add(p + "output.LayerNorm.bias", {h}, 0.1f);
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string hs = header.dump();
  while ((8 + hs.size()) % 8 != 0) hs += ' ';
  {
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = hs.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << hs << data;
  }
  nlohmann::json cfg = {{"architectures", {"BertModel"}}, {"model_type", "bert"},
                        {"vocab_size", sh.vocab},         {"hidden_size", h},
                        {"num_hidden_layers", sh.layers}, {"num_attention_heads", sh.heads},
                        {"intermediate_size", sh.inter},  {"max_position_embeddings", sh.max_pos},
                        {"type_vocab_size", 2},           {"layer_norm_eps", 1e-12},
                        {"hidden_act", "gelu"},           {"pad_token_id", 0}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir;
}

}  // namespace stoke::testing
