// Google Benchmark suite: the fused kernel on every SIMD target this CPU supports, against the
// double-precision reference, on the project's named shapes. Rates are reported as counters
// (FLOP/s, and bytes/s of K+V read for decode shapes).
//   build/release/bench/bench_attention --benchmark_filter='Fused/P1'
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "kernel.h"
#include "problem.h"

namespace {

using cpuattn::Target;

struct Shape {
  const char* name;
  std::int64_t B, H, Hkv, Lq, Lk, D;
  bool causal;
  double flops() const {
    return causal ? 4.0 * B * H * D * Lq * (Lq + 1) / 2 : 4.0 * B * H * Lq * Lk * D;
  }
};

const Shape kShapes[] = {
    {"S1", 32, 12, 12, 128, 128, 64, false},  {"P1", 1, 16, 16, 2048, 2048, 64, false},
    {"P2", 1, 16, 16, 2048, 2048, 128, true}, {"X1", 8, 8, 8, 64, 1024, 64, false},
    {"D1", 4, 32, 8, 1, 4096, 128, false},    {"D2", 8, 32, 8, 1, 16384, 128, false},
};

struct Data {
  std::vector<float> q, k, v, out;
  explicit Data(const Shape& s)
      : q(s.B * s.H * s.Lq * s.D),
        k(s.B * s.Hkv * s.Lk * s.D),
        v(s.B * s.Hkv * s.Lk * s.D),
        out(s.B * s.H * s.Lq * s.D) {
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

void run(benchmark::State& state, const Shape& s, Target target, Impl impl) {
  cpuattn::Context ctx(static_cast<int>(state.range(0)));
  ctx.set_max_target(target);
  if (target != Target::best && cpuattn::active_target(&ctx) != target) {
    state.SkipWithError("target not supported by this CPU");
    return;
  }
  Data d(s);
  cpuattn::AttentionOptions opts;
  opts.causal = s.causal ? cpuattn::Causal::top_left : cpuattn::Causal::none;
  const auto q = cpuattn::f32_view(d.q.data(), {s.B, s.H, s.Lq, s.D});
  const auto k = cpuattn::f32_view(d.k.data(), {s.B, s.Hkv, s.Lk, s.D});
  const auto v = cpuattn::f32_view(d.v.data(), {s.B, s.Hkv, s.Lk, s.D});
  const auto o = cpuattn::f32_view(d.out.data(), {s.B, s.H, s.Lq, s.D});
  // The unfused baseline has no mask support: it runs the causal shapes unmasked, which
  // flatters it (twice the work at the same FLOP count would be counted against it).
  const auto problem = cpuattn::detail::validate(q, k, v, o, {}, false);
  for (auto _ : state) {
    switch (impl) {
      case Impl::fused:
        cpuattn::attention(q, k, v, o, opts, &ctx);
        break;
      case Impl::unfused:
        cpuattn::detail::run_unfused(problem, ctx);
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
  state.counters["KV_B/s"] = benchmark::Counter(8.0 * s.B * s.Hkv * s.Lk * s.D,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

int Register() {
  for (const Shape& s : kShapes) {
    for (Target t : {Target::avx512, Target::avx2, Target::sse4, Target::scalar}) {
      for (Impl impl : {Impl::fused, Impl::unfused}) {
        const std::string name = std::string(impl == Impl::fused ? "Fused/" : "Unfused/") + s.name +
                                 "/" + cpuattn::target_name(t);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [s, t, impl](benchmark::State& st) { run(st, s, t, impl); })
            ->ArgName("threads")
            ->Arg(1)
            ->Arg(2)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
    // The reference is the oracle, not a contender: measure it on the small shapes only.
    if (s.flops() < 2e9) {
      benchmark::RegisterBenchmark(
          (std::string("Reference/") + s.name).c_str(),
          [s](benchmark::State& st) { run(st, s, Target::best, Impl::reference); })
          ->ArgName("threads")
          ->Arg(2)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(1);
    }
  }
  return 0;
}
const int registered = Register();

}  // namespace

BENCHMARK_MAIN();
