// libFuzzer target: GgufFile::FromBuffer on arbitrary bytes must return a Status, never crash or read outside
// the buffer; on success every tensor's first and last byte must be readable and small tensors dequantise.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/loader/gguf_reader.h"
#include "kernels/cpu/quants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = stoke::GgufFile::FromBuffer(data, size, "fuzz.gguf");
  if (!file.ok()) return 0;
  const stoke::GgufFile& f = **file;
  volatile uint8_t sink = 0;
  std::vector<float> out;
  for (const stoke::TensorRef& t : f.tensors()) {
    sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
    if (t.numel() <= (1 << 16)) {
      out.resize(static_cast<size_t>(t.numel()));
      (void)stoke::cpu::DequantizeRow(t.dtype, t.data, out.data(), t.numel());
    }
  }
  // Exercise every accessor on every key; type mismatches must be errors, not crashes.
  for (const std::string& key : f.Keys()) {
    (void)f.GetString(key);
    (void)f.GetInt(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.ValueSummary(key);
    (void)f.ValueAsJson(key);
    if (f.ArrayElementType(key)) {
      (void)f.GetStringArray(key);
      (void)f.GetIntArray(key);
      (void)f.GetFloatArray(key);
    }
  }
  return 0;
}
