// How the safetensors fuzzers (safetensors_fuzz, fp8_checkpoint_fuzz) turn libFuzzer's bytes into a file.
// Inputs starting with '{' are "header JSON up to its last '}', then data": the fuzzer gets a correct u64 length
// prefix for free and spends its time on the JSON and the ranges. Other inputs are taken as raw files, at their
// exact size so that ASan sees over-reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace stoke {

inline std::vector<uint8_t> SafetensorsFuzzFile(const uint8_t* data, size_t size) {
  if (size == 0 || data[0] != '{') return std::vector<uint8_t>(data, data + size);
  size_t header_len = size;
  while (header_len > 0 && data[header_len - 1] != '}') --header_len;
  std::vector<uint8_t> buf(8 + size);
  const uint64_t n = header_len;
  std::memcpy(buf.data(), &n, 8);
  std::memcpy(buf.data() + 8, data, size);
  return buf;
}

}  // namespace stoke
