// stoke embed: sentence embeddings from a BERT-family HF folder (all-MiniLM-L6-v2 ...) on the CPU or a GPU.
//
//   stoke embed --model all-minilm-l6-v2 "first text" "second text"
//   stoke embed --model /path/to/hf_folder --file texts.txt          (one text per line)
//
//   stoke embed --model DIR --device cuda --ids-file ids.json             (token ids, no tokenizer)
//   stoke embed --model DIR --device cuda --bench-batch 1,2,4,8 --seq-len 128 --json out.json
//
// stdout: ONE JSON array with one array of `hidden` floats per text, in input order, each float printed in
// its shortest round-trip form. --bench-repeat N re-embeds the inputs N times after one untimed warm-up pass
// and writes one JSON timing line to stderr (used by bench/cpu_minilm.py); tokenisation is inside the timing.
// --device cuda runs the encoder on the GPU (engine/cuda/cuda_bert.h); auto = cuda when a GPU is visible.
// --ids-file FILE: a JSON array of token-id arrays ([CLS] ... [SEP] included) instead of texts.
// --bench-batch LIST: times the encoder alone (no tokenizer) on random ids, --seq-len tokens per sequence, at
// each batch size: warm-up, then batches for --bench-seconds (at least 3); writes JSON (sequences/s, ms per
// batch, and on a GPU the median h2d / compute / d2h event times) to --json or stdout.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "apps/stoke/cli_util.h"
#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/model_registry.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {
namespace {

struct EmbedOptions {
  std::string model;
  std::string file;
  std::vector<std::string> texts;
  int batch_size = 32;
  int max_seq_length = 0;
  int threads = 0;
  int bench_repeat = 0;
  std::string device = "auto";             // as serve: cuda when this build has CUDA and a GPU is visible
  // BertDeviceOptions' knobs, its defaults.
  std::string encoder_attention = BertDeviceOptions{}.attention;
  std::string encoder_epilogues = BertDeviceOptions{}.epilogues;
  std::string encoder_cuda_graphs = BertDeviceOptions{}.cuda_graphs ? "on" : "off";
  std::string quantization = "none";              // none | fp8 | int8: the Linear weights (docs/precision.md)
  precision::Int8CalibrationOptions calibration;  // int8: the activation scales' samples
  std::string ids_file;
  std::vector<int> bench_batch;
  int seq_len = 128;
  std::vector<int> bench_lengths;  // --bench-lengths: per-sequence lengths instead of seq_len (cycled)
  int gemm_candidates = 1;         // BertDeviceOptions::gemm_candidates
  double bench_seconds = 1.0;
  std::string json_out;
};

// One forward pass over a batch of id rows, on the CPU encoder or a device runner.
using EmbedFn =
    std::function<Status(const std::vector<std::vector<int32_t>>&, std::vector<float>*, EmbedTimes*)>;

// One text per line; a trailing newline does not add an empty text, "\r\n" endings are accepted.
StatusOr<std::vector<std::string>> ReadLines(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

// Tokenizes and embeds `texts` in batches of `batch_size`; out = [texts.size(), hidden].
Status EmbedAll(const BertEncoder& enc, const EmbedFn& embed, const Tokenizer& tok,
                const std::vector<std::string>& texts, int batch_size, std::vector<float>* out,
                int64_t* tokens) {
  EncodeOptions eo;
  eo.add_special = true;
  eo.max_length = enc.max_seq_length();
  const int64_t h = enc.hidden_size();
  out->resize(texts.size() * h);
  *tokens = 0;
  std::vector<float> part;
  for (size_t b = 0; b < texts.size(); b += batch_size) {
    const size_t e = std::min(texts.size(), b + batch_size);
    std::vector<std::vector<int32_t>> ids;
    ids.reserve(e - b);
    for (size_t i = b; i < e; ++i) {
      auto r = tok.Encode(texts[i], eo);
      if (!r.ok()) return r.status().WithContext(fmt::format("text {}", i));
      *tokens += static_cast<int64_t>(r->size());
      ids.push_back(std::move(r).value());
    }
    RETURN_IF_ERROR(embed(ids, &part, nullptr));
    std::copy(part.begin(), part.end(), out->begin() + b * h);
  }
  return OkStatus();
}

// --ids-file: [[101, 7592, 102], ...].
StatusOr<std::vector<std::vector<int32_t>>> ReadIdsFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return InvalidArgumentError("{}: expected a JSON array of token-id arrays", path);
  std::vector<std::vector<int32_t>> rows;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_array()) return InvalidArgumentError("{}: element {} is not an array of ids", path, i);
    std::vector<int32_t> r;
    for (const auto& v : j[i]) {
      if (!v.is_number_integer())
        return InvalidArgumentError("{}: element {} holds a non-integer id", path, i);
      r.push_back(v.get<int32_t>());
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --bench-batch: the encoder alone on random ids of exactly seq_len tokens.
StatusOr<nlohmann::json> BenchEncoder(const BertEncoder& enc, const EmbedFn& embed, const EmbedOptions& o) {
  const BertConfig& c = enc.config();
  if (o.bench_lengths.empty() && (o.seq_len < 2 || o.seq_len > enc.max_seq_length())) {
    return InvalidArgumentError("--seq-len {} is outside [2, {}] (the model's max_seq_length)", o.seq_len,
                                enc.max_seq_length());
  }
  for (int len : o.bench_lengths) {
    if (len < 2 || len > enc.max_seq_length()) {
      return InvalidArgumentError("--bench-lengths: {} is outside [2, {}] (the model's max_seq_length)", len,
                                  enc.max_seq_length());
    }
  }
  std::mt19937 rng(1);
  const int lo = std::min(1000, c.vocab_size / 2);
  std::uniform_int_distribution<int32_t> id(lo, c.vocab_size - 1);
  nlohmann::json results = nlohmann::json::array();
  for (int b : o.bench_batch) {
    if (b < 1) return InvalidArgumentError("--bench-batch: batch size {} must be >= 1", b);
    // Every sequence seq_len long, or (--bench-lengths) the given lengths in turn: a packed variable-length
    // batch (no padding: each sequence costs its own tokens).
    std::vector<std::vector<int32_t>> batch(b);
    int64_t tokens = 0;
    for (int i = 0; i < b; ++i) {
      const int len = o.bench_lengths.empty() ? o.seq_len : o.bench_lengths[i % o.bench_lengths.size()];
      batch[i].resize(len);
      for (int32_t& x : batch[i]) x = id(rng);
      tokens += len;
    }
    std::vector<float> out;
    for (int w = 0; w < 2; ++w) RETURN_IF_ERROR(embed(batch, &out, nullptr));  // scratch sized, GEMMs chosen
    std::vector<double> h2d, compute, d2h;
    int iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double secs = 0;
    while (iters < 3 || (secs < o.bench_seconds && iters < 10000)) {
      EmbedTimes t;
      RETURN_IF_ERROR(embed(batch, &out, &t));
      h2d.push_back(t.h2d_ns / 1e6);
      compute.push_back(t.compute_ns / 1e6);
      d2h.push_back(t.d2h_ns / 1e6);
      ++iters;
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    nlohmann::json r = {{"batch", b},
                        {"iters", iters},
                        {"ms_per_batch", secs * 1e3 / iters},
                        {"seqs_per_s", b * iters / secs},
                        {"tokens", tokens},
                        {"tokens_per_s", double(tokens) * iters / secs},
                        {"h2d_ms_median", Median(h2d)},
                        {"compute_ms_median", Median(compute)},
                        {"d2h_ms_median", Median(d2h)}};
    fmt::print(
        stderr, "stoke embed: batch {:4d} x {} tokens: {:9.1f} seq/s, {:8.3f} ms/batch (compute {:.3f} ms)\n",
        b,
        o.bench_lengths.empty() ? fmt::format("{}", o.seq_len)
                                : fmt::format("{:.1f} (mean)", double(tokens) / b),
        r["seqs_per_s"].get<double>(), r["ms_per_batch"].get<double>(), r["compute_ms_median"].get<double>());
    results.push_back(std::move(r));
  }
  return results;
}

std::string EmbeddingsJson(const std::vector<float>& emb, size_t n, int64_t h) {
  std::string json;
  json.reserve(emb.size() * 14 + n * 4);
  json += '[';
  for (size_t i = 0; i < n; ++i) {
    json += i ? ",\n[" : "[";
    for (int64_t j = 0; j < h; ++j) {
      if (j) json += ',';
      fmt::format_to(std::back_inserter(json), "{}", emb[i * h + j]);
    }
    json += ']';
  }
  json += "]\n";
  return json;
}

// User + system CPU seconds of this process so far: with `threads` threads, cpu / wall well below `threads`
// means other processes took the cores during a timing.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int Run(const EmbedOptions& o, const Backends& backends) {
  auto fail = [](const Status& st) {
    fmt::print(stderr, "stoke embed: {}\n", st.ToString());
    return 1;
  };
  if (o.batch_size < 1) return fail(InvalidArgumentError("--batch-size must be >= 1"));
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  const bool bench = !o.bench_batch.empty();
  const bool ids_mode = !o.ids_file.empty();
  std::vector<std::string> texts;
  if (!o.file.empty()) {
    auto lines = ReadLines(o.file);
    if (!lines.ok()) return fail(lines.status());
    texts = std::move(lines).value();
  }
  texts.insert(texts.end(), o.texts.begin(), o.texts.end());
  if (texts.empty() && !bench && !ids_mode) {
    return fail(InvalidArgumentError("no input: give TEXT arguments, --file, --ids-file or --bench-batch"));
  }

  auto path = ResolveModel(o.model);
  if (!path.ok()) return fail(path.status());
  auto format = DetectModelFormat(*path);
  if (!format.ok()) return fail(format.status());
  if (*format != ModelFormat::kHfFolder) {
    return fail(InvalidArgumentError("{} is not an HF folder; embed needs a BERT-family model", *path));
  }
  auto loaded = BertEncoder::Load(*path);
  if (!loaded.ok()) return fail(loaded.status());
  if (o.max_seq_length > 0) (*loaded)->set_max_seq_length(o.max_seq_length);
  BertDeviceOptions dev_opts;
  dev_opts.device = o.device;
  dev_opts.attention = o.encoder_attention;
  dev_opts.epilogues = o.encoder_epilogues;
  dev_opts.cuda_graphs = o.encoder_cuda_graphs == "on";
  dev_opts.gemm_candidates = o.gemm_candidates;
  auto quant = ParseWeightQuantization(o.quantization);
  if (!quant.ok()) return fail(quant.status());
  dev_opts.quantization = *quant;
  // --quantization fp8: on the CPU the encoder's own weights are rounded here (no consistency gate: that is
  // `stoke model check`); a device quantises its copies of the fp32 weights.
  if (*quant == WeightQuantization::kFp8 && ResolveBertDevice(o.device, backends) == "cpu") {
    if (Status st = (*loaded)->QuantizeWeightsFp8(); !st.ok()) return fail(st);
  }
  // --quantization int8: the activation scales from --calibration-data (refused without), then the CPU's
  // int8 weights (a device makes the same ones from the ranges: BertDeviceOptions::int8_ranges).
  if (!o.calibration.data.empty() && *quant != WeightQuantization::kInt8) {
    return fail(
        InvalidArgumentError("--calibration-data applies to --quantization int8 (not {})", o.quantization));
  }
  if (*quant == WeightQuantization::kInt8) {
    auto calib_tok = LoadTokenizer(*path);
    if (!calib_tok.ok()) return fail(calib_tok.status());
    if (Status st = precision::CalibrateForInt8(**loaded, **calib_tok, o.calibration, &dev_opts); !st.ok())
      return fail(st);
    if (ResolveBertDevice(o.device, backends) == "cpu") {
      if (Status st = (*loaded)->QuantizeWeightsInt8(*dev_opts.int8_ranges); !st.ok()) return fail(st);
    }
  }
  std::shared_ptr<const BertEncoder> enc = std::move(loaded).value();
  if (bench) {
    const int max_b = *std::max_element(o.bench_batch.begin(), o.bench_batch.end());
    int longest = o.seq_len;
    for (int len : o.bench_lengths) longest = std::max(longest, len);
    dev_opts.max_batch_tokens = std::max<int64_t>(dev_opts.max_batch_tokens, int64_t{max_b} * longest);
  } else {
    dev_opts.max_batch_tokens =
        std::max<int64_t>(dev_opts.max_batch_tokens, int64_t{o.batch_size} * enc->max_seq_length());
  }
  auto device = LoadBertOnDevice(enc, dev_opts, backends);
  if (!device.ok()) return fail(device.status());
  std::unique_ptr<BertRunner> runner;
  if (*device) {
    auto r = (*device)->CreateRunner();
    if (!r.ok()) return fail(r.status());
    runner = std::move(r).value();
  }
  const EmbedFn embed = [&](const std::vector<std::vector<int32_t>>& ids, std::vector<float>* out,
                            EmbedTimes* times) -> Status {
    if (runner) return runner->Embed(ids, out, times);
    return enc->Embed(ids, out);
  };
  const std::string device_name = *device ? (*device)->device_name() : "cpu";
  const int64_t h = enc->hidden_size();

  if (bench) {
    auto results = BenchEncoder(*enc, embed, o);
    if (!results.ok()) return fail(results.status());
    const BertConfig& c = enc->config();
    nlohmann::json j = {{"model", *path},
                        {"device", device_name},
                        {"quantization", o.quantization},
                        {"seq_len", o.seq_len},
                        {"hidden_size", c.hidden_size},
                        {"layers", c.num_hidden_layers},
                        {"heads", c.num_attention_heads},
                        {"bench_seconds", o.bench_seconds},
                        {"encoder_epilogues", o.encoder_epilogues},
                        {"encoder_cuda_graphs", o.encoder_cuda_graphs},
                        {"graph_launches", runner ? runner->graph_launches() : 0},
                        {"results", *results}};
    const std::string text = j.dump(1) + "\n";
    if (o.json_out.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else if (Status st = WriteStringToFile(o.json_out, text); !st.ok()) {
      return fail(st);
    }
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  if (ids_mode) {
    auto rows = ReadIdsFile(o.ids_file);
    if (!rows.ok()) return fail(rows.status());
    std::vector<float> emb(rows->size() * h), part;
    for (size_t b = 0; b < rows->size(); b += o.batch_size) {
      const size_t e = std::min(rows->size(), b + o.batch_size);
      std::vector<std::vector<int32_t>> batch(rows->begin() + b, rows->begin() + e);
      if (Status st = embed(batch, &part, nullptr); !st.ok()) return fail(st.WithContext(o.ids_file));
      std::copy(part.begin(), part.end(), emb.begin() + b * h);
    }
    const std::string json = EmbeddingsJson(emb, rows->size(), h);
    std::fwrite(json.data(), 1, json.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  }

  auto tok = LoadTokenizer(*path);
  if (!tok.ok()) return fail(tok.status());
  std::vector<float> emb;
  int64_t tokens = 0;
  const int repeats = std::max(1, o.bench_repeat);
  if (o.bench_repeat > 0) {  // one untimed pass: page in the mapped weights, size the allocator
    if (Status st = EmbedAll(*enc, embed, **tok, texts, o.batch_size, &emb, &tokens); !st.ok())
      return fail(st);
  }
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) {
    if (Status st = EmbedAll(*enc, embed, **tok, texts, o.batch_size, &emb, &tokens); !st.ok())
      return fail(st);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_secs = CpuSeconds() - cpu0;
  if (o.bench_repeat > 0) {
    fmt::print(stderr,
               "{{\"texts\": {}, \"tokens\": {}, \"batch_size\": {}, \"repeat\": {}, \"threads\": {}, "
               "\"seconds\": {:.6f}, \"cpu_seconds\": {:.6f}, \"sentences_per_s\": {:.3f}}}\n",
               texts.size(), tokens, o.batch_size, repeats, ThreadPool::Default().num_threads(), secs,
               cpu_secs, static_cast<double>(texts.size()) * repeats / secs);
  }

  const std::string json = EmbeddingsJson(emb, texts.size(), h);
  std::fwrite(json.data(), 1, json.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

CommandRegistrar kEmbed(
    "embed", "Sentence embeddings (mean-pooled, L2-normalised) from a BERT-family model", [](CLI::App* cmd) {
      auto o = std::make_shared<EmbedOptions>();
      cmd->add_option("--model", o->model, "alias (all-minilm-l6-v2) or HF folder")->required();
      cmd->add_option("--file", o->file, "read texts from a file, one per line");
      cmd->add_option("texts", o->texts, "texts to embed (after those of --file)");
      cmd->add_option("--batch-size", o->batch_size, "texts per forward pass")->capture_default_str();
      cmd->add_option("--max-seq-length", o->max_seq_length,
                      "truncate to this many tokens incl. [CLS]/[SEP] (default: the "
                      "model's, 256 for MiniLM)");
      cmd->add_option("--threads", o->threads, "CPU threads (default: all)");
      cmd->add_option("--bench-repeat", o->bench_repeat,
                      "embed the inputs N times and print a timing line on stderr");
      cmd->add_option("--device", o->device, "cpu, cuda or auto (cuda when a GPU is visible)")
          ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
          ->capture_default_str();
      AddEncoderAttentionFlag(cmd, &o->encoder_attention);
      AddEncoderEpiloguesFlag(cmd, &o->encoder_epilogues);
      AddEncoderCudaGraphsFlag(cmd, &o->encoder_cuda_graphs);
      cmd->add_option(
             "--quantization", o->quantization,
             "Linear weights: none (the checkpoint's: bf16 on cuda, fp32 on cpu), fp8 (E4M3, one scale "
             "per output channel) or int8 (cpu; int8 activations too, --int8-activations, smoothing from "
             "--calibration-data); "
             "unchecked here: `stoke model check` gates it; docs/precision.md")
          ->check(CLI::IsMember({"none", "fp8", "int8"}))
          ->capture_default_str();
      AddCalibrationFlags(cmd, &o->calibration);
      cmd->add_option("--ids-file", o->ids_file,
                      "embed token ids from a JSON array of id arrays (incl. [CLS]/[SEP]) instead of texts");
      cmd->add_option("--bench-batch", o->bench_batch,
                      "time the encoder alone at these batch sizes (e.g. 1,2,4,8) on random ids")
          ->delimiter(',');
      cmd->add_option("--seq-len", o->seq_len, "--bench-batch: tokens per sequence")->capture_default_str();
      cmd->add_option(
             "--gemm-candidates", o->gemm_candidates,
             "cuda: cuBLASLt algorithms timed per GEMM shape the first time it is seen (1 = the "
             "heuristic's first, no timing; more finds faster kernels for fixed shapes, as a benchmark's)")
          ->check(CLI::Range(1, 64))
          ->capture_default_str();
      cmd->add_option("--bench-lengths", o->bench_lengths,
                      "--bench-batch: the sequences' lengths, used in turn (e.g. 120,384,57,...), instead of "
                      "--seq-len for all: a packed variable-length batch")
          ->delimiter(',');
      cmd->add_option("--bench-seconds", o->bench_seconds, "--bench-batch: timed seconds per batch size")
          ->capture_default_str();
      cmd->add_option("--json", o->json_out, "--bench-batch: write the results here (default stdout)");
      return [o](const Backends& backends) { return Run(*o, backends); };
    });

}  // namespace
}  // namespace stoke
