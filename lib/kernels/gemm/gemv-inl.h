// Per-target dense product for a few rows of A (decoding): C [R, N] = A [R, K] B (+ bias) with
// R at most the GEMM micro-kernel's rows, over the same packed B (kernels/gemm/gemm.h).
//
// The GEMM's blocking (packed micro-panels of A, k blocks of B kept in L1) exists to reuse B
// across many rows of A. With one micro-panel of rows there is nothing to reuse: B, the weights,
// streams from memory once with a few FMAs per cache line, and the product is bound by how fast
// one core pulls lines in. So this kernel
//   * reads the rows of A in place (no packing) and keeps every accumulator in registers over the
//     whole of K (no k blocks: C is written once);
//   * walks NP adjacent panels in lock step, NP chosen so there are at least 8 independent
//     accumulators (R x NP x 32 / lanes): 2 FMA pipes x 4 cycles of latency. One row on one panel
//     has 2 on AVX-512, and the FMA latency rather than memory would bound the stream;
//   * prefetches each panel's rows kGemvPrefetchBytes / (NP x row bytes) rows ahead.
// Each C element is bias + the sum over k in increasing k, the GEMM's order: the two paths agree
// bit for bit, so a row's result does not depend on how many rows came with it.
#if defined(CPUATTN_KERNELS_GEMM_GEMV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_GEMM_GEMV_INL_H_
#undef CPUATTN_KERNELS_GEMM_GEMV_INL_H_
#else
#define CPUATTN_KERNELS_GEMM_GEMV_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/gemm/gemm.h"
#include "simd/contract.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// Bytes of B in flight ahead of the rows being read, over all NP streams: a core's read bandwidth
// times the DRAM latency is ~40 GB/s x 100 ns = 4 KB; twice that leaves room for the latency
// under load.
inline constexpr std::int64_t kGemvPrefetchBytes = 8192;

// Adjacent panels walked together for R rows of vectors of `lanes` floats: the fewest that give
// 8 accumulator chains, at most 4 (4 streams of B, and the registers of AVX2).
constexpr int GemvPanels(int R, int lanes) {
  const int per_panel = R * static_cast<int>(detail::PackedMatrix::kPanel) / lanes;
  return std::clamp((8 + per_panel - 1) / per_panel, 1, 4);
}

// C rows [0, R) x panels [0, NP) from `b` (NP adjacent panels of K rows) and the rows `a` of A.
// `cols` are the valid columns of the last panel (kPanel unless it is the matrix's last); `tile`
// receives that panel when it is ragged, so no store passes column N.
template <class O, int R, int NP, class TB>
CPUATTN_ALWAYS_INLINE void GemvTile(const float* const* a, const TB* CPUATTN_RESTRICT b,
                                    std::int64_t K, float* const* c, const float* bias,
                                    std::int64_t cols, float* tile) {
  using V = typename O::V;
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  constexpr int N = O::kLanes;
  constexpr int C = static_cast<int>(P) / N;
  constexpr std::int64_t row_bytes = P * static_cast<std::int64_t>(sizeof(TB));
  constexpr std::int64_t ahead = std::max<std::int64_t>(1, kGemvPrefetchBytes / (NP * row_bytes));
  V acc[R][NP][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int q = 0; q < NP; ++q) {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][q][j] = bias ? O::Load(bias + q * P + j * N) : O::Zero();
    }
  }
  // The prefetches stay inside each panel: past its end lie the next panel's first rows, which
  // the next stream of this tile is reading now.
  const std::int64_t k_pf = std::max<std::int64_t>(0, K - ahead);
  const auto step = [&](std::int64_t k, bool prefetch) __attribute__((always_inline)) {
    CPUATTN_UNROLL(4)
    for (int q = 0; q < NP; ++q) {
      const TB* row = b + (q * K + k) * P;
      if (prefetch) {
        const char* pf = reinterpret_cast<const char*>(row + ahead * P);
        for (std::int64_t off = 0; off < row_bytes; off += 64) detail::Prefetch<3>(pf + off);
      }
      V bv[C];
      LoadWideN<O, C>(row, bv);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const V av = O::Set(a[r][k]);
        CPUATTN_UNROLL(32)
        for (int j = 0; j < C; ++j) acc[r][q][j] = O::MulAdd(av, bv[j], acc[r][q][j]);
      }
    }
  };
  for (std::int64_t k = 0; k < k_pf; ++k) step(k, true);
  for (std::int64_t k = k_pf; k < K; ++k) step(k, false);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int q = 0; q < NP; ++q) {
      const bool ragged = q == NP - 1 && cols < P;
      float* dst = ragged ? tile : c[r] + q * P;
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) O::StoreU(acc[r][q][j], dst + j * N);
      if (ragged) std::copy(tile, tile + cols, c[r] + q * P);
    }
  }
}

// Panels [p, p + np) for R rows, np <= GemvPanels(R): the full groups, then the rest one panel
// at a time.
// C's column 0 is panel c0's.
template <class O, int R, class TB>
void GemvRowsOf(const float* const* a, const detail::PackedMatrix& B, const TB* b0, std::int64_t p0,
                std::int64_t p1, std::int64_t c0, float* const* cbase, float* tile) {
  constexpr int NP = GemvPanels(R, O::kLanes);
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  const std::int64_t K = B.K;
  float* c[R];
  std::int64_t p = p0;
  const auto run = [&](auto np_tag, std::int64_t p) {
    constexpr int np = decltype(np_tag)::value;
    for (int r = 0; r < R; ++r) c[r] = cbase[r] + (p - c0) * P;
    const float* bias = B.has_bias ? B.bias.data() + p * P : nullptr;
    const std::int64_t cols = std::min(P, B.N - (p + np - 1) * P);
    GemvTile<O, R, np, TB>(a, b0 + p * K * P, K, c, bias, cols, tile);
  };
  for (; p + NP <= p1; p += NP) run(std::integral_constant<int, NP>{}, p);
  for (; p < p1; ++p) run(std::integral_constant<int, 1>{}, p);
}

template <class O>
void GemvTask(const detail::GemmProblem& g, std::int64_t t, detail::Scratch& scratch) {
  static_assert(simd::VectorOps<O>);
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  const detail::PackedMatrix& B = *g.b;
  const std::int64_t p0 = g.p_begin + (t % g.panel_tasks) * g.panel_block;
  const std::int64_t p1 = std::min(g.p_end, p0 + g.panel_block);
  float* tile = scratch.get(static_cast<std::size_t>(P));
  const float* a[O::kGemmRows];
  float* c[O::kGemmRows];
  for (std::int64_t r = 0; r < g.M; ++r) {
    a[r] = g.a.row(r);
    c[r] = g.c.row(r);
  }
  const auto rows = [&](auto r_tag) {
    constexpr int R = decltype(r_tag)::value;
    if (B.dtype == DType::bf16) {
      GemvRowsOf<O, R>(a, B, reinterpret_cast<const detail::Bf16*>(B.panel_bf16(0)), p0, p1,
                       g.p_begin, c, tile);
    } else {
      GemvRowsOf<O, R>(a, B, B.panel(0), p0, p1, g.p_begin, c, tile);
    }
  };
  static_assert(O::kGemmRows <= 12, "extend the switch below");
  switch (g.M) {
#define CPUATTN_GEMV_CASE(n)                                                 \
  case n:                                                                    \
    if constexpr (n <= O::kGemmRows) rows(std::integral_constant<int, n>{}); \
    break;
    CPUATTN_GEMV_CASE(1)
    CPUATTN_GEMV_CASE(2)
    CPUATTN_GEMV_CASE(3)
    CPUATTN_GEMV_CASE(4)
    CPUATTN_GEMV_CASE(5)
    CPUATTN_GEMV_CASE(6)
    CPUATTN_GEMV_CASE(7)
    CPUATTN_GEMV_CASE(8)
    CPUATTN_GEMV_CASE(9)
    CPUATTN_GEMV_CASE(10)
    CPUATTN_GEMV_CASE(11)
    CPUATTN_GEMV_CASE(12)
#undef CPUATTN_GEMV_CASE
    default:
      break;
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_GEMM_GEMV_INL_H_
