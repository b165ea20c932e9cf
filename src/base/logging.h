// Logging: spdlog underneath, one process-wide logger writing to stderr (stdout stays clean for the
// commands whose output is data: generate, tokenize, embed).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace stoke {

// level: "trace", "debug", "info", "warn", "error", "off". Unknown names leave the level unchanged.
void InitLogging(std::string_view level);

}  // namespace stoke

#define LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
