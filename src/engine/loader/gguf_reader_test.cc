#include "engine/loader/gguf_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "engine/loader/gguf_writer.h"

namespace stoke {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Parses `bytes` from an exactly-sized heap copy, so AddressSanitizer catches any read past the end.
struct Parsed {
  std::unique_ptr<uint8_t[]> buf;
  StatusOr<std::unique_ptr<GgufFile>> file = Status(StatusCode::kUnknown, "unset");
};
Parsed Parse(const std::string& bytes, const std::string& name = "test.gguf") {
  Parsed p;
  p.buf.reset(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
  std::memcpy(p.buf.get(), bytes.data(), bytes.size());
  p.file = GgufFile::FromBuffer(p.buf.get(), bytes.size(), name);
  return p;
}

std::string F32Bytes(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * 4);
}

// A small file with every value type and a few tensors; the last tensor's size is a multiple of the alignment
// so the file has no trailing padding (every proper prefix is then invalid).
std::string SmallFile(uint32_t version = 3) {
  GgufWriter w(version);
  w.AddString("general.architecture", "llama");
  w.AddU8("t.u8", 200).AddI8("t.i8", -100).AddU16("t.u16", 60000).AddI16("t.i16", -30000);
  w.AddU32("t.u32", 4000000000u).AddI32("t.i32", -2000000000).AddF32("t.f32", 1.5f).AddBool("t.bool", true);
  w.AddU64("t.u64", 1ull << 40).AddI64("t.i64", -(1ll << 40)).AddF64("t.f64", 0.1);
  w.AddStringArray("t.strs", {"a", "", "héllo"});
  w.AddArray<int32_t>("t.i32s", {1, -2, 3});
  w.AddArray<float>("t.f32s", {0.5f, -0.25f});
  std::string nested = GgufWriter::EncodeArrayHeader(GgufType::kArray, 2);
  nested += GgufWriter::EncodeArrayHeader(GgufType::kI32, 1) + GgufWriter::EncodePod<int32_t>(7);
  nested += GgufWriter::EncodeArrayHeader(GgufType::kString, 1) + GgufWriter::EncodeString("x");
  w.AddRaw("t.nested", GgufType::kArray, nested);
  std::string q8(34 * 2, '\0');
  q8[0] = 0x00, q8[1] = 0x3c;  // d = 1.0 for block 0
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<char>(j - 16);
  w.AddTensor("q8", 8, {64}, q8);
  w.AddTensor("norm", 0, {3}, F32Bytes({1, 2, 3}));
  w.AddTensor("w", 0, {4, 2}, F32Bytes({0, 1, 2, 3, 4, 5, 6, 7}));
  return w.Finish();
}

TEST(GgufReader, ReadsEveryValueType) {
  Parsed p = Parse(SmallFile());
  ASSERT_TRUE(p.file.ok()) << p.file.status().ToString();
  const GgufFile& f = **p.file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("t.u8"), 200);
  EXPECT_EQ(*f.GetInt("t.i8"), -100);
  EXPECT_EQ(*f.GetInt("t.u16"), 60000);
  EXPECT_EQ(*f.GetInt("t.i16"), -30000);
  EXPECT_EQ(*f.GetInt("t.u32"), 4000000000ll);
  EXPECT_EQ(*f.GetInt("t.i32"), -2000000000);
  EXPECT_EQ(*f.GetInt("t.u64"), 1ll << 40);
  EXPECT_EQ(*f.GetInt("t.i64"), -(1ll << 40));
  EXPECT_EQ(*f.GetInt("t.bool"), 1);
  EXPECT_EQ(*f.GetFloat("t.f32"), 1.5);
  EXPECT_EQ(*f.GetFloat("t.f64"), 0.1);
  EXPECT_EQ(*f.GetFloat("t.u32"), 4e9);  // integers are accepted as numbers
  EXPECT_TRUE(*f.GetBool("t.bool"));
  EXPECT_THAT(*f.GetStringArray("t.strs"), ElementsAre("a", "", "héllo"));
  EXPECT_THAT(*f.GetIntArray("t.i32s"), ElementsAre(1, -2, 3));
  EXPECT_THAT(*f.GetFloatArray("t.f32s"), ElementsAre(0.5f, -0.25f));
  EXPECT_THAT(*f.GetFloatArray("t.i32s"), ElementsAre(1.0f, -2.0f, 3.0f));
  EXPECT_EQ(f.ValueAsJson("t.nested"), nlohmann::json::parse(R"([[7], ["x"]])"));
  EXPECT_EQ(f.ValueAsJson("t.u64"), nlohmann::json(uint64_t{1} << 40));
  EXPECT_TRUE(f.ValueAsJson("absent").is_null());
  EXPECT_EQ(f.TypeOf("t.nested"), GgufType::kArray);
  EXPECT_EQ(f.ArrayElementType("t.nested"), GgufType::kArray);
  EXPECT_EQ(f.ArrayElementType("t.u8"), std::nullopt);
  EXPECT_THAT(f.Keys(),
              ElementsAre("general.architecture", "t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32", "t.f32",
                          "t.bool", "t.u64", "t.i64", "t.f64", "t.strs", "t.i32s", "t.f32s", "t.nested"));
  EXPECT_EQ(f.ValueSummary("t.strs"), "[string x 3]");
  EXPECT_EQ(f.ValueSummary("general.architecture"), "\"llama\"");
  EXPECT_EQ(f.ValueSummary("t.bool"), "true");
  EXPECT_EQ(f.ValueSummary("t.i8"), "-100");
  EXPECT_EQ(f.ValueSummary("t.f32"), "1.5");
}

TEST(GgufReader, LongStringSummaryIsCut) {
  GgufWriter w;
  w.AddString("s", std::string(500, 'a') + "\n");
  Parsed p = Parse(w.Finish());
  ASSERT_TRUE(p.file.ok());
  const std::string s = (*p.file)->ValueSummary("s");
  EXPECT_LT(s.size(), 80u);
  EXPECT_THAT(s, HasSubstr("...\""));
}

TEST(GgufReader, AccessorErrorsNameKeyAndType) {
  Parsed p = Parse(SmallFile());
  ASSERT_TRUE(p.file.ok());
  const GgufFile& f = **p.file;
  auto missing = f.GetString("no.such.key");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no.such.key"));
  auto wrong = f.GetString("t.u32");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("'t.u32' is u32, not a string"));
  EXPECT_EQ(f.GetInt("t.f32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetBool("t.u8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetFloat("general.architecture").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetStringArray("t.i32s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetIntArray("t.strs").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetFloatArray("t.nested").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetIntArray("t.u8").status().code(), StatusCode::kInvalidArgument);
}

TEST(GgufReader, U64AboveInt64MaxIsOutOfRange) {
  GgufWriter w;
  w.AddU64("big", std::numeric_limits<uint64_t>::max());
  w.AddArray<uint64_t>("bigs", {1, std::numeric_limits<uint64_t>::max()});
  Parsed p = Parse(w.Finish());
  ASSERT_TRUE(p.file.ok());
  EXPECT_EQ((*p.file)->GetInt("big").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*p.file)->GetIntArray("bigs").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*p.file)->ValueAsJson("big").get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ((*p.file)->ValueSummary("big"), "18446744073709551615");
}

TEST(GgufReader, EmptyArraysAndEmptyFile) {
  GgufWriter w;
  w.AddStringArray("e.s", {});
  w.AddArray<float>("e.f", std::vector<float>{});
  Parsed p = Parse(w.Finish());
  ASSERT_TRUE(p.file.ok()) << p.file.status().ToString();
  EXPECT_TRUE((*p.file)->GetStringArray("e.s")->empty());
  EXPECT_TRUE((*p.file)->GetFloatArray("e.f")->empty());
  EXPECT_TRUE((*p.file)->tensors().empty());

  Parsed none = Parse(GgufWriter().Finish());  // just the header
  ASSERT_TRUE(none.file.ok()) << none.file.status().ToString();
  EXPECT_TRUE((*none.file)->Keys().empty());
}

TEST(GgufReader, TensorsHaveReversedShapesAndPointIntoTheData) {
  const std::string bytes = SmallFile();
  Parsed p = Parse(bytes);
  ASSERT_TRUE(p.file.ok());
  const GgufFile& f = **p.file;
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  const TensorRef* w = f.FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_THAT(w->shape, ElementsAre(2, 4));  // ne = [4, 2]: rows of 4
  EXPECT_EQ(w->nbytes, 32u);
  float v[8];
  std::memcpy(v, w->data, 32);
  EXPECT_EQ(v[5], 5.0f);
  const TensorRef* q8 = f.FindTensor("q8");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->dtype, DType::kQ8_0);
  EXPECT_THAT(q8->shape, ElementsAre(64));
  EXPECT_EQ(q8->nbytes, 68u);
  EXPECT_EQ(q8->data, p.buf.get() + f.data_offset());
  EXPECT_EQ(f.GgmlType(0), 8u);
  EXPECT_EQ(f.FindTensor("nope"), nullptr);
  // Every tensor lies inside the buffer.
  for (const TensorRef& t : f.tensors()) {
    EXPECT_GE(t.data, p.buf.get());
    EXPECT_LE(t.data + t.nbytes, p.buf.get() + bytes.size());
  }
}

TEST(GgufReader, OpensFilesFromDisk) {
  const std::string path = ::testing::TempDir() + "/gguf_reader_test_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(WriteStringToFile(path, SmallFile()).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->tensors().size(), 3u);
  ::unlink(path.c_str());
  EXPECT_EQ(GgufFile::Open(path).status().code(), StatusCode::kNotFound);
}

TEST(GgufReader, Version2IsReadLikeVersion3) {
  Parsed p = Parse(SmallFile(2));
  ASSERT_TRUE(p.file.ok()) << p.file.status().ToString();
  EXPECT_EQ((*p.file)->version(), 2u);
  EXPECT_EQ((*p.file)->tensors().size(), 3u);
}

TEST(GgufReader, RejectsOtherVersionsAndByteSwappedFiles) {
  Parsed v1 = Parse(SmallFile(1));
  EXPECT_EQ(v1.file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(v1.file.status().message(), HasSubstr("v1 is not supported"));
  Parsed v4 = Parse(SmallFile(4));
  EXPECT_THAT(v4.file.status().message(), HasSubstr("unsupported GGUF version 4"));
  Parsed swapped = Parse(SmallFile(0x03000000));
  EXPECT_THAT(swapped.file.status().message(), HasSubstr("byte-swapped"));
  std::string bad = SmallFile();
  bad[0] = 'X';
  Parsed magic = Parse(bad);
  EXPECT_THAT(magic.file.status().message(), HasSubstr("not a GGUF file"));
}

TEST(GgufReader, EveryTruncationFailsCleanly) {
  const std::string bytes = SmallFile();
  ASSERT_TRUE(Parse(bytes).file.ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Parsed p = Parse(bytes.substr(0, n), "cut.gguf");
    ASSERT_FALSE(p.file.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(p.file.status().code(), StatusCode::kDataLoss) << n << ": " << p.file.status().ToString();
    EXPECT_THAT(p.file.status().message(), HasSubstr("cut.gguf")) << n;
  }
}

// Overwrites every byte of the metadata and tensor records with a few values: must never crash or over-read
// (run under ASan); most variants fail, some (a changed value) still parse.
TEST(GgufReader, CorruptedBytesNeverCrash) {
  const std::string bytes = SmallFile();
  Parsed ok = Parse(bytes);
  ASSERT_TRUE(ok.file.ok());
  const size_t records_end = (*ok.file)->data_offset();
  int failures = 0;
  for (size_t i = 0; i < records_end; ++i) {
    for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      std::string b = bytes;
      b[i] = static_cast<char>(v);
      Parsed p = Parse(b);
      if (!p.file.ok()) {
        ++failures;
        continue;
      }
      for (const TensorRef& t : (*p.file)->tensors()) {  // touch the first and last byte of every tensor
        volatile uint8_t sink = t.data[0] ^ t.data[t.nbytes - 1];
        (void)sink;
      }
    }
  }
  EXPECT_GT(failures, 100);
}

TEST(GgufReader, AlignmentKey) {
  GgufWriter w;
  w.set_alignment(64);
  w.AddU32("general.alignment", 64);
  w.AddTensor("a", 0, {3}, F32Bytes({1, 2, 3}));
  w.AddTensor("b", 0, {1}, F32Bytes({4}));
  Parsed p = Parse(w.Finish());
  ASSERT_TRUE(p.file.ok()) << p.file.status().ToString();
  EXPECT_EQ((*p.file)->alignment(), 64u);
  EXPECT_EQ((*p.file)->data_offset() % 64, 0u);
  float b;
  std::memcpy(&b, (*p.file)->FindTensor("b")->data, 4);
  EXPECT_EQ(b, 4.0f);
  EXPECT_EQ((*p.file)->FindTensor("b")->data - (*p.file)->FindTensor("a")->data, 64);
}

TEST(GgufReader, AlignmentOfOneAllowsAnyOffset) {
  GgufWriter w;
  w.set_alignment(1);
  w.AddU32("general.alignment", 1);
  w.AddTensor("a", 0, {3}, F32Bytes({1, 2, 3}));
  w.AddTensor("b", 1, {1}, std::string("\x00\x3c", 2));
  Parsed p = Parse(w.Finish());
  ASSERT_TRUE(p.file.ok()) << p.file.status().ToString();
  EXPECT_EQ((*p.file)->FindTensor("b")->data - (*p.file)->FindTensor("a")->data, 12);
}

TEST(GgufReader, RejectsBadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufWriter w;
    w.AddU32("general.alignment", a);
    Parsed p = Parse(w.Finish());
    EXPECT_EQ(p.file.status().code(), StatusCode::kInvalidArgument) << a;
    EXPECT_THAT(p.file.status().message(), HasSubstr("not a power of two")) << a;
  }
  GgufWriter w;
  w.AddU64("general.alignment", 32);
  EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("general.alignment must be u32"));
}

TEST(GgufReader, RejectsUnalignedOutOfFileAndOverlappingTensors) {
  {
    GgufWriter w;
    w.AddTensor("t", 0, {8}, "", /*offset=*/4);
    Parsed p = Parse(w.Finish());
    EXPECT_EQ(p.file.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(p.file.status().message(), HasSubstr("tensor 't' (#0): data offset 4 is not a multiple"));
  }
  {
    GgufWriter w;
    w.AddTensor("a", 0, {8}, F32Bytes({0, 0, 0, 0, 0, 0, 0, 0}));
    w.AddTensor("blk.3.attn_q.weight", 0, {8}, "", /*offset=*/4096);
    Parsed p = Parse(w.Finish(), "model.gguf");
    EXPECT_EQ(p.file.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(p.file.status().message(),
                HasSubstr("model.gguf: tensor 'blk.3.attn_q.weight' (#1): data [offset 4096, +32)"));
    EXPECT_THAT(p.file.status().message(), HasSubstr("runs past end of file"));
  }
  {
    GgufWriter w;  // offset + size overflows u64
    w.AddTensor("a", 0, {8}, F32Bytes({0, 0, 0, 0, 0, 0, 0, 0}));
    w.AddTensor("b", 0, {8}, "", /*offset=*/std::numeric_limits<uint64_t>::max() - 31);
    EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("runs past end of file"));
  }
  {
    GgufWriter w;
    w.AddTensor("a", 0, {16}, std::string(64, '\0'));
    w.AddTensor("b", 0, {8}, "", /*offset=*/32);  // inside a's [0, 64)
    Parsed p = Parse(w.Finish());
    EXPECT_EQ(p.file.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(p.file.status().message(),
                HasSubstr("tensor 'a' (#0) data [offset 0, +64) overlaps tensor 'b'"));
  }
  {
    GgufWriter w;  // the same data for two tensors is an overlap too
    w.AddTensor("a", 0, {8}, std::string(32, '\0'));
    w.AddTensor("b", 0, {8}, "", /*offset=*/0);
    EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("overlaps"));
  }
}

TEST(GgufReader, RejectsAbsurdDimensions) {
  const auto error_for = [](uint32_t type, std::vector<uint64_t> ne) {
    GgufWriter w;
    w.AddTensor("t", type, std::move(ne), "", /*offset=*/0);
    return Parse(w.Finish()).file.status();
  };
  EXPECT_THAT(error_for(0, {1, 1, 1, 1, 1}).message(), HasSubstr("n_dims 5 exceeds the maximum of 4"));
  EXPECT_THAT(error_for(0, {4, 0}).message(), HasSubstr("ne[1] = 0 is out of range"));
  EXPECT_THAT(error_for(0, {1ull << 63}).message(), HasSubstr("out of range"));
  EXPECT_THAT(error_for(0, {1ull << 40, 1ull << 40}).message(), HasSubstr("element count overflows"));
  EXPECT_THAT(error_for(8, {33}).message(),
              HasSubstr("ne[0] = 33 is not a multiple of the Q8_0 block size 32"));
  EXPECT_THAT(error_for(0, {1ull << 62}).message(), HasSubstr("byte size overflows"));
  // Huge but representable: fails on the bounds check, without allocating anything.
  EXPECT_THAT(error_for(0, {1ull << 40}).message(), HasSubstr("runs past end of file"));
}

TEST(GgufReader, RejectsUnknownRemovedAndUnsupportedTypes) {
  for (uint32_t type : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u}) {
    GgufWriter w;
    w.AddTensor("t", type, {256}, "", 0);
    Status st = Parse(w.Finish()).file.status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << type;
    EXPECT_THAT(st.message(), HasSubstr("invalid ggml type")) << type;
  }
  GgufWriter w;
  w.AddTensor("t", 13, {256}, "", 0);  // Q5_K: a real type stoke does not implement
  Status st = Parse(w.Finish()).file.status();
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(st.message(), HasSubstr("Q5_K"));
}

TEST(GgufReader, RejectsDuplicates) {
  GgufWriter w;
  w.AddU32("k", 1).AddU32("k", 2);
  EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("'k' (record at byte 41): duplicate key"));
  GgufWriter t;
  t.AddTensor("x", 0, {8}, std::string(32, '\0'));
  t.AddTensor("x", 0, {8}, std::string(32, '\0'));
  EXPECT_THAT(Parse(t.Finish()).file.status().message(), HasSubstr("duplicate tensor name"));
}

TEST(GgufReader, RejectsCountsAndLengthsBeyondTheFile) {
  {
    GgufWriter w;
    w.AddU32("k", 1);
    w.set_count_overrides(std::nullopt, 1ull << 60);
    EXPECT_THAT(Parse(w.Finish()).file.status().message(),
                HasSubstr("metadata_kv_count 1152921504606846976"));
  }
  {
    GgufWriter w;
    w.set_count_overrides(std::numeric_limits<uint64_t>::max(), std::nullopt);
    EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("tensor_count"));
  }
  {
    GgufWriter w;
    w.AddU8("a", 1).AddU8("b", 1).AddU8("c", 1).AddU8("d", 1).AddU8("e", 1);
    w.AddRaw("s", GgufType::kString, GgufWriter::EncodePod(std::numeric_limits<uint64_t>::max()) + "abc");
    Status st = Parse(w.Finish(), "model.gguf").file.status();
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_THAT(st.message(), HasSubstr("model.gguf: metadata key #5 's'"));
    EXPECT_THAT(st.message(), HasSubstr("string length 18446744073709551615 exceeds remaining 3 bytes"));
  }
  {
    GgufWriter w;
    w.AddRaw("arr", GgufType::kArray, GgufWriter::EncodeArrayHeader(GgufType::kU64, 1ull << 62));
    EXPECT_THAT(Parse(w.Finish()).file.status().message(),
                HasSubstr("array of 4611686018427387904 u64 elements"));
  }
  {
    GgufWriter w;  // a key longer than the file
    std::string bytes = w.AddU8("k", 1).Finish();
    uint64_t huge = 1000;
    std::memcpy(&bytes[24], &huge, 8);
    EXPECT_THAT(Parse(bytes).file.status().message(),
                HasSubstr("metadata key #0 at byte 24: key string length 1000"));
  }
}

TEST(GgufReader, RejectsInvalidValueTypesAndDeepNesting) {
  GgufWriter w;
  w.AddRawTyped("k", 13, "x");
  EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("unknown value type 13"));
  GgufWriter e;
  e.AddRaw("k", GgufType::kArray, GgufWriter::EncodePod<uint32_t>(99) + GgufWriter::EncodePod<uint64_t>(0));
  EXPECT_THAT(Parse(e.Finish()).file.status().message(), HasSubstr("unknown array element type 99"));

  std::string deep;  // 20 levels of [array x 1]
  for (int i = 0; i < 20; ++i) deep += GgufWriter::EncodeArrayHeader(GgufType::kArray, 1);
  deep += GgufWriter::EncodeArrayHeader(GgufType::kU8, 0);
  GgufWriter d;
  d.AddRaw("deep", GgufType::kArray, deep);
  EXPECT_THAT(Parse(d.Finish()).file.status().message(), HasSubstr("nested deeper"));
}

TEST(GgufReader, TensorNameLimit) {
  GgufWriter w;
  w.AddTensor(std::string(65, 'n'), 0, {8}, std::string(32, '\0'));
  EXPECT_THAT(Parse(w.Finish()).file.status().message(), HasSubstr("over the limit of 64"));
  GgufWriter ok;
  ok.AddTensor(std::string(64, 'n'), 0, {8}, std::string(32, '\0'));
  EXPECT_TRUE(Parse(ok.Finish()).file.ok());
}

TEST(GgufReader, GgmlTypeMapping) {
  EXPECT_EQ(DTypeFromGgmlType(0), DType::kF32);
  EXPECT_EQ(DTypeFromGgmlType(1), DType::kF16);
  EXPECT_EQ(DTypeFromGgmlType(3), DType::kQ4_1);
  EXPECT_EQ(DTypeFromGgmlType(8), DType::kQ8_0);
  EXPECT_EQ(DTypeFromGgmlType(12), DType::kQ4_K);
  EXPECT_EQ(DTypeFromGgmlType(14), DType::kQ6_K);
  EXPECT_EQ(DTypeFromGgmlType(30), DType::kBF16);
  EXPECT_EQ(DTypeFromGgmlType(4), std::nullopt);
  EXPECT_EQ(DTypeFromGgmlType(13), std::nullopt);
  EXPECT_EQ(*GgmlTypeFromDType(DType::kQ5_1), 7u);
  EXPECT_EQ(*GgmlTypeFromDType(DType::kBF16), 30u);
  EXPECT_FALSE(GgmlTypeFromDType(DType::kU8).ok());
  EXPECT_EQ(GgmlTypeName(13), "Q5_K");
  EXPECT_EQ(GgmlTypeName(31), "type 31 (removed Q4_0_4_4)");
  EXPECT_EQ(GgmlTypeName(99), "type 99 (unknown)");
  // Every mapped type round-trips.
  for (uint32_t id = 0; id < 64; ++id) {
    if (auto d = DTypeFromGgmlType(id)) {
      EXPECT_EQ(*GgmlTypeFromDType(*d), id);
    }
  }
}

TEST(GgufWriter, TypedTensorChecksSize) {
  GgufWriter w;
  const std::vector<int64_t> shape = {2, 32};
  EXPECT_TRUE(w.AddTensor("q", DType::kQ8_0, shape, std::string(68, '\0')).ok());
  EXPECT_FALSE(w.AddTensor("bad", DType::kQ8_0, shape, std::string(67, '\0')).ok());
  Parsed p = Parse(w.Finish());
  ASSERT_TRUE(p.file.ok());
  EXPECT_THAT((*p.file)->FindTensor("q")->shape, ElementsAre(2, 32));
}

}  // namespace
}  // namespace stoke
