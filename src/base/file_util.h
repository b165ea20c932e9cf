// Files: read-only memory maps (model weights are mapped, never copied) and small whole-file reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace stoke {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to size() == 0 and data() == nullptr.
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Whole file into a string; fails with NotFound / DataLoss naming the path. `max_bytes` bounds memory.
StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes = size_t{1} << 30);
Status WriteStringToFile(const std::string& path, std::string_view contents);

}  // namespace stoke
