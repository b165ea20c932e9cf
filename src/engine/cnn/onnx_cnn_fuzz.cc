// libFuzzer target: arbitrary bytes as an ONNX file through the reader, the CNN graph builder and a plan for
// a small input must give a Status, never crash; a plan that fits in 64 MiB also runs.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/cnn/cnn_model.h"
#include "engine/onnx/onnx_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = stoke::onnx::ParseOnnx(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.onnx");
  if (!m.ok()) return 0;
  auto model = stoke::cnn::CnnModel::FromOnnx(*m, "fuzz.onnx");
  if (!model.ok()) return 0;
  const std::vector<int64_t> dims = {1, 3, 16, 16};
  auto plan = stoke::cnn::CnnPlan::Create((*model)->graph(), dims);
  if (!plan.ok() || (*plan)->buffer_floats() > (int64_t{1} << 24)) return 0;
  stoke::cnn::CnnRunner runner(*model);
  std::vector<float> x(3 * 16 * 16, 0.5f), out;
  std::vector<int64_t> od;
  stoke::ThreadPool pool(1);
  (void)runner.Run(x.data(), dims, &out, &od, pool);
  return 0;
}
