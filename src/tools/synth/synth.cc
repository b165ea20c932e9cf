#include "tools/synth/synth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "base/file_util.h"
#include "base/half.h"
#include "tools/synth/synth_internal.h"

namespace stoke::synth {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// ---- shapes (the real checkpoints' config.json values) ---------------------------------------------------

struct LlamaShape {
  const char* name;
  int hidden, ffn, layers, heads, kv_heads, head_dim, vocab, max_pos;
  double rope_theta;
  double rope_factor;  // 0 = no rope_scaling; else llama3 scaling (low 1, high 4, original 8192)
  bool tied;
  int bos;
  int eos;
  bool llama3_tokenizer;  // else SmolLM2's
};

constexpr LlamaShape kLlamaShapes[] = {
    {"llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 500000.0, 8.0, false, 128000, 128001, true},
    {"llama-3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 500000.0, 32.0, true, 128000, 128001, true},
    {"smollm2-135m", 576, 1536, 30, 9, 3, 64, 49152, 8192, 100000.0, 0.0, true, 1, 2, false},
};

struct BertShape {
  const char* name;
  int hidden, layers, heads, ffn, vocab, max_pos, type_vocab;
};

constexpr BertShape kBertShapes[] = {
    {"bert-base", 768, 12, 12, 3072, 30522, 512, 2},
    {"bert-large", 1024, 24, 16, 4096, 30522, 512, 2},
};

const LlamaShape* FindLlama(const std::string& s) {
  for (const auto& l : kLlamaShapes)
    if (s == l.name) return &l;
  return nullptr;
}
const BertShape* FindBert(const std::string& s) {
  for (const auto& b : kBertShapes)
    if (s == b.name) return &b;
  return nullptr;
}

// ---- PRNG ----------------------------------------------------------------------------------------------

inline uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// ---- tensor plans --------------------------------------------------------------------------------------

enum class DTypeOut { kBF16, kF16, kF32 };

int ElemBytes(DTypeOut d) {
  return d == DTypeOut::kF32 ? 4 : 2;
}
const char* DTypeTag(DTypeOut d) {
  return d == DTypeOut::kF32 ? "F32" : d == DTypeOut::kF16 ? "F16" : "BF16";
}

// How one tensor's values are made: offset + scale * N(key, i), or (permuted rows) row j of the tensor is row
// (perm_a * j + perm_b) mod rows of another tensor's stream (an untied lm_head built from the embedding).
struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  float scale = 0;
  float offset = 0;
  uint64_t key = 0;
  bool permuted_rows = false;
  int64_t perm_a = 1, perm_b = 0;

  int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  }
};

struct Plan {
  std::vector<TensorPlan> tensors;
  Json config;
  std::vector<std::pair<std::string, std::string>> extra_files;  // name -> contents
};

TensorPlan Normal(uint64_t seed, std::string name, std::vector<int64_t> shape, double scale,
                  double offset = 0) {
  TensorPlan t;
  t.key = SynthTensorKey(seed, name);
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.scale = static_cast<float>(scale);
  t.offset = static_cast<float>(offset);
  return t;
}

constexpr double kNormNoise = 0.02;  // norm weights 1 + N(0, 0.02)
constexpr double kBiasStd = 0.02;

const char* TorchDType(DTypeOut d) {
  return d == DTypeOut::kF32 ? "float32" : d == DTypeOut::kF16 ? "float16" : "bfloat16";
}

// The Llama scheme (docs/adding-a-model.md, "Synthetic models"): the residual stream keeps the current
// token's embedding e (std sigma_e = 2.5/sqrt(H) per element) and the layers add r with |r| ~ 2.5 |e|.
// Against the (tied, or row-permuted) output embedding every other token's logit is ~N(0, ~2.3), the current
// token's (or its permutation image's) ~0.93*sqrt(H): top-1 margins of 10+ logits at every position, so bf16
// noise never flips top-1, while the spread of every other logit comes from the layers and exposes any error
// in them.
Plan LlamaPlan(const LlamaShape& s, int layers, uint64_t seed, DTypeOut dt) {
  Plan p;
  const int64_t H = s.hidden, F = s.ffn, V = s.vocab, qd = int64_t{s.heads} * s.head_dim,
                kvd = int64_t{s.kv_heads} * s.head_dim;
  const double sigma_e = 2.5 / std::sqrt(static_cast<double>(H));
  const double rho = 1.5;  // |layers' sum| / |embedding| in the final residual
  const double t = rho * sigma_e / std::sqrt(2.0 * layers);  // per-sublayer output RMS
  const double attn_rms = 0.4, mlp_rms = 0.6;  // typical RMS of the attention output / silu(g)*u
  p.tensors.push_back(Normal(seed, "model.embed_tokens.weight", {V, H}, sigma_e));
  for (int l = 0; l < layers; ++l) {
    const std::string pre = fmt::format("model.layers.{}.", l);
    p.tensors.push_back(Normal(seed, pre + "input_layernorm.weight", {H}, kNormNoise, 1.0));
    p.tensors.push_back(Normal(seed, pre + "self_attn.q_proj.weight", {qd, H}, std::sqrt(1.5 / H)));
    p.tensors.push_back(Normal(seed, pre + "self_attn.k_proj.weight", {kvd, H}, std::sqrt(1.5 / H)));
    p.tensors.push_back(Normal(seed, pre + "self_attn.v_proj.weight", {kvd, H}, std::sqrt(1.0 / H)));
    p.tensors.push_back(Normal(seed, pre + "self_attn.o_proj.weight", {H, qd}, t / attn_rms / std::sqrt(qd)));
    p.tensors.push_back(Normal(seed, pre + "post_attention_layernorm.weight", {H}, kNormNoise, 1.0));
    p.tensors.push_back(Normal(seed, pre + "mlp.gate_proj.weight", {F, H}, std::sqrt(1.0 / H)));
    p.tensors.push_back(Normal(seed, pre + "mlp.up_proj.weight", {F, H}, std::sqrt(1.0 / H)));
    p.tensors.push_back(Normal(seed, pre + "mlp.down_proj.weight", {H, F}, t / mlp_rms / std::sqrt(F)));
  }
  p.tensors.push_back(Normal(seed, "model.norm.weight", {H}, kNormNoise, 1.0));
  if (!s.tied) {
    TensorPlan head = Normal(seed, "lm_head.weight", {V, H}, sigma_e);
    head.key = p.tensors[0].key;  // the embedding's rows, permuted: top-1 is a fixed permutation of the input
    head.permuted_rows = true;
    head.perm_a = 7919;
    while (std::gcd(head.perm_a, V) != 1) head.perm_a += 2;
    head.perm_b = 12345 % V;
    p.tensors.push_back(head);
  }

  Json c;
  c["architectures"] = Json::array({"LlamaForCausalLM"});
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = s.bos;
  c["eos_token_id"] = s.eos;
  c["head_dim"] = s.head_dim;
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = s.ffn;
  c["max_position_embeddings"] = s.max_pos;
  c["mlp_bias"] = false;
  c["model_type"] = "llama";
  c["num_attention_heads"] = s.heads;
  c["num_hidden_layers"] = layers;
  c["num_key_value_heads"] = s.kv_heads;
  c["pretraining_tp"] = 1;
  c["rms_norm_eps"] = 1e-5;
  if (s.rope_factor > 0) {
    c["rope_scaling"] = {{"factor", s.rope_factor},
                         {"high_freq_factor", 4.0},
                         {"low_freq_factor", 1.0},
                         {"original_max_position_embeddings", 8192},
                         {"rope_type", "llama3"}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["rope_theta"] = s.rope_theta;
  c["tie_word_embeddings"] = s.tied;
  c["torch_dtype"] = TorchDType(dt);
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab;
  p.config = std::move(c);

  BpeSpec bpe;
  bpe.vocab_size = s.vocab;
  bpe.seed = seed;
  Json tc;
  if (s.llama3_tokenizer) {
    const char* named[] = {"<|begin_of_text|>",
                           "<|end_of_text|>",
                           "<|reserved_special_token_0|>",
                           "<|reserved_special_token_1|>",
                           "<|finetune_right_pad_id|>",
                           "<|reserved_special_token_2|>",
                           "<|start_header_id|>",
                           "<|end_header_id|>",
                           "<|eom_id|>",
                           "<|eot_id|>",
                           "<|python_tag|>"};
    const int first = s.vocab - 256;
    for (int i = 0; i < 256; ++i) {
      bpe.specials.emplace_back(
          first + i, i < 11 ? std::string(named[i]) : fmt::format("<|reserved_special_token_{}|>", i - 8));
    }
    bpe.pre = BpeSpec::Pre::kLlama3;
    bpe.bos = "<|begin_of_text|>";
    tc["bos_token"] = "<|begin_of_text|>";
    tc["eos_token"] = "<|end_of_text|>";
    tc["chat_template"] =
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if "
        "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
  } else {
    const char* named[] = {"<|endoftext|>",  "<|im_start|>",    "<|im_end|>",       "<repo_name>",
                           "<reponame>",     "<file_sep>",      "<filename>",       "<gh_stars>",
                           "<issue_start>",  "<issue_comment>", "<issue_closed>",   "<jupyter_start>",
                           "<jupyter_text>", "<jupyter_code>",  "<jupyter_output>", "<jupyter_script>",
                           "<empty_output>"};
    for (int i = 0; i < 17; ++i) bpe.specials.emplace_back(i, named[i]);
    bpe.pre = BpeSpec::Pre::kSmolLm;
    tc["bos_token"] = "<|im_start|>";
    tc["eos_token"] = "<|im_end|>";
    tc["pad_token"] = "<|im_end|>";
    tc["unk_token"] = "<|endoftext|>";
    tc["chat_template"] =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
        "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% "
        "endif %}";
  }
  tc["add_bos_token"] = s.llama3_tokenizer;
  tc["add_eos_token"] = false;
  tc["clean_up_tokenization_spaces"] = false;
  tc["model_input_names"] = Json::array({"input_ids", "attention_mask"});
  tc["model_max_length"] = s.max_pos;
  tc["tokenizer_class"] = "PreTrainedTokenizerFast";
  p.extra_files.emplace_back("tokenizer.json", BpeTokenizerJson(bpe));
  p.extra_files.emplace_back("tokenizer_config.json", tc.dump(2) + "\n");
  Json gen{{"bos_token_id", s.bos}, {"eos_token_id", s.eos}, {"do_sample", false}};
  p.extra_files.emplace_back("generation_config.json", gen.dump(2) + "\n");
  return p;
}

// BERT (post-LN): every Linear keeps unit-variance activations (std 1/sqrt(fan_in); the FFN output 1.5x for
// GELU's smaller output), query/key 1.22x for attention scores of std ~1.5, LayerNorm gamma 1 + noise,
// biases small. Embeddings: word N(0,1), position and token type N(0, 0.5).
Plan BertPlan(const BertShape& s, int layers, uint64_t seed, DTypeOut dt) {
  Plan p;
  const int64_t H = s.hidden, F = s.ffn;
  const double inv_h = 1.0 / std::sqrt(static_cast<double>(H)),
               inv_f = 1.0 / std::sqrt(static_cast<double>(F));
  p.tensors.push_back(Normal(seed, "embeddings.word_embeddings.weight", {s.vocab, H}, 1.0));
  p.tensors.push_back(Normal(seed, "embeddings.position_embeddings.weight", {s.max_pos, H}, 0.5));
  p.tensors.push_back(Normal(seed, "embeddings.token_type_embeddings.weight", {s.type_vocab, H}, 0.5));
  p.tensors.push_back(Normal(seed, "embeddings.LayerNorm.weight", {H}, kNormNoise, 1.0));
  p.tensors.push_back(Normal(seed, "embeddings.LayerNorm.bias", {H}, kBiasStd));
  auto linear = [&](const std::string& name, int64_t out, int64_t in, double scale) {
    p.tensors.push_back(Normal(seed, name + ".weight", {out, in}, scale));
    p.tensors.push_back(Normal(seed, name + ".bias", {out}, kBiasStd));
  };
  auto norm = [&](const std::string& name) {
    p.tensors.push_back(Normal(seed, name + ".weight", {H}, kNormNoise, 1.0));
    p.tensors.push_back(Normal(seed, name + ".bias", {H}, kBiasStd));
  };
  for (int l = 0; l < layers; ++l) {
    const std::string pre = fmt::format("encoder.layer.{}.", l);
    linear(pre + "attention.self.query", H, H, std::sqrt(1.5) * inv_h);
    linear(pre + "attention.self.key", H, H, std::sqrt(1.5) * inv_h);
    linear(pre + "attention.self.value", H, H, inv_h);
    linear(pre + "attention.output.dense", H, H, inv_h);
    norm(pre + "attention.output.LayerNorm");
    linear(pre + "intermediate.dense", F, H, inv_h);
    linear(pre + "output.dense", H, F, 1.5 * inv_f);
    norm(pre + "output.LayerNorm");
  }
  linear("pooler.dense", H, H, inv_h);

  Json c;
  c["architectures"] = Json::array({"BertModel"});
  c["attention_probs_dropout_prob"] = 0.1;
  c["classifier_dropout"] = nullptr;
  c["hidden_act"] = "gelu";
  c["hidden_dropout_prob"] = 0.1;
  c["hidden_size"] = s.hidden;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = s.ffn;
  c["layer_norm_eps"] = 1e-12;
  c["max_position_embeddings"] = s.max_pos;
  c["model_type"] = "bert";
  c["num_attention_heads"] = s.heads;
  c["num_hidden_layers"] = layers;
  c["pad_token_id"] = 0;
  c["position_embedding_type"] = "absolute";
  c["torch_dtype"] = TorchDType(dt);
  c["type_vocab_size"] = s.type_vocab;
  c["use_cache"] = true;
  c["vocab_size"] = s.vocab;
  p.config = std::move(c);

  std::string vocab_txt;
  p.extra_files.emplace_back("tokenizer.json", WordPieceTokenizerJson(s.vocab, seed, &vocab_txt));
  p.extra_files.emplace_back("vocab.txt", std::move(vocab_txt));
  Json tc{{"cls_token", "[CLS]"},     {"do_lower_case", true},          {"mask_token", "[MASK]"},
          {"model_max_length", 512},  {"pad_token", "[PAD]"},           {"sep_token", "[SEP]"},
          {"strip_accents", nullptr}, {"tokenize_chinese_chars", true}, {"tokenizer_class", "BertTokenizer"},
          {"unk_token", "[UNK]"}};
  p.extra_files.emplace_back("tokenizer_config.json", tc.dump(2) + "\n");
  return p;
}

// ---- writing -------------------------------------------------------------------------------------------

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into Plan::tensors
  std::string header;           // 8-byte length + JSON, padded
  int64_t data_bytes = 0;
};

// One unit of work: elements [begin, end) of a tensor, written at `offset` in a shard file.
struct Task {
  size_t shard, tensor;
  int64_t begin, end;
  int64_t offset;
};

void Fill(const TensorPlan& t, int64_t begin, int64_t end, DTypeOut dt, uint8_t* out) {
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  for (int64_t i = begin; i < end; ++i) {
    uint64_t idx = static_cast<uint64_t>(i);
    if (t.permuted_rows) {
      const int64_t r = i / cols, col = i % cols;
      idx = static_cast<uint64_t>(((t.perm_a * r + t.perm_b) % rows) * cols + col);
    }
    const float v = t.offset + t.scale * SynthNormal(t.key, idx);
    const int64_t k = i - begin;
    switch (dt) {
      case DTypeOut::kBF16: {
        const uint16_t h = Fp32ToBf16(v);
        std::memcpy(out + 2 * k, &h, 2);
        break;
      }
      case DTypeOut::kF16: {
        const uint16_t h = Fp32ToFp16(v);
        std::memcpy(out + 2 * k, &h, 2);
        break;
      }
      case DTypeOut::kF32:
        std::memcpy(out + 4 * k, &v, 4);
        break;
    }
  }
}

Status PWriteAll(int fd, const uint8_t* data, size_t n, int64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, offset);
    if (w < 0) {
      if (errno == EINTR) continue;
      return InternalError("{}: write at offset {} failed: {}", path, offset, std::strerror(errno));
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return OkStatus();
}

std::string HumanGB(int64_t b) {
  return fmt::format("{:.2f} GB", b / 1e9);
}

}  // namespace

float SynthNormal(uint64_t key, uint64_t index) {
  const uint64_t x = SplitMix(key ^ SplitMix(index));
  const double s = static_cast<double>(x & 0xffff) + static_cast<double>((x >> 16) & 0xffff) +
                   static_cast<double>((x >> 32) & 0xffff) + static_cast<double>(x >> 48);
  // Irwin-Hall(4) of U{0..65535}: mean 4 * 32767.5, variance 4 * (65536^2 - 1) / 12.
  constexpr double kMean = 4 * 32767.5;
  static const double kInvStd = 1.0 / std::sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0);
  return static_cast<float>((s - kMean) * kInvStd);
}

uint64_t SynthTensorKey(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  return SplitMix(h ^ SplitMix(seed + 0x5851f42d4c957f2dULL));
}

std::vector<std::string> ShapeNames() {
  std::vector<std::string> out;
  for (const auto& l : kLlamaShapes) out.push_back(l.name);
  for (const auto& b : kBertShapes) out.push_back(b.name);
  return out;
}

StatusOr<std::string> ShapeArch(const std::string& shape) {
  if (FindLlama(shape) != nullptr) return std::string("llama");
  if (FindBert(shape) != nullptr) return std::string("bert");
  std::string known;
  for (const auto& n : ShapeNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgumentError("--shape '{}' is not a known shape (known: {})", shape, known);
}

StatusOr<SynthResult> WriteSynthModel(const SynthOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::string arch, ShapeArch(o.shape));
  if (!o.arch.empty() && o.arch != arch) {
    if (o.arch != "llama" && o.arch != "bert")
      return InvalidArgumentError("--arch '{}': expected llama or bert", o.arch);
    return InvalidArgumentError("--arch {} does not match --shape {} (a {} shape)", o.arch, o.shape, arch);
  }
  DTypeOut dt;
  if (o.dtype == "bf16") {
    dt = DTypeOut::kBF16;
  } else if (o.dtype == "f16") {
    dt = DTypeOut::kF16;
  } else if (o.dtype == "f32") {
    dt = DTypeOut::kF32;
  } else {
    return InvalidArgumentError("--dtype '{}': expected bf16, f16 or f32", o.dtype);
  }
  if (o.out_dir.empty()) return InvalidArgumentError("--out is required");
  if (o.layers < 0) return InvalidArgumentError("--layers must be >= 1");
  if (o.max_shard_bytes <= 0) return InvalidArgumentError("max shard size must be > 0");

  Plan plan;
  if (const LlamaShape* l = FindLlama(o.shape)) {
    plan = LlamaPlan(*l, o.layers > 0 ? o.layers : l->layers, o.seed, dt);
  } else {
    const BertShape* b = FindBert(o.shape);
    plan = BertPlan(*b, o.layers > 0 ? o.layers : b->layers, o.seed, dt);
  }
  plan.config["stoke_synth"] = {{"shape", o.shape},
                                {"seed", o.seed},
                                {"dtype", o.dtype},
                                {"scheme", "docs/adding-a-model.md#synthetic-models"}};

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return InternalError("--out {}: cannot create the folder: {}", o.out_dir, ec.message());

  // Shards: tensors in order, a new file when the next tensor would pass max_shard_bytes.
  const int eb = ElemBytes(dt);
  std::vector<Shard> shards(1);
  int64_t total_bytes = 0, params = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const int64_t bytes = plan.tensors[i].numel() * eb;
    if (!shards.back().tensors.empty() && shards.back().data_bytes + bytes > o.max_shard_bytes) {
      shards.emplace_back();
    }
    shards.back().tensors.push_back(i);
    shards.back().data_bytes += bytes;
    total_bytes += bytes;
    params += plan.tensors[i].numel();
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    Shard& sh = shards[s];
    sh.file = shards.size() == 1 ? "model.safetensors"
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    Json h;
    h["__metadata__"] = {{"format", "pt"}};
    int64_t off = 0;
    for (size_t i : sh.tensors) {
      const TensorPlan& t = plan.tensors[i];
      const int64_t bytes = t.numel() * eb;
      h[t.name] = {{"dtype", DTypeTag(dt)}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
      off += bytes;
    }
    std::string js = h.dump();
    while ((8 + js.size()) % 8 != 0) js += ' ';  // data starts 8-byte aligned, as the reference writer does
    const uint64_t n = js.size();
    sh.header.assign(reinterpret_cast<const char*>(&n), 8);  // little-endian host (x86-64 / aarch64)
    sh.header += js;
  }

  // Tasks of at most 8M elements.
  constexpr int64_t kChunk = int64_t{8} << 20;
  std::vector<Task> tasks;
  for (size_t s = 0; s < shards.size(); ++s) {
    int64_t off = static_cast<int64_t>(shards[s].header.size());
    for (size_t i : shards[s].tensors) {
      const int64_t n = plan.tensors[i].numel();
      for (int64_t b = 0; b < n; b += kChunk) {
        const int64_t e = std::min(n, b + kChunk);
        tasks.push_back({s, i, b, e, off + b * eb});
      }
      off += n * eb;
    }
  }

  std::vector<int> fds(shards.size(), -1);
  auto close_all = [&] {
    for (int& fd : fds) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  };
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string path = (fs::path(o.out_dir) / shards[s].file).string();
    fds[s] = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fds[s] < 0) {
      close_all();
      return InternalError("{}: cannot create: {}", path, std::strerror(errno));
    }
    const int64_t size = static_cast<int64_t>(shards[s].header.size()) + shards[s].data_bytes;
    if (::ftruncate(fds[s], size) != 0) {
      close_all();
      return InternalError("{}: cannot size to {} bytes: {}", path, size, std::strerror(errno));
    }
    Status st = PWriteAll(fds[s], reinterpret_cast<const uint8_t*>(shards[s].header.data()),
                          shards[s].header.size(), 0, path);
    if (!st.ok()) {
      close_all();
      return st;
    }
  }

  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> written{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  Status first_error;
  auto worker = [&] {
    std::vector<uint8_t> buf(static_cast<size_t>(kChunk) * eb);
    for (size_t k = next++; k < tasks.size() && !failed; k = next++) {
      const Task& t = tasks[k];
      Fill(plan.tensors[t.tensor], t.begin, t.end, dt, buf.data());
      const size_t n = static_cast<size_t>(t.end - t.begin) * eb;
      Status st = PWriteAll(fds[t.shard], buf.data(), n, t.offset,
                            (fs::path(o.out_dir) / shards[t.shard].file).string());
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (first_error.ok()) first_error = st;
        failed = true;
      }
      written += static_cast<int64_t>(n);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  if (o.progress) {
    const bool tty = ::isatty(STDERR_FILENO);
    int last_decile = -1;
    while (written.load() < total_bytes && !failed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t w = written.load();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double frac = total_bytes > 0 ? static_cast<double>(w) / total_bytes : 1.0;
      if (tty) {
        const int bar = static_cast<int>(frac * 30);
        std::fprintf(stderr, "\rsynth %s [%s%s] %3.0f%% %s / %s  %.2f GB/s ", o.shape.c_str(),
                     std::string(bar, '#').c_str(), std::string(30 - bar, ' ').c_str(), frac * 100,
                     HumanGB(w).c_str(), HumanGB(total_bytes).c_str(), w / 1e9 / std::max(secs, 1e-3));
      } else if (static_cast<int>(frac * 10) > last_decile) {
        last_decile = static_cast<int>(frac * 10);
        std::fprintf(stderr, "synth %s: %3.0f%% of %s (%.1f s)\n", o.shape.c_str(), frac * 100,
                     HumanGB(total_bytes).c_str(), secs);
      }
    }
    if (tty) std::fprintf(stderr, "\n");
  }
  for (auto& th : pool) th.join();
  for (size_t s = 0; s < shards.size() && first_error.ok(); ++s) {
    if (::close(fds[s]) != 0) {
      first_error = InternalError("{}: close failed: {}", shards[s].file, std::strerror(errno));
    }
    fds[s] = -1;
  }
  close_all();
  RETURN_IF_ERROR(first_error);

  SynthResult r;
  for (const auto& sh : shards) r.files.push_back(sh.file);
  if (shards.size() > 1) {
    Json index;
    index["metadata"] = {{"total_size", total_bytes}};
    Json map = Json::object();
    for (const auto& sh : shards) {
      for (size_t i : sh.tensors) map[plan.tensors[i].name] = sh.file;
    }
    index["weight_map"] = std::move(map);
    RETURN_IF_ERROR(WriteStringToFile((fs::path(o.out_dir) / "model.safetensors.index.json").string(),
                                      index.dump(2) + "\n"));
    r.files.push_back("model.safetensors.index.json");
  }
  RETURN_IF_ERROR(
      WriteStringToFile((fs::path(o.out_dir) / "config.json").string(), plan.config.dump(2) + "\n"));
  r.files.push_back("config.json");
  for (const auto& [name, text] : plan.extra_files) {
    RETURN_IF_ERROR(WriteStringToFile((fs::path(o.out_dir) / name).string(), text));
    r.files.push_back(name);
  }
  r.parameters = params;
  r.weight_bytes = total_bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace stoke::synth
