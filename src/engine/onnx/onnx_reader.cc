#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "base/file_util.h"
#include "base/half.h"
#include "engine/onnx/onnx_model.h"
#include "engine/onnx/onnx_subset.pb.h"

namespace stoke::onnx {
namespace {

namespace pb = stoke::onnx_pb;

int ElementBytes(DataType t) {
  switch (t) {
    case DataType::kFloat:
      return 4;
    case DataType::kUint8:
      return 1;
    case DataType::kInt8:
      return 1;
    case DataType::kUint16:
      return 2;
    case DataType::kInt16:
      return 2;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kBool:
      return 1;
    case DataType::kFloat16:
      return 2;
    case DataType::kDouble:
      return 8;
    case DataType::kUint32:
      return 4;
    case DataType::kUint64:
      return 8;
    case DataType::kBfloat16:
      return 2;
    default:
      return 0;
  }
}

template <typename T>
T LoadLe(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 are little-endian, as ONNX's raw_data
  return v;
}

// raw_data -> floats or ints.
void DecodeRaw(const std::string& raw, DataType t, int64_t n, OnnxTensor* out) {
  const char* p = raw.data();
  const int eb = ElementBytes(t);
  if (IsFloating(t))
    out->floats.resize(static_cast<size_t>(n));
  else
    out->ints.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i, p += eb) {
    switch (t) {
      case DataType::kFloat:
        out->floats[i] = LoadLe<float>(p);
        break;
      case DataType::kFloat16:
        out->floats[i] = Fp16ToFp32(LoadLe<uint16_t>(p));
        break;
      case DataType::kBfloat16:
        out->floats[i] = Bf16ToFp32(LoadLe<uint16_t>(p));
        break;
      case DataType::kDouble:
        out->floats[i] = static_cast<float>(LoadLe<double>(p));
        break;
      case DataType::kUint8:
        out->ints[i] = LoadLe<uint8_t>(p);
        break;
      case DataType::kInt8:
        out->ints[i] = LoadLe<int8_t>(p);
        break;
      case DataType::kBool:
        out->ints[i] = LoadLe<uint8_t>(p) != 0;
        break;
      case DataType::kUint16:
        out->ints[i] = LoadLe<uint16_t>(p);
        break;
      case DataType::kInt16:
        out->ints[i] = LoadLe<int16_t>(p);
        break;
      case DataType::kInt32:
        out->ints[i] = LoadLe<int32_t>(p);
        break;
      case DataType::kUint32:
        out->ints[i] = LoadLe<uint32_t>(p);
        break;
      case DataType::kInt64:
        out->ints[i] = LoadLe<int64_t>(p);
        break;
      case DataType::kUint64:
        out->ints[i] = static_cast<int64_t>(LoadLe<uint64_t>(p));
        break;
      default:
        break;
    }
  }
}

// The typed fields: FLOAT in float_data; (u)int8/16/32, bool, FLOAT16/BFLOAT16 (as bit patterns) in
// int32_data; INT64 in int64_data; DOUBLE in double_data; UINT32/64 in uint64_data.
Status DecodeTyped(const pb::TensorProto& p, DataType t, int64_t n, OnnxTensor* out, std::string_view what) {
  int64_t have = 0;
  switch (t) {
    case DataType::kFloat:
      have = p.float_data_size();
      out->floats.assign(p.float_data().begin(), p.float_data().end());
      break;
    case DataType::kDouble:
      have = p.double_data_size();
      for (double d : p.double_data()) out->floats.push_back(static_cast<float>(d));
      break;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      have = p.int32_data_size();
      for (int32_t v : p.int32_data()) {
        const auto bits = static_cast<uint16_t>(v);
        out->floats.push_back(t == DataType::kFloat16 ? Fp16ToFp32(bits) : Bf16ToFp32(bits));
      }
      break;
    case DataType::kInt64:
      have = p.int64_data_size();
      out->ints.assign(p.int64_data().begin(), p.int64_data().end());
      break;
    case DataType::kUint32:
    case DataType::kUint64:
      have = p.uint64_data_size();
      for (uint64_t v : p.uint64_data()) out->ints.push_back(static_cast<int64_t>(v));
      break;
    default:  // int32 and narrower, bool
      have = p.int32_data_size();
      out->ints.assign(p.int32_data().begin(), p.int32_data().end());
      break;
  }
  if (have != n) {
    return InvalidArgumentError("{}: holds {} {} values but its dims {} need {}", what, have, DataTypeName(t),
                                fmt::join(out->dims, "x"), n);
  }
  return OkStatus();
}

StatusOr<OnnxTensor> ConvertTensor(const pb::TensorProto& p, std::string_view where) {
  OnnxTensor out;
  out.name = p.name();
  const std::string what =
      out.name.empty() ? std::string(where) : fmt::format("{}: tensor '{}'", where, out.name);
  out.type = static_cast<DataType>(p.data_type());
  out.dims.assign(p.dims().begin(), p.dims().end());
  for (int64_t d : out.dims) {
    if (d < 0) return InvalidArgumentError("{}: negative dim in {}", what, fmt::join(out.dims, "x"));
  }
  if (p.data_location() == pb::TensorProto::EXTERNAL || p.external_data_size() > 0) {
    return UnimplementedError(
        "{}: data in an external file is not supported (save the model with its weights "
        "inside the .onnx)",
        what);
  }
  if (ElementBytes(out.type) == 0) {
    return UnimplementedError("{}: data type {} is not supported", what, DataTypeName(out.type));
  }
  const int64_t n = out.NumElements();
  if (n < 0 || n > (int64_t{1} << 40)) {
    return InvalidArgumentError("{}: dims {} hold too many values", what, fmt::join(out.dims, "x"));
  }
  if (p.has_raw_data()) {
    const int64_t want = n * ElementBytes(out.type);
    if (static_cast<int64_t>(p.raw_data().size()) != want) {
      return InvalidArgumentError("{}: raw_data has {} bytes but {} {} values need {}", what,
                                  p.raw_data().size(), n, DataTypeName(out.type), want);
    }
    DecodeRaw(p.raw_data(), out.type, n, &out);
    return out;
  }
  RETURN_IF_ERROR(DecodeTyped(p, out.type, n, &out, what));
  return out;
}

StatusOr<OnnxAttribute> ConvertAttribute(const pb::AttributeProto& a, std::string_view node) {
  OnnxAttribute out;
  out.name = a.name();
  using A = pb::AttributeProto;
  switch (a.type()) {
    case A::FLOAT:
      out.kind = OnnxAttribute::Kind::kFloat;
      out.f = a.f();
      break;
    case A::INT:
      out.kind = OnnxAttribute::Kind::kInt;
      out.i = a.i();
      break;
    case A::STRING:
      out.kind = OnnxAttribute::Kind::kString;
      out.s = a.s();
      break;
    case A::FLOATS:
      out.kind = OnnxAttribute::Kind::kFloats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case A::INTS:
      out.kind = OnnxAttribute::Kind::kInts;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case A::STRINGS:
      out.kind = OnnxAttribute::Kind::kStrings;
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case A::TENSOR: {
      out.kind = OnnxAttribute::Kind::kTensor;
      ASSIGN_OR_RETURN(OnnxTensor t, ConvertTensor(a.t(), fmt::format("{}: attribute '{}'", node, a.name())));
      out.t = std::move(t);
      break;
    }
    default:
      out.kind = OnnxAttribute::Kind::kOther;
      break;  // graphs, sparse tensors: refused where used
  }
  return out;
}

OnnxValueInfo ConvertValueInfo(const pb::ValueInfoProto& v) {
  OnnxValueInfo out;
  out.name = v.name();
  if (v.type().has_tensor_type()) {
    const auto& tt = v.type().tensor_type();
    out.type = static_cast<DataType>(tt.elem_type());
    if (tt.has_shape()) {
      out.has_shape = true;
      for (const auto& d : tt.shape().dim()) {
        out.dims.push_back(d.has_dim_value() && d.dim_value() > 0 ? d.dim_value() : -1);
      }
    }
  }
  return out;
}

}  // namespace

std::string_view DataTypeName(DataType t) {
  switch (t) {
    case DataType::kUndefined:
      return "UNDEFINED";
    case DataType::kFloat:
      return "FLOAT";
    case DataType::kUint8:
      return "UINT8";
    case DataType::kInt8:
      return "INT8";
    case DataType::kUint16:
      return "UINT16";
    case DataType::kInt16:
      return "INT16";
    case DataType::kInt32:
      return "INT32";
    case DataType::kInt64:
      return "INT64";
    case DataType::kString:
      return "STRING";
    case DataType::kBool:
      return "BOOL";
    case DataType::kFloat16:
      return "FLOAT16";
    case DataType::kDouble:
      return "DOUBLE";
    case DataType::kUint32:
      return "UINT32";
    case DataType::kUint64:
      return "UINT64";
    case DataType::kComplex64:
      return "COMPLEX64";
    case DataType::kComplex128:
      return "COMPLEX128";
    case DataType::kBfloat16:
      return "BFLOAT16";
  }
  return "unknown type";
}

bool IsFloating(DataType t) {
  return t == DataType::kFloat || t == DataType::kFloat16 || t == DataType::kBfloat16 ||
         t == DataType::kDouble;
}

int64_t OnnxTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) return -1;
    n *= d;
  }
  return n;
}

const OnnxAttribute* OnnxNode::Find(std::string_view attr) const {
  for (const OnnxAttribute& a : attributes) {
    if (a.name == attr) return &a;
  }
  return nullptr;
}

std::string OnnxNode::Describe() const {
  return fmt::format("node '{}' ({})", name, op_type);
}

StatusOr<int64_t> OnnxNode::Int(std::string_view attr, int64_t def) const {
  const OnnxAttribute* a = Find(attr);
  if (a == nullptr) return def;
  if (a->kind != OnnxAttribute::Kind::kInt)
    return InvalidArgumentError("{}: attribute '{}' is not an int", Describe(), attr);
  return a->i;
}

StatusOr<float> OnnxNode::Float(std::string_view attr, float def) const {
  const OnnxAttribute* a = Find(attr);
  if (a == nullptr) return def;
  if (a->kind != OnnxAttribute::Kind::kFloat) {
    return InvalidArgumentError("{}: attribute '{}' is not a float", Describe(), attr);
  }
  return a->f;
}

StatusOr<std::string> OnnxNode::String(std::string_view attr, std::string_view def) const {
  const OnnxAttribute* a = Find(attr);
  if (a == nullptr) return std::string(def);
  if (a->kind != OnnxAttribute::Kind::kString) {
    return InvalidArgumentError("{}: attribute '{}' is not a string", Describe(), attr);
  }
  return a->s;
}

StatusOr<std::vector<int64_t>> OnnxNode::Ints(std::string_view attr, std::vector<int64_t> def) const {
  const OnnxAttribute* a = Find(attr);
  if (a == nullptr) return def;
  if (a->kind != OnnxAttribute::Kind::kInts) {
    return InvalidArgumentError("{}: attribute '{}' is not a list of ints", Describe(), attr);
  }
  return a->ints;
}

const OnnxTensor* OnnxModel::FindInitializer(std::string_view name) const {
  auto it = initializers.find(name);
  return it == initializers.end() ? nullptr : &it->second;
}

StatusOr<OnnxModel> ParseOnnx(std::string_view bytes, std::string_view source) {
  pb::ModelProto proto;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return InvalidArgumentError("{}: not an ONNX model (the protobuf does not parse)", source);
  }
  if (!proto.has_graph()) return InvalidArgumentError("{}: the ONNX model has no graph", source);
  OnnxModel m;
  m.ir_version = proto.ir_version();
  m.producer = proto.producer_name();
  for (const auto& op : proto.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") m.opset = op.version();
  }
  for (const auto& kv : proto.metadata_props()) m.metadata[kv.key()] = kv.value();
  const pb::GraphProto& g = proto.graph();
  for (const pb::TensorProto& t : g.initializer()) {
    ASSIGN_OR_RETURN(OnnxTensor x, ConvertTensor(t, fmt::format("{}: initializer", source)));
    if (x.name.empty()) return InvalidArgumentError("{}: an initializer has no name", source);
    std::string name = x.name;
    m.initializers.emplace(std::move(name), std::move(x));
  }
  for (const pb::ValueInfoProto& v : g.input()) {
    if (m.initializers.count(v.name()) == 0) m.inputs.push_back(ConvertValueInfo(v));
  }
  for (const pb::ValueInfoProto& v : g.output()) m.outputs.push_back(ConvertValueInfo(v));
  m.nodes.reserve(g.node_size());
  for (int i = 0; i < g.node_size(); ++i) {
    const pb::NodeProto& p = g.node(i);
    OnnxNode n;
    n.op_type = p.op_type();
    n.name = p.name().empty() ? fmt::format("{}#{}", n.op_type, i) : p.name();
    n.domain = p.domain() == "ai.onnx" ? "" : p.domain();
    n.inputs.assign(p.input().begin(), p.input().end());
    n.outputs.assign(p.output().begin(), p.output().end());
    for (const pb::AttributeProto& a : p.attribute()) {
      ASSIGN_OR_RETURN(OnnxAttribute x, ConvertAttribute(a, fmt::format("{}: {}", source, n.Describe())));
      n.attributes.push_back(std::move(x));
    }
    m.nodes.push_back(std::move(n));
  }
  if (m.inputs.empty()) return InvalidArgumentError("{}: the graph has no input", source);
  if (m.outputs.empty()) return InvalidArgumentError("{}: the graph has no output", source);
  return m;
}

StatusOr<OnnxModel> ReadOnnxFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path, size_t{2} << 30));
  return ParseOnnx(bytes, path);
}

}  // namespace stoke::onnx
