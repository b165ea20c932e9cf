#include "engine/cnn/const_tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace stoke::cnn {
namespace {

using onnx::OnnxNode;

Status NeedInputs(const OnnxNode& n, const std::vector<const ConstTensor*>& in, size_t count) {
  if (in.size() < count)
    return InvalidArgumentError("{}: needs {} inputs, has {}", n.Describe(), count, in.size());
  for (size_t k = 0; k < count; ++k) {
    if (in[k] == nullptr) return InvalidArgumentError("{}: input {} is missing", n.Describe(), k);
  }
  return OkStatus();
}

std::vector<int64_t> AsInts(const ConstTensor& t) {
  if (t.is_int) return t.i;
  std::vector<int64_t> v;
  for (float x : t.f) v.push_back(static_cast<int64_t>(x));
  return v;
}

ConstTensor Binary(const OnnxNode& n, const ConstTensor& a, const ConstTensor& b,
                   const std::vector<int64_t>& dims) {
  ConstTensor out;
  out.dims = dims;
  out.is_int = a.is_int && b.is_int;
  const int64_t total = NumElements(dims);
  const size_t rank = dims.size();
  auto index = [&](const ConstTensor& t, int64_t flat) {
    // Broadcast index of `flat` (in `dims`) into t (right-aligned).
    int64_t idx = 0, stride = 1;
    int64_t rem = flat;
    std::vector<int64_t> coord(rank);
    for (size_t d = rank; d-- > 0;) {
      coord[d] = rem % dims[d];
      rem /= dims[d];
    }
    const size_t off = rank - t.dims.size();
    for (size_t d = t.dims.size(); d-- > 0;) {
      const int64_t c = t.dims[d] == 1 ? 0 : coord[d + off];
      idx += c * stride;
      stride *= t.dims[d];
    }
    return idx;
  };
  const std::string& op = n.op_type;
  for (int64_t k = 0; k < total; ++k) {
    const double x = a.At(index(a, k));
    const double y = b.At(index(b, k));
    double r = 0;
    if (op == "Add")
      r = x + y;
    else if (op == "Sub")
      r = x - y;
    else if (op == "Mul")
      r = x * y;
    else
      r = out.is_int ? (y == 0 ? 0 : std::trunc(x / y)) : x / y;
    if (out.is_int)
      out.i.push_back(static_cast<int64_t>(r));
    else
      out.f.push_back(static_cast<float>(r));
  }
  return out;
}

StatusOr<ConstTensor> Slice(const OnnxNode& n, const std::vector<const ConstTensor*>& in, int64_t opset) {
  std::vector<int64_t> starts, ends, axes, steps;
  if (opset < 10) {
    ASSIGN_OR_RETURN(starts, n.Ints("starts"));
    ASSIGN_OR_RETURN(ends, n.Ints("ends"));
    ASSIGN_OR_RETURN(axes, n.Ints("axes"));
  } else {
    RETURN_IF_ERROR(NeedInputs(n, in, 3));
    starts = AsInts(*in[1]);
    ends = AsInts(*in[2]);
    if (in.size() > 3 && in[3] != nullptr) axes = AsInts(*in[3]);
    if (in.size() > 4 && in[4] != nullptr) steps = AsInts(*in[4]);
  }
  const ConstTensor& x = *in[0];
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  if (axes.empty()) {
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<int64_t>(k));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
    return InvalidArgumentError("{}: starts, ends, axes and steps differ in length", n.Describe());
  }
  std::vector<int64_t> b(rank, 0), s(rank, 1), out_dims = x.dims;
  for (size_t k = 0; k < starts.size(); ++k) {
    ASSIGN_OR_RETURN(int64_t ax, NormalizeAxis(axes[k], rank, n.Describe()));
    const int64_t dim = x.dims[ax];
    if (steps[k] != 1)
      return UnimplementedError("{}: Slice with step {} is not supported", n.Describe(), steps[k]);
    int64_t st = starts[k] < 0 ? starts[k] + dim : starts[k];
    int64_t en = ends[k] < 0 ? ends[k] + dim : ends[k];
    st = std::clamp<int64_t>(st, 0, dim);
    en = std::clamp<int64_t>(en, 0, dim);
    b[ax] = st;
    out_dims[ax] = std::max<int64_t>(0, en - st);
  }
  ConstTensor out;
  out.dims = out_dims;
  out.is_int = x.is_int;
  const int64_t total = NumElements(out_dims);
  for (int64_t k = 0; k < total; ++k) {
    int64_t rem = k, src = 0, stride = 1;
    std::vector<int64_t> coord(rank);
    for (int64_t d = rank; d-- > 0;) {
      coord[d] = rem % out_dims[d];
      rem /= out_dims[d];
    }
    for (int64_t d = rank; d-- > 0;) {
      src += (coord[d] + b[d]) * stride;
      stride *= x.dims[d];
    }
    if (out.is_int)
      out.i.push_back(x.i[src]);
    else
      out.f.push_back(x.f[src]);
  }
  return out;
}

StatusOr<ConstTensor> Concat(const OnnxNode& n, const std::vector<const ConstTensor*>& in) {
  ASSIGN_OR_RETURN(int64_t axis_attr, n.Int("axis", 0));
  RETURN_IF_ERROR(NeedInputs(n, in, 1));
  const int64_t rank = static_cast<int64_t>(in[0]->dims.size());
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(axis_attr, rank, n.Describe()));
  ConstTensor out;
  out.dims = in[0]->dims;
  out.dims[axis] = 0;
  out.is_int = in[0]->is_int;
  for (const ConstTensor* t : in) {
    if (t == nullptr || static_cast<int64_t>(t->dims.size()) != rank) {
      return InvalidArgumentError("{}: inputs differ in rank", n.Describe());
    }
    out.dims[axis] += t->dims[axis];
  }
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out.dims[d];
  for (int64_t o = 0; o < outer; ++o) {
    for (const ConstTensor* t : in) {
      int64_t inner = 1;
      for (int64_t d = axis; d < rank; ++d) inner *= t->dims[d];
      for (int64_t k = 0; k < inner; ++k) {
        if (out.is_int)
          out.i.push_back(static_cast<int64_t>(t->At(o * inner + k)));
        else
          out.f.push_back(static_cast<float>(t->At(o * inner + k)));
      }
    }
  }
  return out;
}

StatusOr<ConstTensor> Gather(const OnnxNode& n, const ConstTensor& x, const ConstTensor& idx) {
  ASSIGN_OR_RETURN(int64_t axis_attr, n.Int("axis", 0));
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(axis_attr, rank, n.Describe()));
  const std::vector<int64_t> ids = AsInts(idx);
  ConstTensor out;
  out.is_int = x.is_int;
  out.dims.assign(x.dims.begin(), x.dims.begin() + axis);
  out.dims.insert(out.dims.end(), idx.dims.begin(), idx.dims.end());
  out.dims.insert(out.dims.end(), x.dims.begin() + axis + 1, x.dims.end());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.dims[d];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t id : ids) {
      const int64_t j = id < 0 ? id + x.dims[axis] : id;
      if (j < 0 || j >= x.dims[axis])
        return InvalidArgumentError("{}: index {} out of range", n.Describe(), id);
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t src = (o * x.dims[axis] + j) * inner + k;
        if (out.is_int)
          out.i.push_back(x.i[src]);
        else
          out.f.push_back(x.f[src]);
      }
    }
  }
  return out;
}

StatusOr<ConstTensor> Transpose(const OnnxNode& n, const ConstTensor& x) {
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  std::vector<int64_t> def;
  for (int64_t d = rank; d-- > 0;) def.push_back(d);
  ASSIGN_OR_RETURN(std::vector<int64_t> perm, n.Ints("perm", def));
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t d = 0; d < static_cast<int64_t>(sorted.size()); ++d) {
    if (sorted[d] != d || static_cast<int64_t>(sorted.size()) != rank) {
      return InvalidArgumentError("{}: perm is not a permutation of the {} axes", n.Describe(), rank);
    }
  }
  if (static_cast<int64_t>(perm.size()) != rank) {
    return InvalidArgumentError("{}: perm has the wrong length", n.Describe());
  }
  ConstTensor out;
  out.is_int = x.is_int;
  for (int64_t p : perm) out.dims.push_back(x.dims[p]);
  std::vector<int64_t> in_strides(rank, 1);
  for (int64_t d = rank - 1; d-- > 0;) in_strides[d] = in_strides[d + 1] * x.dims[d + 1];
  const int64_t total = NumElements(out.dims);
  for (int64_t k = 0; k < total; ++k) {
    int64_t rem = k, src = 0;
    for (int64_t d = rank; d-- > 0;) {
      src += (rem % out.dims[d]) * in_strides[perm[d]];
      rem /= out.dims[d];
    }
    if (out.is_int)
      out.i.push_back(x.i[src]);
    else
      out.f.push_back(x.f[src]);
  }
  return out;
}

StatusOr<ConstTensor> Reshaped(const ConstTensor& x, std::vector<int64_t> dims) {
  ConstTensor out = x;
  out.dims = std::move(dims);
  return out;
}

StatusOr<std::vector<int64_t>> SqueezeAxes(const OnnxNode& n, const std::vector<const ConstTensor*>& in,
                                           int64_t opset) {
  if (opset < 13) return n.Ints("axes");
  if (in.size() > 1 && in[1] != nullptr) return AsInts(*in[1]);
  return std::vector<int64_t>{};
}

}  // namespace

ConstTensor ConstTensor::FromOnnx(const onnx::OnnxTensor& t) {
  ConstTensor c;
  c.dims = t.dims;
  c.is_int = !onnx::IsFloating(t.type);
  c.f = t.floats;
  c.i = t.ints;
  return c;
}

int64_t NumElements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string DimsString(const std::vector<int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

StatusOr<std::vector<int64_t>> BroadcastDims(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                             std::string_view what) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t x = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
    const int64_t y = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
    if (x != y && x != 1 && y != 1) {
      return InvalidArgumentError("{}: shapes {} and {} do not broadcast", what, DimsString(a),
                                  DimsString(b));
    }
    out[k] = x == 1 ? y : x;
  }
  return out;
}

StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank, std::string_view what) {
  if (axis < -rank || axis >= rank)
    return InvalidArgumentError("{}: axis {} out of range for rank {}", what, axis, rank);
  return axis < 0 ? axis + rank : axis;
}

StatusOr<std::vector<int64_t>> ReshapeDims(const std::vector<int64_t>& in, const std::vector<int64_t>& target,
                                           bool allowzero, std::string_view what) {
  std::vector<int64_t> out(target.size());
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < target.size(); ++k) {
    int64_t d = target[k];
    if (d == 0 && !allowzero) {
      if (k >= in.size())
        return InvalidArgumentError("{}: target dim {} copies a dim the input lacks", what, k);
      d = in[k];
    }
    if (d == -1) {
      if (infer >= 0) return InvalidArgumentError("{}: more than one -1 in the target shape", what);
      infer = static_cast<int64_t>(k);
      continue;
    }
    if (d < 0 || d > (int64_t{1} << 32)) return InvalidArgumentError("{}: invalid target dim {}", what, d);
    out[k] = d;
    known *= d;
  }
  const int64_t total = NumElements(in);
  if (infer >= 0) {
    if (known == 0 || total % known != 0) {
      return InvalidArgumentError("{}: cannot reshape {} into {}", what, DimsString(in), DimsString(target));
    }
    out[infer] = total / known;
  } else if (known != total) {
    return InvalidArgumentError("{}: cannot reshape {} ({} values) into {}", what, DimsString(in), total,
                                DimsString(target));
  }
  return out;
}

namespace {
StatusOr<ConstTensor> FoldNodeUnchecked(const OnnxNode& n, const std::vector<const ConstTensor*>& in,
                                        int64_t opset);
}  // namespace

// Folding is for shapes and small constants: a result above 16M values is refused rather than allocated.
StatusOr<ConstTensor> FoldNode(const OnnxNode& n, const std::vector<const ConstTensor*>& in, int64_t opset) {
  constexpr int64_t kMaxFolded = int64_t{1} << 24;
  const std::string& op = n.op_type;
  if ((op == "Add" || op == "Sub" || op == "Mul" || op == "Div") && in.size() >= 2 && in[0] != nullptr &&
      in[1] != nullptr) {
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastDims(in[0]->dims, in[1]->dims, n.Describe()));
    int64_t total = 1;
    for (int64_t d : dims) {
      if (d > 0 && total > kMaxFolded / d) {
        return UnimplementedError("{}: folding would make more than {} values", n.Describe(), kMaxFolded);
      }
      total *= d;
    }
  }
  ASSIGN_OR_RETURN(ConstTensor out, FoldNodeUnchecked(n, in, opset));
  if (out.size() > kMaxFolded) {
    return UnimplementedError("{}: folding would make {} values", n.Describe(), out.size());
  }
  return out;
}

namespace {
StatusOr<ConstTensor> FoldNodeUnchecked(const OnnxNode& n, const std::vector<const ConstTensor*>& in,
                                        int64_t opset) {
  const std::string& op = n.op_type;
  if (op == "Identity" || op == "Dropout") {
    RETURN_IF_ERROR(NeedInputs(n, in, 1));
    return *in[0];
  }
  if (op == "Cast") {
    RETURN_IF_ERROR(NeedInputs(n, in, 1));
    ASSIGN_OR_RETURN(int64_t to, n.Int("to", 1));
    ConstTensor out;
    out.dims = in[0]->dims;
    out.is_int = !onnx::IsFloating(static_cast<onnx::DataType>(to));
    for (int64_t k = 0; k < in[0]->size(); ++k) {
      if (out.is_int)
        out.i.push_back(static_cast<int64_t>(in[0]->At(k)));
      else
        out.f.push_back(static_cast<float>(in[0]->At(k)));
    }
    return out;
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    RETURN_IF_ERROR(NeedInputs(n, in, 2));
    ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastDims(in[0]->dims, in[1]->dims, n.Describe()));
    return Binary(n, *in[0], *in[1], dims);
  }
  if (op == "Slice") {
    RETURN_IF_ERROR(NeedInputs(n, in, 1));
    return Slice(n, in, opset);
  }
  if (op == "Concat") return Concat(n, in);
  if (op == "Gather") {
    RETURN_IF_ERROR(NeedInputs(n, in, 2));
    return Gather(n, *in[0], *in[1]);
  }
  if (op == "Transpose") {
    RETURN_IF_ERROR(NeedInputs(n, in, 1));
    return Transpose(n, *in[0]);
  }
  if (op == "Reshape") {
    RETURN_IF_ERROR(NeedInputs(n, in, 2));
    ASSIGN_OR_RETURN(int64_t allowzero, n.Int("allowzero", 0));
    ASSIGN_OR_RETURN(std::vector<int64_t> dims,
                     ReshapeDims(in[0]->dims, AsInts(*in[1]), allowzero != 0, n.Describe()));
    return Reshaped(*in[0], std::move(dims));
  }
  if (op == "Flatten") {
    RETURN_IF_ERROR(NeedInputs(n, in, 1));
    ASSIGN_OR_RETURN(int64_t axis_attr, n.Int("axis", 1));
    const int64_t rank = static_cast<int64_t>(in[0]->dims.size());
    const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
    int64_t a = 1, b = 1;
    for (int64_t d = 0; d < rank; ++d) (d < axis ? a : b) *= in[0]->dims[d];
    return Reshaped(*in[0], {a, b});
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    RETURN_IF_ERROR(NeedInputs(n, in, 1));
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, SqueezeAxes(n, in, opset));
    std::vector<int64_t> dims = in[0]->dims;
    if (op == "Unsqueeze") {
      const int64_t out_rank = static_cast<int64_t>(dims.size() + axes.size());
      for (int64_t& a : axes) {
        ASSIGN_OR_RETURN(a, NormalizeAxis(a, out_rank, n.Describe()));
      }
      std::sort(axes.begin(), axes.end());
      for (int64_t a : axes) dims.insert(dims.begin() + std::min<int64_t>(a, dims.size()), 1);
    } else {
      std::vector<int64_t> kept;
      const int64_t rank = static_cast<int64_t>(dims.size());
      for (int64_t d = 0; d < rank; ++d) {
        bool drop = axes.empty() ? dims[d] == 1 : false;
        for (int64_t a : axes) drop |= (a < 0 ? a + rank : a) == d;
        if (!drop) kept.push_back(dims[d]);
      }
      dims = kept;
    }
    return Reshaped(*in[0], std::move(dims));
  }
  return UnimplementedError("{}: cannot be evaluated ahead of time", n.Describe());
}

}  // namespace

}  // namespace stoke::cnn
