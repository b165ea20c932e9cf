#include "engine/cnn/cnn_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>

namespace stoke::cnn {

namespace {

// Output size of a sliding window; pads [begin_h, begin_w, end_h, end_w] are updated for auto_pad.
StatusOr<std::pair<int64_t, int64_t>> WindowOut(const std::string& auto_pad, int64_t in_h, int64_t in_w,
                                                int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                                                int64_t dw, bool ceil_mode, std::vector<int64_t>* pads,
                                                const onnx::OnnxNode& n) {
  const int64_t eff_h = (kh - 1) * dh + 1, eff_w = (kw - 1) * dw + 1;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t oh = (in_h + sh - 1) / sh, ow = (in_w + sw - 1) / sw;
    const int64_t th = std::max<int64_t>(0, (oh - 1) * sh + eff_h - in_h);
    const int64_t tw = std::max<int64_t>(0, (ow - 1) * sw + eff_w - in_w);
    const bool upper = auto_pad == "SAME_UPPER";
    *pads = {upper ? th / 2 : th - th / 2, upper ? tw / 2 : tw - tw / 2, 0, 0};
    (*pads)[2] = th - (*pads)[0];
    (*pads)[3] = tw - (*pads)[1];
    return std::pair{oh, ow};
  }
  if (auto_pad == "VALID")
    *pads = {0, 0, 0, 0};
  else if (auto_pad != "NOTSET" && !auto_pad.empty()) {
    return InvalidArgumentError("{}: unknown auto_pad '{}'", n.Describe(), auto_pad);
  }
  auto out = [&](int64_t in, int64_t pb, int64_t pe, int64_t eff, int64_t s) {
    const int64_t span = in + pb + pe - eff;
    if (span < 0) return int64_t{0};
    int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (ceil_mode && (o - 1) * s >= in + pb) --o;  // the last window must start inside the input
    return o;
  };
  const int64_t oh = out(in_h, (*pads)[0], (*pads)[2], eff_h, sh);
  const int64_t ow = out(in_w, (*pads)[1], (*pads)[3], eff_w, sw);
  if (oh < 1 || ow < 1) {
    return InvalidArgumentError("{}: a {}x{} input is smaller than the {}x{} window", n.Describe(), in_h,
                                in_w, eff_h, eff_w);
  }
  return std::pair{oh, ow};
}

std::vector<int64_t> Pad4(const std::vector<int64_t>& d) {
  std::vector<int64_t> p(4 - std::min<size_t>(4, d.size()), 1);
  p.insert(p.end(), d.begin(), d.end());
  return p;
}

std::vector<int64_t> NhwcDims(const std::vector<int64_t>& nchw) {
  return {nchw[0], nchw[2], nchw[3], nchw[1]};
}

std::vector<int64_t> Strides(const std::vector<int64_t>& d) {
  std::vector<int64_t> s(d.size(), 1);
  for (size_t k = d.size(); k-- > 1;) s[k - 1] = s[k] * d[k];
  return s;
}

}  // namespace

// Walks the graph's live nodes once, keeping for each ONNX value name either its known tensor or its
// run-time value id.
class Planner {
 public:
  Planner(const CnnGraph& g, CnnPlan* p) : g_(g), p_(p) {}

  Status Build(const std::vector<int64_t>& input_dims) {
    if (input_dims.size() != 4) {
      return InvalidArgumentError("the CNN engine takes a 4-D NCHW input, got {}", DimsString(input_dims));
    }
    p_->input_ = NewValue(input_dims, false);
    rt_[g_.input_name] = p_->input_;
    for (const CnnNode& n : g_.nodes) {
      if (!n.dead) RETURN_IF_ERROR(Plan(n));
    }
    const std::string& out_name = g_.output_names[0];
    if (known_.count(out_name) || g_.constants.count(out_name)) {
      return UnimplementedError("output '{}' does not depend on the input", out_name);
    }
    auto it = rt_.find(out_name);
    if (it == rt_.end()) return InvalidArgumentError("output '{}' is not produced by any node", out_name);
    p_->output_ = Plain(it->second);
    AssignBuffers();
    return OkStatus();
  }

 private:
  int NewValue(std::vector<int64_t> dims, bool nhwc, int root = -1) {
    const int id = static_cast<int>(p_->values_.size());
    p_->values_.push_back({.dims = std::move(dims), .nhwc = nhwc, .root = root < 0 ? id : root});
    return id;
  }

  const ConstTensor* Known(const std::string& name) const {
    if (auto it = g_.constants.find(name); it != g_.constants.end()) return &it->second;
    if (auto it = known_.find(name); it != known_.end()) return &it->second;
    return nullptr;
  }

  StatusOr<int> Runtime(const CnnNode& n, size_t k) const {
    if (k >= n.inputs.size() || n.inputs[k].empty()) {
      return InvalidArgumentError("{}: input {} is missing", n.src.Describe(), k);
    }
    auto it = rt_.find(n.inputs[k]);
    if (it == rt_.end()) {
      if (Known(n.inputs[k]) != nullptr) {
        return UnimplementedError("{}: input '{}' is a constant where the engine needs a computed tensor",
                                  n.src.Describe(), n.inputs[k]);
      }
      return InvalidArgumentError("{}: input '{}' is not produced by any earlier node", n.src.Describe(),
                                  n.inputs[k]);
    }
    return it->second;
  }

  const std::vector<int64_t>& Dims(int v) const { return p_->values_[v].dims; }

  Step& AddStep(StepKind kind, const CnnNode* node, std::vector<int> in, int out) {
    Step s;
    s.kind = kind;
    s.node = node;
    s.in = std::move(in);
    s.out = out;
    p_->steps_.push_back(std::move(s));
    return p_->steps_.back();
  }

  // v in NHWC (4-D only).
  int Nhwc(int v) {
    if (p_->values_[v].nhwc) return v;
    if (auto it = to_nhwc_.find(v); it != to_nhwc_.end()) return it->second;
    const std::vector<int64_t> d = Dims(v);
    const int out = d[2] * d[3] == 1 ? NewValue(d, true, p_->values_[v].root) : NewValue(d, true);
    if (d[2] * d[3] != 1) {
      Step& s = AddStep(StepKind::kToNhwc, nullptr, {v}, out);
      s.outer = d[0], s.len = d[1], s.inner = d[2] * d[3];
    }
    return to_nhwc_[v] = out;
  }

  // v row-major in its logical dims.
  int Plain(int v) {
    if (!p_->values_[v].nhwc) return v;
    if (auto it = to_plain_.find(v); it != to_plain_.end()) return it->second;
    const std::vector<int64_t> d = Dims(v);
    const int out = d[2] * d[3] == 1 ? NewValue(d, false, p_->values_[v].root) : NewValue(d, false);
    if (d[2] * d[3] != 1) {
      Step& s = AddStep(StepKind::kToNchw, nullptr, {v}, out);
      s.outer = d[0], s.len = d[1], s.inner = d[2] * d[3];
    }
    return to_plain_[v] = out;
  }

  // A known float tensor as a constant operand, padded to `rank` and, when nhwc, transposed.
  int ConstOperand(const ConstTensor& t, bool nhwc) {
    std::vector<int64_t> dims = t.dims;
    std::vector<float> data = t.is_int ? std::vector<float>(t.i.begin(), t.i.end()) : t.f;
    if (nhwc) {
      dims = Pad4(dims);
      std::vector<float> tr(data.size());
      const int64_t c = dims[1], hw = dims[2] * dims[3];
      for (int64_t n = 0; n < dims[0]; ++n)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t p = 0; p < hw; ++p) tr[(n * hw + p) * c + ch] = data[(n * c + ch) * hw + p];
      data = std::move(tr);
    }
    p_->owned_.push_back(std::move(data));
    const int v = NewValue(dims, nhwc);
    p_->values_[v].konst = p_->owned_.back().data();
    return v;
  }

  Status Plan(const CnnNode& n) {
    const std::string what = n.src.Describe();
    // Known inputs only: evaluate now.
    if (n.kind == OpKind::kShape) return PlanShape(n);
    bool all_known = !n.inputs.empty();
    std::vector<const ConstTensor*> kin;
    for (const std::string& i : n.inputs) {
      const ConstTensor* k = i.empty() ? nullptr : Known(i);
      all_known &= i.empty() || k != nullptr;
      kin.push_back(k);
    }
    if (all_known && n.kind != OpKind::kConv && n.kind != OpKind::kGemm) {
      auto folded = FoldNode(n.src, kin, g_.opset);
      if (!folded.ok()) return folded.status();
      known_[n.outputs[0]] = std::move(*folded);
      return OkStatus();
    }
    switch (n.kind) {
      case OpKind::kConv:
        return PlanConv(n);
      case OpKind::kMaxPool:
      case OpKind::kAveragePool:
        return PlanPool(n);
      case OpKind::kGlobalAveragePool: {
        ASSIGN_OR_RETURN(int x, Runtime(n, 0));
        RETURN_IF_ERROR(Need4d(n, x));
        x = Nhwc(x);
        const std::vector<int64_t> d = Dims(x);
        const int out = NewValue({d[0], d[1], 1, 1}, true);
        rt_[n.outputs[0]] = out;
        AddStep(StepKind::kGlobalAveragePool, &n, {x}, out);
        return OkStatus();
      }
      case OpKind::kBinary:
        return PlanBinary(n);
      case OpKind::kActivation: {
        ASSIGN_OR_RETURN(int x, Runtime(n, 0));
        const int out = NewValue(Dims(x), p_->values_[x].nhwc);
        rt_[n.outputs[0]] = out;
        AddStep(StepKind::kActivation, &n, {x}, out);
        return OkStatus();
      }
      case OpKind::kChannelAffine: {
        ASSIGN_OR_RETURN(int x, Runtime(n, 0));
        const std::vector<int64_t> d = Dims(x);  // a copy: NewValue may reallocate values_
        if (d.size() < 2 || d[1] != static_cast<int64_t>(n.scale.size())) {
          return InvalidArgumentError("{}: input {} does not have {} channels", what, DimsString(d),
                                      n.scale.size());
        }
        const int out = NewValue(d, p_->values_[x].nhwc);
        rt_[n.outputs[0]] = out;
        Step& s = AddStep(StepKind::kChannelAffine, &n, {x}, out);
        int64_t rest = 1;
        for (size_t k = 2; k < d.size(); ++k) rest *= d[k];
        s.len = d[1];
        s.outer = p_->values_[x].nhwc ? d[0] * rest : d[0];
        s.inner = p_->values_[x].nhwc ? 1 : rest;
        return OkStatus();
      }
      case OpKind::kGemm:
        return PlanGemm(n);
      case OpKind::kSoftmax: {
        ASSIGN_OR_RETURN(int x, Runtime(n, 0));
        x = Plain(x);
        const std::vector<int64_t> d = Dims(x);  // a copy: NewValue may reallocate values_
        ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n.axis, static_cast<int64_t>(d.size()), what));
        const int out = NewValue(d, false);
        rt_[n.outputs[0]] = out;
        Step& s = AddStep(StepKind::kSoftmax, &n, {x}, out);
        s.outer = 1, s.len = 1, s.inner = 1;
        for (int64_t k = 0; k < static_cast<int64_t>(d.size()); ++k) {
          if (k < axis)
            s.outer *= d[k];
          else if (k == axis || g_.opset < 13)
            s.len *= d[k];  // before opset 13: flattened from axis on
          else
            s.inner *= d[k];
        }
        return OkStatus();
      }
      case OpKind::kAlias:
        return PlanAlias(n, kin);
      case OpKind::kConcat:
        return PlanConcat(n);
      case OpKind::kShape:
        return OkStatus();
      case OpKind::kFoldOnly:
        return UnimplementedError(
            "{}: supported only on shapes and constants, not on tensors computed from the "
            "input",
            what);
    }
    return InternalError("{}: unknown kind", what);
  }

  Status Need4d(const CnnNode& n, int x) const {
    if (Dims(x).size() != 4) {
      return InvalidArgumentError("{}: needs a 4-D NCHW input, got {}", n.src.Describe(),
                                  DimsString(Dims(x)));
    }
    return OkStatus();
  }

  Status PlanShape(const CnnNode& n) {
    std::vector<int64_t> dims;
    if (auto it = rt_.find(n.inputs[0]); it != rt_.end())
      dims = Dims(it->second);
    else if (const ConstTensor* k = Known(n.inputs[0]); k != nullptr)
      dims = k->dims;
    else
      return InvalidArgumentError("{}: input '{}' is unknown", n.src.Describe(), n.inputs[0]);
    const int64_t rank = static_cast<int64_t>(dims.size());
    ASSIGN_OR_RETURN(int64_t start, n.src.Int("start", 0));
    ASSIGN_OR_RETURN(int64_t end, n.src.Int("end", rank));
    start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
    end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
    ConstTensor t;
    t.is_int = true;
    for (int64_t k = start; k < end; ++k) t.i.push_back(dims[k]);
    t.dims = {static_cast<int64_t>(t.i.size())};
    known_[n.outputs[0]] = std::move(t);
    return OkStatus();
  }

  Status PlanConv(const CnnNode& n) {
    ASSIGN_OR_RETURN(int x, Runtime(n, 0));
    RETURN_IF_ERROR(Need4d(n, x));
    const ConvParams& c = n.conv;
    const std::vector<int64_t> d = Dims(x);
    if (d[1] != c.in_c_per_group * c.groups) {
      return InvalidArgumentError("{}: input has {} channels, the weights expect {}", n.src.Describe(), d[1],
                                  c.in_c_per_group * c.groups);
    }
    std::vector<int64_t> pads = c.pads;
    ASSIGN_OR_RETURN(auto oh_ow, WindowOut(c.auto_pad, d[2], d[3], c.kernel_h, c.kernel_w, c.stride_h,
                                           c.stride_w, c.dilation_h, c.dilation_w, false, &pads, n.src));
    x = Nhwc(x);
    const int out = NewValue({d[0], c.out_c, oh_ow.first, oh_ow.second}, true);
    rt_[n.outputs[0]] = out;
    Step& s = AddStep(StepKind::kConv, &n, {x}, out);
    s.conv = {.batch = d[0],
              .in_h = d[2],
              .in_w = d[3],
              .in_c = d[1],
              .out_h = oh_ow.first,
              .out_w = oh_ow.second,
              .out_c = c.out_c,
              .kernel_h = c.kernel_h,
              .kernel_w = c.kernel_w,
              .stride_h = c.stride_h,
              .stride_w = c.stride_w,
              .pad_top = pads[0],
              .pad_left = pads[1],
              .dilation_h = c.dilation_h,
              .dilation_w = c.dilation_w,
              .groups = c.groups};
    return s.conv.Validate().WithContext(n.src.Describe());
  }

  Status PlanPool(const CnnNode& n) {
    ASSIGN_OR_RETURN(int x, Runtime(n, 0));
    RETURN_IF_ERROR(Need4d(n, x));
    const PoolParams& p = n.pool;
    const std::vector<int64_t> d = Dims(x);
    std::vector<int64_t> pads = p.pads;
    ASSIGN_OR_RETURN(auto oh_ow,
                     WindowOut(p.auto_pad, d[2], d[3], p.kernel_h, p.kernel_w, p.stride_h, p.stride_w,
                               p.dilation_h, p.dilation_w, p.ceil_mode, &pads, n.src));
    x = Nhwc(x);
    const int out = NewValue({d[0], d[1], oh_ow.first, oh_ow.second}, true);
    rt_[n.outputs[0]] = out;
    Step& s = AddStep(StepKind::kPool, &n, {x}, out);
    s.pool_kind = n.kind == OpKind::kMaxPool ? cpu::PoolKind::kMax : cpu::PoolKind::kAverage;
    s.pool = {.batch = d[0],
              .channels = d[1],
              .in_h = d[2],
              .in_w = d[3],
              .out_h = oh_ow.first,
              .out_w = oh_ow.second,
              .kernel_h = p.kernel_h,
              .kernel_w = p.kernel_w,
              .stride_h = p.stride_h,
              .stride_w = p.stride_w,
              .pad_top = pads[0],
              .pad_left = pads[1],
              .pad_bottom = pads[2],
              .pad_right = pads[3],
              .dilation_h = p.dilation_h,
              .dilation_w = p.dilation_w,
              .count_include_pad = p.count_include_pad};
    return OkStatus();
  }

  Status PlanBinary(const CnnNode& n) {
    const std::string what = n.src.Describe();
    if (n.inputs.size() != 2) return InvalidArgumentError("{}: needs two inputs", what);
    std::vector<int64_t> dims[2];
    int rt[2] = {-1, -1};
    const ConstTensor* k[2] = {nullptr, nullptr};
    bool any_nhwc = false;
    for (int s = 0; s < 2; ++s) {
      if (auto it = rt_.find(n.inputs[s]); it != rt_.end()) {
        rt[s] = it->second;
        dims[s] = Dims(rt[s]);
        any_nhwc |= p_->values_[rt[s]].nhwc;
      } else if ((k[s] = Known(n.inputs[s])) != nullptr) {
        dims[s] = k[s]->dims;
      } else {
        return InvalidArgumentError("{}: input '{}' is unknown", what, n.inputs[s]);
      }
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, BroadcastDims(dims[0], dims[1], what));
    const bool nhwc = out_dims.size() == 4 && any_nhwc;
    int v[2];
    for (int s = 0; s < 2; ++s) {
      if (k[s] != nullptr) {
        if (nhwc && dims[s].size() > 4) return InvalidArgumentError("{}: operand rank above 4", what);
        v[s] = ConstOperand(*k[s], nhwc);
      } else if (nhwc) {
        if (dims[s].size() != 4) {
          return UnimplementedError("{}: broadcasting a {}-D tensor against a 4-D image is not supported",
                                    what, dims[s].size());
        }
        v[s] = Nhwc(rt[s]);
      } else {
        v[s] = Plain(rt[s]);
      }
    }
    const int out = NewValue(out_dims, nhwc);
    rt_[n.outputs[0]] = out;
    Step& st = AddStep(StepKind::kBinary, &n, {v[0], v[1]}, out);
    const std::string& op = n.src.op_type;
    st.op = op == "Add" ? '+' : op == "Sub" ? '-' : op == "Mul" ? '*' : '/';
    st.bdims = nhwc ? NhwcDims(out_dims) : out_dims;
    const size_t r = st.bdims.size();
    for (int s = 0; s < 2; ++s) {
      std::vector<int64_t> pd = p_->values_[v[s]].nhwc ? NhwcDims(Pad4(Dims(v[s]))) : Dims(v[s]);
      pd.insert(pd.begin(), r - pd.size(), 1);
      std::vector<int64_t> str = Strides(pd);
      for (size_t d = 0; d < r; ++d) {
        if (pd[d] == 1 && st.bdims[d] != 1) str[d] = 0;
      }
      st.bstride[s] = str;
    }
    return OkStatus();
  }

  Status PlanGemm(const CnnNode& n) {
    ASSIGN_OR_RETURN(int x, Runtime(n, 0));
    x = Plain(x);
    const std::vector<int64_t> d = Dims(x);  // a copy: NewValue may reallocate values_
    if (d.empty() || d.back() != n.gemm.k || (n.src.op_type == "Gemm" && d.size() != 2)) {
      return InvalidArgumentError("{}: input {} does not match the weights' K = {}", n.src.Describe(),
                                  DimsString(d), n.gemm.k);
    }
    std::vector<int64_t> od = d;
    od.back() = n.gemm.n;
    const int out = NewValue(od, false);
    rt_[n.outputs[0]] = out;
    Step& s = AddStep(StepKind::kGemm, &n, {x}, out);
    s.outer = NumElements(d) / n.gemm.k;
    return OkStatus();
  }

  Status PlanAlias(const CnnNode& n, const std::vector<const ConstTensor*>& kin) {
    const std::string what = n.src.Describe();
    ASSIGN_OR_RETURN(int x, Runtime(n, 0));
    const std::string& op = n.src.op_type;
    std::vector<int64_t> dims = Dims(x);
    if (op == "Identity" || op == "Dropout") {
      rt_[n.outputs[0]] = x;
      return OkStatus();
    }
    x = Plain(x);
    // The shape arithmetic is FoldNode's, run on an empty tensor of the input's dims.
    ConstTensor shape_only;
    shape_only.dims = dims;
    shape_only.f.assign(static_cast<size_t>(NumElements(dims)), 0.0f);
    std::vector<const ConstTensor*> in = kin;
    in[0] = &shape_only;
    for (size_t k = 1; k < in.size(); ++k) {
      if (!n.inputs[k].empty() && in[k] == nullptr) {
        return UnimplementedError(
            "{}: input '{}' must be known before running (a constant or computed from "
            "shapes)",
            what, n.inputs[k]);
      }
    }
    ASSIGN_OR_RETURN(ConstTensor r, FoldNode(n.src, in, g_.opset));
    rt_[n.outputs[0]] = NewValue(r.dims, false, p_->values_[x].root);
    return OkStatus();
  }

  Status PlanConcat(const CnnNode& n) {
    std::vector<int> xs;
    bool all_nhwc = true;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      ASSIGN_OR_RETURN(int x, Runtime(n, k));
      xs.push_back(x);
      all_nhwc &= p_->values_[x].nhwc;
    }
    const int64_t rank = static_cast<int64_t>(Dims(xs[0]).size());
    ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(n.axis, rank, n.src.Describe()));
    const bool nhwc = all_nhwc && rank == 4 && axis == 1;
    std::vector<int64_t> od = Dims(xs[0]);
    od[axis] = 0;
    for (int& x : xs) {
      if (!nhwc) x = Plain(x);
      const std::vector<int64_t> d = Dims(x);  // a copy: NewValue may reallocate values_
      for (int64_t k = 0; k < rank; ++k) {
        if (k != axis && d[k] != Dims(xs[0])[k]) {
          return InvalidArgumentError("{}: inputs {} and {} differ off the axis", n.src.Describe(),
                                      DimsString(d), DimsString(Dims(xs[0])));
        }
      }
      od[axis] += d[axis];
    }
    const int out = NewValue(od, nhwc);
    rt_[n.outputs[0]] = out;
    Step& s = AddStep(StepKind::kConcat, &n, xs, out);
    s.nhwc_concat = nhwc;
    s.outer = 1;
    if (nhwc) {
      s.outer = od[0] * od[2] * od[3];
      for (int x : xs) s.parts.push_back(Dims(x)[1]);
    } else {
      for (int64_t k = 0; k < axis; ++k) s.outer *= od[k];
      for (int x : xs) s.parts.push_back(NumElements(Dims(x)) / s.outer);
    }
    return OkStatus();
  }

  // Greedy reuse: a value's buffer returns to the free list after its last reader.
  void AssignBuffers() {
    const int nv = static_cast<int>(p_->values_.size());
    std::vector<int> last(nv, -1);
    for (int s = 0; s < static_cast<int>(p_->steps_.size()); ++s) {
      for (int v : p_->steps_[s].in) last[p_->values_[v].root] = s;
    }
    last[p_->values_[p_->output_].root] = std::numeric_limits<int>::max();
    p_->buffer_of_.assign(nv, -1);
    std::vector<int> free;
    for (int s = 0; s < static_cast<int>(p_->steps_.size()); ++s) {
      const int out = p_->steps_[s].out;
      const int64_t need = NumElements(p_->values_[out].dims);
      int best = -1;  // the smallest free buffer that fits, else the largest (grown)
      for (int b : free) {
        if (p_->buffer_floats_[b] >= need && (best < 0 || p_->buffer_floats_[b] < p_->buffer_floats_[best]))
          best = b;
      }
      if (best < 0) {
        for (int b : free) {
          if (best < 0 || p_->buffer_floats_[b] > p_->buffer_floats_[best]) best = b;
        }
      }
      if (best < 0) {
        best = static_cast<int>(p_->buffer_floats_.size());
        p_->buffer_floats_.push_back(need);
      } else {
        free.erase(std::find(free.begin(), free.end(), best));
        p_->buffer_floats_[best] = std::max(p_->buffer_floats_[best], need);
      }
      p_->buffer_of_[out] = best;
      for (int v : p_->steps_[s].in) {
        const int r = p_->values_[v].root;
        if (last[r] == s && p_->buffer_of_[r] >= 0 && p_->values_[r].konst == nullptr) {
          if (std::find(free.begin(), free.end(), p_->buffer_of_[r]) == free.end())
            free.push_back(p_->buffer_of_[r]);
        }
      }
    }
  }

  const CnnGraph& g_;
  CnnPlan* p_;
  std::map<std::string, int, std::less<>> rt_;
  std::map<std::string, ConstTensor, std::less<>> known_;
  std::map<int, int> to_nhwc_, to_plain_;
};

StatusOr<std::unique_ptr<CnnPlan>> CnnPlan::Create(const CnnGraph& graph,
                                                   const std::vector<int64_t>& input_dims) {
  auto plan = std::unique_ptr<CnnPlan>(new CnnPlan());
  Planner planner(graph, plan.get());
  RETURN_IF_ERROR(planner.Build(input_dims));
  return plan;
}

int64_t CnnPlan::buffer_floats() const {
  int64_t total = 0;
  for (int64_t f : buffer_floats_) total += f;
  return total;
}

}  // namespace stoke::cnn
