// Small helpers shared by subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace stoke {

// `--ids` argument: a JSON array of token ids, or `@FILE` holding one.
StatusOr<std::vector<int32_t>> ParseIdsArg(const std::string& arg);

}  // namespace stoke
