// libFuzzer target: SafetensorsFile::FromBuffer must reject or accept any byte string without crashing, and
// every tensor it accepts must lie inside the buffer. Seeds: tiny valid files are easy to write by hand (see
// the test).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/loader/safetensors_fuzz_input.h"
#include "engine/loader/safetensors_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf = stoke::SafetensorsFuzzFile(data, size);
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
