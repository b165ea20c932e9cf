#include "base/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace stoke {

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("{}: no such file", path);
    return FailedPreconditionError("{}: cannot open: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return FailedPreconditionError("{}: not a regular file", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return ResourceExhaustedError("{}: mmap of {} bytes failed: {}", path, size, std::strerror(errno));
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("{}: cannot open", path);
  in.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(in.tellg());
  if (size > max_bytes) return ResourceExhaustedError("{}: {} bytes is over the {} byte limit", path, size, max_bytes);
  in.seekg(0);
  std::string out(size, '\0');
  if (size > 0 && !in.read(out.data(), static_cast<std::streamsize>(size))) {
    return DataLossError("{}: short read", path);
  }
  return out;
}

Status WriteStringToFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return FailedPreconditionError("{}: cannot open for writing", path);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out) return DataLossError("{}: write failed", path);
  return OkStatus();
}

}  // namespace stoke
