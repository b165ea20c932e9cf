// Small helpers shared by subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model/factory.h"

namespace CLI {
class App;
}

namespace stoke {

// `--ids` argument: a JSON array of token ids, or `@FILE` holding one.
StatusOr<std::vector<int32_t>> ParseIdsArg(const std::string& arg);

// --device, --gpu-memory-fraction and --cuda-graphs, shared by serve, generate and score.
struct DeviceFlags {
  std::string device = "auto";  // auto | cpu | cuda
  double gpu_memory_fraction = 0.90;
  std::string cuda_graphs = "on";  // on | off
};
void AddDeviceFlags(CLI::App* cmd, DeviceFlags* flags);
// The decoder options the flags ask for (InvalidArgument naming the flag when a value is out of range).
StatusOr<DecoderOptions> DecoderOptionsFromFlags(const DeviceFlags& flags);

}  // namespace stoke
