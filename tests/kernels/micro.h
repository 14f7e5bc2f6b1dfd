// Entry points to single micro-kernels of every provider and target, for tests/kernels/: the
// per-target units (micro_hwy.cc, micro_xsimd.cc) instantiate the library's kernel pieces
// (lib/kernels/, lib/simd/) with their provider, exactly as the library's own units do, and
// export them through the same dispatch mechanism. Test assertions stay in the target-independent
// driver (test_kernels.cpp), so no test framework code is compiled with AVX-512 flags.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.h"
#include "cpuattn/cpuattn.h"
#include "dispatch/dispatch.h"

namespace cpuattn::detail {

struct MicroKernels {
  Target target;
  Simd provider;
  int lanes, score_rows, score_cols, pv_rows, pv_cols;
  std::int64_t block_keys;
  void (*exp2)(const float* in, float* out, std::size_t n);
  void (*tanh)(const float* in, float* out, std::size_t n);
  void (*softcap)(const float* in, float* out, std::size_t n, float cap);
  // Transposes a lanes x lanes row-major matrix in place, through registers.
  void (*transpose)(float* m);
  // The score micro-kernel for R rows and one panel of score_cols * lanes keys (s aligned).
  // masked: apply ends[r] and masks[r] (nullptr or the row's mask at the tile's first key).
  void (*score_tile)(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp,
                     float* s, std::int64_t s_stride, std::int32_t col0, bool masked,
                     const std::int32_t* ends, const void* const* masks, MaskKind kind,
                     std::int64_t mask_stride);
  // acc[R][C vectors] += P[R][nk] . Vp chunk (vp rows cw floats apart). acc aligned.
  void (*pv_tile)(int R, int C, const float* p, std::int64_t p_stride, const float* vp,
                  std::int64_t cw, std::int64_t nk, float* acc, std::int64_t acc_stride);
  // Packs keys [j0, j0 + nk) of (b, hk) into Kp panels and Vp chunks (see
  // kernels/flash/driver-inl.h).
  void (*pack_kv)(const Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0,
                  std::int64_t nk, float* kp, float* vp);
  // One online-softmax step of a row (flash softmax-inl.h); lrow holds lanes partial sums.
  void (*softmax_row)(float* srow, std::int64_t ncols, float* m, float* lrow, float* arow,
                      std::int64_t dvp);
};

const MicroKernels& micro_kernels(const Choice& choice);

}  // namespace cpuattn::detail

CPUATTN_DECLARE_XSIMD_TABLE(MicroKernels, GetMicroKernels)
