// Google Benchmark suite: the fused kernel on every SIMD provider and target this CPU supports,
// against the unfused baseline and the double-precision reference, on the project's named shapes
// (bench/support/shapes.h, the table `cpuattn bench` uses). Rates are reported as counters
// (FLOP/s, and bytes/s of K+V read for decode shapes). Thread counts run from 1 to this
// machine's logical CPUs. Google Benchmark writes JSON with --benchmark_out, and its compare.py
// (Debian's libbenchmark-tools) compares two such files (docs/profiling.md, "Comparing two
// builds"):
//   build/release/bench/bench_attention --benchmark_filter='Fused/P1/highway'
//   build/release/bench/bench_attention --benchmark_filter=Fused/ --benchmark_out=run.json
//       --benchmark_out_format=json --benchmark_repetitions=5   (one command line)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "probes.h"
#include "shapes.h"

namespace {

using cpuattn::Target;

using cpuattn::Simd;
using Shape = cpuattn::bench::Shape;

struct Data {
  std::vector<float> q, k, v, out;
  explicit Data(const Shape& s)
      : q(s.B * s.H * s.Lq * s.D),
        k(s.B * s.Hkv * s.Lk * s.D),
        v(s.B * s.Hkv * s.Lk * s.Dv),
        out(s.B * s.H * s.Lq * s.Dv) {
    std::uint32_t x = 12345;
    for (auto* vec : {&q, &k, &v}) {
      for (auto& f : *vec) {
        x = x * 1664525u + 1013904223u;
        f = static_cast<float>(x >> 8) / float(1 << 24) * 2.0f - 1.0f;
      }
    }
  }
};

enum class Impl { fused, unfused, reference };

void run(benchmark::State& state, const Shape& s, Simd simd, Target target, Impl impl) {
  cpuattn::Context ctx(static_cast<int>(state.range(0)));
  ctx.set_max_target(target);
  ctx.set_simd(simd);
  if (target != Target::best &&
      (cpuattn::active_target(&ctx) != target || cpuattn::active_simd(&ctx) != simd)) {
    state.SkipWithError("provider or target not supported by this CPU");
    return;
  }
  Data d(s);
  cpuattn::AttentionOptions opts;
  opts.causal = s.causal ? cpuattn::Causal::top_left : cpuattn::Causal::none;
  opts.window_left = s.window_left;
  opts.window_right = s.window_right;
  const auto q = cpuattn::f32_view(d.q.data(), {s.B, s.H, s.Lq, s.D});
  const auto k = cpuattn::f32_view(d.k.data(), {s.B, s.Hkv, s.Lk, s.D});
  const auto v = cpuattn::f32_view(d.v.data(), {s.B, s.Hkv, s.Lk, s.Dv});
  const auto o = cpuattn::f32_view(d.out.data(), {s.B, s.H, s.Lq, s.Dv});
  // The unfused baseline has no mask support: it runs the causal shapes unmasked, which
  // flatters it (twice the work at the same FLOP count would be counted against it).
  for (auto _ : state) {
    switch (impl) {
      case Impl::fused:
        cpuattn::attention(q, k, v, o, opts, &ctx);
        break;
      case Impl::unfused:
        cpuattn::unfused_attention(q, k, v, o, ctx);
        break;
      case Impl::reference:
        cpuattn::reference_attention(q, k, v, o, opts);
        break;
    }
    benchmark::DoNotOptimize(d.out.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(s.flops(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["KV_B/s"] =
      benchmark::Counter(s.kv_bytes(), benchmark::Counter::kIsIterationInvariantRate);
}

// 1, 2, ... up to the machine's logical CPUs.
void ThreadArgs(benchmark::internal::Benchmark* b) {
  const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int t = 1; t <= n; ++t) b->Arg(t);
}

int Register() {
  for (const auto& named : cpuattn::bench::named_shapes()) {
    // Not a structured binding: clang 14 cannot capture one in the lambdas below.
    const auto& s = named.second;
    for (Simd simd : {Simd::highway, Simd::xsimd}) {
      for (Target t : {Target::avx512, Target::avx2, Target::sse4, Target::scalar}) {
        if (simd == Simd::xsimd && t == Target::scalar) continue;  // xsimd has no scalar unit
        for (Impl impl : {Impl::fused, Impl::unfused}) {
          // The unfused baseline would materialize W1's 32768^2 scores per head (64 GB).
          if (impl == Impl::unfused && (s.window_left >= 0 || s.window_right >= 0)) continue;
          const std::string name = std::string(impl == Impl::fused ? "Fused/" : "Unfused/") +
                                   s.name + "/" + cpuattn::simd_name(simd) + "/" +
                                   cpuattn::target_name(t);
          benchmark::RegisterBenchmark(
              name.c_str(), [s, simd, t, impl](benchmark::State& st) { run(st, s, simd, t, impl); })
              ->ArgName("threads")
              ->Apply(ThreadArgs)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
      }
    }
    // The reference is the oracle, not a contender: measure it on the small shapes only.
    if (s.flops() < 2e9) {
      benchmark::RegisterBenchmark(
          (std::string("Reference/") + s.name).c_str(),
          [s](benchmark::State& st) { run(st, s, Simd::highway, Target::best, Impl::reference); })
          ->ArgName("threads")
          ->Arg(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(1);
    }
  }
  return 0;
}
const int registered = Register();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Which kernels this CPU runs, in the JSON "context" next to Google Benchmark's own CPU facts.
  benchmark::AddCustomContext("cpuattn_targets", cpuattn::supported_targets());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
