// MatMul at SmolLM2-135M shapes (Q4_1 linears, Q8_0 tied output), decode (m = 1) and prefill (m = 128):
// per shape with a hot weight, and per step (30 layers with their own weights + the output head for one row).
// Prints one JSON object on stdout. Build and run (no CMake target; links the kernels library):
//   cmake --build build/<dir> --target stoke_kernels_cpu
//   g++ -std=c++20 -O2 -march=x86-64-v3 -Isrc src/kernels/cpu/matmul_bench.cc
//   build/<dir>/src/kernels/cpu/libstoke_kernels_cpu.a \
//     build/<dir>/src/api/libstoke_api.a build/<dir>/src/base/libstoke_base.a -lopenblas -lfmt -lspdlog -o
//     /tmp/matmul_bench
//   /tmp/matmul_bench [threads]
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "api/dtype.h"
#include "base/thread_pool.h"
#include "kernels/cpu/matmul.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Linear {
  const char* name;
  int64_t k, n;
  stoke::DType t;
};

// One SmolLM2 layer: q, k, v, o, gate, up, down; then the output head. CpuLlama fuses q|k|v and gate|up into
// one matrix each (kFusedLayer).
const Linear kLayer[] = {{"q", 576, 576, stoke::DType::kQ4_1},     {"k", 576, 192, stoke::DType::kQ4_1},
                         {"v", 576, 192, stoke::DType::kQ4_1},     {"o", 576, 576, stoke::DType::kQ4_1},
                         {"gate", 576, 1536, stoke::DType::kQ4_1}, {"up", 576, 1536, stoke::DType::kQ4_1},
                         {"down", 1536, 576, stoke::DType::kQ4_1}};
const Linear kFusedLayer[] = {{"qkv", 576, 960, stoke::DType::kQ4_1},
                              {"o", 576, 576, stoke::DType::kQ4_1},
                              {"gate_up", 576, 3072, stoke::DType::kQ4_1},
                              {"down", 1536, 576, stoke::DType::kQ4_1}};
const Linear kOutput = {"output", 576, 49152, stoke::DType::kQ8_0};
constexpr int kLayers = 30;

std::vector<uint8_t> RandomWeight(const Linear& l, std::mt19937& rng) {
  std::vector<uint8_t> w(stoke::RowBytes(l.t, l.k).value() * l.n);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  const int bb = stoke::GetDTypeInfo(l.t).block_bytes;
  for (size_t off = 0; off < w.size(); off += bb) {  // fp16 scales ~0.01 (0x2000) so values stay finite
    w[off] = 0x00;
    w[off + 1] = 0x20;
  }
  return w;
}

struct Stats {
  double median, min;
};

Stats Summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

// Thread CPU time: on a shared machine it leaves out the time the thread was preempted.
double ThreadCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// Microseconds per call of one shape with a hot weight: wall clock, and with one thread also thread CPU time.
struct ShapeTimes {
  Stats wall, cpu;
};

ShapeTimes TimeShape(const Linear& l, int64_t m, stoke::ThreadPool& pool, std::mt19937& rng) {
  const std::vector<uint8_t> w = RandomWeight(l, rng);
  std::vector<float> x(m * l.k), y(m * l.n);
  std::normal_distribution<float> dist;
  for (float& f : x) f = dist(rng);
  std::vector<double> us, cpu_us;
  const auto start = Clock::now();
  while (us.size() < 5 || (Clock::now() - start < std::chrono::milliseconds(300) && us.size() < 2000)) {
    const auto t0 = Clock::now();
    const double c0 = ThreadCpuUs();
    if (!stoke::cpu::MatMul(x.data(), m, l.k, w.data(), l.t, l.n, y.data(), pool).ok()) std::abort();
    cpu_us.push_back(ThreadCpuUs() - c0);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return {Summarise(us), Summarise(cpu_us)};
}

// Milliseconds for one step's matmuls: every layer with its own weights (so they stream from memory as in
// a real model), then the output head for one row (decode, or the last prompt token of a prefill).
template <size_t N>
ShapeTimes TimeStep(const Linear (&layer)[N], int64_t m, int reps, stoke::ThreadPool& pool,
                    std::mt19937& rng) {
  std::vector<std::vector<uint8_t>> weights;
  for (int l = 0; l < kLayers; ++l) {
    for (const Linear& lin : layer) weights.push_back(RandomWeight(lin, rng));
  }
  const std::vector<uint8_t> out_w = RandomWeight(kOutput, rng);
  std::vector<float> x(m * 1536, 0.5f), y(m * 49152);
  std::vector<double> ms, cpu_ms;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = Clock::now();
    const double c0 = ThreadCpuUs();
    for (int l = 0; l < kLayers; ++l) {
      for (size_t i = 0; i < N; ++i) {
        const Linear& lin = layer[i];
        if (!stoke::cpu::MatMul(x.data(), m, lin.k, weights[l * N + i].data(), lin.t, lin.n, y.data(), pool)
                 .ok()) {
          std::abort();
        }
      }
    }
    if (!stoke::cpu::MatMul(x.data(), 1, kOutput.k, out_w.data(), kOutput.t, kOutput.n, y.data(), pool)
             .ok()) {
      std::abort();
    }
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cpu_ms.push_back((ThreadCpuUs() - c0) / 1e3);
  }
  return {Summarise(ms), Summarise(cpu_ms)};
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  stoke::ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::printf("{\n  \"threads\": %d,\n  \"shapes\": [\n", threads);
  std::vector<Linear> all(std::begin(kLayer), std::end(kLayer));
  all.push_back(kOutput);
  for (int64_t m : {1, 128}) {
    for (size_t i = 0; i < all.size(); ++i) {
      const Linear& l = all[i];
      const ShapeTimes st = TimeShape(l, m, pool, rng);
      const double best = threads == 1 ? st.cpu.min : st.wall.min;  // CPU time is per thread: 1 thread only
      const double gmacs = static_cast<double>(m) * l.k * l.n / best / 1e3;
      const std::string cpu = threads == 1 ? fmt::format("{:.1f}", st.cpu.min) : "null";
      std::printf(
          "    {\"name\": \"%s\", \"dtype\": \"%s\", \"m\": %ld, \"k\": %ld, \"n\": %ld, \"wall_us_median\": "
          "%.1f, \"wall_us_min\": %.1f, \"cpu_us_min\": %s, \"gmac_s\": %.1f}%s\n",
          l.name, std::string(stoke::DTypeName(l.t)).c_str(), m, l.k, l.n, st.wall.median, st.wall.min,
          cpu.c_str(), gmacs, m == 128 && i + 1 == all.size() ? "" : ",");
    }
  }
  std::printf("  ],\n  \"steps\": [\n");
  for (int64_t m : {1, 128}) {
    const int reps = m == 1 ? 30 : 5;
    for (int fused = 0; fused < 2; ++fused) {
      const ShapeTimes st =
          fused ? TimeStep(kFusedLayer, m, reps, pool, rng) : TimeStep(kLayer, m, reps, pool, rng);
      const std::string cpu = threads == 1 ? fmt::format("{:.2f}", st.cpu.min) : "null";
      std::printf(
          "    {\"layout\": \"%s\", \"m\": %ld, \"wall_ms_median\": %.2f, \"wall_ms_min\": %.2f, "
          "\"cpu_ms_min\": %s}%s\n",
          fused ? "fused qkv + gate_up" : "7 linears per layer", m, st.wall.median, st.wall.min, cpu.c_str(),
          m == 128 && fused ? "" : ",");
    }
  }
  std::printf("  ]\n}\n");
  return 0;
}
