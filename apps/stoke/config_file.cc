#include "apps/stoke/config_file.h"

#include <toml++/toml.h>

#include <sstream>
#include <string>

#include "base/file_util.h"

namespace stoke {

namespace {

StatusOr<nlohmann::json> FromToml(const std::string& path, const std::string& text) {
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return InvalidArgumentError("{}: TOML: {} (at {})", path, std::string(e.description()), where.str());
  }
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    if (auto s = node.value<std::string>(); s && node.is_string()) {
      j[key] = *s;
    } else if (node.is_boolean()) {
      j[key] = *node.value<bool>();
    } else if (node.is_integer()) {
      j[key] = *node.value<int64_t>();
    } else if (node.is_floating_point()) {
      j[key] = *node.value<double>();
    } else {
      return InvalidArgumentError(
          "{}: '{}' must be a string, number or boolean (tables and arrays are not "
          "flags)",
          path, key);
    }
  }
  return j;
}

}  // namespace

StatusOr<nlohmann::json> ReadConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  if (path.ends_with(".toml")) return FromToml(path, text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError("--config {}: expected a JSON object of flag names", path);
  return j;
}

}  // namespace stoke
