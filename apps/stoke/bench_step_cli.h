// `stoke bench step`: the engine step microbenchmark, a subcommand of `stoke bench` (cmd_bench.cc adds it).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/stoke/command.h"

namespace stoke {

// Adds the `step` subcommand to `bench`; `*run` is set to what runs it once parsed.
CLI::App* AddBenchStepCommand(CLI::App* bench, CommandRun* run);

}  // namespace stoke
