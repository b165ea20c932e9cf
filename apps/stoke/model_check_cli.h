// `stoke model check`: the output-consistency gate from the command line (cmd_model_check.cc).
#pragma once

#include "apps/stoke/command.h"

namespace stoke {

// Adds the `check` subcommand under `stoke model`; *run is set to what runs it once parsed.
CLI::App* AddModelCheckCommand(CLI::App* model, CommandRun* run);

}  // namespace stoke
