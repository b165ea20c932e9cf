#include "engine/loader/safetensors_reader.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

namespace stoke {
namespace {

using nlohmann::json;

struct NamedDType {
  std::string_view name;
  DType dtype;
};
constexpr std::array<NamedDType, 14> kDTypes = {{
    {"F64", DType::kF64},
    {"F32", DType::kF32},
    {"F16", DType::kF16},
    {"BF16", DType::kBF16},
    {"I64", DType::kI64},
    {"I32", DType::kI32},
    {"I16", DType::kI16},
    {"I8", DType::kI8},
    {"U64", DType::kU64},
    {"U32", DType::kU32},
    {"U16", DType::kU16},
    {"U8", DType::kU8},
    {"BOOL", DType::kBool},
    {"F8_E4M3", DType::kF8E4M3},  // pre-quantised FP8 checkpoints: the loader pairs it with a weight_scale
}};

// Checked a * b for sizes; false on overflow.
bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// A non-negative JSON integer (nlohmann stores non-negative literals as unsigned).
bool AsU64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

struct Entry {
  TensorRef ref;
  uint64_t begin = 0;
  uint64_t end = 0;
};

}  // namespace

StatusOr<DType> SafetensorsDType(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (d.name == name) return d.dtype;
  }
  // F8_E5M2, F8_E8M0, F4, F6_E2M3, F6_E3M2, C64 and whatever comes next: loading them is not implemented.
  // FP8 checkpoints store their weights as F8_E4M3 (read above); an F8_E5M2 / E8M0 one says so.
  if (name.starts_with("F8_")) {
    return UnimplementedError(
        "dtype '{}' is not supported: of the fp8 types stoke reads F8_E4M3 (the weights of pre-quantised FP8 "
        "checkpoints, with their weight_scale tensors; docs/precision.md)",
        name);
  }
  return UnimplementedError(
      "dtype '{}' is not supported (stoke reads F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, "
      "BOOL, F8_E4M3)",
      name);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = path;
  f->data_ = mapped->data();
  f->size_ = mapped->size();
  f->file_ = std::move(mapped);
  RETURN_IF_ERROR(f->Parse());
  return f;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(const uint8_t* data, size_t size,
                                                                       std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  f->data_ = data;
  f->size_ = size;
  RETURN_IF_ERROR(f->Parse());
  return f;
}

const TensorRef* SafetensorsFile::FindTensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::Parse() {
  const std::string& file = name_;
  if (size_ < 8)
    return DataLossError("{}: {} bytes is too short for a safetensors header (need 8)", file, size_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, data_, 8);  // little-endian; stoke only targets LE hosts
  if (header_len > kSafetensorsMaxHeaderBytes) {
    return InvalidArgumentError("{}: header size {} is over the {} byte limit (not a safetensors file?)",
                                file, header_len, kSafetensorsMaxHeaderBytes);
  }
  if (header_len > size_ - 8) {
    return DataLossError("{}: header size {} runs past the end of the {} byte file (truncated?)", file,
                         header_len, size_);
  }
  if (header_len < 2 || data_[8] != '{') {
    return InvalidArgumentError("{}: header is not a JSON object (does not start with '{{')", file);
  }
  const char* hbegin = reinterpret_cast<const char*>(data_ + 8);
  // JSON keeps the last of two equal keys: a file naming a tensor twice would load whichever came last.
  // Such a file is refused, naming the tensor.
  std::set<std::string> names;
  std::string duplicate;
  auto on_key = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !names.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header = json::parse(hbegin, hbegin + header_len, on_key, /*allow_exceptions=*/false);
  if (!duplicate.empty())
    return InvalidArgumentError("{}: duplicate tensor name '{}' in the header", file, duplicate);
  if (header.is_discarded()) {
    // Parse again with exceptions only to get the position of the error (cold path).
    std::string why = "syntax error";
    try {
      json again = json::parse(hbegin, hbegin + header_len);
      (void)again;
    } catch (const json::parse_error& e) {
      why = fmt::format("syntax error at header byte {}", e.byte);
    } catch (const std::exception& e) {
      why = e.what();
    }
    return InvalidArgumentError("{}: header is not valid JSON: {}", file, why);
  }
  if (!header.is_object()) return InvalidArgumentError("{}: header is not a JSON object", file);

  data_offset_ = 8 + header_len;
  const uint64_t buffer_len = size_ - data_offset_;
  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return InvalidArgumentError("{}: __metadata__ is not an object", file);
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return InvalidArgumentError("{}: __metadata__ value of '{}' is not a string", file, mk);
        }
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) return InvalidArgumentError("{}: tensor '{}': entry is not an object", file, key);
    const auto dt = value.find("dtype");
    const auto sh = value.find("shape");
    const auto off = value.find("data_offsets");
    if (dt == value.end() || !dt->is_string()) {
      return InvalidArgumentError("{}: tensor '{}': missing or non-string \"dtype\"", file, key);
    }
    if (sh == value.end() || !sh->is_array()) {
      return InvalidArgumentError("{}: tensor '{}': missing or non-array \"shape\"", file, key);
    }
    if (off == value.end() || !off->is_array() || off->size() != 2) {
      return InvalidArgumentError("{}: tensor '{}': \"data_offsets\" must be [begin, end]", file, key);
    }
    Entry e;
    e.ref.name = key;
    auto dtype = SafetensorsDType(dt->get<std::string>());
    if (!dtype.ok())
      return Status(dtype.status().code(),
                    fmt::format("{}: tensor '{}': {}", file, key, dtype.status().message()));
    e.ref.dtype = *dtype;
    uint64_t numel = 1;
    for (const json& d : *sh) {
      uint64_t dim = 0;
      if (!AsU64(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgumentError("{}: tensor '{}': shape {} has a non-integer or negative dimension", file,
                                    key, sh->dump());
      }
      if (MulOverflows(numel, dim, &numel)) {
        return InvalidArgumentError("{}: tensor '{}': shape {} overflows", file, key, sh->dump());
      }
      e.ref.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    if (MulOverflows(numel, static_cast<uint64_t>(GetDTypeInfo(e.ref.dtype).block_bytes), &nbytes)) {
      return InvalidArgumentError("{}: tensor '{}': shape {} overflows", file, key, sh->dump());
    }
    if (!AsU64((*off)[0], &e.begin) || !AsU64((*off)[1], &e.end)) {
      return InvalidArgumentError("{}: tensor '{}': data_offsets {} are not non-negative integers", file, key,
                                  off->dump());
    }
    if (e.begin > e.end) {
      return InvalidArgumentError("{}: tensor '{}': data_offsets [{}, {}) end before they begin", file, key,
                                  e.begin, e.end);
    }
    if (e.end > buffer_len) {
      return DataLossError(
          "{}: tensor '{}': data_offsets [{}, {}) run past the {} byte data buffer (truncated?)", file, key,
          e.begin, e.end, buffer_len);
    }
    if (e.end - e.begin != nbytes) {
      return InvalidArgumentError("{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}) hold {}",
                                  file, key, DTypeName(e.ref.dtype), sh->dump(), nbytes, e.begin, e.end,
                                  e.end - e.begin);
    }
    e.ref.nbytes = static_cast<size_t>(nbytes);
    e.ref.data = data_ + data_offset_ + e.begin;
    entries.push_back(std::move(e));
  }

  // The spec requires the ranges to tile the data buffer exactly: no overlap, no holes, nothing after the
  // last one.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    if (e.begin < expected) {
      return InvalidArgumentError(
          "{}: tensor '{}': data_offsets [{}, {}) overlap the previous tensor (ends at {})", file, e.ref.name,
          e.begin, e.end, expected);
    }
    if (e.begin > expected) {
      return InvalidArgumentError("{}: tensor '{}': data_offsets [{}, {}) leave a hole of {} bytes before it",
                                  file, e.ref.name, e.begin, e.end, e.begin - expected);
    }
    expected = e.end;
  }
  if (expected != buffer_len) {
    return InvalidArgumentError(
        "{}: tensors cover {} of the {} byte data buffer; {} trailing bytes belong to none", file, expected,
        buffer_len, buffer_len - expected);
  }
  tensors_.reserve(entries.size());
  for (Entry& e : entries) {
    index_.emplace(e.ref.name, tensors_.size());
    tensors_.push_back(std::move(e.ref));
  }
  return OkStatus();
}

}  // namespace stoke
