// libFuzzer target: SafetensorsFile::FromBuffer must reject or accept any byte string without crashing, and
// every tensor it accepts must lie inside the buffer. Seeds: tiny valid files are easy to write by hand (see
// the test).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/loader/safetensors_reader.h"

namespace {

// Inputs starting with '{' are "header JSON up to its last '}', then data": the fuzzer gets a correct u64
// length prefix for free and spends its time on the JSON and the ranges. Other inputs are taken as raw files.
std::vector<uint8_t> MakeFile(const uint8_t* data, size_t size) {
  if (size == 0 || data[0] != '{')
    return std::vector<uint8_t>(data, data + size);  // exact size: ASan sees over-reads
  size_t header_len = size;
  while (header_len > 0 && data[header_len - 1] != '}') --header_len;
  std::vector<uint8_t> buf(8 + size);
  const uint64_t n = header_len;
  std::memcpy(buf.data(), &n, 8);
  std::memcpy(buf.data() + 8, data, size);
  return buf;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf = MakeFile(data, size);
  auto f = stoke::SafetensorsFile::FromBuffer(buf.data(), buf.size(), "fuzz.safetensors");
  if (!f.ok()) return 0;
  uint64_t sum = 0;
  for (const stoke::TensorRef& t : (*f)->tensors()) {
    if (t.nbytes > 0 && (t.data < buf.data() || t.data + t.nbytes > buf.data() + buf.size())) std::abort();
    if ((*f)->FindTensor(t.name) == nullptr) std::abort();
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];  // touch every byte
  }
  return static_cast<int>(sum & 0);
}
