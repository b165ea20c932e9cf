// stoke embed: sentence embeddings from a BERT-family HF folder (all-MiniLM-L6-v2 ...) on the CPU.
//
//   stoke embed --model all-minilm-l6-v2 "first text" "second text"
//   stoke embed --model /path/to/hf_folder --file texts.txt          (one text per line)
//
// stdout: ONE JSON array with one array of `hidden` floats per text, in input order, each float printed in
// its shortest round-trip form. --bench-repeat N re-embeds the inputs N times after one untimed warm-up pass
// and writes one JSON timing line to stderr (used by bench/cpu_minilm.py); tokenisation is inside the timing.
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/stoke/command.h"
#include "base/file_util.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/model_registry.h"
#include "engine/model/bert.h"
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
};

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
Status EmbedAll(const BertEncoder& enc, const Tokenizer& tok, const std::vector<std::string>& texts,
                int batch_size, std::vector<float>* out, int64_t* tokens) {
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
    RETURN_IF_ERROR(enc.Embed(ids, &part));
    std::copy(part.begin(), part.end(), out->begin() + b * h);
  }
  return OkStatus();
}

// User + system CPU seconds of this process so far: with `threads` threads, cpu / wall well below `threads`
// means other processes took the cores during a timing.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int Run(const EmbedOptions& o) {
  auto fail = [](const Status& st) {
    fmt::print(stderr, "stoke embed: {}\n", st.ToString());
    return 1;
  };
  if (o.batch_size < 1) return fail(InvalidArgumentError("--batch-size must be >= 1"));
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  std::vector<std::string> texts;
  if (!o.file.empty()) {
    auto lines = ReadLines(o.file);
    if (!lines.ok()) return fail(lines.status());
    texts = std::move(lines).value();
  }
  texts.insert(texts.end(), o.texts.begin(), o.texts.end());
  if (texts.empty()) return fail(InvalidArgumentError("no input: give TEXT arguments or --file"));

  auto path = ResolveModel(o.model);
  if (!path.ok()) return fail(path.status());
  auto format = DetectModelFormat(*path);
  if (!format.ok()) return fail(format.status());
  if (*format != ModelFormat::kHfFolder) {
    return fail(InvalidArgumentError("{} is not an HF folder; embed needs a BERT-family model", *path));
  }
  auto enc = BertEncoder::Load(*path);
  if (!enc.ok()) return fail(enc.status());
  if (o.max_seq_length > 0) (*enc)->set_max_seq_length(o.max_seq_length);
  auto tok = LoadTokenizer(*path);
  if (!tok.ok()) return fail(tok.status());

  std::vector<float> emb;
  int64_t tokens = 0;
  const int repeats = std::max(1, o.bench_repeat);
  if (o.bench_repeat > 0) {  // one untimed pass: page in the mapped weights, size the allocator
    if (Status st = EmbedAll(**enc, **tok, texts, o.batch_size, &emb, &tokens); !st.ok()) return fail(st);
  }
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) {
    if (Status st = EmbedAll(**enc, **tok, texts, o.batch_size, &emb, &tokens); !st.ok()) return fail(st);
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

  const int64_t h = (*enc)->hidden_size();
  std::string json;
  json.reserve(emb.size() * 14 + texts.size() * 4);
  json += '[';
  for (size_t i = 0; i < texts.size(); ++i) {
    json += i ? ",\n[" : "[";
    for (int64_t j = 0; j < h; ++j) {
      if (j) json += ',';
      fmt::format_to(std::back_inserter(json), "{}", emb[i * h + j]);
    }
    json += ']';
  }
  json += "]\n";
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
      return [o]() { return Run(*o); };
    });

}  // namespace
}  // namespace stoke
