#include "base/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace stoke {

void InitLogging(std::string_view level) {
  static bool initialised = false;
  if (!initialised) {
    auto logger = spdlog::stderr_color_mt("stoke");
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %v");
    spdlog::set_default_logger(logger);
    initialised = true;
  }
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl != spdlog::level::off || level == "off") spdlog::set_level(lvl);
}

}  // namespace stoke
