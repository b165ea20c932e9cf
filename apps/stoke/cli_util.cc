#include "apps/stoke/cli_util.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/file_util.h"

namespace stoke {

StatusOr<std::vector<int32_t>> ParseIdsArg(const std::string& arg) {
  std::string text = arg;
  if (!arg.empty() && arg[0] == '@') {
    ASSIGN_OR_RETURN(text, ReadFileToString(arg.substr(1)));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return InvalidArgumentError("--ids: expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    if (!v.is_number_integer()) return InvalidArgumentError("--ids: every element must be an integer");
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

void AddDeviceFlags(CLI::App* cmd, DeviceFlags* flags) {
  cmd->add_option("--device", flags->device,
                  "auto (cuda when this build has CUDA and a GPU is visible, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--gpu-memory-fraction", flags->gpu_memory_fraction,
                  "cuda: fraction of the GPU's memory for weights, activations and the KV cache")
      ->capture_default_str();
  cmd->add_option("--cuda-graphs", flags->cuda_graphs, "cuda: replay decode steps as CUDA graphs (on|off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

StatusOr<DecoderOptions> DecoderOptionsFromFlags(const DeviceFlags& flags) {
  if (!(flags.gpu_memory_fraction > 0.0 && flags.gpu_memory_fraction <= 1.0)) {
    return InvalidArgumentError("--gpu-memory-fraction {} must be in (0, 1]", flags.gpu_memory_fraction);
  }
  if (flags.device != "auto" && flags.device != "cpu" && flags.device != "cuda") {
    return InvalidArgumentError("--device {}: expected auto, cpu or cuda", flags.device);
  }
  DecoderOptions o;
  o.device = flags.device;
  o.gpu_memory_fraction = flags.gpu_memory_fraction;
  o.cuda_graphs = flags.cuda_graphs != "off";
  return o;
}

}  // namespace stoke
