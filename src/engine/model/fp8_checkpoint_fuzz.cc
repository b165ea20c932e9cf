// libFuzzer target: a safetensors file as a pre-quantised FP8 checkpoint. Every F8_E4M3 matrix that has a
// weight_scale(_inv) beside it goes through DequantizeFp8Weight, which must accept or refuse it without
// crashing or reading outside the tensors; an accepted one must give finite values. The input is taken as
// safetensors_fuzz takes it ('{...' = header JSON then data, with the length prefix written for it); the block
// size of per-block scales comes from the input's length, so every size gets tried.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "engine/loader/safetensors_fuzz_input.h"
#include "engine/loader/safetensors_reader.h"
#include "engine/model/fp8_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static stoke::ThreadPool pool(1);
  std::vector<uint8_t> buf = stoke::SafetensorsFuzzFile(data, size);
  auto f = stoke::SafetensorsFile::FromBuffer(buf.data(), buf.size(), "fuzz.safetensors");
  if (!f.ok()) return 0;
  stoke::Fp8CheckpointFormat format;
  format.block_rows = 1 + static_cast<int64_t>(size % 37);
  format.block_cols = 1 + static_cast<int64_t>((size / 37) % 41);
  for (const stoke::TensorRef& t : (*f)->tensors()) {
    if (t.dtype != stoke::DType::kF8E4M3 || t.shape.size() != 2 || t.numel() > (1 << 20)) continue;
    const std::string scale = stoke::Fp8ScaleName(t.name, [&](const std::string& n) {
      return (*f)->FindTensor(n) != nullptr;
    });
    if (scale.empty()) continue;
    std::vector<float> out(static_cast<size_t>(t.numel()));
    auto layout = stoke::DequantizeFp8Weight(t, *(*f)->FindTensor(scale), format, pool, out.data());
    if (!layout.ok()) continue;
    for (float v : out) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  return 0;
}
