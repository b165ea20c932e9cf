// Exposes stoke's GGUF reader and quantisers to tests/golden/test_gguf_golden.py, which compares them with
// the `gguf` Python package (gguf-py).
//
//   gguf_golden_tool dump FILE [OUTDIR] [--tensors NAME,NAME,...]
//       stdout: JSON {version, alignment, data_offset, metadata: [{key, type, elem_type?, value}],
//                     tensors: [{index, name, ggml_type, dtype, shape (outermost first), nbytes}]}
//       OUTDIR/<index>.f32: each float-like or quantised tensor (or only the named ones), dequantised, raw
//       little-endian fp32 in row-major order.
//   gguf_golden_tool quantize TYPE IN.f32 OUT    TYPE in Q8_0 Q4_0 Q4_1 Q5_0 Q5_1; ggml's reference quantiser
// Errors: message on stderr, exit 1 (usage: exit 2).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "engine/loader/gguf_reader.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

int Fail(const Status& st) {
  std::cerr << st.ToString() << "\n";
  return 1;
}

int Usage() {
  std::cerr << "usage: gguf_golden_tool dump FILE [OUTDIR] [--tensors NAME,...]\n"
               "       gguf_golden_tool quantize Q8_0|Q4_0|Q4_1|Q5_0|Q5_1 IN.f32 OUT\n";
  return 2;
}

int Dump(const std::string& path, const std::string& outdir, const std::set<std::string>& only) {
  auto opened = GgufFile::Open(path);
  if (!opened.ok()) return Fail(opened.status());
  const GgufFile& f = **opened;
  nlohmann::json out;
  out["version"] = f.version();
  out["alignment"] = f.alignment();
  out["data_offset"] = f.data_offset();
  out["metadata"] = nlohmann::json::array();
  for (const std::string& key : f.Keys()) {
    nlohmann::json kv = {{"key", key}, {"type", GgufTypeName(*f.TypeOf(key))}, {"value", f.ValueAsJson(key)}};
    if (auto elem = f.ArrayElementType(key)) kv["elem_type"] = GgufTypeName(*elem);
    out["metadata"].push_back(std::move(kv));
  }
  out["tensors"] = nlohmann::json::array();
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorRef& t = f.tensors()[i];
    out["tensors"].push_back({{"index", i},
                              {"name", t.name},
                              {"ggml_type", f.GgmlType(i)},
                              {"dtype", DTypeName(t.dtype)},
                              {"shape", t.shape},
                              {"nbytes", t.nbytes}});
    if (outdir.empty() || (!only.empty() && !only.count(t.name))) continue;
    std::vector<float> values(static_cast<size_t>(t.numel()));
    Status st = cpu::DequantizeRow(t.dtype, t.data, values.data(), t.numel());
    if (!st.ok()) continue;  // integer tensors
    st = WriteStringToFile(outdir + "/" + std::to_string(i) + ".f32",
                           std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4));
    if (!st.ok()) return Fail(st);
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

int Quantize(const std::string& type, const std::string& in, const std::string& out) {
  using Fn = void (*)(const float*, void*, int64_t);
  const std::vector<std::tuple<std::string, DType, Fn>> kQuantisers = {
      {"Q8_0", DType::kQ8_0, cpu::QuantizeRowQ8_0},
      {"Q4_0", DType::kQ4_0, cpu::QuantizeRowQ4_0},
      {"Q4_1", DType::kQ4_1, cpu::QuantizeRowQ4_1},
      {"Q5_0", DType::kQ5_0, cpu::QuantizeRowQ5_0},
      {"Q5_1", DType::kQ5_1, cpu::QuantizeRowQ5_1}};
  for (const auto& [name, dtype, fn] : kQuantisers) {
    if (name != type) continue;
    auto bytes = ReadFileToString(in);
    if (!bytes.ok()) return Fail(bytes.status());
    const int64_t n = static_cast<int64_t>(bytes->size() / 4);
    auto row_bytes = RowBytes(dtype, n);
    if (bytes->size() % 4 != 0 || !row_bytes.ok()) {
      return Fail(InvalidArgumentError("{}: {} bytes is not a whole number of {} blocks of fp32", in,
                                       bytes->size(), type));
    }
    std::vector<float> x(n);
    std::memcpy(x.data(), bytes->data(), bytes->size());
    std::string q(*row_bytes, '\0');
    fn(x.data(), q.data(), n);
    Status st = WriteStringToFile(out, q);
    return st.ok() ? 0 : Fail(st);
  }
  return Usage();
}

}  // namespace
}  // namespace stoke

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 2 && args[0] == "dump") {
    std::string outdir;
    std::set<std::string> only;
    for (size_t i = 2; i < args.size(); ++i) {
      if (args[i] == "--tensors" && i + 1 < args.size()) {
        std::stringstream names(args[++i]);
        for (std::string name; std::getline(names, name, ',');) only.insert(name);
      } else if (outdir.empty()) {
        outdir = args[i];
      } else {
        return stoke::Usage();
      }
    }
    return stoke::Dump(args[1], outdir, only);
  }
  if (args.size() == 4 && args[0] == "quantize") return stoke::Quantize(args[1], args[2], args[3]);
  return stoke::Usage();
}
