// stoke: one binary, subcommands serve | generate | embed | tokenize | model | bench | doctor | tune.
#include <CLI/CLI.hpp>

#include "base/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"stoke: an inference server that keeps the GPU busy and shows where the time goes"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  stoke::InitLogging(log_level);
  return 0;
}
