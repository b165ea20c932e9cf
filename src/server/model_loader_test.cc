// What MakeModelConfig decides before anything is loaded: the kind and the served names from a --model source
// or a stoke.toml, for image classifiers beside the other kinds; and a repository folder's *.onnx file as its
// model. Nothing here loads a model (the configs' `load` functions are not run).
#include "server/model_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server/repository_folder.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;

class ModelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("stoke_model_loader_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& rel, const std::string& text) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  StatusOr<ModelConfig> Make(ModelSettings m) {
    if (m.origin.empty()) m.origin = "--model " + m.source;
    return MakeModelConfig(m, server_, backends_, &registry_, &keep_);
  }
  static std::vector<std::string> ServedNames(const ModelConfig& c) {
    std::vector<std::string> out;
    for (const auto& s : c.served) out.push_back(s.name);
    return out;
  }

  fs::path dir_;
  ServerOptions server_;
  Backends backends_ = CpuBackends();
  MetricsRegistry registry_;
  std::vector<std::unique_ptr<ServerMetrics>> keep_;
};

TEST_F(ModelLoaderTest, OnnxFileIsAnImageModelServedTwice) {
  const std::string onnx = Write("nets/resnet50.onnx", "not read before loading");
  EXPECT_TRUE(IsBatchedModelSource(onnx));
  auto c = Make({.source = onnx});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kind, ModelKind::kImage);
  EXPECT_EQ(c->name, "resnet50");
  EXPECT_EQ(ServedNames(*c), (std::vector<std::string>{"resnet50", "resnet50-tensor"}));
  EXPECT_EQ(c->aliases, std::vector<std::string>{onnx});
  // Without a model file: max_batch_size 32, dynamic batching on (as an encoder).
  EXPECT_EQ(c->served[0].config.max_batch_size, 32);
  EXPECT_TRUE(c->served[0].config.dynamic_batching.has_value());
  EXPECT_STREQ(ModelKindName(c->kind), "image");
}

TEST_F(ModelLoaderTest, ImageAliasIsAnImageModel) {
  EXPECT_TRUE(IsBatchedModelSource("ppocr-mobile-v2-cls"));
  auto c = Make({.name = "cls", .source = "ppocr-mobile-v2-cls", .max_batch_size = 8});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kind, ModelKind::kImage);
  EXPECT_EQ(ServedNames(*c), (std::vector<std::string>{"cls", "cls-tensor"}));
  EXPECT_EQ(c->served[1].config.max_batch_size, 8);
}

TEST_F(ModelLoaderTest, ImageModelFileAndKindKey) {
  Write("m/net.onnx", "x");
  const std::string file =
      Write("m/model.json", R"({"type": "image", "name": "net", "model": "net.onnx", "max_batch_size": 4})");
  auto c = Make({.source = file, .kind = "image"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kind, ModelKind::kImage);
  EXPECT_EQ(ServedNames(*c), (std::vector<std::string>{"net", "net-tensor"}));
  EXPECT_EQ(c->served[0].config.max_batch_size, 4);
  EXPECT_FALSE(c->served[0].config.dynamic_batching.has_value());  // a file without the key: off, as Triton

  // kind = "image" makes any other file an image model (the ONNX reader judges it at load).
  auto k = Make({.source = Write("weights.bin", "x"), .kind = "image"});
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_EQ(k->kind, ModelKind::kImage);
}

TEST_F(ModelLoaderTest, KindThatDisagreesWithTheSourceIsAnError) {
  auto c = Make({.source = Write("a.onnx", "x"), .kind = "encoder", .origin = "models/a/stoke.toml"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("kind 'encoder' but"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("is an image model"), std::string::npos) << c.status().message();

  auto file = Make({.source = Write("b.json", R"({"type": "image"})")});
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("needs \"model\" (alias or .onnx file)"), std::string::npos)
      << file.status().message();

  auto unknown = Make({.source = "x.onnx", .kind = "vision"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("decoder, encoder, image or synthetic"), std::string::npos);
}

TEST_F(ModelLoaderTest, RepositoryFolderTakesItsOnnxFile) {
  Write("repo/cls/classifier.onnx", "x");
  Write("repo/two/a.onnx", "x");
  Write("repo/two/b.onnx", "x");
  auto one = ReadRepositoryFolder((dir_ / "repo").string());
  ASSERT_FALSE(one.ok());  // "two" holds two
  EXPECT_NE(one.status().message().find("2 *.onnx files"), std::string::npos) << one.status().message();

  fs::remove(dir_ / "repo/two/a.onnx");
  fs::remove(dir_ / "repo/two/b.onnx");
  Write("repo/two/stoke.toml", "source = \"ppocr-mobile-v2-cls\"\nkind = \"image\"\n");
  auto folder = ReadRepositoryFolder((dir_ / "repo").string());
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  ASSERT_EQ(folder->size(), 2u);
  EXPECT_EQ((*folder)[0].name, "cls");
  EXPECT_EQ((*folder)[0].source, (dir_ / "repo/cls/classifier.onnx").string());
  EXPECT_EQ((*folder)[1].kind, "image");
  auto c = Make((*folder)[0]);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(ServedNames(*c), (std::vector<std::string>{"cls", "cls-tensor"}));
}

// A decoder's precisions in its stoke.toml (`-` or `_`): parsed into its settings; a bad value names the key,
// the value and the file.
TEST_F(ModelLoaderTest, RepositoryFolderReadsThePrecisionKeys) {
  Write("repo/q/stoke.toml",
        "source = \"smollm2-135m-instruct\"\nquantization = \"fp8\"\nkv-cache-dtype = \"int8\"\n");
  Write("repo/r/stoke.toml", "source = \"smollm2-135m-instruct\"\n");
  auto folder = ReadRepositoryFolder((dir_ / "repo").string());
  ASSERT_TRUE(folder.ok()) << folder.status().message();
  ASSERT_EQ(folder->size(), 2u);
  EXPECT_EQ((*folder)[0].quantization, WeightQuantization::kFp8);
  EXPECT_EQ((*folder)[0].kv_cache_dtype, KvCacheDtype::kInt8);
  EXPECT_FALSE((*folder)[1].quantization.has_value());

  for (const char* bad : {"int4", "FP8"}) {
    Write("repo/r/stoke.toml",
          std::string("source = \"smollm2-135m-instruct\"\nquantization = \"") + bad + "\"\n");
    auto r = ReadRepositoryFolder((dir_ / "repo").string());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("quantization '") + bad + "'"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("stoke.toml"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace stoke
