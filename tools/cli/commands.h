// Subcommands of the `cpuattn` tool. Each add_* registers its subcommand on `app`; its callback
// sets `exit_code` (0 ok, 2 bad input or arguments) and prints errors as one line on stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace cpuattn::cli {

void add_run_command(CLI::App& app, int& exit_code);
void add_mha_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_profile_command(CLI::App& app, int& exit_code);
void add_examples_command(CLI::App& app, int& exit_code);
void add_heatmap_command(CLI::App& app, int& exit_code);
void add_serve_bench_command(CLI::App& app, int& exit_code);

}  // namespace cpuattn::cli
