#include "cpuattn/perf.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "context_impl.h"
#include "kernel.h"

namespace cpuattn {
namespace {

using Clock = std::chrono::steady_clock;

const detail::KernelInfo& kernels(const Context* context) {
  const Context& c = context != nullptr ? *context : default_context();
  return detail::kernels_for(c.max_target());
}

void check_threads(int threads) {
  if (threads < 1) throw Error("cpuattn: threads must be >= 1, got " + std::to_string(threads));
}

}  // namespace

double measure_fma_peak_gflops(int threads, const Context* context) {
  check_threads(threads);
  const detail::KernelInfo& ki = kernels(context);
  tbb::task_arena arena(threads);
  double best = 0;
  // About 30 ms a repetition, best of 5: long enough for the clock to settle at the frequency
  // AVX-512 FMAs run at, so that % of peak does not depend on what ran before.
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> flops(threads, 0.0);
    const std::int64_t iters = 6'000'000;
    const auto t0 = Clock::now();
    arena.execute([&] {
      // One chunk per thread; static so each thread runs exactly one probe concurrently.
      tbb::parallel_for(
          0, threads, [&](int t) { flops[t] = ki.fma_probe(iters); }, tbb::static_partitioner());
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

double measure_read_bandwidth_gbps(int threads, std::size_t bytes, const Context* context) {
  check_threads(threads);
  const detail::KernelInfo& ki = kernels(context);
  const std::size_t n = std::max<std::size_t>(bytes / sizeof(float) / 1024 * 1024, 1024);
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))), &std::free);
  if (!buf) throw std::bad_alloc();
  tbb::task_arena arena(threads);
  const std::size_t per = n / threads / 64 * 64;
  // First touch by the threads that will read, so pages are mapped before timing.
  arena.execute([&] {
    tbb::parallel_for(
        0, threads, [&](int t) { std::fill(buf.get() + t * per, buf.get() + (t + 1) * per, 1.0f); },
        tbb::static_partitioner());
  });
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> sums(threads);
    const auto t0 = Clock::now();
    arena.execute([&] {
      tbb::parallel_for(
          0, threads, [&](int t) { sums[t] = ki.read_probe(buf.get() + t * per, per); },
          tbb::static_partitioner());
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (float x : sums) sink = sink + x;
    best = std::max(best, double(per) * threads * sizeof(float) / s * 1e-9);
  }
  return best;
}

}  // namespace cpuattn
