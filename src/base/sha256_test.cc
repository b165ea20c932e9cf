#include "base/sha256.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "base/file_util.h"

namespace stoke {
namespace {

// FIPS 180-4 / NIST CAVP vectors.
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(
      Sha256Hex(
          "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
          "mnopqrstnopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256Test, MillionA) {
  Sha256 h;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.Update(chunk);
  EXPECT_EQ(h.FinishHex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Block-boundary lengths (55, 56, 63, 64, 65 bytes) exercise both padding branches; split updates must agree.
TEST(Sha256Test, SplitUpdatesMatchOneShot) {
  std::string data;
  for (int i = 0; i < 300; ++i) data += static_cast<char>(i * 7 + 3);
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 300}) {
    const std::string_view s(data.data(), len);
    const std::string one = Sha256Hex(s);
    for (size_t split = 0; split <= len; split += 13) {
      Sha256 h;
      h.Update(s.substr(0, split));
      h.Update(s.substr(split));
      EXPECT_EQ(h.FinishHex(), one) << "len " << len << " split " << split;
    }
  }
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256Test, FileMatchesMemoryAndMissingFileIsNotFound) {
  const std::string path = (std::filesystem::temp_directory_path() / "stoke_sha256_test.bin").string();
  std::string data(3 * (1 << 20) + 17, '\0');  // spans several 1 MiB read chunks
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  ASSERT_TRUE(WriteStringToFile(path, data).ok());
  auto got = Sha256File(path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, Sha256Hex(data));
  std::remove(path.c_str());
  auto missing = Sha256File(path);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace stoke
