// stoke: one binary, subcommands serve | generate | score | embed | tokenize | model | bench | doctor | trace |
// tune | gpu.
// Each subcommand lives in its own cmd_<name>.cc and registers itself (command.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>

#include "apps/stoke/command.h"
#include "apps/stoke/make_backends.h"
#include "base/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"stoke: an inference server that keeps the GPU busy and shows where the time goes"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.set_version_flag("--version", "stoke 0.1.0");
  app.footer("Models: --model takes an alias (stoke model list) or a path; a missing alias is fetched on first use.\n"
             "Run `stoke <command> --help` for a command's options.");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();

  auto& registry = stoke::CommandRegistry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, stoke::CommandRun> runs;
  for (const auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    runs[sub] = spec.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and the relevant usage
    return 2;     // usage errors exit 2, as documented in README
  }
  stoke::InitLogging(log_level);
  // The one place that decides what stoke computes on (CPU, plus CUDA in a CUDA build); each command gets it.
  const stoke::Backends backends = stoke::MakeBackends();
  for (auto& [sub, run] : runs) {
    if (sub->parsed()) return run(backends);
  }
  return 0;
}
