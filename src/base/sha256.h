// SHA-256 (FIPS 180-4), for checking downloaded model files. Streamed: files are hashed in 1 MiB chunks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace stoke {

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  std::array<uint8_t, 32> Finish();  // the object must not be updated afterwards
  std::string FinishHex();           // lowercase hex

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string Sha256Hex(std::string_view data);
// Reads `path` in 1 MiB chunks; NotFound / DataLoss name the path.
StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace stoke
