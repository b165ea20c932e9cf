#include "engine/loader/safetensors_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/file_util.h"

namespace stoke {
namespace {

using ::testing::HasSubstr;

// u64 LE header length + header + data.
std::string Pack(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const std::string& bytes,
                                                 std::string name = "t.safetensors") {
  return SafetensorsFile::FromBuffer(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                     std::move(name));
}

// A valid file: a [2, 3] F32, a scalar F16, an empty BF16 and a [4] I64, with metadata, header padded with
// spaces (as the Python writer does). Tensors are listed out of offset order on purpose.
std::string ValidFile(std::string* data_out = nullptr) {
  std::string data;
  const float f[6] = {1, 2, 3, 4, 5, 6};
  data.append(reinterpret_cast<const char*>(f), sizeof(f));  // [0, 24)
  const int64_t ids[4] = {7, -8, 9, 1LL << 40};
  data.append(reinterpret_cast<const char*>(ids), sizeof(ids));  // [24, 56)
  data += std::string("\x00\x3c", 2);                            // fp16 1.0 at [56, 58)
  std::string header = R"({"__metadata__":{"format":"pt"},)"
                       R"("ids":{"dtype":"I64","shape":[4],"data_offsets":[24,56]},)"
                       R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("empty":{"dtype":"BF16","shape":[0,5],"data_offsets":[56,56]},)"
                       R"("s":{"dtype":"F16","shape":[],"data_offsets":[56,58]}})";
  header.append(5, ' ');
  if (data_out) *data_out = data;
  return Pack(header, data);
}

TEST(SafetensorsTest, ParsesValidFile) {
  const std::string bytes = ValidFile();
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const auto& st = **f;
  EXPECT_EQ(st.metadata().at("format"), "pt");
  ASSERT_EQ(st.tensors().size(), 4u);
  // Offset order: w, ids, then the empty tensor and the scalar (both begin at 56; the empty one ends first).
  EXPECT_EQ(st.tensors()[0].name, "w");
  EXPECT_EQ(st.tensors()[1].name, "ids");
  EXPECT_EQ(st.tensors()[2].name, "empty");
  EXPECT_EQ(st.tensors()[3].name, "s");

  const TensorRef* w = st.FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->nbytes, 24u);
  float v[6];
  std::memcpy(v, w->data, sizeof(v));
  EXPECT_EQ(v[5], 6.0f);
  EXPECT_EQ(w->data, reinterpret_cast<const uint8_t*>(bytes.data()) + st.data_offset());

  const TensorRef* ids = st.FindTensor("ids");
  ASSERT_NE(ids, nullptr);
  int64_t last;
  std::memcpy(&last, ids->data + 24, 8);
  EXPECT_EQ(last, 1LL << 40);

  const TensorRef* empty = st.FindTensor("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(empty->nbytes, 0u);

  const TensorRef* s = st.FindTensor("s");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(s->nbytes, 2u);
  EXPECT_EQ(st.FindTensor("nope"), nullptr);
}

TEST(SafetensorsTest, EveryDTypeHasItsSize) {
  const std::vector<std::pair<std::string, std::pair<DType, int>>> cases = {
      {"F64", {DType::kF64, 8}},   {"F32", {DType::kF32, 4}}, {"F16", {DType::kF16, 2}},
      {"BF16", {DType::kBF16, 2}}, {"I64", {DType::kI64, 8}}, {"I32", {DType::kI32, 4}},
      {"I16", {DType::kI16, 2}},   {"I8", {DType::kI8, 1}},   {"U64", {DType::kU64, 8}},
      {"U32", {DType::kU32, 4}},   {"U16", {DType::kU16, 2}}, {"U8", {DType::kU8, 1}},
      {"BOOL", {DType::kBool, 1}}, {"F8_E4M3", {DType::kF8E4M3, 1}},
  };
  for (const auto& [name, expect] : cases) {
    const int bytes = 3 * expect.second;
    const std::string header =
        R"({"x":{"dtype":")" + name + R"(","shape":[3],"data_offsets":[0,)" + std::to_string(bytes) + "]}}";
    auto f = Parse(Pack(header, std::string(bytes, '\1')));
    ASSERT_TRUE(f.ok()) << name << ": " << f.status().ToString();
    EXPECT_EQ((*f)->tensors()[0].dtype, expect.first) << name;
    // One byte short must fail for every dtype.
    const std::string short_header = R"({"x":{"dtype":")" + name + R"(","shape":[3],"data_offsets":[0,)" +
                                     std::to_string(bytes - 1) + "]}}";
    EXPECT_FALSE(Parse(Pack(short_header, std::string(bytes - 1, '\1'))).ok()) << name;
  }
}

TEST(SafetensorsTest, UnsupportedDTypeIsUnimplementedNamingTensorAndDType) {
  for (const char* dt : {"F8_E5M2", "F8_E8M0", "F4", "C64", "Q4_0"}) {
    const std::string header =
        std::string(R"({"layer.w":{"dtype":")") + dt + R"(","shape":[2],"data_offsets":[0,2]}})";
    auto f = Parse(Pack(header, "ab"), "m.safetensors");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented) << dt;
    EXPECT_THAT(f.status().message(), HasSubstr("m.safetensors"));
    EXPECT_THAT(f.status().message(), HasSubstr("layer.w"));
    EXPECT_THAT(f.status().message(), HasSubstr(dt));
    if (std::string_view(dt).starts_with("F8_")) {  // the fp8 type it does read
      EXPECT_THAT(f.status().message(), HasSubstr("F8_E4M3"));
    }
  }
}

struct BadCase {
  const char* what;
  std::string bytes;
  StatusCode code;
  const char* needle;  // must appear in the message
};

std::vector<BadCase> BadCases() {
  const std::string d24(24, '\0');
  auto one = [&](const std::string& entry, const std::string& data = std::string(24, '\0')) {
    return Pack("{" + entry + "}", data);
  };
  std::string huge(8, '\0');
  const uint64_t big = kSafetensorsMaxHeaderBytes + 1;
  std::memcpy(huge.data(), &big, 8);
  huge += "{}";
  std::string past(8, '\0');
  const uint64_t n = 100;
  std::memcpy(past.data(), &n, 8);
  past += "{}";
  return {
      {"empty file", "", StatusCode::kDataLoss, "too short"},
      {"7 bytes", "\x02\0\0\0\0\0\0", StatusCode::kDataLoss, "too short"},
      {"header over limit", huge, StatusCode::kInvalidArgument, "limit"},
      {"header past end", past, StatusCode::kDataLoss, "past the end"},
      {"not json", Pack("{nope", ""), StatusCode::kInvalidArgument, "not valid JSON"},
      {"array header", Pack("[1,2]", ""), StatusCode::kInvalidArgument, "not a JSON object"},
      {"entry not object", one(R"("w":3)"), StatusCode::kInvalidArgument, "'w'"},
      {"no dtype", one(R"("w":{"shape":[6],"data_offsets":[0,24]})"), StatusCode::kInvalidArgument, "dtype"},
      {"no shape", one(R"("w":{"dtype":"F32","data_offsets":[0,24]})"), StatusCode::kInvalidArgument,
       "shape"},
      {"no offsets", one(R"("w":{"dtype":"F32","shape":[6]})"), StatusCode::kInvalidArgument, "data_offsets"},
      {"3 offsets", one(R"("w":{"dtype":"F32","shape":[6],"data_offsets":[0,24,24]})"),
       StatusCode::kInvalidArgument, "data_offsets"},
      {"negative dim", one(R"("w":{"dtype":"F32","shape":[-6],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "shape"},
      {"float dim", one(R"("w":{"dtype":"F32","shape":[6.0],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "shape"},
      {"shape overflow", one(R"("w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "overflows"},
      {"bytes overflow", one(R"("w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "overflows"},
      {"negative offset", one(R"("w":{"dtype":"F32","shape":[6],"data_offsets":[-1,24]})"),
       StatusCode::kInvalidArgument, "data_offsets"},
      {"end before begin", one(R"("w":{"dtype":"F32","shape":[0],"data_offsets":[24,0]})"),
       StatusCode::kInvalidArgument, "end before"},
      {"past buffer", one(R"("w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]})"), StatusCode::kDataLoss,
       "past the 24 byte data buffer"},
      {"size mismatch", one(R"("w":{"dtype":"F32","shape":[5],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "needs 20 bytes"},
      {"overlap",
       one(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]})"),
       StatusCode::kInvalidArgument, "overlap"},
      {"duplicate range",
       one(R"("a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]},"b":{"dtype":"I32","shape":[6],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "overlap"},
      {"hole",
       one(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]})"),
       StatusCode::kInvalidArgument, "hole"},
      {"hole at start", one(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]})"),
       StatusCode::kInvalidArgument, "hole"},
      {"trailing bytes", one(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
       StatusCode::kInvalidArgument, "trailing"},
      {"metadata not object",
       one(R"("__metadata__":[1],"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "__metadata__"},
      {"metadata value not string",
       one(R"("__metadata__":{"n":1},"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]})"),
       StatusCode::kInvalidArgument, "'n'"},
  };
}

TEST(SafetensorsTest, MalformedFilesGiveClearErrors) {
  for (const BadCase& c : BadCases()) {
    auto f = Parse(c.bytes, "bad.safetensors");
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_EQ(f.status().code(), c.code) << c.what << ": " << f.status().ToString();
    EXPECT_THAT(f.status().message(), HasSubstr("bad.safetensors")) << c.what;
    EXPECT_THAT(f.status().message(), HasSubstr(c.needle)) << c.what << ": " << f.status().ToString();
  }
}

TEST(SafetensorsTest, ErrorsNameTheTensor) {
  const std::string header = R"({"encoder.layer.3.w":{"dtype":"F32","shape":[5],"data_offsets":[0,24]}})";
  auto f = Parse(Pack(header, std::string(24, '\0')));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("'encoder.layer.3.w'"));
}

// JSON would keep the second of two equal keys; the reader refuses the file instead. A key named twice inside
// a tensor's entry is not a tensor name (the JSON rules apply there).
TEST(SafetensorsTest, DuplicateTensorNameIsRefused) {
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  auto f = Parse(Pack(header, std::string(16, '\0')), "dup.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("duplicate tensor name 'w'"));
  EXPECT_THAT(f.status().message(), HasSubstr("dup.safetensors"));
}

// Every proper prefix of a valid file is rejected, and reading it never touches bytes past the end (each
// prefix is copied into a buffer of exactly its size so ASan builds catch an over-read).
TEST(SafetensorsTest, TruncationAtEveryByteIsRejected) {
  const std::string bytes = ValidFile();
  ASSERT_TRUE(Parse(bytes).ok());
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + len);
    auto f = SafetensorsFile::FromBuffer(prefix.data(), prefix.size(), "cut.safetensors");
    EXPECT_FALSE(f.ok()) << "prefix of " << len << " bytes was accepted";
    if (!f.ok()) EXPECT_THAT(f.status().message(), HasSubstr("cut.safetensors"));
  }
}

TEST(SafetensorsTest, OpenMapsFileAndNamesPathInErrors) {
  const auto dir = std::filesystem::temp_directory_path() / ("stoke_st_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.safetensors").string();
  const std::string cut = (dir / "cut.safetensors").string();
  std::string data;
  const std::string bytes = ValidFile(&data);
  ASSERT_TRUE(WriteStringToFile(good, bytes).ok());
  ASSERT_TRUE(WriteStringToFile(cut, bytes.substr(0, bytes.size() - 3)).ok());
  auto f = SafetensorsFile::Open(good);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), good);
  EXPECT_EQ((*f)->file_size(), bytes.size());
  EXPECT_EQ(std::memcmp((*f)->FindTensor("w")->data, data.data(), 24), 0);

  auto c = SafetensorsFile::Open(cut);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(c.status().message(), HasSubstr(cut));
  EXPECT_THAT(c.status().message(), HasSubstr("truncated"));

  auto missing = SafetensorsFile::Open((dir / "missing.safetensors").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stoke
