#include <gtest/gtest.h>

#include <cstring>

#include "base/half.h"
#include "engine/onnx/onnx_model.h"
#include "engine/onnx/onnx_subset.pb.h"

namespace stoke::onnx {
namespace {

namespace pb = stoke::onnx_pb;

pb::ModelProto SmallModel() {
  pb::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("test");
  auto* op = m.add_opset_import();
  op->set_version(13);
  pb::GraphProto* g = m.mutable_graph();
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(1);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  g->add_output()->set_name("y");
  // w: FLOAT in raw_data; b: FLOAT in float_data; h: FLOAT16 in raw_data; s: INT64 in int64_data.
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(1);
  w->add_dims(2);
  w->add_dims(3);
  const float wv[6] = {1, 2, 3, 4, 5, 6};
  w->set_raw_data(std::string(reinterpret_cast<const char*>(wv), sizeof(wv)));
  auto* b = g->add_initializer();
  b->set_name("b");
  b->set_data_type(1);
  b->add_dims(2);
  b->add_float_data(0.5f);
  b->add_float_data(-1.5f);
  auto* h = g->add_initializer();
  h->set_name("h");
  h->set_data_type(10);
  h->add_dims(1);
  const uint16_t hv = Fp32ToFp16(0.25f);
  h->set_raw_data(std::string(reinterpret_cast<const char*>(&hv), 2));
  auto* s = g->add_initializer();
  s->set_name("s");
  s->set_data_type(7);
  s->add_dims(2);
  s->add_int64_data(-1);
  s->add_int64_data(7);
  auto* n = g->add_node();
  n->set_op_type("Gemm");
  n->add_input("x");
  n->add_input("w");
  n->add_input("b");
  n->add_output("y");
  auto* a = n->add_attribute();
  a->set_name("transB");
  a->set_type(pb::AttributeProto::INT);
  a->set_i(1);
  auto* f = n->add_attribute();
  f->set_name("alpha");
  f->set_type(pb::AttributeProto::FLOAT);
  f->set_f(2.0f);
  return m;
}

TEST(OnnxReaderTest, ReadsGraphTensorsAndAttributes) {
  const std::string bytes = SmallModel().SerializeAsString();
  auto m = ParseOnnx(bytes, "small.onnx");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->opset, 13);
  EXPECT_EQ(m->producer, "test");
  ASSERT_EQ(m->inputs.size(), 1u);  // initializers are not inputs
  EXPECT_EQ(m->inputs[0].dims, (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(m->FindInitializer("w")->floats, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(m->FindInitializer("b")->floats, (std::vector<float>{0.5f, -1.5f}));
  EXPECT_EQ(m->FindInitializer("h")->floats, (std::vector<float>{0.25f}));
  EXPECT_EQ(m->FindInitializer("s")->ints, (std::vector<int64_t>{-1, 7}));
  ASSERT_EQ(m->nodes.size(), 1u);
  const OnnxNode& n = m->nodes[0];
  EXPECT_EQ(n.name, "Gemm#0");  // unnamed nodes are named by op and index
  EXPECT_EQ(*n.Int("transB", 0), 1);
  EXPECT_EQ(*n.Float("alpha", 1), 2.0f);
  EXPECT_EQ(*n.Int("transA", 0), 0);  // default
  auto wrong = n.Float("transB", 0);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("node 'Gemm#0' (Gemm): attribute 'transB' is not a float"),
            std::string::npos);
}

TEST(OnnxReaderTest, GarbageIsNotAModel) {
  auto m = ParseOnnx("definitely not a protobuf \xff\xff\xff", "x.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("x.onnx: not an ONNX model"), std::string::npos)
      << m.status().message();
}

TEST(OnnxReaderTest, RawDataOfTheWrongSizeNamesTheTensor) {
  pb::ModelProto p = SmallModel();
  p.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(20);
  auto m = ParseOnnx(p.SerializeAsString(), "x.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor 'w': raw_data has 20 bytes but 6 FLOAT values need 24"),
            std::string::npos)
      << m.status().message();
}

TEST(OnnxReaderTest, ExternalDataIsRefused) {
  pb::ModelProto p = SmallModel();
  p.mutable_graph()->mutable_initializer(0)->set_data_location(pb::TensorProto::EXTERNAL);
  auto m = ParseOnnx(p.SerializeAsString(), "x.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("tensor 'w': data in an external file is not supported"),
            std::string::npos);
}

TEST(OnnxReaderTest, TypedFieldCountMustMatchDims) {
  pb::ModelProto p = SmallModel();
  p.mutable_graph()->mutable_initializer(1)->add_dims(2);  // b now claims 2x2 = 4 values, holds 2
  auto m = ParseOnnx(p.SerializeAsString(), "x.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("holds 2 FLOAT values but its dims 2x2 need 4"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace stoke::onnx
