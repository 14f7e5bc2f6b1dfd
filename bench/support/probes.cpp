#include "probes.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "api/context_impl.h"
#include "core/problem.h"
#include "core/scratch.h"
#include "dispatch/dispatch.h"

namespace cpuattn {
namespace detail {
const ProbeKernels& probe_kernels(const Choice& choice);
}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;

const detail::ProbeKernels& kernels(const Context* context) {
  return detail::probe_kernels(detail::choose(context));
}

void check_threads(int threads) {
  if (threads < 1) throw Error("cpuattn: threads must be >= 1, got " + std::to_string(threads));
}

// Runs f(t) on `threads` OS threads released together by a spin barrier, and returns the
// elapsed seconds of the slowest. Plain threads, not a task arena: a freshly created arena may
// start before its workers join, and then a "2-thread" probe runs on one thread.
template <class F>
double run_concurrently(int threads, F&& f) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> seconds(static_cast<std::size_t>(threads), 0.0);
  auto body = [&](int t) {
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) {
    }
    const auto t0 = Clock::now();
    f(t);
    seconds[static_cast<std::size_t>(t)] = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  while (ready.load() < threads - 1) {
  }
  go.store(true, std::memory_order_release);
  body(0);
  for (auto& th : pool) th.join();
  return *std::max_element(seconds.begin(), seconds.end());
}

// Best of 5 repetitions of a probe returning the flops it ran, on `threads` threads, in GFLOP/s.
template <class Probe>
double best_gflops(int threads, Probe&& probe) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> flops(static_cast<std::size_t>(threads), 0.0);
    const double s = run_concurrently(threads, [&](int t) { flops[t] = probe(); });
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / s * 1e-9);
  }
  return best;
}

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// `bytes` rounded up to whole 2 MiB pages, 2 MiB-aligned, advised to take huge pages or not
// (Linux: MADV_HUGEPAGE / MADV_NOHUGEPAGE; advice, which THP "never" or "always" may override).
// Free with std::free.
void* alloc_pages(std::size_t bytes, ProbePages pages) {
  const std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, size);
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  (void)madvise(p, size, pages == ProbePages::huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
  (void)pages;
#endif
  return p;
}

// The read probe's buffer: whole 2 MiB pages, advised MADV_HUGEPAGE (Linux), so that where the
// kernel grants transparent huge pages (its usual mode, "madvise", gives them only to memory that
// asks) the probe streams without a TLB miss every 4 KiB, which in a virtual machine is a
// two-level page walk, and its first touch takes 512 page faults per GiB instead of 262,144.
// The probe is the ceiling of one stream per thread (docs/performance.md#dm-huge-pages). The
// 4 KiB one (ProbePages::small) is advised MADV_NOHUGEPAGE, so that THP "always" leaves it small:
// the ceiling of a plain stream over memory as a default allocation lies
// (docs/performance.md#dm-read-4k-pages).
struct ProbeBuffer {
  ProbeBuffer(std::size_t bytes, ProbePages pages)
      : size((bytes + kHugePage - 1) / kHugePage * kHugePage),
        p(static_cast<float*>(alloc_pages(bytes, pages))) {}
  ~ProbeBuffer() { std::free(p); }
  ProbeBuffer(const ProbeBuffer&) = delete;
  ProbeBuffer& operator=(const ProbeBuffer&) = delete;
  const std::size_t size;  // whole huge pages
  float* const p;
};

// The read probe's buffer is kept from call to call (a bench run reads it for every target and
// thread count, before and after the cases): its first touch, not the reads, was most of a short
// run's time, since zeroing each new page is slow in a virtual machine whose host also backs the
// page on first touch (docs/performance.md#dm-probe-buffer). It grows when a call asks for more.
std::mutex probe_buffer_mutex;
std::unique_ptr<ProbeBuffer> probe_buffer_kept[2];  // by ProbePages

// A buffer of at least n floats on `pages`, every page mapped; a new one is first touched by the
// `threads` threads that will read it, `per` floats each, so each page sits where its reader runs.
const float* probe_buffer(std::size_t n, int threads, std::size_t per, ProbePages pages) {
  std::unique_ptr<ProbeBuffer>& kept = probe_buffer_kept[static_cast<int>(pages)];
  if (!kept || kept->size < n * sizeof(float)) {
    kept.reset();  // the old one goes first: two 1 GiB buffers of one kind at once are not needed
    kept = std::make_unique<ProbeBuffer>(n * sizeof(float), pages);
    float* const p = kept->p;
    run_concurrently(threads, [&](int t) { std::fill(p + t * per, p + (t + 1) * per, 1.0f); });
    std::fill(p + threads * per, p + kept->size / sizeof(float), 1.0f);
  }
  return kept->p;
}

// A kernel probe (one of ProbeKernels' rep-count members) at about 1.2 GFLOP a repetition, so that
// each repetition is long against the clock and short against the run.
double kernel_probe_gflops(int threads, const Context* context,
                           double (*const detail::ProbeKernels::*probe)(std::int64_t)) {
  check_threads(threads);
  const auto run = kernels(context).*probe;
  const double per_rep = run(1);
  return best_gflops(threads, [&] { return run(static_cast<std::int64_t>(1.2e9 / per_rep)); });
}

}  // namespace

void* alloc_huge_pages(std::size_t bytes) { return alloc_pages(bytes, ProbePages::huge); }

double measure_fma_peak_gflops(int threads, const Context* context) {
  check_threads(threads);
  const detail::ProbeKernels& ki = kernels(context);
  // About 30 ms a repetition: long enough for the clock to settle at the frequency AVX-512 FMAs
  // run at, so that % of peak does not depend on what ran before.
  return best_gflops(threads, [&] { return ki.fma(6'000'000); });
}

double measure_tile_gflops(int threads, const Context* context) {
  return kernel_probe_gflops(threads, context, &detail::ProbeKernels::tile);
}

double measure_block_gflops(int threads, const Context* context) {
  return kernel_probe_gflops(threads, context, &detail::ProbeKernels::block);
}

double measure_read_bandwidth_gbps(int threads, std::size_t bytes, const Context* context,
                                   ProbePages pages) {
  check_threads(threads);
  const detail::ProbeKernels& ki = kernels(context);
  const std::size_t n = std::max<std::size_t>(bytes / sizeof(float) / 1024 * 1024, 1024);
  const std::size_t per = n / threads / 64 * 64;
  const std::lock_guard<std::mutex> lock(probe_buffer_mutex);
  const float* const data = probe_buffer(n, threads, per, pages);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    for (const auto read : {ki.read, ki.read_spilled}) {
      std::vector<float> sums(static_cast<std::size_t>(threads));
      const double s =
          run_concurrently(threads, [&](int t) { sums[t] = read(data + t * per, per); });
      for (float x : sums) sink = sink + x;
      best = std::max(best, double(per) * threads * sizeof(float) / s * 1e-9);
    }
  }
  return best;
}

void unfused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                       const OutputView& out, Context& context) {
  const detail::Problem p = detail::validate(q, k, v, out, {}, /*allow_f64=*/false);
  const detail::ProbeKernels& ki = kernels(&context);
  Context::Impl& c = detail::ContextAccess::impl(context);
  c.run([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, p.B * p.H, 1),
                      [&](const tbb::blocked_range<std::int64_t>& r) {
                        detail::Scratch& s = c.task_scratch.local();
                        const Context::Impl::Lease lease{c, s};
                        for (std::int64_t bh = r.begin(); bh < r.end(); ++bh) {
                          ki.unfused_head(p, bh / p.H, bh % p.H, s);
                        }
                      });
  });
}

}  // namespace cpuattn
