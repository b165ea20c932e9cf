// Subcommands register themselves, one file each (cmd_<name>.cc), so adding one never edits main.cc:
//
//   static stoke::CommandRegistrar kGenerate("generate", "Generate text from a prompt",
//       [](CLI::App* cmd) {
//         auto opts = std::make_shared<GenerateOptions>();
//         cmd->add_option("--model", opts->model, "...")->required();
//         // run after parsing, with the Backends main() built (make_backends.h); returns the exit code
//         return [opts](const stoke::Backends& backends) -> int { ...; return 0; };
//       });
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "engine/model/backends.h"

namespace stoke {

// Runs a parsed command. `backends`: what this process may compute on, built once in main(); commands that
// load a model pass it to the loaders (LoadDecoder, LoadBertOnDevice, RunServer, ...).
using CommandRun = std::function<int(const Backends& backends)>;
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
