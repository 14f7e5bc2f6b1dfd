// Machine probes that put benchmark figures in proportion: the FMA peak and the read bandwidth of
// this machine, measured with the same SIMD target and thread count as the kernels they judge.
#pragma once

#include <cstddef>

#include "cpuattn/cpuattn.h"

namespace cpuattn {

// Peak f32 FMA throughput in GFLOP/s with `threads` threads (>= 1) on the target the context
// would run (or the default context's). Takes about 0.2 s.
double measure_fma_peak_gflops(int threads, const Context* context = nullptr);

// Throughput in GFLOP/s of the fused kernel's score micro-kernel on L1-resident operands (D = 64),
// with `threads` threads: the ceiling of the kernel's arithmetic, which no cache miss, softmax or
// packing lowers. Its ratio to the FMA peak shows how much of that peak is reachable at all.
// Takes about 0.2 s.
double measure_tile_gflops(int threads, const Context* context = nullptr);

// Sustained read bandwidth in GB/s (1e9 bytes/s) with `threads` threads, streaming `bytes` of
// memory (default 1 GiB, far larger than any cache here).
double measure_read_bandwidth_gbps(int threads, std::size_t bytes = std::size_t{1} << 30,
                                   const Context* context = nullptr);

}  // namespace cpuattn
