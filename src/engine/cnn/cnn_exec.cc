// CnnPlan::Run: the steps in order, each on its input and output buffers (kernels/cpu for the heavy ones).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cnn/cnn_plan.h"
#include "kernels/cpu/matmul.h"

namespace stoke::cnn {
namespace {

// [outer, len, inner] <-> [outer, inner, len]
void Transpose3(const float* x, int64_t outer, int64_t a, int64_t b, float* y) {
  for (int64_t o = 0; o < outer; ++o) {
    const float* xo = x + o * a * b;
    float* yo = y + o * a * b;
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) yo[j * a + i] = xo[i * b + j];
  }
}

inline float Apply(char op, float a, float b) {
  switch (op) {
    case '+':
      return a + b;
    case '-':
      return a - b;
    case '*':
      return a * b;
    default:
      return a / b;
  }
}

// out[i...] = a[i . sa] op b[i . sb] over dims; the last dim is the inner loop (op a template argument, so
// the common contiguous case vectorises).
template <char Op>
void BroadcastBinaryOp(const std::vector<int64_t>& dims, const float* a, const std::vector<int64_t>& sa,
                       const float* b, const std::vector<int64_t>& sb, float* out, ThreadPool& pool) {
  const size_t r = dims.size();
  if (r == 0) {
    out[0] = Apply(Op, a[0], b[0]);
    return;
  }
  const int64_t inner = dims[r - 1];
  const int64_t rows = NumElements(dims) / std::max<int64_t>(inner, 1);
  const int64_t ia = sa[r - 1], ib = sb[r - 1];
  pool.ParallelFor(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t row = r0; row < r1; ++row) {
                       int64_t rem = row, oa = 0, ob = 0;
                       for (size_t d = r - 1; d-- > 0;) {
                         const int64_t c = rem % dims[d];
                         rem /= dims[d];
                         oa += c * sa[d];
                         ob += c * sb[d];
                       }
                       float* o = out + row * inner;
                       const float* pa = a + oa;
                       const float* pb = b + ob;
                       if (ia == 1 && ib == 1) {
                         for (int64_t k = 0; k < inner; ++k) o[k] = Apply(Op, pa[k], pb[k]);
                       } else if (ia == 1 && ib == 0) {
                         const float y = pb[0];
                         for (int64_t k = 0; k < inner; ++k) o[k] = Apply(Op, pa[k], y);
                       } else {
                         for (int64_t k = 0; k < inner; ++k) o[k] = Apply(Op, pa[k * ia], pb[k * ib]);
                       }
                     }
                   });
}

void BroadcastBinary(char op, const std::vector<int64_t>& dims, const float* a,
                     const std::vector<int64_t>& sa, const float* b, const std::vector<int64_t>& sb,
                     float* out, ThreadPool& pool) {
  switch (op) {
    case '+':
      return BroadcastBinaryOp<'+'>(dims, a, sa, b, sb, out, pool);
    case '-':
      return BroadcastBinaryOp<'-'>(dims, a, sa, b, sb, out, pool);
    case '*':
      return BroadcastBinaryOp<'*'>(dims, a, sa, b, sb, out, pool);
    default:
      return BroadcastBinaryOp<'/'>(dims, a, sa, b, sb, out, pool);
  }
}

void Softmax(const float* x, int64_t outer, int64_t len, int64_t inner, float* y) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const float* xo = x + o * len * inner + i;
      float* yo = y + o * len * inner + i;
      float m = -INFINITY;
      for (int64_t k = 0; k < len; ++k) m = std::max(m, xo[k * inner]);
      double sum = 0;
      for (int64_t k = 0; k < len; ++k) {
        yo[k * inner] = std::exp(xo[k * inner] - m);
        sum += yo[k * inner];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t k = 0; k < len; ++k) yo[k * inner] *= inv;
    }
  }
}

}  // namespace

const float* CnnPlan::Data(int v, const std::vector<std::vector<float>>& bufs, const float* x) const {
  const RtValue& val = values_[v];
  if (val.konst != nullptr) return val.konst;
  const int root = val.root;
  if (root == input_) return x;
  return bufs[buffer_of_[root]].data();
}

Status CnnPlan::RunStep(const Step& s, const std::vector<const float*>& in, float* out, CnnWorkspace* ws,
                        ThreadPool& pool) const {
  switch (s.kind) {
    case StepKind::kConv: {
      const ConvParams& c = s.node->conv;
      return cpu::Conv2dNhwc(in[0], s.conv, c.weights.data(), c.bias.empty() ? nullptr : c.bias.data(),
                             s.node->act, out, pool);
    }
    case StepKind::kPool:
      cpu::Pool2dNhwc(s.pool_kind, in[0], s.pool, out, pool);
      return OkStatus();
    case StepKind::kGlobalAveragePool: {
      const std::vector<int64_t>& d = values_[s.in[0]].dims;
      cpu::GlobalAveragePoolNhwc(in[0], d[0], d[2] * d[3], d[1], out);
      return OkStatus();
    }
    case StepKind::kBinary:
      BroadcastBinary(s.op, s.bdims, in[0], s.bstride[0], in[1], s.bstride[1], out, pool);
      return OkStatus();
    case StepKind::kActivation: {
      const int64_t n = NumElements(values_[s.out].dims);
      std::memcpy(out, in[0], static_cast<size_t>(n) * sizeof(float));
      cpu::BiasActivation(nullptr, s.node->act, out, 1, n, pool);
      return OkStatus();
    }
    case StepKind::kChannelAffine: {
      const std::vector<float>& a = s.node->scale;
      const std::vector<float>& b = s.node->shift;
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t c = 0; c < s.len; ++c)
          for (int64_t i = 0; i < s.inner; ++i) {
            const int64_t k = (o * s.len + c) * s.inner + i;
            out[k] = in[0][k] * a[c] + b[c];
          }
      return OkStatus();
    }
    case StepKind::kGemm: {
      const GemmParams& g = s.node->gemm;
      RETURN_IF_ERROR(cpu::MatMul(in[0], s.outer, g.k, g.weights.data(), DType::kF32, g.n, out, pool));
      cpu::BiasActivation(g.bias.empty() ? nullptr : g.bias.data(), s.node->act, out, s.outer, g.n, pool);
      return OkStatus();
    }
    case StepKind::kSoftmax:
      Softmax(in[0], s.outer, s.len, s.inner, out);
      return OkStatus();
    case StepKind::kConcat: {
      int64_t width = 0;
      for (int64_t p : s.parts) width += p;
      int64_t off = 0;
      for (size_t k = 0; k < in.size(); ++k) {
        const int64_t p = s.parts[k];
        for (int64_t o = 0; o < s.outer; ++o) {
          std::memcpy(out + o * width + off, in[k] + o * p, static_cast<size_t>(p) * sizeof(float));
        }
        off += p;
      }
      return OkStatus();
    }
    case StepKind::kToNhwc:
      Transpose3(in[0], s.outer, s.len, s.inner, out);
      return OkStatus();
    case StepKind::kToNchw:
      Transpose3(in[0], s.outer, s.inner, s.len, out);
      return OkStatus();
  }
  return InternalError("unknown step");
}

Status CnnPlan::Run(const float* x, CnnWorkspace* ws, ThreadPool& pool, std::vector<float>* out,
                    std::vector<int64_t>* out_dims) const {
  if (ws->buffers.size() < buffer_floats_.size()) ws->buffers.resize(buffer_floats_.size());
  for (size_t b = 0; b < buffer_floats_.size(); ++b) {
    if (static_cast<int64_t>(ws->buffers[b].size()) < buffer_floats_[b])
      ws->buffers[b].resize(buffer_floats_[b]);
  }
  std::vector<const float*> in;
  for (const Step& s : steps_) {
    in.clear();
    for (int v : s.in) in.push_back(Data(v, ws->buffers, x));
    float* o = ws->buffers[buffer_of_[values_[s.out].root]].data();
    Status st = RunStep(s, in, o, ws, pool);
    if (!st.ok()) return s.node != nullptr ? st.WithContext(s.node->src.Describe()) : st;
  }
  const RtValue& ov = values_[output_];
  *out_dims = ov.dims;
  const float* data = Data(output_, ws->buffers, x);
  out->assign(data, data + NumElements(ov.dims));
  return OkStatus();
}

}  // namespace stoke::cnn
