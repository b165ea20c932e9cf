#include "apps/stoke/cli_util.h"

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

}  // namespace stoke
