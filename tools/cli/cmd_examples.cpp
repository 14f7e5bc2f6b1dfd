// `cpuattn examples`: the worked examples of the seed documents, computed by the fast path and
// the reference and printed next to their published values.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::cli {
namespace {

struct Example {
  const char* title;
  std::vector<std::vector<float>> q, k, v;
  double scale;  // <= 0: default 1/sqrt(D)
  bool causal;
  std::vector<float> published;  // [Lq * Dv], row-major
};

std::vector<float> flat(const std::vector<std::vector<float>>& m) {
  std::vector<float> f;
  for (const auto& r : m) f.insert(f.end(), r.begin(), r.end());
  return f;
}

// Returns the largest |computed - published| of the two paths.
double show(const Example& e) {
  const std::int64_t Lq = e.q.size(), Lk = e.k.size(), D = e.q[0].size(), Dv = e.v[0].size();
  const auto q = flat(e.q), k = flat(e.k), v = flat(e.v);
  std::vector<float> fast(Lq * Dv), ref(Lq * Dv);
  AttentionOptions o;
  if (e.scale > 0) o.scale = e.scale;
  if (e.causal) o.causal = Causal::top_left;
  attention(f32_view(q.data(), {1, 1, Lq, D}), f32_view(k.data(), {1, 1, Lk, D}),
            f32_view(v.data(), {1, 1, Lk, Dv}), f32_view(fast.data(), {1, 1, Lq, Dv}), o);
  reference_attention(f32_view(q.data(), {1, 1, Lq, D}), f32_view(k.data(), {1, 1, Lk, D}),
                      f32_view(v.data(), {1, 1, Lk, Dv}), f32_view(ref.data(), {1, 1, Lq, Dv}), o);
  std::printf("%s\n  %-11s %-11s %-11s\n", e.title, "published", "fast path", "reference");
  double worst = 0;
  for (std::size_t i = 0; i < fast.size(); ++i) {
    std::printf("  %-11.8f %-11.8f %-11.8f\n", e.published[i], fast[i], ref[i]);
    worst = std::max({worst, std::abs(double(fast[i]) - e.published[i]),
                      std::abs(double(ref[i]) - e.published[i])});
  }
  return worst;
}

int run_examples() {
  const std::vector<Example> examples = {
      {"Seed 000: causal self-attention, scale 1/sqrt(3)",
       {{1, 0, 0}, {0, 1, 0}},
       {{1, 2, 3}, {4, 5, 6}},
       {{0, 1, 0}, {1, 0, 1}},
       0,
       true,
       {0, 1, 0, 0.8496745531f, 0.1503254469f, 0.8496745531f}},
      {"Seed 001: self-attention of four words, scale 1/sqrt(3)",
       {{2, 0, 2}, {2, 0, 0}, {4, 0, 2}, {2, 1, 2}},
       {{2, 2, 2}, {0, 2, 1}, {2, 4, 3}, {0, 1, 1}},
       {{1, 1, 0}, {0, 1, 1}, {1, 2, 1}, {0, 0, 0}},
       0,
       false,
       {0.9852202489f, 1.74174051f, 0.7565202611f, 0.909652645f, 1.409652645f, 0.5f, 0.99851226f,
        1.7584933413f, 0.7599810813f, 0.9956038602f, 1.9040730856f, 0.9084692254f}},
      {"Seed 002: the quiz, no scaling",
       {{0.4685f, 0.9785f}},
       {{0.5539f, 0.7239f}, {0.4111f, 0.3878f}, {0.2376f, 0.1264f}},
       {{0.5539f, 0.7239f}, {0.4111f, 0.3878f}, {0.2376f, 0.1264f}},
       1.0,
       false,
       {0.4386924863f, 0.4855324097f}},
      {"Seed 002: the quiz at temperature 0.01 (selects the best match)",
       {{0.4685f, 0.9785f}},
       {{0.5539f, 0.7239f}, {0.4111f, 0.3878f}, {0.2376f, 0.1264f}},
       {{0.5539f, 0.7239f}, {0.4111f, 0.3878f}, {0.2376f, 0.1264f}},
       100.0,
       false,
       {0.5539f, 0.7239f}},
      {"Seed 002: dictionary lookup, no scaling",
       {{0, 1, 0}},
       {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}},
       {{2, 3}, {5, 7}, {3, 2}},
       1.0,
       false,
       {3.9402922119f, 5.0925259814f}},
      {"Seed 002: dictionary lookup at temperature 0.01",
       {{0, 1, 0}},
       {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}},
       {{2, 3}, {5, 7}, {3, 2}},
       100.0,
       false,
       {5, 7}},
  };
  double worst = 0;
  for (const auto& e : examples) worst = std::max(worst, show(e));
  std::printf("largest difference from the published values: %.2e (%s)\n", worst,
              worst < 1e-4 ? "ok" : "MISMATCH");
  return worst < 1e-4 ? 0 : 1;
}

}  // namespace

void add_examples_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "examples",
      "Compute the worked examples of the seed documents with the fast path and the reference\n"
      "and print them next to their published values. Example: cpuattn examples");
  cmd->callback([&exit_code] { exit_code = run_examples(); });
}

}  // namespace cpuattn::cli
