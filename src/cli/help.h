// `--help` and docs/trainer-arguments.md, both printed from the options table.
#pragma once
#include <string>

#include "cli/options_table.h"

namespace anatomy::cli {

std::string top_help();
std::string command_help(Command cmd);
// docs/trainer-arguments.md: anatomy's options, then every TrainingArguments field with what
// anatomy does with it (`anatomy help --markdown` prints it; a test keeps the file equal to it).
std::string markdown_doc();

}  // namespace anatomy::cli
