// cpuattn: command-line front end of the library (run attention on .npy files, benchmark,
// draw attention weights).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "cpuattn: fast CPU attention, out = softmax(scale * Q K^T + mask) V.\n"
      "Examples:\n"
      "  cpuattn run --q q.npy --k k.npy --v v.npy --out out.npy --mask causal\n"
      "  cpuattn run --kind additive --h h.npy --s s.npy --w1 w1.npy --w2 w2.npy --va v.npy "
      "--out c.npy\n"
      "  cpuattn mha --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 "
      "--causal --out out.npy\n"
      "  cpuattn bench --shape P1 --threads 1,2\n"
      "  cpuattn bench --sweep threads --shape P1 --out scaling.json\n"
      "  cpuattn profile --shape P1 --trace p1.json\n"
      "  cpuattn examples\n"
      "  cpuattn heatmap --weights w.npy --out heat.png\n"
      "  cpuattn serve-bench --clients 1,2,8,64 --duration 5 --md",
      "cpuattn"};
  app.require_subcommand(1);
  int exit_code = 0;
  cpuattn::cli::add_run_command(app, exit_code);
  cpuattn::cli::add_mha_command(app, exit_code);
  cpuattn::cli::add_bench_command(app, exit_code);
  cpuattn::cli::add_profile_command(app, exit_code);
  cpuattn::cli::add_examples_command(app, exit_code);
  cpuattn::cli::add_heatmap_command(app, exit_code);
  cpuattn::cli::add_serve_bench_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors are exit code 2 with one line on stderr, like every other bad input.
    std::fprintf(stderr, "cpuattn: %s (see cpuattn --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpuattn: %s\n", e.what());
    return 2;
  }
  return exit_code;
}
