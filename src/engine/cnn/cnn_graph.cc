#include "engine/cnn/cnn_graph.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

namespace stoke::cnn {
namespace {

using onnx::OnnxNode;

constexpr char kSupportedOps[] =
    "Conv, BatchNormalization, Relu, Clip, HardSigmoid, HardSwish, Sigmoid, Add, Sub, Mul, Div, MaxPool, "
    "AveragePool, GlobalAveragePool, Gemm, MatMul, Softmax, Flatten, Reshape, Squeeze, Unsqueeze, Concat, "
    "Identity, Dropout, Constant, and Shape, Cast, Slice, Gather, Transpose on shapes and constants";

bool Foldable(const std::string& op) {
  static const std::set<std::string> kOps = {"Identity",  "Dropout", "Cast",    "Add",       "Sub",
                                             "Mul",       "Div",     "Slice",   "Concat",    "Gather",
                                             "Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze"};
  return kOps.count(op) > 0;
}

// Constant nodes: "value" (a tensor) or value_float(s) / value_int(s).
StatusOr<ConstTensor> ConstantValue(const OnnxNode& n) {
  for (const onnx::OnnxAttribute& a : n.attributes) {
    if (a.name == "value" && a.t) return ConstTensor::FromOnnx(*a.t);
    ConstTensor c;
    if (a.name == "value_float") {
      c.f = {a.f};
    } else if (a.name == "value_floats") {
      c.f = a.floats;
      c.dims = {static_cast<int64_t>(a.floats.size())};
    } else if (a.name == "value_int") {
      c.is_int = true;
      c.i = {a.i};
    } else if (a.name == "value_ints") {
      c.is_int = true;
      c.i = a.ints;
      c.dims = {static_cast<int64_t>(a.ints.size())};
    } else {
      continue;
    }
    return c;
  }
  return UnimplementedError("{}: only value, value_float(s) and value_int(s) are supported", n.Describe());
}

class Builder {
 public:
  Builder(const onnx::OnnxModel& m, const std::string& source, CnnGraph* g) : m_(m), source_(source), g_(g) {}

  Status Run() {
    g_->opset = m_.opset;
    for (const auto& [name, t] : m_.initializers) g_->constants[name] = ConstTensor::FromOnnx(t);
    g_->input_name = m_.inputs[0].name;
    g_->input_dims = m_.inputs[0].dims;
    if (m_.inputs.size() != 1) {
      return UnimplementedError("{}: the graph has {} inputs; the CNN engine takes one image tensor", source_,
                                m_.inputs.size());
    }
    if (!onnx::IsFloating(m_.inputs[0].type)) {
      return UnimplementedError("{}: input '{}' is {}; the CNN engine takes a float image tensor", source_,
                                g_->input_name, onnx::DataTypeName(m_.inputs[0].type));
    }
    for (const onnx::OnnxValueInfo& o : m_.outputs) g_->output_names.push_back(o.name);
    for (const OnnxNode& n : m_.nodes) RETURN_IF_ERROR(Add(n).WithContext(source_));
    FuseHardSwish();
    FoldConvBatchNorm();
    FoldConvAdd();
    FuseActivations();
    for (CnnNode& n : g_->nodes) {
      if (!n.dead && n.kind == OpKind::kConv) PackConv(&n);
    }
    for (const CnnNode& n : g_->nodes) {
      if (!n.dead && n.kind == OpKind::kSoftmax && n.outputs[0] == g_->output_names[0])
        g_->ends_with_softmax = true;
    }
    // An Identity between the Softmax and the output (PaddlePaddle's exports) still ends with a Softmax.
    for (const CnnNode& n : g_->nodes) {
      if (!n.dead && n.kind == OpKind::kAlias && n.outputs[0] == g_->output_names[0]) {
        const CnnNode* p = Producer(n.inputs[0]);
        if (p != nullptr && p->kind == OpKind::kSoftmax) g_->ends_with_softmax = true;
      }
    }
    return OkStatus();
  }

 private:
  const ConstTensor* Const(const std::string& name) const {
    auto it = g_->constants.find(name);
    return it == g_->constants.end() ? nullptr : &it->second;
  }

  Status Add(const OnnxNode& n) {
    if (n.outputs.empty() || n.outputs[0].empty())
      return InvalidArgumentError("{}: has no output", n.Describe());
    if (!n.domain.empty()) {
      return UnimplementedError("{}: operator domain '{}' is not supported (only the default ONNX domain)",
                                n.Describe(), n.domain);
    }
    if (n.op_type == "Constant") {
      ASSIGN_OR_RETURN(ConstTensor c, ConstantValue(n));
      if (!n.outputs.empty()) g_->constants[n.outputs[0]] = std::move(c);
      return OkStatus();
    }
    // Fold now when every input is a constant.
    if (Foldable(n.op_type)) {
      std::vector<const ConstTensor*> in;
      bool all = true;
      for (const std::string& name : n.inputs) {
        const ConstTensor* c = name.empty() ? nullptr : Const(name);
        all &= name.empty() || c != nullptr;
        in.push_back(c);
      }
      if (all && !n.inputs.empty()) {
        ASSIGN_OR_RETURN(ConstTensor c, FoldNode(n, in, g_->opset));
        g_->constants[n.outputs[0]] = std::move(c);
        return OkStatus();
      }
    }
    CnnNode c;
    c.src = n;
    c.inputs = n.inputs;
    c.outputs = n.outputs;
    RETURN_IF_ERROR(Compile(&c));
    g_->nodes.push_back(std::move(c));
    return OkStatus();
  }

  // The inputs an op needs present (the rewrites and the planner index them without checking again).
  static Status CheckArity(const OnnxNode& n) {
    static const std::map<std::string, size_t, std::less<>> kMin = {
        {"Add", 2}, {"Sub", 2}, {"Mul", 2}, {"Div", 2}, {"Reshape", 2}, {"Gather", 2}};
    auto it = kMin.find(n.op_type);
    const size_t need = it == kMin.end() ? 1 : it->second;
    if (n.inputs.size() < need) {
      return InvalidArgumentError("{}: needs {} inputs, has {}", n.Describe(), need, n.inputs.size());
    }
    for (size_t k = 0; k < need; ++k) {
      if (n.inputs[k].empty()) return InvalidArgumentError("{}: input {} is missing", n.Describe(), k);
    }
    return OkStatus();
  }

  // Window attributes: small positive sizes (a huge stride or dilation would overflow the output size).
  static Status CheckWindow(const OnnxNode& n, const std::vector<int64_t>& at_least_1,
                            const std::vector<int64_t>& pads) {
    constexpr int64_t kMax = int64_t{1} << 16;
    for (int64_t v : at_least_1) {
      if (v < 1 || v > kMax) {
        return InvalidArgumentError("{}: kernel, strides and dilations must be in [1, {}], got {}",
                                    n.Describe(), kMax, v);
      }
    }
    for (int64_t v : pads) {
      if (v < 0 || v > kMax)
        return InvalidArgumentError("{}: pads must be in [0, {}], got {}", n.Describe(), kMax, v);
    }
    return OkStatus();
  }

  Status Compile(CnnNode* c) {
    const OnnxNode& n = c->src;
    const std::string& op = n.op_type;
    RETURN_IF_ERROR(CheckArity(n));
    if (op == "Conv") return CompileConv(c);
    if (op == "MaxPool" || op == "AveragePool") return CompilePool(c);
    if (op == "GlobalAveragePool") return Kind(c, OpKind::kGlobalAveragePool);
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") return Kind(c, OpKind::kBinary);
    if (op == "Relu" || op == "Clip" || op == "HardSigmoid" || op == "HardSwish" || op == "Sigmoid") {
      c->kind = OpKind::kActivation;
      return ActivationOf(n, &c->act);
    }
    if (op == "BatchNormalization") return CompileBatchNorm(c);
    if (op == "Gemm" || op == "MatMul") return CompileGemm(c);
    if (op == "Softmax") {
      ASSIGN_OR_RETURN(c->axis, n.Int("axis", g_->opset < 13 ? 1 : -1));
      return Kind(c, OpKind::kSoftmax);
    }
    if (op == "Concat") {
      ASSIGN_OR_RETURN(c->axis, n.Int("axis", 0));
      return Kind(c, OpKind::kConcat);
    }
    if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Identity" ||
        op == "Dropout") {
      return Kind(c, OpKind::kAlias);
    }
    if (op == "Shape") return Kind(c, OpKind::kShape);
    if (op == "Cast" || op == "Slice" || op == "Gather" || op == "Transpose")
      return Kind(c, OpKind::kFoldOnly);
    return UnimplementedError("{}: op type '{}' is not supported by the CNN engine (supported: {})",
                              n.Describe(), op, kSupportedOps);
  }

  static Status Kind(CnnNode* c, OpKind k) {
    c->kind = k;
    return OkStatus();
  }

  Status ActivationOf(const OnnxNode& n, cpu::ActivationParams* a) {
    const std::string& op = n.op_type;
    if (op == "Relu") {
      a->kind = cpu::Activation::kRelu;
    } else if (op == "Sigmoid") {
      a->kind = cpu::Activation::kSigmoid;
    } else if (op == "HardSwish") {
      a->kind = cpu::Activation::kHardSwish;
    } else if (op == "HardSigmoid") {
      a->kind = cpu::Activation::kHardSigmoid;
      ASSIGN_OR_RETURN(a->alpha, n.Float("alpha", 0.2f));
      ASSIGN_OR_RETURN(a->beta, n.Float("beta", 0.5f));
    } else {  // Clip
      a->kind = cpu::Activation::kClip;
      a->lo = -std::numeric_limits<float>::infinity();
      a->hi = std::numeric_limits<float>::infinity();
      if (g_->opset < 11) {
        ASSIGN_OR_RETURN(a->lo, n.Float("min", a->lo));
        ASSIGN_OR_RETURN(a->hi, n.Float("max", a->hi));
      }
      for (size_t k = 1; k < n.inputs.size() && k < 3; ++k) {
        if (n.inputs[k].empty()) continue;
        const ConstTensor* t = Const(n.inputs[k]);
        if (t == nullptr || t->size() != 1) {
          return UnimplementedError("{}: the {} bound must be a constant scalar", n.Describe(),
                                    k == 1 ? "min" : "max");
        }
        (k == 1 ? a->lo : a->hi) = static_cast<float>(t->At(0));
      }
    }
    return OkStatus();
  }

  Status CompileConv(CnnNode* c) {
    const OnnxNode& n = c->src;
    if (n.inputs.size() < 2) return InvalidArgumentError("{}: needs an input and weights", n.Describe());
    const ConstTensor* w = Const(n.inputs[1]);
    if (w == nullptr || w->is_int) {
      return UnimplementedError("{}: the weights '{}' must be a float initializer", n.Describe(),
                                n.inputs[1]);
    }
    if (w->dims.size() != 4) {
      return UnimplementedError("{}: only 2-D convolutions are supported (weights {})", n.Describe(),
                                DimsString(w->dims));
    }
    ConvParams& p = c->conv;
    p.out_c = w->dims[0];
    p.in_c_per_group = w->dims[1];
    p.kernel_h = w->dims[2];
    p.kernel_w = w->dims[3];
    p.weights = w->f;
    ASSIGN_OR_RETURN(p.groups, n.Int("group", 1));
    ASSIGN_OR_RETURN(std::vector<int64_t> strides, n.Ints("strides", {1, 1}));
    ASSIGN_OR_RETURN(std::vector<int64_t> dil, n.Ints("dilations", {1, 1}));
    ASSIGN_OR_RETURN(p.pads, n.Ints("pads", {0, 0, 0, 0}));
    ASSIGN_OR_RETURN(p.auto_pad, n.String("auto_pad", "NOTSET"));
    if (strides.size() != 2 || dil.size() != 2 || p.pads.size() != 4) {
      return InvalidArgumentError("{}: strides, dilations and pads must be 2-D", n.Describe());
    }
    if (p.groups < 1 || p.out_c % p.groups != 0) {
      return InvalidArgumentError("{}: group {} does not divide {} output channels", n.Describe(), p.groups,
                                  p.out_c);
    }
    RETURN_IF_ERROR(CheckWindow(n, {p.kernel_h, p.kernel_w, strides[0], strides[1], dil[0], dil[1]}, p.pads));
    p.stride_h = strides[0];
    p.stride_w = strides[1];
    p.dilation_h = dil[0];
    p.dilation_w = dil[1];
    if (n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const ConstTensor* b = Const(n.inputs[2]);
      if (b == nullptr || b->size() != p.out_c) {
        return UnimplementedError("{}: the bias must be a float initializer of {} values", n.Describe(),
                                  p.out_c);
      }
      p.bias = b->f;
    }
    c->inputs.resize(1);
    c->kind = OpKind::kConv;
    return OkStatus();
  }

  Status CompilePool(CnnNode* c) {
    const OnnxNode& n = c->src;
    PoolParams& p = c->pool;
    ASSIGN_OR_RETURN(std::vector<int64_t> k, n.Ints("kernel_shape"));
    if (k.size() != 2) return UnimplementedError("{}: only 2-D pooling is supported", n.Describe());
    ASSIGN_OR_RETURN(std::vector<int64_t> s, n.Ints("strides", {1, 1}));
    ASSIGN_OR_RETURN(std::vector<int64_t> d, n.Ints("dilations", {1, 1}));
    ASSIGN_OR_RETURN(p.pads, n.Ints("pads", {0, 0, 0, 0}));
    ASSIGN_OR_RETURN(p.auto_pad, n.String("auto_pad", "NOTSET"));
    ASSIGN_OR_RETURN(int64_t ceil, n.Int("ceil_mode", 0));
    ASSIGN_OR_RETURN(int64_t cip, n.Int("count_include_pad", 0));
    if (s.size() != 2 || d.size() != 2 || p.pads.size() != 4) {
      return InvalidArgumentError("{}: strides, dilations and pads must be 2-D", n.Describe());
    }
    RETURN_IF_ERROR(CheckWindow(n, {k[0], k[1], s[0], s[1], d[0], d[1]}, p.pads));
    p.kernel_h = k[0];
    p.kernel_w = k[1];
    p.stride_h = s[0];
    p.stride_w = s[1];
    p.dilation_h = d[0];
    p.dilation_w = d[1];
    p.ceil_mode = ceil != 0;
    p.count_include_pad = cip != 0;
    c->kind = n.op_type == "MaxPool" ? OpKind::kMaxPool : OpKind::kAveragePool;
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) {
      return UnimplementedError("{}: the Indices output is not supported", n.Describe());
    }
    return OkStatus();
  }

  // y = (x - mean) / sqrt(var + eps) * scale + bias  ==  x * a + b per channel.
  Status CompileBatchNorm(CnnNode* c) {
    const OnnxNode& n = c->src;
    if (n.inputs.size() < 5) return InvalidArgumentError("{}: needs 5 inputs", n.Describe());
    const ConstTensor* t[4];
    for (int k = 0; k < 4; ++k) {
      t[k] = Const(n.inputs[k + 1]);
      if (t[k] == nullptr || t[k]->is_int || t[k]->size() != t[0]->size()) {
        return UnimplementedError("{}: scale, bias, mean and variance must be float initializers of one size",
                                  n.Describe());
      }
    }
    ASSIGN_OR_RETURN(float eps, n.Float("epsilon", 1e-5f));
    const int64_t ch = t[0]->size();
    c->scale.resize(ch);
    c->shift.resize(ch);
    for (int64_t k = 0; k < ch; ++k) {
      const double a = t[0]->f[k] / std::sqrt(static_cast<double>(t[3]->f[k]) + eps);
      c->scale[k] = static_cast<float>(a);
      c->shift[k] = static_cast<float>(t[1]->f[k] - t[2]->f[k] * a);
    }
    c->inputs.resize(1);
    c->outputs.resize(1);
    c->kind = OpKind::kChannelAffine;
    return OkStatus();
  }

  Status CompileGemm(CnnNode* c) {
    const OnnxNode& n = c->src;
    const bool gemm = n.op_type == "Gemm";
    if (n.inputs.size() < 2) return InvalidArgumentError("{}: needs two inputs", n.Describe());
    const ConstTensor* b = Const(n.inputs[1]);
    if (b == nullptr || b->is_int || b->dims.size() != 2) {
      return UnimplementedError(
          "{}: B must be a 2-D float initializer (a product of two computed tensors is "
          "not supported)",
          n.Describe());
    }
    int64_t trans_a = 0, trans_b = 0;
    float alpha = 1, beta = 1;
    if (gemm) {
      ASSIGN_OR_RETURN(trans_a, n.Int("transA", 0));
      ASSIGN_OR_RETURN(trans_b, n.Int("transB", 0));
      ASSIGN_OR_RETURN(alpha, n.Float("alpha", 1.0f));
      ASSIGN_OR_RETURN(beta, n.Float("beta", 1.0f));
    }
    if (trans_a != 0) return UnimplementedError("{}: transA = 1 is not supported", n.Describe());
    GemmParams& p = c->gemm;
    p.k = trans_b ? b->dims[1] : b->dims[0];
    p.n = trans_b ? b->dims[0] : b->dims[1];
    p.weights.resize(static_cast<size_t>(p.n * p.k));
    for (int64_t i = 0; i < p.n; ++i) {
      for (int64_t j = 0; j < p.k; ++j) {
        p.weights[i * p.k + j] = alpha * (trans_b ? b->f[i * p.k + j] : b->f[j * p.n + i]);
      }
    }
    if (gemm && n.inputs.size() > 2 && !n.inputs[2].empty()) {
      const ConstTensor* bias = Const(n.inputs[2]);
      if (bias == nullptr || bias->is_int || (bias->size() != p.n && bias->size() != 1)) {
        return UnimplementedError("{}: C must be a float initializer of {} values (or one)", n.Describe(),
                                  p.n);
      }
      p.bias.resize(p.n);
      for (int64_t i = 0; i < p.n; ++i) p.bias[i] = beta * bias->f[bias->size() == 1 ? 0 : i];
    }
    c->inputs.resize(1);
    c->kind = OpKind::kGemm;
    return OkStatus();
  }

  // Uses of each value by live nodes; graph outputs count as one more use.
  std::map<std::string, int> Uses() const {
    std::map<std::string, int> uses;
    for (const CnnNode& n : g_->nodes) {
      if (n.dead) continue;
      for (const std::string& i : n.inputs) {
        if (!i.empty()) ++uses[i];
      }
    }
    for (const std::string& o : g_->output_names) ++uses[o];
    return uses;
  }

  CnnNode* Producer(const std::string& value) {
    for (CnnNode& n : g_->nodes) {
      if (!n.dead && !n.outputs.empty() && n.outputs[0] == value) return &n;
    }
    return nullptr;
  }

  bool ConstScalarIs(const std::string& name, double v) const {
    const ConstTensor* t = Const(name);
    return t != nullptr && t->size() == 1 && std::abs(t->At(0) - v) < 1e-6 * std::max(1.0, std::abs(v));
  }

  // x * clip(x + 3, 0, 6) / 6  (or * (1/6))  ->  HardSwish(x).
  void FuseHardSwish() {
    for (CnnNode& d : g_->nodes) {
      if (d.dead || d.kind != OpKind::kBinary) continue;
      const bool div6 = d.src.op_type == "Div" && ConstScalarIs(d.inputs[1], 6);
      const bool mul6 = d.src.op_type == "Mul" && ConstScalarIs(d.inputs[1], 1.0 / 6);
      if (!div6 && !mul6) continue;
      CnnNode* mul = Producer(d.inputs[0]);
      if (mul == nullptr || mul->kind != OpKind::kBinary || mul->src.op_type != "Mul") continue;
      const auto uses = Uses();
      for (int side = 0; side < 2; ++side) {
        const std::string& x = mul->inputs[side];
        CnnNode* clip = Producer(mul->inputs[1 - side]);
        if (clip == nullptr || clip->kind != OpKind::kActivation ||
            clip->act.kind != cpu::Activation::kClip || clip->act.lo != 0 || clip->act.hi != 6) {
          continue;
        }
        CnnNode* add = Producer(clip->inputs[0]);
        if (add == nullptr || add->kind != OpKind::kBinary || add->src.op_type != "Add" ||
            add->inputs[0] != x || !ConstScalarIs(add->inputs[1], 3)) {
          continue;
        }
        if (uses.at(add->outputs[0]) != 1 || uses.at(clip->outputs[0]) != 1 || uses.at(mul->outputs[0]) != 1)
          continue;
        add->dead = clip->dead = mul->dead = true;
        d.kind = OpKind::kActivation;
        d.act = {.kind = cpu::Activation::kHardSwish};
        d.inputs = {x};
        break;
      }
    }
  }

  // The single consumer of `conv`'s output, or null.
  CnnNode* OnlyConsumer(const CnnNode& conv, const std::map<std::string, int>& uses) {
    auto it = uses.find(conv.outputs[0]);
    if (it == uses.end() || it->second != 1) return nullptr;
    for (CnnNode& n : g_->nodes) {
      if (n.dead) continue;
      for (const std::string& i : n.inputs) {
        if (i == conv.outputs[0]) return &n;
      }
    }
    return nullptr;
  }

  void FoldConvBatchNorm() {
    for (CnnNode& conv : g_->nodes) {
      if (conv.dead || conv.kind != OpKind::kConv || conv.act.kind != cpu::Activation::kNone) continue;
      CnnNode* bn = OnlyConsumer(conv, Uses());
      if (bn == nullptr || bn->kind != OpKind::kChannelAffine ||
          static_cast<int64_t>(bn->scale.size()) != conv.conv.out_c) {
        continue;
      }
      ConvParams& p = conv.conv;
      const int64_t per_out = static_cast<int64_t>(p.weights.size()) / p.out_c;
      if (p.bias.empty()) p.bias.assign(p.out_c, 0.0f);
      for (int64_t o = 0; o < p.out_c; ++o) {
        for (int64_t k = 0; k < per_out; ++k) p.weights[o * per_out + k] *= bn->scale[o];
        p.bias[o] = p.bias[o] * bn->scale[o] + bn->shift[o];
      }
      conv.outputs = bn->outputs;
      bn->dead = true;
    }
  }

  // Conv -> Add(constant per channel: [C], [C,1,1], [1,C,1,1], or a scalar) folds into the bias.
  void FoldConvAdd() {
    for (CnnNode& conv : g_->nodes) {
      if (conv.dead || conv.kind != OpKind::kConv || conv.act.kind != cpu::Activation::kNone) continue;
      CnnNode* add = OnlyConsumer(conv, Uses());
      if (add == nullptr || add->kind != OpKind::kBinary || add->src.op_type != "Add") continue;
      const std::string& other = add->inputs[0] == conv.outputs[0] ? add->inputs[1] : add->inputs[0];
      const ConstTensor* t = Const(other);
      if (t == nullptr || t->is_int) continue;
      const int64_t c = conv.conv.out_c;
      bool per_channel = t->size() == c && t->dims.size() >= 3 && t->dims.size() <= 4 &&
                         t->dims[t->dims.size() - 1] == 1 && t->dims[t->dims.size() - 2] == 1;
      if (t->dims.size() == 4) per_channel &= t->dims[0] == 1;
      if (!per_channel && t->size() != 1) continue;
      ConvParams& p = conv.conv;
      if (p.bias.empty()) p.bias.assign(c, 0.0f);
      for (int64_t o = 0; o < c; ++o) p.bias[o] += t->f[t->size() == 1 ? 0 : o];
      conv.outputs = add->outputs;
      add->dead = true;
    }
  }

  void FuseActivations() {
    for (CnnNode& conv : g_->nodes) {
      if (conv.dead || (conv.kind != OpKind::kConv && conv.kind != OpKind::kGemm) ||
          conv.act.kind != cpu::Activation::kNone) {
        continue;
      }
      CnnNode* act = OnlyConsumer(conv, Uses());
      if (act == nullptr || act->kind != OpKind::kActivation) continue;
      conv.act = act->act;
      conv.outputs = act->outputs;
      act->dead = true;
    }
  }

  static void PackConv(CnnNode* n) {
    ConvParams& p = n->conv;
    cpu::Conv2dShape s;
    s.in_c = p.in_c_per_group * p.groups;
    s.out_c = p.out_c;
    s.kernel_h = p.kernel_h;
    s.kernel_w = p.kernel_w;
    s.groups = p.groups;
    p.weights = cpu::PackConvWeights(p.weights.data(), s);
    p.packed = true;
  }

  const onnx::OnnxModel& m_;
  const std::string& source_;
  CnnGraph* g_;
};

}  // namespace

StatusOr<std::unique_ptr<CnnGraph>> BuildCnnGraph(const onnx::OnnxModel& model, const std::string& source) {
  auto g = std::make_unique<CnnGraph>();
  Builder b(model, source, g.get());
  RETURN_IF_ERROR(b.Run());
  return g;
}

}  // namespace stoke::cnn
