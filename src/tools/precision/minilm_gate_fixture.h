// Test fixture of the encoder gate tests (encoder_gate_test.cc, int8_gate_test.cc): the real all-MiniLM-L6-v2
// (the test skips when it is not fetched), its tokenizer, the fp32 encoder as the gate's reference, and the
// default gate text.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <memory>
#include <string>

#include "engine/loader/model_registry.h"
#include "tools/precision/encoder_gate.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {

class MiniLmGateFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = DefaultModelDir() + "/all-minilm-l6-v2";
    struct stat st {};
    if (::stat((path_ + "/model.safetensors").c_str(), &st) != 0)
      GTEST_SKIP() << path_ << " is absent (stoke model fetch all-minilm-l6-v2)";
    auto text = ReadGateText("");
    if (!text.ok()) GTEST_SKIP() << "no default gate text";
    text_ = std::move(text).value();
    auto tok = LoadTokenizer(path_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(tok).value();
    auto ref = BertEncoder::Load(path_);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    reference_ = std::move(ref).value();
  }

  std::string path_, text_;
  std::unique_ptr<Tokenizer> tok_;
  std::shared_ptr<const BertEncoder> reference_;
};

}  // namespace stoke::precision
