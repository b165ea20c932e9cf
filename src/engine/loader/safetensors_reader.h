// safetensors reader (model-formats.md §4): u64 LE header size, a JSON header naming each tensor's dtype,
// shape and [begin, end) byte range in the data buffer that follows. The file is mapped, never copied; every
// range is validated before any tensor byte is touched, so a malformed file gives a Status naming the file
// and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/file_util.h"
#include "base/status.h"
#include "engine/loader/tensor.h"

namespace stoke {

// The reference implementation's limit on the JSON header; bigger headers are refused before parsing.
inline constexpr size_t kSafetensorsMaxHeaderBytes = 100'000'000;

// "F32" -> DType::kF32 ..., "F8_E4M3" -> DType::kF8E4M3. Any other name (F8_E5M2, F8_E8M0, F4, F6_*, C64,
// ...) gives Unimplemented.
StatusOr<DType> SafetensorsDType(std::string_view name);

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it fully.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses `data` in place (no copy; `data` must outlive the result). `name` appears in error messages.
  static StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(const uint8_t* data, size_t size,
                                                               std::string name);

  const std::string& path() const { return name_; }
  size_t file_size() const { return size_; }
  size_t data_offset() const { return data_offset_; }  // 8 + header size: where the data buffer starts
  // In data-offset order (the order of the bytes in the file).
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const TensorRef* FindTensor(std::string_view name) const;  // nullptr if absent
  // "__metadata__" (e.g. {"format": "pt"}); empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::unique_ptr<MappedFile> file_;  // null for FromBuffer
  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t data_offset_ = 0;
  std::vector<TensorRef> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace stoke
