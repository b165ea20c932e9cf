// An ONNX model as plain C++ values: what the CNN engine (engine/cnn/) builds its graph from. The reader
// parses the ModelProto with protobuf (onnx_subset.proto) and copies out the graph; no protobuf type leaves
// this folder.
//
//   ASSIGN_OR_RETURN(OnnxModel m, ReadOnnxFile("resnet50.onnx"));
//   for (const OnnxNode& n : m.nodes) ... n.op_type, n.inputs, n.Int("group", 1) ...
//   const OnnxTensor* w = m.FindInitializer(n.inputs[1]);
//
// Tensors are decoded at read time from raw_data (little-endian) or the typed fields: floating types
// (FLOAT, FLOAT16, BFLOAT16, DOUBLE) into `floats`, integer and bool types into `ints`. Tensors in external
// files, strings and complex types are refused with an error naming the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke::onnx {

// TensorProto.DataType values (upstream numbering).
enum class DataType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUint32 = 12,
  kUint64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBfloat16 = 16,
};

std::string_view DataTypeName(DataType t);  // "FLOAT", "INT64"; "type 42" for unknown ones
bool IsFloating(DataType t);                // FLOAT, FLOAT16, BFLOAT16, DOUBLE

struct OnnxTensor {
  std::string name;
  DataType type = DataType::kFloat;
  std::vector<int64_t> dims;  // empty = scalar
  std::vector<float> floats;  // floating types
  std::vector<int64_t> ints;  // integer and bool types

  int64_t NumElements() const;
};

struct OnnxAttribute {
  enum class Kind { kFloat, kInt, kString, kTensor, kFloats, kInts, kStrings, kOther };
  std::string name;
  Kind kind = Kind::kOther;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::optional<OnnxTensor> t;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
};

struct OnnxNode {
  std::string name;  // may be empty in the file; the reader names it "<op_type>#<index>" then
  std::string op_type;
  std::string domain;               // "" or "ai.onnx" = the default domain
  std::vector<std::string> inputs;  // "" = an omitted optional input
  std::vector<std::string> outputs;
  std::vector<OnnxAttribute> attributes;

  const OnnxAttribute* Find(std::string_view attr) const;
  // Typed getters with defaults. A present attribute of the wrong kind is an error naming node and attribute.
  StatusOr<int64_t> Int(std::string_view attr, int64_t def) const;
  StatusOr<float> Float(std::string_view attr, float def) const;
  StatusOr<std::string> String(std::string_view attr, std::string_view def) const;
  StatusOr<std::vector<int64_t>> Ints(std::string_view attr, std::vector<int64_t> def = {}) const;
  // "node 'conv1' (Conv)", for error messages.
  std::string Describe() const;
};

struct OnnxValueInfo {
  std::string name;
  DataType type = DataType::kFloat;
  std::vector<int64_t> dims;  // -1 = symbolic or unknown
  bool has_shape = false;
};

struct OnnxModel {
  int64_t ir_version = 0;
  int64_t opset = 0;  // of the default domain
  std::string producer;
  std::vector<OnnxNode> nodes;  // in file order (ONNX requires topological order)
  std::map<std::string, OnnxTensor, std::less<>> initializers;
  std::vector<OnnxValueInfo> inputs;  // graph inputs that are not initializers
  std::vector<OnnxValueInfo> outputs;
  std::map<std::string, std::string> metadata;  // metadata_props

  const OnnxTensor* FindInitializer(std::string_view name) const;
};

// Parses a serialized ModelProto. `source` names the file in errors.
StatusOr<OnnxModel> ParseOnnx(std::string_view bytes, std::string_view source);
StatusOr<OnnxModel> ReadOnnxFile(const std::string& path);

}  // namespace stoke::onnx
