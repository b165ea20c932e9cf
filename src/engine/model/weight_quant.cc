#include "engine/model/weight_quant.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <vector>

#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/quants.h"

namespace stoke {

Status RoundTripFp8Rows(DType dtype, const void* data, int64_t rows, int64_t cols, float scale_multiplier,
                        ThreadPool& pool, float* out) {
  if (rows <= 0 || cols <= 0) return OkStatus();
  ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(dtype, cols));
  const auto* src = static_cast<const uint8_t*>(data);
  std::atomic<bool> failed{false};
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(cols);
    std::vector<uint8_t> q(cols);
    for (int64_t r = r0; r < r1; ++r) {
      if (!cpu::DequantizeRow(dtype, src + r * row_bytes, row.data(), cols).ok()) {
        failed = true;
        return;
      }
      const float scale =
          cpu::QuantizeKvRow(row.data(), static_cast<int>(cols), KvCacheDtype::kFp8, q.data());
      cpu::DequantizeKvRow(q.data(), static_cast<int>(cols), scale * scale_multiplier, KvCacheDtype::kFp8,
                           out + r * cols);
    }
  });
  if (failed) {
    return InvalidArgumentError("--quantization fp8: cannot widen a [{}, {}] {} matrix to fp32", rows, cols,
                                GetDTypeInfo(dtype).name);
  }
  return OkStatus();
}

namespace {

// W' = the fp8 round trip of `in`, row by row, into a new F32 buffer `owner` keeps.
StatusOr<LinearWeight> RoundTripFp8(const LinearWeight& in, const Fp8WeightOptions& o, ThreadPool& pool,
                                    LlamaWeights* owner) {
  if (in.empty() || in.rows <= 0 || in.cols <= 0) return in;  // an absent matrix (q/k/v when fused)
  const int64_t rows = in.rows, cols = in.cols;
  auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(rows * cols) * sizeof(float));
  RETURN_IF_ERROR(RoundTripFp8Rows(in.dtype, in.data, rows, cols, o.testing_scale_multiplier, pool,
                                   reinterpret_cast<float*>(buf.get())));
  LinearWeight w{buf.get(), DType::kF32, rows, cols};
  owner->owned.push_back(std::move(buf));
  return w;
}

// The projection matrices of `w` (absent ones included: RoundTripFp8 passes them through).
std::vector<LinearWeight*> Projections(LlamaWeights* w, bool lm_head) {
  std::vector<LinearWeight*> all;
  if (lm_head) all.push_back(&w->lm_head);
  for (LlamaLayerWeights& l : w->layers) {
    for (LinearWeight* m : {&l.qkv, &l.q, &l.k, &l.v, &l.o, &l.gate_up, &l.gate, &l.up, &l.down})
      all.push_back(m);
  }
  return all;
}

// Drops the owned buffers no matrix points at any more (a fused qkv / gate_up the loader built, replaced).
// Every owned buffer holds one whole matrix from its first byte (ConcatRows, RoundTripFp8).
void FreeUnused(LlamaWeights* w) {
  std::set<const void*> used = {w->embedding.data, w->lm_head.data};
  for (LinearWeight* m : Projections(w, /*lm_head=*/false)) used.insert(m->data);
  std::erase_if(w->owned, [&](const std::unique_ptr<uint8_t[]>& b) { return !used.contains(b.get()); });
}

}  // namespace

Status QuantizeLlamaWeightsFp8(LlamaWeights* w, const Fp8WeightOptions& options) {
  if (w->quantization != WeightQuantization::kNone) {
    return FailedPreconditionError("--quantization fp8: the weights are already quantised ({})",
                                   WeightQuantizationName(w->quantization));
  }
  ThreadPool& pool = options.pool != nullptr ? *options.pool : ThreadPool::Default();
  for (LinearWeight* m : Projections(w, options.quantize_lm_head)) {
    ASSIGN_OR_RETURN(*m, RoundTripFp8(*m, options, pool, w));
  }
  FreeUnused(w);
  w->quantization = WeightQuantization::kFp8;
  return OkStatus();
}

}  // namespace stoke
