#include "net/grpc/grpc_codec.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>

#include "net/grpc/grpc_server.h"

namespace stoke {
namespace {

inference::ModelInferRequest Request() {
  inference::ModelInferRequest req;
  req.set_model_name("m");
  return req;
}

void ExpectError(const inference::ModelInferRequest& req, std::string_view needle) {
  auto r = DecodeGrpcInputs(req);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

// Every stoke code but Unknown has its gRPC code (a model file cut short was UNKNOWN); ResourceExhausted is
// UNAVAILABLE (a full queue: Triton's mapping, clients retry it).
TEST(GrpcCodeForTest, EveryCodeHasItsGrpcCode) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kDataLoss); ++c) {
    const StatusCode code = static_cast<StatusCode>(c);
    const Status s = code == StatusCode::kOk ? OkStatus() : Status(code, "x");
    if (code == StatusCode::kResourceExhausted) {
      EXPECT_EQ(GrpcCodeFor(s), grpc::StatusCode::UNAVAILABLE);
    } else {
      EXPECT_EQ(GrpcCodeFor(s), c) << StatusCodeName(code);  // the same numbers as gRPC's
    }
  }
}

TEST(GrpcCodecTest, TypedContentsPackLittleEndian) {
  auto req = Request();
  auto* a = req.add_inputs();
  a->set_name("a");
  a->set_datatype("INT16");
  a->add_shape(1);
  a->add_shape(2);
  a->mutable_contents()->add_int_contents(-3);
  a->mutable_contents()->add_int_contents(300);
  auto* s = req.add_inputs();
  s->set_name("s");
  s->set_datatype("BYTES");
  s->add_shape(1);
  s->mutable_contents()->add_bytes_contents("hey");
  auto* f = req.add_inputs();
  f->set_name("f");
  f->set_datatype("FP32");
  f->add_shape(2);
  f->mutable_contents()->add_fp32_contents(0.5f);
  f->mutable_contents()->add_fp32_contents(-1.0f);
  auto r = DecodeGrpcInputs(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  int16_t i16[2];
  std::memcpy(i16, (*r)[0].data.data(), 4);
  EXPECT_EQ(i16[0], -3);
  EXPECT_EQ(i16[1], 300);
  EXPECT_EQ(SplitBytesElements((*r)[1].data), (std::vector<std::string_view>{"hey"}));
  float fl[2];
  std::memcpy(fl, (*r)[2].data.data(), 8);
  EXPECT_EQ(fl[0], 0.5f);
  EXPECT_EQ(fl[1], -1.0f);
}

TEST(GrpcCodecTest, RawContentsAreAllOrNothingAndChecked) {
  auto req = Request();
  auto* a = req.add_inputs();
  a->set_name("a");
  a->set_datatype("FP16");  // raw only
  a->add_shape(3);
  req.add_raw_input_contents(std::string(6, '\0'));
  auto ok = DecodeGrpcInputs(req);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)[0].data.size(), 6u);

  req.set_raw_input_contents(0, std::string(5, '\0'));
  ExpectError(req, "input 'a': 5 bytes of data, but the shape needs 3 elements of FP16 (6 bytes)");

  auto two = Request();
  for (const char* n : {"x", "y"}) {
    auto* t = two.add_inputs();
    t->set_name(n);
    t->set_datatype("UINT8");
    t->add_shape(1);
  }
  two.add_raw_input_contents("a");
  ExpectError(two, "raw_input_contents has 1 entries but there are 2 inputs");

  auto mixed = Request();
  auto* m = mixed.add_inputs();
  m->set_name("m");
  m->set_datatype("UINT8");
  m->add_shape(1);
  m->mutable_contents()->add_uint_contents(1);
  mixed.add_raw_input_contents("a");
  ExpectError(mixed, "input 'm': has contents although raw_input_contents is used");
}

TEST(GrpcCodecTest, TypedErrorsNameTheInput) {
  auto req = Request();
  auto* a = req.add_inputs();
  a->set_name("a");
  a->set_datatype("INT8");
  a->add_shape(1);
  a->mutable_contents()->add_int_contents(1000);
  ExpectError(req, "input 'a': 1000 is out of range");
  a->mutable_contents()->set_int_contents(0, 1);
  a->mutable_contents()->add_int_contents(2);
  ExpectError(req, "input 'a': contents has 2 INT8 elements but shape [1] needs 1");
  a->set_datatype("BF16");
  ExpectError(req, "input 'a': BF16 must be sent in raw_input_contents");
  a->set_datatype("FLOAT");
  ExpectError(req, "input 'a': unknown datatype 'FLOAT'");
}

TEST(GrpcCodecTest, ParametersAndOutputs) {
  auto req = Request();
  (*req.mutable_parameters())["priority"].set_int64_param(2);
  (*req.mutable_parameters())["timeout"].set_uint64_param(500);
  (*req.mutable_parameters())["custom"].set_string_param("ignored");
  auto p = DecodeGrpcParameters(req);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->priority, 2);
  EXPECT_EQ(p->timeout_us, 500);
  (*req.mutable_parameters())["sequence_id"].set_int64_param(1);
  EXPECT_EQ(DecodeGrpcParameters(req).status().code(), StatusCode::kUnimplemented);

  InferTensor y{"y", TensorType::kFp32, {1, 2}, std::string(8, 'x')};
  InferTensor z{"z", TensorType::kInt64, {1, 1}, std::string(8, 'z')};
  auto sel = Request();
  sel.add_outputs()->set_name("z");
  inference::ModelInferResponse resp;
  ASSERT_TRUE(EncodeGrpcOutputs(sel, {y, z}, &resp).ok());
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).name(), "z");
  EXPECT_EQ(resp.outputs(0).datatype(), "INT64");
  EXPECT_EQ(resp.raw_output_contents(0), z.data);
  inference::ModelInferResponse all;
  ASSERT_TRUE(EncodeGrpcOutputs(Request(), {y, z}, &all).ok());
  EXPECT_EQ(all.outputs_size(), 2);
  EXPECT_EQ(all.raw_output_contents_size(), 2);
  sel.add_outputs()->set_name("nope");
  inference::ModelInferResponse bad;
  EXPECT_EQ(EncodeGrpcOutputs(sel, {y, z}, &bad).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoke
