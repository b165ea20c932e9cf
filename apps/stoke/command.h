// Subcommands register themselves, one file each (cmd_<name>.cc), so adding one never edits main.cc:
//
//   static stoke::CommandRegistrar kGenerate("generate", "Generate text from a prompt",
//       [](CLI::App* cmd) {
//         auto opts = std::make_shared<GenerateOptions>();
//         cmd->add_option("--model", opts->model, "...")->required();
//         return [opts]() -> int { ...; return 0; };  // run after parsing; returns the exit code
//       });
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace stoke {

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App*)>;

struct CommandSpec {
  std::string name;
  std::string description;
  CommandSetup setup;
};

inline std::vector<CommandSpec>& CommandRegistry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string description, CommandSetup setup) {
    CommandRegistry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace stoke
