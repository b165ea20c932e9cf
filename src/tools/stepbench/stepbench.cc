#include "tools/stepbench/stepbench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <thread>

#include "base/clock.h"
#include "engine/loader/model_registry.h"
#include "engine/model/backends.h"
#include "engine/model/step_costs.h"

#ifndef STOKE_BUILD_DESCRIBE
#define STOKE_BUILD_DESCRIBE "unknown"
#endif

namespace stoke::stepbench {
namespace {

using Json = nlohmann::ordered_json;

void Log(std::FILE* f, const std::string& s) {
  if (f == nullptr) return;
  std::fputs(s.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

Json Stats(const std::vector<double>& ms) {
  double sum = 0;
  for (double v : ms) sum += v;
  return Json{{"median", Percentile(ms, 50)},
              {"p10", Percentile(ms, 10)},
              {"p90", Percentile(ms, 90)},
              {"mean", ms.empty() ? 0.0 : sum / ms.size()},
              {"min", ms.empty() ? 0.0 : *std::min_element(ms.begin(), ms.end())},
              {"n", ms.size()}};
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf.data();
}

// Deterministic token ids in [lo, hi).
std::vector<int32_t> Tokens(int n, int32_t lo, int32_t hi, uint64_t seed) {
  std::vector<int32_t> out(n);
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out[i] = lo + static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(hi - lo));
  }
  return out;
}

std::vector<int32_t> Blocks(int first, int count) {
  std::vector<int32_t> t(count);
  for (int i = 0; i < count; ++i) t[i] = first + i;
  return t;
}

}  // namespace

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

std::string CommitString() {
  // What the binary was built from (configure-time `git describe`; bundle.sh reconfigures each time) is what
  // was measured. The working directory's describe is only a fallback: on a GPU host running a bundle it names
  // whatever checkout the command happens to run in.
  const std::string built = STOKE_BUILD_DESCRIBE;
  if (!built.empty() && built != "unknown") return built;
  std::string out;
  if (std::FILE* p = ::popen("git describe --always --dirty 2>/dev/null", "r")) {
    std::array<char, 256> buf{};
    while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
    if (::pclose(p) != 0) out.clear();
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out + " (working directory; build not stamped)";
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(' ', c + 1));
    }
  }
  return "";
}

StatusOr<Json> RunStepBench(const StepBenchOptions& o, const Backends& backends, std::FILE* progress) {
  if (o.decode_batch < 0 || o.context < 1 || o.prefill < 0 || o.mixed < 0 || o.iters < 1 || o.warmup < 0 ||
      o.chunk < 1 || o.block_size < 1) {
    return InvalidArgumentError(
        "bench step: --decode-batch, --prefill and --mixed must be >= 0, --context, --iters and --chunk >= "
        "1");
  }
  ASSIGN_OR_RETURN(std::string path, ResolveModel(o.model));
  Log(progress, fmt::format("bench step: loading {} on {}", path, o.decoder.device));
  const Nanos load_start = MonotonicNanos();
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model, LoadDecoder(path, o.decoder, backends));
  const double load_s = (MonotonicNanos() - load_start) / 1e9;
  const LlamaConfig& c = model->config();
  const std::string device = model->device_name();
  const bool cuda = device.rfind("cuda", 0) == 0;
  Log(progress, fmt::format("bench step: loaded in {:.1f} s on {}", load_s, device));

  // Parameters and bytes read per step (engine/model/step_costs.h).
  const int64_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, L = c.num_layers;
  ASSIGN_OR_RETURN(const DecoderStepCosts costs, ComputeDecoderStepCosts(*model, path));
  const int64_t matmul_params = costs.matmul_params, lm_head_params = costs.lm_head_params;
  const double bytes_per_param = costs.bytes_per_param;
  const double weight_bytes = costs.weight_bytes;
  const int64_t kv_per_token = model->KvBytesPerToken();

  // KV: decode sequences side by side, the prefill reuses blocks from 0 afterwards.
  const int bs = o.block_size;
  const int decode_steps = o.warmup + o.iters;
  const bool mixed = o.mixed > 0 && o.decode_batch > 0;  // a second run of decode steps, each with a prompt
  const int blocks_per_seq = (o.context + decode_steps * (mixed ? 2 : 1) + bs) / bs;
  const int decode_blocks = o.decode_batch * blocks_per_seq;
  const int prefill_blocks = (o.prefill + bs - 1) / bs;
  const int mixed_blocks = mixed ? (o.mixed + bs - 1) / bs : 0;  // after the decodes' blocks
  const int num_blocks = std::max({decode_blocks + mixed_blocks, prefill_blocks, 1});
  const int64_t kv_bytes = int64_t{num_blocks} * bs * kv_per_token;
  if (model->KvBudgetBytes() > 0 && kv_bytes > model->KvBudgetBytes()) {
    return ResourceExhaustedError(
        "bench step: the KV cache for {} sequences x {} tokens (or a {}-token prefill) needs {:.2f} GiB, "
        "more than the {:.2f} GiB the device has left (lower --decode-batch/--context/--prefill or raise "
        "--gpu-memory-fraction)",
        o.decode_batch, o.context + decode_steps, o.prefill, kv_bytes / 1073741824.0,
        model->KvBudgetBytes() / 1073741824.0);
  }
  RETURN_IF_ERROR(model->AllocateKvCache(num_blocks, bs));
  const int32_t tok_lo = std::min<int32_t>(256, V / 4), tok_hi = std::max<int32_t>(tok_lo + 1, V - 512);

  Json report;
  report["command"] = o.command;
  report["commit"] = CommitString();
  report["date"] = UtcNow();
  Json machine{{"device", device}, {"cpu", CpuModel()}, {"cpu_threads", std::thread::hardware_concurrency()}};
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) == 0) machine["hostname"] = host.data();
  report["machine"] = machine;
  // The engine knobs this run used (DecoderOptions; flags of the same names, docs/api.md "Engine knobs").
  const CudaDecoderTuning& t = o.decoder.cuda;
  Json engine{{"cuda_graphs", o.decoder.cuda_graphs},
              {"device_sampling", o.device_sampling},
              {"ggml_numerics", o.decoder.ggml_compatible_numerics},
              {"gemv_max_rows", t.gemv_max_rows},
              {"fp8_gemv_max_rows", t.fp8_gemv_max_rows},
              {"gemv_split", t.gemv_split},
              {"pdl", t.pdl},
              {"decode_min_partition", t.decode_min_partition},
              {"decode_partition", t.decode_partition},
              {"decode_pipeline", t.decode_pipeline},
              {"decode_attention", t.decode_attention},
              {"decode_stages", t.decode_stages},
              {"prefill_attention", t.prefill_attention},
              {"mixed_attention", t.mixed_attention},
              {"kquant_gemv", t.kquant_gemv},
              {"vector_elementwise", t.vector_elementwise},
              {"kv_cache_dtype", model->kv_cache_dtype_name()},
              {"quantization", model->quantization_name()},
              // The knobs from cuda_graphs to vector_elementwise are recorded as given; only a CUDA model
              // reads them (the CPU engine runs the same either way).
              {"cuda_knobs_apply", cuda}};
  report["engine"] = engine;
  report["model"] = {{"path", path},
                     {"layers", L},
                     {"hidden", H},
                     {"heads", c.num_heads},
                     {"kv_heads", c.num_kv_heads},
                     {"head_dim", c.head_dim},
                     {"ffn", F},
                     {"vocab", V},
                     {"parameters_matmul", matmul_params},
                     {"parameters_lm_head", lm_head_params},
                     {"bytes_per_param", bytes_per_param},
                     {"kv_bytes_per_token", kv_per_token},
                     {"load_seconds", load_s}};
  // What a server's KV cache holds at this precision: the budget the device leaves after weights and scratch
  // (cuda, --gpu-memory-fraction; 0 on the CPU, where --kv-cache-bytes sets it) in blocks of --block-size.
  const int64_t kv_budget = model->KvBudgetBytes();
  const int64_t kv_capacity_blocks = kv_per_token > 0 ? kv_budget / (kv_per_token * bs) : 0;
  report["kv_cache"] = {{"dtype", model->kv_cache_dtype_name()},
                        {"bytes_per_token", kv_per_token},
                        {"budget_bytes", kv_budget},
                        {"block_size", bs},
                        {"capacity_blocks", kv_capacity_blocks},
                        {"capacity_tokens", kv_capacity_blocks * bs}};
  Log(progress, fmt::format("bench step: KV {} at {} bytes/token: {} blocks of {} in {:.2f} GiB",
                            model->kv_cache_dtype_name(), kv_per_token, kv_capacity_blocks, bs,
                            kv_budget / 1073741824.0));

  StepInput in;
  StepOutput out;
  // ---- decode --------------------------------------------------------------------------------------------
  if (o.decode_batch > 0) {
    Log(progress, fmt::format("bench step: filling KV: {} x {} tokens", o.decode_batch, o.context));
    for (int s = 0; s < o.decode_batch; ++s) {
      const std::vector<int32_t> ids = Tokens(o.context, tok_lo, tok_hi, 1000 + s);
      for (int begin = 0; begin < o.context; begin += o.chunk) {
        const int len = std::min(o.chunk, o.context - begin);
        in.token_ids.assign(ids.begin() + begin, ids.begin() + begin + len);
        in.sequences.assign(1, StepSequence{});
        StepSequence& q = in.sequences[0];
        q.token_begin = 0;
        q.num_tokens = len;
        q.start_pos = begin;
        q.block_table = Blocks(s * blocks_per_seq, blocks_per_seq);
        q.logits = begin + len == o.context ? StepSequence::Logits::kLast : StepSequence::Logits::kNone;
        RETURN_IF_ERROR(model->Step(in, &out));
      }
    }
    Log(progress, fmt::format("bench step: decode: {} warm-up + {} timed steps of {} sequence(s)", o.warmup,
                              o.iters, o.decode_batch));
    std::vector<double> ms;
    const std::vector<int32_t> next = Tokens(decode_steps * o.decode_batch, tok_lo, tok_hi, 7);
    const bool device_draw = o.device_sampling && model->SamplesOnDevice();
    // `in` = the decode batch's step i, every sequence one token at position pos.
    const auto decodes = [&](int i, int pos) {
      in.token_ids.clear();
      in.sequences.clear();
      for (int s = 0; s < o.decode_batch; ++s) {
        in.token_ids.push_back(next[i * o.decode_batch + s]);
        StepSequence q;
        q.token_begin = s;
        q.num_tokens = 1;
        q.start_pos = pos;
        q.block_table = Blocks(s * blocks_per_seq, blocks_per_seq);
        q.logits = device_draw ? StepSequence::Logits::kToken : StepSequence::Logits::kLast;
        in.sequences.push_back(std::move(q));
      }
    };
    for (int i = 0; i < decode_steps; ++i) {
      decodes(i, o.context + i);
      const Nanos t0 = MonotonicNanos();
      RETURN_IF_ERROR(model->Step(in, &out));
      const double dt = (MonotonicNanos() - t0) / 1e6;
      if (out.num_rows + static_cast<int64_t>(out.tokens.size()) != o.decode_batch)
        return InternalError("bench step: decode step returned {} rows and {} tokens for {}", out.num_rows,
                             out.tokens.size(), o.decode_batch);
      if (i >= o.warmup) ms.push_back(dt);
    }
    const double med = Percentile(ms, 50);
    const double ctx_avg = o.context + o.warmup + (o.iters - 1) / 2.0;
    const double kv_read = static_cast<double>(o.decode_batch) * ctx_avg * static_cast<double>(kv_per_token);
    const double bytes = weight_bytes + kv_read;
    Json d{{"batch", o.decode_batch},
           {"context", o.context},
           {"sampling", device_draw ? "device (greedy, token ids to the host)" : "host (logits to the host)"},
           {"mean_context_timed", ctx_avg},
           {"step_ms", Stats(ms)},
           {"tokens_per_s", o.decode_batch / (med / 1e3)},
           {"weight_bytes_per_step", weight_bytes},
           {"kv_bytes_per_step", kv_read},
           {"bytes_per_step", bytes},
           {"achieved_gbps", bytes / (med / 1e3) / 1e9}};
    report["decode"] = d;
    Log(progress, fmt::format("bench step: decode median {:.3f} ms (p10 {:.3f}, p90 {:.3f}), {:.1f} tok/s, "
                              "{:.1f} GB/s",
                              med, Percentile(ms, 10), Percentile(ms, 90), o.decode_batch / (med / 1e3),
                              bytes / (med / 1e3) / 1e9));
    if (mixed) {
      // The same decodes, each step with a fresh o.mixed-token prompt behind them (as the scheduler orders a
      // step): what a prefill chunk costs on top of a decode step (--mixed-attention says how it runs).
      Log(progress,
          fmt::format("bench step: mixed: {} warm-up + {} timed steps of {} decodes + a {}-token prompt",
                      o.warmup, o.iters, o.decode_batch, o.mixed));
      const std::vector<int32_t> prompt = Tokens(o.mixed, tok_lo, tok_hi, 11);
      std::vector<double> mms;
      for (int i = 0; i < decode_steps; ++i) {
        decodes(i, o.context + decode_steps + i);
        StepSequence p;
        p.token_begin = o.decode_batch;
        p.num_tokens = o.mixed;
        p.start_pos = 0;
        p.block_table = Blocks(decode_blocks, mixed_blocks);
        p.logits = device_draw ? StepSequence::Logits::kToken : StepSequence::Logits::kLast;
        in.sequences.push_back(std::move(p));
        in.token_ids.insert(in.token_ids.end(), prompt.begin(), prompt.end());
        const Nanos t0 = MonotonicNanos();
        RETURN_IF_ERROR(model->Step(in, &out));
        if (i >= o.warmup) mms.push_back((MonotonicNanos() - t0) / 1e6);
      }
      const double mmed = Percentile(mms, 50);
      report["mixed"] = {{"batch", o.decode_batch},
                         {"prompt_tokens", o.mixed},
                         {"context", o.context + decode_steps},
                         {"mixed_attention", t.mixed_attention},
                         {"step_ms", Stats(mms)},
                         {"decode_step_ms", med},
                         {"extra_ms_over_decode", mmed - med},
                         {"tokens_per_s", (o.decode_batch + o.mixed) / (mmed / 1e3)}};
      Log(progress, fmt::format("bench step: mixed median {:.3f} ms ({:+.3f} ms over the decode step)", mmed,
                                mmed - med));
    }
  }

  // ---- prefill -------------------------------------------------------------------------------------------
  const int64_t gemm_m = std::min(o.prefill, o.chunk);
  if (o.prefill > 0) {
    const int runs = std::max(3, o.iters / 4);
    Log(progress, fmt::format("bench step: prefill: {} tokens (chunks of {}), 1 warm-up + {} timed runs",
                              o.prefill, o.chunk, runs));
    const std::vector<int32_t> ids = Tokens(o.prefill, tok_lo, tok_hi, 99);
    std::vector<double> ms;
    for (int r = 0; r < runs + 1; ++r) {
      const Nanos t0 = MonotonicNanos();
      for (int begin = 0; begin < o.prefill; begin += o.chunk) {
        const int len = std::min(o.chunk, o.prefill - begin);
        in.token_ids.assign(ids.begin() + begin, ids.begin() + begin + len);
        in.sequences.assign(1, StepSequence{});
        StepSequence& q = in.sequences[0];
        q.num_tokens = len;
        q.start_pos = begin;
        q.block_table = Blocks(0, prefill_blocks);
        q.logits = begin + len == o.prefill ? StepSequence::Logits::kLast : StepSequence::Logits::kNone;
        RETURN_IF_ERROR(model->Step(in, &out));
      }
      const double dt = (MonotonicNanos() - t0) / 1e6;
      if (r > 0) ms.push_back(dt);
    }
    const double med = Percentile(ms, 50);
    const double T = o.prefill;
    const double matmul_flops =
        2.0 * static_cast<double>(matmul_params) * T + 2.0 * static_cast<double>(V * H);
    const double attn_flops = 2.0 * T * T * static_cast<double>(L) * c.num_heads * c.head_dim;
    const double flops = matmul_flops + attn_flops;
    report["prefill"] = {{"tokens", o.prefill},
                         {"chunk", o.chunk},
                         {"ms", Stats(ms)},
                         {"tokens_per_s", T / (med / 1e3)},
                         {"flops", flops},
                         {"matmul_flops", matmul_flops},
                         {"attention_flops", attn_flops},
                         {"achieved_tflops", flops / (med / 1e3) / 1e12},
                         {"largest_gemm", {{"m", gemm_m}, {"n", 2 * F}, {"k", H}}}};
    Log(progress, fmt::format("bench step: prefill median {:.2f} ms, {:.0f} tok/s, {:.2f} TFLOP/s", med,
                              T / (med / 1e3), flops / (med / 1e3) / 1e12));
  }

  // ---- the device's own limits (CUDA) --------------------------------------------------------------------
  if (cuda) {
    RooflineProbe probe = o.roofline;
    if (probe == nullptr) {
      report["device_roofline"] = {{"error", "this build has no CUDA roofline probe"}};
    } else {
      Log(progress, "bench step: measuring the device: D2D copy bandwidth and bf16 GEMM rates");
      std::vector<GemmShape> shapes = {{"square_8192", 8192, 8192, 8192}};
      if (o.prefill > 0) shapes.push_back({"prefill_gate_up", gemm_m, 2 * F, H});
      StatusOr<DeviceRoofline> r = probe(o.decoder.gpu_index, shapes, o.decoder.cuda.gemm_cache_path);
      if (!r.ok()) {
        report["device_roofline"] = {{"error", r.status().ToString()}};
        Log(progress, "bench step: device probe failed: " + r.status().ToString());
      } else {
        Json g = Json::array();
        for (const GemmRate& gr : r->gemms) {
          g.push_back({{"shape", gr.shape.name},
                       {"m", gr.shape.m},
                       {"n", gr.shape.n},
                       {"k", gr.shape.k},
                       {"ms", gr.ms},
                       {"tflops", gr.tflops}});
        }
        report["machine"]["gpu"] = r->device;
        report["device_roofline"] = {{"d2d_copy_bytes", r->copy_bytes},
                                     {"d2d_copy_ms", r->copy_ms},
                                     {"d2d_gbps_read_plus_write", r->d2d_gbps},
                                     {"gemm_bf16", g}};
        if (report.contains("decode") && r->d2d_gbps > 0) {
          report["decode"]["hbm_roofline_fraction"] =
              report["decode"]["achieved_gbps"].get<double>() / r->d2d_gbps;
        }
        if (report.contains("prefill")) {
          for (const GemmRate& gr : r->gemms) {
            if (gr.tflops <= 0) continue;
            const std::string key = gr.shape.name == "square_8192" ? "gemm_square_fraction" : "gemm_fraction";
            report["prefill"][key] = report["prefill"]["achieved_tflops"].get<double>() / gr.tflops;
          }
        }
        Log(progress, fmt::format("bench step: D2D {:.0f} GB/s (r+w); GEMM {}", r->d2d_gbps, g.dump()));
      }
    }
  }
  return report;
}

}  // namespace stoke::stepbench
