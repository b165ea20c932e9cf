// MatMul at SmolLM2-135M shapes (Q4_1 linears, Q8_0 tied output), decode (m = 1) and prefill (m = 128).
// Prints one JSON object on stdout. Build and run (no CMake target; links the kernels library):
//   cmake --build build/<dir> --target stoke_kernels_cpu
//   g++ -std=c++20 -O2 -march=x86-64-v3 -Isrc src/kernels/cpu/matmul_bench.cc
//   build/<dir>/src/kernels/cpu/libstoke_kernels_cpu.a \
//     build/<dir>/src/api/libstoke_api.a build/<dir>/src/base/libstoke_base.a -lopenblas -lfmt -lspdlog -o
//     /tmp/matmul_bench
//   /tmp/matmul_bench [threads]
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

// One SmolLM2 layer: q, k, v, o, gate, up, down; then the output head.
const Linear kLayer[] = {{"q", 576, 576, stoke::DType::kQ4_1},     {"k", 576, 192, stoke::DType::kQ4_1},
                         {"v", 576, 192, stoke::DType::kQ4_1},     {"o", 576, 576, stoke::DType::kQ4_1},
                         {"gate", 576, 1536, stoke::DType::kQ4_1}, {"up", 576, 1536, stoke::DType::kQ4_1},
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds per call of one shape with a hot weight.
double TimeShape(const Linear& l, int64_t m, stoke::ThreadPool& pool, std::mt19937& rng) {
  const std::vector<uint8_t> w = RandomWeight(l, rng);
  std::vector<float> x(m * l.k), y(m * l.n);
  std::normal_distribution<float> dist;
  for (float& f : x) f = dist(rng);
  std::vector<double> us;
  const auto start = Clock::now();
  while (us.size() < 5 || (Clock::now() - start < std::chrono::milliseconds(300) && us.size() < 2000)) {
    const auto t0 = Clock::now();
    if (!stoke::cpu::MatMul(x.data(), m, l.k, w.data(), l.t, l.n, y.data(), pool).ok()) std::abort();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return Median(us);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  stoke::ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::printf("{\n  \"threads\": %d,\n  \"shapes_us\": [\n", threads);
  std::vector<Linear> all(std::begin(kLayer), std::end(kLayer));
  all.push_back(kOutput);
  for (int64_t m : {1, 128}) {
    for (size_t i = 0; i < all.size(); ++i) {
      const Linear& l = all[i];
      const double us = TimeShape(l, m, pool, rng);
      const double gmacs = static_cast<double>(m) * l.k * l.n / us / 1e3;
      std::printf(
          "    {\"name\": \"%s\", \"dtype\": \"%s\", \"m\": %ld, \"k\": %ld, \"n\": %ld, \"us\": %.1f, "
          "\"gmac_s\": %.1f},\n",
          l.name, std::string(stoke::DTypeName(l.t)).c_str(), m, l.k, l.n, us, gmacs);
    }
  }
  // A whole decode token: 30 layers with their own (cold-ish) weights, then the output head.
  std::vector<std::vector<uint8_t>> weights;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (const Linear& l : kLayer) weights.push_back(RandomWeight(l, rng));
  }
  const std::vector<uint8_t> out_w = RandomWeight(kOutput, rng);
  for (int64_t m : {1, 128}) {
    std::vector<float> x(m * 1536, 0.5f), y(m * 49152);
    std::vector<double> ms;
    for (int rep = 0; rep < (m == 1 ? 30 : 5); ++rep) {
      const auto t0 = Clock::now();
      for (int layer = 0; layer < kLayers; ++layer) {
        for (size_t i = 0; i < std::size(kLayer); ++i) {
          const Linear& l = kLayer[i];
          if (!stoke::cpu::MatMul(x.data(), m, l.k, weights[layer * 7 + i].data(), l.t, l.n, y.data(), pool)
                   .ok()) {
            std::abort();
          }
        }
      }
      // Prefill needs logits only for the last token.
      if (!stoke::cpu::MatMul(x.data(), 1, kOutput.k, out_w.data(), kOutput.t, kOutput.n, y.data(), pool)
               .ok()) {
        std::abort();
      }
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::printf("    {\"name\": \"all_matmuls_one_step\", \"m\": %ld, \"ms\": %.2f}%s\n", m, Median(ms),
                m == 1 ? "," : "");
  }
  std::printf("  ]\n}\n");
  return 0;
}
