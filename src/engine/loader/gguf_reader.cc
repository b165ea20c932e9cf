// GGUF parsing. Every count, length and offset read from the file is checked against the bytes that remain
// before it is used, so a truncated or hostile file yields a Status naming the place, never a crash or a
// huge allocation. Validation is complete before Open returns; accessors then trust the recorded offsets.
#include "engine/loader/gguf_reader.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace stoke {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr size_t kHeaderBytes = 24;          // magic, version, tensor_count, metadata_kv_count
constexpr uint32_t kDefaultAlignment = 32;
constexpr size_t kMaxTensorName = 64;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;                      // nested arrays; bounds recursion on hostile input
constexpr size_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, smallest value
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims = 0, type, offset

constexpr uint32_t kNumGgufTypes = 13;

// Bytes of a fixed-size value; 0 for string and array.
size_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

// Smallest encoding of one array element of type t (a string is at least its length, an array its header).
size_t MinElementBytes(GgufType t) {
  if (t == GgufType::kString) return 8;
  if (t == GgufType::kArray) return 4 + 8;
  return ScalarBytes(t);
}

bool IsIntegerType(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kBool:
      return true;
    default:
      return false;
  }
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Integer or bool at p as int64; u64 values above INT64_MAX set *overflow.
int64_t LoadInt(GgufType t, const uint8_t* p, bool* overflow) {
  *overflow = false;
  switch (t) {
    case GgufType::kU8:
      return Load<uint8_t>(p);
    case GgufType::kI8:
      return Load<int8_t>(p);
    case GgufType::kU16:
      return Load<uint16_t>(p);
    case GgufType::kI16:
      return Load<int16_t>(p);
    case GgufType::kU32:
      return Load<uint32_t>(p);
    case GgufType::kI32:
      return Load<int32_t>(p);
    case GgufType::kI64:
      return Load<int64_t>(p);
    case GgufType::kBool:
      return Load<uint8_t>(p) != 0;
    case GgufType::kU64: {
      const uint64_t v = Load<uint64_t>(p);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) *overflow = true;
      return static_cast<int64_t>(v);
    }
    default:
      return 0;
  }
}

double LoadNumber(GgufType t, const uint8_t* p) {
  if (t == GgufType::kF32) return Load<float>(p);
  if (t == GgufType::kF64) return Load<double>(p);
  if (t == GgufType::kU64) return static_cast<double>(Load<uint64_t>(p));
  bool overflow;
  return static_cast<double>(LoadInt(t, p, &overflow));
}

// Size of the already-validated value of type t at p (strings and arrays walk their contents).
size_t EncodedBytes(GgufType t, const uint8_t* p) {
  if (t == GgufType::kString) return 8 + Load<uint64_t>(p);
  if (t != GgufType::kArray) return ScalarBytes(t);
  const auto elem = static_cast<GgufType>(Load<uint32_t>(p));
  const uint64_t count = Load<uint64_t>(p + 4);
  size_t n = 12;
  if (ScalarBytes(elem) != 0) return n + count * ScalarBytes(elem);
  for (uint64_t i = 0; i < count; ++i) n += EncodedBytes(elem, p + n);
  return n;
}

nlohmann::json ScalarJson(GgufType t, const uint8_t* p) {
  switch (t) {
    case GgufType::kU8:
      return Load<uint8_t>(p);
    case GgufType::kI8:
      return Load<int8_t>(p);
    case GgufType::kU16:
      return Load<uint16_t>(p);
    case GgufType::kI16:
      return Load<int16_t>(p);
    case GgufType::kU32:
      return Load<uint32_t>(p);
    case GgufType::kI32:
      return Load<int32_t>(p);
    case GgufType::kU64:
      return Load<uint64_t>(p);
    case GgufType::kI64:
      return Load<int64_t>(p);
    case GgufType::kF32:
      return static_cast<double>(Load<float>(p));
    case GgufType::kF64:
      return Load<double>(p);
    case GgufType::kBool:
      return Load<uint8_t>(p) != 0;
    case GgufType::kString: {
      const uint64_t len = Load<uint64_t>(p);
      return std::string(reinterpret_cast<const char*>(p + 8), len);
    }
    default:
      return nullptr;
  }
}

// Value of type t at p as JSON; for arrays p points at the array header (element type, count).
nlohmann::json AnyJson(GgufType t, const uint8_t* p) {
  if (t != GgufType::kArray) return ScalarJson(t, p);
  const auto elem = static_cast<GgufType>(Load<uint32_t>(p));
  const uint64_t count = Load<uint64_t>(p + 4);
  nlohmann::json out = nlohmann::json::array();
  const uint8_t* q = p + 12;
  for (uint64_t i = 0; i < count; ++i) {
    out.push_back(AnyJson(elem, q));
    q += EncodedBytes(elem, q);
  }
  return out;
}

struct GgmlTypeEntry {
  const char* name;
  std::optional<DType> dtype;  // nullopt: known to ggml but stoke cannot compute with it
  bool removed;
};

// Indexed by ggml_type id (ggml.h). Removed ids are kept so the error can say so.
const std::array<GgmlTypeEntry, 40>& GgmlTypes() {
  static const std::array<GgmlTypeEntry, 40> kTypes = {{
      {"F32", DType::kF32, false},        {"F16", DType::kF16, false},
      {"Q4_0", DType::kQ4_0, false},      {"Q4_1", DType::kQ4_1, false},
      {"Q4_2", std::nullopt, true},       {"Q4_3", std::nullopt, true},
      {"Q5_0", DType::kQ5_0, false},      {"Q5_1", DType::kQ5_1, false},
      {"Q8_0", DType::kQ8_0, false},      {"Q8_1", std::nullopt, false},
      {"Q2_K", std::nullopt, false},      {"Q3_K", std::nullopt, false},
      {"Q4_K", DType::kQ4_K, false},      {"Q5_K", std::nullopt, false},
      {"Q6_K", DType::kQ6_K, false},      {"Q8_K", std::nullopt, false},
      {"IQ2_XXS", std::nullopt, false},   {"IQ2_XS", std::nullopt, false},
      {"IQ3_XXS", std::nullopt, false},   {"IQ1_S", std::nullopt, false},
      {"IQ4_NL", std::nullopt, false},    {"IQ3_S", std::nullopt, false},
      {"IQ2_S", std::nullopt, false},     {"IQ4_XS", std::nullopt, false},
      {"I8", DType::kI8, false},          {"I16", DType::kI16, false},
      {"I32", DType::kI32, false},        {"I64", DType::kI64, false},
      {"F64", DType::kF64, false},        {"IQ1_M", std::nullopt, false},
      {"BF16", DType::kBF16, false},      {"Q4_0_4_4", std::nullopt, true},
      {"Q4_0_4_8", std::nullopt, true},   {"Q4_0_8_8", std::nullopt, true},
      {"TQ1_0", std::nullopt, false},     {"TQ2_0", std::nullopt, false},
      {"IQ4_NL_4_4", std::nullopt, true}, {"IQ4_NL_4_8", std::nullopt, true},
      {"IQ4_NL_8_8", std::nullopt, true}, {"MXFP4", std::nullopt, false},
  }};
  return kTypes;
}

// Reads little-endian fields from [0, size) with bounds checks; never reads past the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }
  template <typename T>
  bool Read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Skip(uint64_t n) {
    if (n > remaining()) return false;
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The parse state and its error constructors, which all name the file and the place.
class Parser {
 public:
  Parser(const std::string& name, const uint8_t* data, size_t size)
      : name_(name), cur_(data, size), size_(size) {}
  Cursor& cur() { return cur_; }

  Status Truncated(const std::string& where, std::string_view what, size_t need) const {
    return DataLossError("{}: {} at byte {}: {} needs {} bytes but only {} remain (file size {})", name_,
                         where, cur_.pos(), what, need, cur_.remaining(), size_);
  }
  template <typename T>
  Status ReadField(T* out, const std::string& where, std::string_view what) {
    if (!cur_.Read(out)) return Truncated(where, what, sizeof(T));
    return OkStatus();
  }
  // A gguf string (u64 length + bytes) as a view into the buffer.
  Status ReadString(std::string_view* out, const std::string& where, std::string_view what) {
    uint64_t len;
    RETURN_IF_ERROR(ReadField(&len, where, what));
    if (len > cur_.remaining()) {
      return DataLossError("{}: {} at byte {}: {} length {} exceeds remaining {} bytes", name_, where,
                           cur_.pos() - 8, what, len, cur_.remaining());
    }
    *out = std::string_view(reinterpret_cast<const char*>(cur_.here()), len);
    cur_.Skip(len);
    return OkStatus();
  }
  Status ReadType(GgufType* out, const std::string& where, std::string_view what) {
    uint32_t t;
    RETURN_IF_ERROR(ReadField(&t, where, what));
    if (t >= kNumGgufTypes) {
      return DataLossError("{}: {} at byte {}: unknown {} {}", name_, where, cur_.pos() - 4, what, t);
    }
    *out = static_cast<GgufType>(t);
    return OkStatus();
  }
  // Validates and skips a value of type t; for arrays reads the header first.
  Status SkipValue(GgufType t, int depth, const std::string& where) {
    if (t == GgufType::kString) {
      std::string_view s;
      return ReadString(&s, where, "string");
    }
    if (t != GgufType::kArray) {
      if (!cur_.Skip(ScalarBytes(t))) return Truncated(where, GgufTypeName(t), ScalarBytes(t));
      return OkStatus();
    }
    if (depth >= kMaxArrayDepth) {
      return InvalidArgumentError("{}: {} at byte {}: arrays nested deeper than {}", name_, where, cur_.pos(),
                                  kMaxArrayDepth);
    }
    GgufType elem;
    uint64_t count;
    RETURN_IF_ERROR(ReadType(&elem, where, "array element type"));
    RETURN_IF_ERROR(ReadField(&count, where, "array length"));
    return SkipElements(elem, count, depth, where);
  }
  Status SkipElements(GgufType elem, uint64_t count, int depth, const std::string& where) {
    const size_t min = MinElementBytes(elem);
    if (count > cur_.remaining() / min) {
      return DataLossError(
          "{}: {} at byte {}: array of {} {} elements (at least {} bytes each) exceeds remaining {} bytes",
          name_, where, cur_.pos(), count, GgufTypeName(elem), min, cur_.remaining());
    }
    if (elem != GgufType::kString && elem != GgufType::kArray) {
      cur_.Skip(count * min);
      return OkStatus();
    }
    for (uint64_t i = 0; i < count; ++i) {
      Status st = SkipValue(elem, depth + 1, where);
      if (!st.ok()) return Status(st.code(), fmt::format("{} (array element #{})", st.message(), i));
    }
    return OkStatus();
  }

 private:
  const std::string& name_;
  Cursor cur_;
  size_t size_;
};

std::string Quote(std::string_view s, size_t max) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const char c = s[i];
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else
      out += c;
  }
  out += s.size() > max ? "...\"" : "\"";
  return out;
}

}  // namespace

std::string_view GgufTypeName(GgufType t) {
  static constexpr std::array<std::string_view, kNumGgufTypes> kNames = {
      "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < kNumGgufTypes ? kNames[i] : "unknown";
}

std::optional<DType> DTypeFromGgmlType(uint32_t ggml_type) {
  if (ggml_type >= GgmlTypes().size()) return std::nullopt;
  return GgmlTypes()[ggml_type].dtype;
}

StatusOr<uint32_t> GgmlTypeFromDType(DType t) {
  for (uint32_t i = 0; i < GgmlTypes().size(); ++i) {
    if (GgmlTypes()[i].dtype == t) return i;
  }
  return InvalidArgumentError("{} has no GGML type", DTypeName(t));
}

std::string GgmlTypeName(uint32_t ggml_type) {
  if (ggml_type >= GgmlTypes().size()) return fmt::format("type {} (unknown)", ggml_type);
  const GgmlTypeEntry& e = GgmlTypes()[ggml_type];
  if (e.removed) return fmt::format("type {} (removed {})", ggml_type, e.name);
  return e.name;
}

GgufFile::~GgufFile() = default;

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->data_ = mapped->data();
  f->size_ = mapped->size();
  f->file_ = std::move(mapped);
  f->path_ = path;
  RETURN_IF_ERROR(f->Parse());
  return f;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(const uint8_t* data, size_t size, std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->data_ = data;
  f->size_ = size;
  f->path_ = std::move(name);
  RETURN_IF_ERROR(f->Parse());
  return f;
}

Status GgufFile::Parse() {
  const std::string& name = path_;
  if (size_ < 4 || Load<uint32_t>(data_) != kGgufMagic) {
    if (size_ < 4) return DataLossError("{}: {} bytes is too short for a GGUF file", name, size_);
    return InvalidArgumentError(
        "{}: not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x}, expected 'GGUF')", name, data_[0],
        data_[1], data_[2], data_[3]);
  }
  if (size_ < kHeaderBytes) {
    return DataLossError("{}: truncated GGUF header ({} of {} bytes)", name, size_, kHeaderBytes);
  }
  version_ = Load<uint32_t>(data_ + 4);
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped >= 1 && swapped <= 3) {
      return InvalidArgumentError(
          "{}: byte-swapped (big-endian) GGUF v{} (version field reads 0x{:08x}); only "
          "little-endian files are supported",
          name, swapped, version_);
    }
    if (version_ == 1) return InvalidArgumentError("{}: GGUF v1 is not supported (only v2 and v3)", name);
    return InvalidArgumentError("{}: unsupported GGUF version {} (only v2 and v3)", name, version_);
  }
  Parser p(name, data_, size_);
  Cursor& cur = p.cur();
  cur.Skip(8);
  uint64_t tensor_count, kv_count;
  RETURN_IF_ERROR(p.ReadField(&tensor_count, "header", "tensor_count"));
  RETURN_IF_ERROR(p.ReadField(&kv_count, "header", "metadata_kv_count"));
  // Each record takes some minimum number of bytes, so counts larger than the file allows are corrupt; this
  // also bounds every reserve() below.
  if (kv_count > cur.remaining() / kMinKvBytes) {
    return DataLossError("{}: header: metadata_kv_count {} cannot fit in the remaining {} bytes", name,
                         kv_count, cur.remaining());
  }
  if (tensor_count > (cur.remaining() - kv_count * kMinKvBytes) / kMinTensorInfoBytes) {
    return DataLossError("{}: header: tensor_count {} cannot fit in the remaining {} bytes", name,
                         tensor_count, cur.remaining());
  }

  // Metadata.
  keys_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string where = fmt::format("metadata key #{}", i);
    const size_t start = cur.pos();
    std::string_view key;
    RETURN_IF_ERROR(p.ReadString(&key, where, "key string"));
    where = fmt::format("metadata key #{} '{}' (record at byte {})", i, key.substr(0, 100), start);
    if (values_.find(key) != values_.end()) {
      return InvalidArgumentError("{}: {}: duplicate key", name, where);
    }
    Value v{};
    RETURN_IF_ERROR(p.ReadType(&v.type, where, "value type"));
    if (v.type == GgufType::kArray) {
      v.offset = cur.pos();  // accessors read arrays from their header (element type, count)
      RETURN_IF_ERROR(p.ReadType(&v.elem_type, where, "array element type"));
      RETURN_IF_ERROR(p.ReadField(&v.count, where, "array length"));
      RETURN_IF_ERROR(p.SkipElements(v.elem_type, v.count, 0, where));
    } else {
      v.offset = cur.pos();
      RETURN_IF_ERROR(p.SkipValue(v.type, 0, where));
    }
    keys_.emplace_back(key);
    values_.emplace(std::string(key), v);
  }

  // general.alignment: u32, a power of two (gguf.cpp's rule; the spec also asks for a multiple of 8).
  alignment_ = kDefaultAlignment;
  if (auto it = values_.find(std::string_view("general.alignment")); it != values_.end()) {
    if (it->second.type != GgufType::kU32) {
      return InvalidArgumentError("{}: general.alignment must be u32, not {}", name,
                                  GgufTypeName(it->second.type));
    }
    const uint32_t a = Load<uint32_t>(data_ + it->second.offset);
    if (a == 0 || (a & (a - 1)) != 0) {
      return InvalidArgumentError("{}: general.alignment = {} is not a power of two", name, a);
    }
    alignment_ = a;
  }

  // Tensor records.
  std::vector<uint64_t> offsets;
  tensors_.reserve(tensor_count);
  ggml_types_.reserve(tensor_count);
  offsets.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    std::string where = fmt::format("tensor #{}", i);
    const size_t start = cur.pos();
    std::string_view tname;
    RETURN_IF_ERROR(p.ReadString(&tname, where, "name"));
    where = fmt::format("tensor '{}' (#{}, record at byte {})", tname.substr(0, 100), i, start);
    if (tname.size() > kMaxTensorName) {
      return InvalidArgumentError("{}: {}: name is {} bytes, over the limit of {}", name, where, tname.size(),
                                  kMaxTensorName);
    }
    if (tensor_index_.find(tname) != tensor_index_.end()) {
      return InvalidArgumentError("{}: {}: duplicate tensor name", name, where);
    }
    uint32_t n_dims;
    RETURN_IF_ERROR(p.ReadField(&n_dims, where, "n_dims"));
    if (n_dims > kMaxDims) {
      return InvalidArgumentError("{}: {}: n_dims {} exceeds the maximum of {}", name, where, n_dims,
                                  kMaxDims);
    }
    std::array<uint64_t, kMaxDims> ne{};
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      RETURN_IF_ERROR(p.ReadField(&ne[d], where, "ne[]"));
      if (ne[d] == 0 || ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgumentError("{}: {}: dimension ne[{}] = {} is out of range", name, where, d, ne[d]);
      }
      if (__builtin_mul_overflow(numel, ne[d], &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return InvalidArgumentError("{}: {}: element count overflows (ne[{}] = {})", name, where, d, ne[d]);
      }
    }
    uint32_t ggml_type;
    RETURN_IF_ERROR(p.ReadField(&ggml_type, where, "ggml_type"));
    const std::optional<DType> dtype = DTypeFromGgmlType(ggml_type);
    if (!dtype) {
      if (ggml_type < GgmlTypes().size() && !GgmlTypes()[ggml_type].removed) {
        return UnimplementedError("{}: {}: ggml type {} is not supported by stoke", name, where,
                                  GgmlTypeName(ggml_type));
      }
      return InvalidArgumentError("{}: {}: invalid ggml type: {}", name, where, GgmlTypeName(ggml_type));
    }
    const DTypeInfo& info = GetDTypeInfo(*dtype);
    const uint64_t row = n_dims == 0 ? 1 : ne[0];
    if (row % info.block_elems != 0) {
      return InvalidArgumentError("{}: {}: row length ne[0] = {} is not a multiple of the {} block size {}",
                                  name, where, row, info.name, info.block_elems);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel / info.block_elems, static_cast<uint64_t>(info.block_bytes), &nbytes)) {
      return InvalidArgumentError("{}: {}: byte size overflows", name, where);
    }
    uint64_t offset;
    RETURN_IF_ERROR(p.ReadField(&offset, where, "data offset"));

    TensorRef t;
    t.name = std::string(tname);
    t.dtype = *dtype;
    for (uint32_t d = n_dims; d > 0; --d) t.shape.push_back(static_cast<int64_t>(ne[d - 1]));
    t.nbytes = nbytes;
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
    ggml_types_.push_back(ggml_type);
    offsets.push_back(offset);
  }

  // Data section: starts at the next multiple of the alignment after the tensor records.
  data_offset_ = (cur.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (tensor_count > 0 && data_offset_ > size_) {
    return DataLossError(
        "{}: data section would start at byte {} (tensor records end at {}, alignment {}), past "
        "end of file (size {})",
        name, data_offset_, cur.pos(), alignment_, size_);
  }
  const size_t data_bytes = tensor_count > 0 ? size_ - data_offset_ : 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorRef& t = tensors_[i];
    if (offsets[i] % alignment_ != 0) {
      return DataLossError("{}: tensor '{}' (#{}): data offset {} is not a multiple of the alignment {}",
                           name, t.name, i, offsets[i], alignment_);
    }
    if (offsets[i] > data_bytes || t.nbytes > data_bytes - offsets[i]) {
      return DataLossError(
          "{}: tensor '{}' (#{}): data [offset {}, +{}) at file byte {} runs past end of file "
          "(size {})",
          name, t.name, i, offsets[i], t.nbytes, data_offset_ + offsets[i], size_);
    }
  }
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t a = order[k - 1], b = order[k];
    if (offsets[a] + tensors_[a].nbytes > offsets[b]) {
      return DataLossError(
          "{}: tensor '{}' (#{}) data [offset {}, +{}) overlaps tensor '{}' (#{}) at offset {}", name,
          tensors_[a].name, a, offsets[a], tensors_[a].nbytes, tensors_[b].name, b, offsets[b]);
    }
  }
  for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].data = data_ + data_offset_ + offsets[i];
  return OkStatus();
}

// ---- Accessors -------------------------------------------------------------------------------------------

bool GgufFile::Has(std::string_view key) const {
  return values_.find(key) != values_.end();
}

StatusOr<const GgufFile::Value*> GgufFile::Lookup(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return NotFoundError("{}: metadata key '{}' not found", path_, key);
  return &it->second;
}

std::optional<GgufType> GgufFile::TypeOf(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second.type;
}

std::optional<GgufType> GgufFile::ArrayElementType(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.type != GgufType::kArray) return std::nullopt;
  return it->second.elem_type;
}

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (v->type != GgufType::kString) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not a string", path_, key,
                                GgufTypeName(v->type));
  }
  const uint64_t len = Load<uint64_t>(data_ + v->offset);
  return std::string(reinterpret_cast<const char*>(data_ + v->offset + 8), len);
}

StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (!IsIntegerType(v->type)) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not an integer", path_, key,
                                GgufTypeName(v->type));
  }
  bool overflow;
  const int64_t x = LoadInt(v->type, data_ + v->offset, &overflow);
  if (overflow) {
    return OutOfRangeError("{}: metadata key '{}' = {} does not fit in int64", path_, key,
                           Load<uint64_t>(data_ + v->offset));
  }
  return x;
}

StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (v->type == GgufType::kBool ||
      (!IsIntegerType(v->type) && v->type != GgufType::kF32 && v->type != GgufType::kF64)) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not a number", path_, key,
                                GgufTypeName(v->type));
  }
  return LoadNumber(v->type, data_ + v->offset);
}

StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (v->type != GgufType::kBool) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not a bool", path_, key, GgufTypeName(v->type));
  }
  return Load<uint8_t>(data_ + v->offset) != 0;
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not an array of strings", path_, key,
                                v->type == GgufType::kArray
                                    ? fmt::format("an array of {}", GgufTypeName(v->elem_type))
                                    : std::string(GgufTypeName(v->type)));
  }
  std::vector<std::string> out;
  out.reserve(v->count);
  const uint8_t* q = data_ + v->offset + 12;
  for (uint64_t i = 0; i < v->count; ++i) {
    const uint64_t len = Load<uint64_t>(q);
    out.emplace_back(reinterpret_cast<const char*>(q + 8), len);
    q += 8 + len;
  }
  return out;
}

StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (v->type != GgufType::kArray || !IsIntegerType(v->elem_type)) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not an array of integers", path_, key,
                                v->type == GgufType::kArray
                                    ? fmt::format("an array of {}", GgufTypeName(v->elem_type))
                                    : std::string(GgufTypeName(v->type)));
  }
  std::vector<int64_t> out(v->count);
  const size_t step = ScalarBytes(v->elem_type);
  const uint8_t* q = data_ + v->offset + 12;
  for (uint64_t i = 0; i < v->count; ++i) {
    bool overflow;
    out[i] = LoadInt(v->elem_type, q + i * step, &overflow);
    if (overflow)
      return OutOfRangeError("{}: metadata key '{}' element #{} does not fit in int64", path_, key, i);
  }
  return out;
}

StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  ASSIGN_OR_RETURN(const Value* v, Lookup(key));
  if (v->type != GgufType::kArray || v->elem_type == GgufType::kBool ||
      (!IsIntegerType(v->elem_type) && v->elem_type != GgufType::kF32 && v->elem_type != GgufType::kF64)) {
    return InvalidArgumentError("{}: metadata key '{}' is {}, not an array of numbers", path_, key,
                                v->type == GgufType::kArray
                                    ? fmt::format("an array of {}", GgufTypeName(v->elem_type))
                                    : std::string(GgufTypeName(v->type)));
  }
  std::vector<float> out(v->count);
  const size_t step = ScalarBytes(v->elem_type);
  const uint8_t* q = data_ + v->offset + 12;
  if (v->elem_type == GgufType::kF32) {
    if (v->count > 0) std::memcpy(out.data(), q, v->count * 4);
    return out;
  }
  for (uint64_t i = 0; i < v->count; ++i) out[i] = static_cast<float>(LoadNumber(v->elem_type, q + i * step));
  return out;
}

std::vector<std::string> GgufFile::Keys() const {
  return keys_;
}

std::string GgufFile::ValueSummary(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return "(absent)";
  const Value& v = it->second;
  const uint8_t* p = data_ + v.offset;
  switch (v.type) {
    case GgufType::kArray:
      return fmt::format("[{} x {}]", GgufTypeName(v.elem_type), v.count);
    case GgufType::kString: {
      const uint64_t len = Load<uint64_t>(p);
      return Quote(std::string_view(reinterpret_cast<const char*>(p + 8), len), 60);
    }
    case GgufType::kBool:
      return Load<uint8_t>(p) ? "true" : "false";
    case GgufType::kF32:
      return fmt::format("{}", Load<float>(p));
    case GgufType::kF64:
      return fmt::format("{}", Load<double>(p));
    case GgufType::kU64:
      return fmt::format("{}", Load<uint64_t>(p));
    default: {
      bool overflow;
      return fmt::format("{}", LoadInt(v.type, p, &overflow));
    }
  }
}

nlohmann::json GgufFile::ValueAsJson(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return nullptr;
  return AnyJson(it->second.type, data_ + it->second.offset);
}

const TensorRef* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace stoke
