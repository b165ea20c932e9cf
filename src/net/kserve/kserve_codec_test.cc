#include "net/kserve/kserve_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

namespace stoke {
namespace {

using nlohmann::json;

std::vector<float> Floats(const std::string& data) {
  std::vector<float> v(data.size() / 4);
  std::memcpy(v.data(), data.data(), data.size());
  return v;
}

void ExpectError(std::string_view body, std::optional<size_t> hl, std::string_view needle) {
  auto r = ParseRestInferRequest(body, hl);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(KserveCodecTest, JsonDataFlatOrNested) {
  for (const char* data : {"[1, 2, 3, 4, 5, 6]", "[[1, 2, 3], [4, 5, 6]]"}) {
    const std::string body = std::string(R"({"id": "abc", "inputs": [{"name": "x", "datatype": "FP32",
        "shape": [2, 3], "data": )") +
                             data + "}]}";
    auto r = ParseRestInferRequest(body, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->id, "abc");
    ASSERT_EQ(r->inputs.size(), 1u);
    EXPECT_EQ(r->inputs[0].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(Floats(r->inputs[0].data), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(KserveCodecTest, TypedJsonElements) {
  auto r = ParseRestInferRequest(R"({"inputs": [
      {"name": "b", "datatype": "BOOL", "shape": [2], "data": [true, false]},
      {"name": "i", "datatype": "INT64", "shape": [2], "data": [-5, 9007199254740993]},
      {"name": "u", "datatype": "UINT8", "shape": [1], "data": [255]},
      {"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": ["hi", "über"]}],
      "parameters": {"priority": 2, "timeout": 1500, "binary_data_output": true, "custom": "x"}})",
                                 std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].data, std::string("\x01\x00", 2));
  int64_t i[2];
  std::memcpy(i, r->inputs[1].data.data(), 16);
  EXPECT_EQ(i[0], -5);
  EXPECT_EQ(i[1], 9007199254740993);  // exact, not through a double
  EXPECT_EQ(SplitBytesElements(r->inputs[3].data), (std::vector<std::string_view>{"hi", "über"}));
  EXPECT_EQ(r->priority, 2);
  EXPECT_EQ(r->timeout_us, 1500);
  EXPECT_TRUE(r->binary_data_output);
}

TEST(KserveCodecTest, BinaryInputsFollowJsonOrderMixedWithJson) {
  const std::string head = R"({"inputs": [
      {"name": "a", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}},
      {"name": "j", "datatype": "INT32", "shape": [1], "data": [7]},
      {"name": "t", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 7}}],
      "outputs": [{"name": "y", "parameters": {"binary_data": true}}]})";
  std::string body = head;
  const int32_t a[2] = {3, -4};
  body.append(reinterpret_cast<const char*>(a), 8);
  AppendBytesElement("abc", &body);
  auto r = ParseRestInferRequest(body, head.size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].data, std::string(reinterpret_cast<const char*>(a), 8));
  EXPECT_EQ(SplitBytesElements(r->inputs[2].data), (std::vector<std::string_view>{"abc"}));
  ASSERT_EQ(r->outputs.size(), 1u);
  EXPECT_EQ(r->outputs[0].binary, true);
}

TEST(KserveCodecTest, MalformedRequestsNameTheInput) {
  const char* x = R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]})";
  ExpectError(x, std::nullopt, "input 'x': 'data' has 3 elements but shape [2, 2] needs 4");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1], "data": [1]}]})", std::nullopt,
              "input 'x': unknown datatype 'FLOAT'");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}]})", std::nullopt,
              "input 'x': 300 is out of range");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]}]})",
              std::nullopt, "input 'x': expected an integer");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "FP16", "shape": [1], "data": [1]}]})", std::nullopt,
              "input 'x': FP16 has no JSON form");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]}]})", std::nullopt,
              "input 'x': expected a string");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": []}]})", std::nullopt,
              "input 'x': 'shape' must be a list of non-negative integers");
  ExpectError(R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]})", std::nullopt,
              "input 'x': 'data' is missing");
  ExpectError(R"({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]})", std::nullopt,
              "inputs[0]: 'name' must be a string");
  ExpectError(R"({"inputs": 3})", std::nullopt, "'inputs' must be a list");
  ExpectError(R"({"inputs": [)", std::nullopt, "not valid JSON");
  ExpectError(R"({"inputs": [], "parameters": {"sequence_id": 3}})", std::nullopt, "sequence batching");
  // Binary: sizes that do not add up.
  const std::string head =
      R"({"inputs": [{"name": "b", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]})";
  ExpectError(head + std::string(4, '\0'), head.size(), "input 'b': binary_data_size 8 but only 4 bytes");
  ExpectError(head + std::string(12, '\0'), head.size(), "4 bytes of binary data follow the JSON header");
  ExpectError(head + std::string(8, '\0'), std::nullopt, "Inference-Header-Content-Length header is missing");
  ExpectError(head, head.size() + 10, "exceeds the body");
  const std::string bad_size =
      R"({"inputs": [{"name": "b", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 8}}]})";
  ExpectError(bad_size + std::string(8, '\0'), bad_size.size(),
              "input 'b': 8 bytes of data, but the shape needs 3");
  const std::string bad_bytes =
      R"({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]})";
  ExpectError(bad_bytes + std::string("\x09\0\0\0ab", 6), bad_bytes.size(),
              "input 't': BYTES element 0 claims 9");
  EXPECT_FALSE(ParseHeaderLength("12x").ok());
  EXPECT_EQ(*ParseHeaderLength(""), std::nullopt);
  EXPECT_EQ(*ParseHeaderLength("42"), std::optional<size_t>(42));
}

TEST(KserveCodecTest, ResponseJsonAndBinary) {
  InferTensor y{"y", TensorType::kFp32, {1, 3}, {}};
  const float v[3] = {0.1f, -2.5f, 3e-8f};
  y.data.assign(reinterpret_cast<const char*>(v), 12);
  InferTensor z{"z", TensorType::kBytes, {1, 1}, {}};
  AppendBytesElement("ok", &z.data);

  RestInferRequest req;
  req.id = "r1";
  auto json_resp = EncodeRestInferResponse("m", "1", req, {y, z});
  ASSERT_TRUE(json_resp.ok());
  EXPECT_FALSE(json_resp->header_length.has_value());
  json j = json::parse(json_resp->body);
  EXPECT_EQ(j["model_name"], "m");
  EXPECT_EQ(j["model_version"], "1");
  EXPECT_EQ(j["id"], "r1");
  EXPECT_EQ(j["outputs"][0]["shape"], json::array({1, 3}));
  EXPECT_EQ(j["outputs"][0]["datatype"], "FP32");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(j["outputs"][0]["data"][i].get<float>(), v[i]);  // round-trips exactly
  EXPECT_EQ(j["outputs"][1]["data"], json::array({"ok"}));

  // Only z, binary; y not returned.
  req.outputs = {{"z", true}};
  auto bin = EncodeRestInferResponse("m", "1", req, {y, z});
  ASSERT_TRUE(bin.ok());
  ASSERT_TRUE(bin->header_length.has_value());
  json h = json::parse(bin->body.substr(0, *bin->header_length));
  ASSERT_EQ(h["outputs"].size(), 1u);
  EXPECT_EQ(h["outputs"][0]["parameters"]["binary_data_size"], z.data.size());
  EXPECT_EQ(bin->body.substr(*bin->header_length), z.data);

  req.outputs = {{"nope", std::nullopt}};
  auto bad = EncodeRestInferResponse("m", "1", req, {y});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unexpected inference output 'nope'"), std::string::npos);
}

TEST(KserveCodecTest, RawBinaryRequestInfersTheShape) {
  ModelSignature sig;
  sig.inputs = {{"INPUT0", TensorType::kUint8, {-1}}};
  auto r = ParseRawBinaryRequest(std::string(10, 'a'), sig, 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->inputs[0].shape, (std::vector<int64_t>{1, 10}));
  EXPECT_TRUE(r->binary_data_output);
  sig.inputs.push_back({"INPUT1", TensorType::kUint8, {1}});
  EXPECT_FALSE(ParseRawBinaryRequest("x", sig, 8).ok());
}

TEST(KserveCodecTest, StatusMapping) {
  EXPECT_EQ(HttpStatusFor(InvalidArgumentError("x")), 400);
  EXPECT_EQ(HttpStatusFor(NotFoundError("x")), 404);
  EXPECT_EQ(HttpStatusFor(UnavailableError("x")), 503);
  EXPECT_EQ(HttpStatusFor(UnimplementedError("x")), 501);
  EXPECT_EQ(HttpStatusFor(InternalError("x")), 500);
  EXPECT_EQ(json::parse(KserveErrorBody("bad \"x\""))["error"], "bad \"x\"");
}

}  // namespace
}  // namespace stoke
