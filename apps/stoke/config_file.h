// `stoke serve --config FILE`: a flat table of long-flag names to values, as JSON or TOML.
//
//   serve.json:  {"port": 8080, "max-batch-size": 8, "no-prefix-cache": true}
//   serve.toml:  port = 8080
//                max-batch-size = 8        # max_batch_size works too
//                no-prefix-cache = true
//
// TOML is chosen by the ".toml" extension (toml++), anything else is read as JSON. Only top-level scalar
// values (strings, integers, floats, booleans) are allowed; a table or an array is an error naming the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace stoke {

// The file as one JSON object of scalars (TOML converted key by key, in the file's order of keys).
StatusOr<nlohmann::json> ReadConfigFile(const std::string& path);

}  // namespace stoke
