// Benchmark support (not part of the library's API): machine probes that put benchmark figures in
// proportion, and the unfused baseline the fused kernel is compared with. Each runs on the SIMD
// provider and target the given context would run (or the default context's).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpuattn/cpuattn.h"

namespace cpuattn {

// Peak f32 FMA throughput in GFLOP/s with `threads` threads (>= 1). Takes about 0.2 s.
double measure_fma_peak_gflops(int threads, const Context* context = nullptr);

// Throughput in GFLOP/s of the fused kernel's score micro-kernel on L1-resident operands (D = 64),
// with `threads` threads: the ceiling of the kernel's arithmetic, which no cache miss, softmax or
// packing lowers. Its ratio to the FMA peak shows how much of that peak is reachable at all.
// Takes about 0.2 s.
double measure_tile_gflops(int threads, const Context* context = nullptr);

// Throughput in GFLOP/s of one K/V block of the fused loop on cached operands (64 rows against
// 128 keys, D = Dv = 64: the one-pass scores and softmax, then P V), with `threads` threads: the
// ceiling of the loop with its softmax, below the score micro-kernel's by the max, exp2 and sums
// the softmax adds to the FMA pipes. A call's distance from it is what the loop's cold reads and
// prefetches cost, and the work beside the loop (packing, rescaling, the output). Takes about
// 0.2 s.
double measure_block_gflops(int threads, const Context* context = nullptr);

// The pages of the read probe's buffer: 2 MiB (transparent huge pages where the kernel grants
// them) or 4 KiB (advised MADV_NOHUGEPAGE, as a tensor of the default allocator lies).
enum class ProbePages { huge, small };

// Sustained read bandwidth in GB/s (1e9 bytes/s) with `threads` threads, streaming `bytes` of
// memory (default 1 GiB, far larger than any cache here) on `pages`: the best of three passes of
// each of two loops (ProbeKernels::read, read_spilled), the faster of which depends on the CPU. The
// buffer stays allocated for the next call, for the rest of the process (its first touch costs more
// than the reads), one per page size; calls are serialised.
double measure_read_bandwidth_gbps(int threads, std::size_t bytes = std::size_t{1} << 30,
                                   const Context* context = nullptr,
                                   ProbePages pages = ProbePages::huge);

// `bytes` rounded up to whole 2 MiB pages, 2 MiB-aligned and advised MADV_HUGEPAGE (Linux), so
// that where the kernel grants transparent huge pages (its usual mode, "madvise", gives them only
// to memory that asks) a stream over it misses the TLB once per 2 MiB instead of every 4 KiB.
// Free with std::free. Throws std::bad_alloc. The read probe's buffer; `bench --huge-pages`.
void* alloc_huge_pages(std::size_t bytes);

// The unfused three-pass baseline (scores materialized per head, softmax, then P V) on the
// context's threads: f32, no masks, no lse. Same argument checks as attention().
void unfused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                       const OutputView& out, Context& context);

namespace detail {
struct Problem;
class Scratch;
struct ProbeKernels {
  Target target;
  Simd provider;
  // Runs `iters` rounds of independent FMAs; returns the flops executed.
  double (*fma)(std::int64_t iters);
  // The score micro-kernel on L1-resident data, `reps` times; returns the flops executed.
  double (*tile)(std::int64_t reps);
  // One K/V block of the fused loop on cached data, `reps` times; returns the flops executed.
  double (*block)(std::int64_t reps);
  // Sums n floats (n a multiple of 64) with vector loads, four sums in registers.
  float (*read)(const float* data, std::size_t n);
  // The same sum with the four sums kept in memory (a load and a store per vector).
  float (*read_spilled)(const float* data, std::size_t n);
  // The unfused baseline for one (b, h).
  void (*unfused_head)(const Problem&, std::int64_t b, std::int64_t h, Scratch&);
};
}  // namespace detail

}  // namespace cpuattn
