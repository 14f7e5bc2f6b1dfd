// Entry points to the native units of the avx512_bf16 unit (lib/kernels/flash/x86/), for
// tests/kernels/test_native_units.cpp: micro_native.cc compiles them with the library's native
// flags (AVX-512 + AVX512-BF16 + AVX512-VNNI); the tests run them only where CPUID reports the
// extensions (active_bf16_path() is "avx512_bf16"). Each runs one unit on one K/V block of a
// Problem whose Q, K and V the test fills (batch 0, K/V head 0, keys [0, nk)).
#pragma once

#include <cstdint>

#include "core/problem.h"

namespace cpuattn::detail {

struct NativeMicroKernels {
  // ScoreUnit::tile_bf16: Q rows (bf16, heads [0, rows) at position 0) packed as pairs, K packed
  // as panels, s[r][0, nk rounded to panels) = qscale * q_r . k_j.
  void (*tile_scores)(const Problem& p, int rows, std::int64_t nk, float qscale, float* s,
                      std::int64_t s_stride);
  // Bf16Tile::ProbBlock (scores and softmax in one pass): Q and K as for tile_scores, nk a whole
  // number of 64-key panels; pb[r][j] = 2^(qscale q_r . k_j - m[r]) rounded to bf16 (bits),
  // lsum[r * 16, + 16) the lanes' partial sums of those before rounding; false if a score is
  // above m[r] + 8 or NaN. With `first`, m[r] is set to row r's largest score of the first
  // panel (and back to -inf on false).
  bool (*tile_probs)(const Problem& p, int rows, std::int64_t nk, float qscale, float* m,
                     bool first, std::uint16_t* pb, std::int64_t pb_stride, float* lsum);
  // PvUnit::tile_bf16: acc[r][0, Dv) += P[r] (rounded to bf16) . V, V packed as pairs.
  void (*tile_pv)(const Problem& p, int rows, std::int64_t nk, const float* pr,
                  std::int64_t p_stride, float* acc, std::int64_t acc_stride);
  // ScoreUnit::tile_amx then its scaling: as tile_scores, on AMX tiles (D a multiple of 32; run
  // only where Choice::amx_bf16, which asks the OS for the tile state).
  void (*amx_scores)(const Problem& p, int rows, std::int64_t nk, float qscale, float* s,
                     std::int64_t s_stride);
  // PvUnit::tile_amx: as tile_pv, on AMX tiles.
  void (*amx_pv)(const Problem& p, int rows, std::int64_t nk, const float* pr,
                 std::int64_t p_stride, float* acc, std::int64_t acc_stride);
  // QUnit::f32_hilo + ScoreUnit::dot: f32 Qp rows (vector-aligned, stride qs) split into bf16
  // hi + lo, s[r][j] = qp_r . k_j over bf16 K rows in place (DotScores with the hi/lo dot).
  void (*hilo_scores)(int rows, float* qp, std::int64_t qs, const Problem& p, std::int64_t nk,
                      float* s, std::int64_t s_stride);
  // PvUnit::runs_bf16 (bf16 V) or runs_vnni (int8 V with its scales), then the column order
  // restored: acc[r][0, Dv) += P[r] . V; P rows are overwritten (scaled, rounded).
  void (*pv_runs)(const Problem& p, int rows, std::int64_t nk, float* pr, std::int64_t p_stride,
                  float* acc, std::int64_t acc_stride);
};

const NativeMicroKernels& native_micro_kernels();

}  // namespace cpuattn::detail
