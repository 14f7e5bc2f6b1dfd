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
// More rows than the tile's (O::kGemvRows: 3 on AVX2, 12 on AVX-512) go in groups that take each
// chunk of a panel in turn (GemvGroups): the first group reads it from memory, the others from
// L1, so B still streams once.
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

#include "kernels/common/outer-inl.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/panel_order-inl.h"
#include "simd/contract.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// Bytes of B in flight ahead of the rows being read, over all NP streams: a core's read bandwidth
// times the DRAM latency is ~40 GB/s x 100 ns = 4 KB; twice that leaves room for the latency
// under load.
inline constexpr std::int64_t kGemvPrefetchBytes = 8192;

// Bytes of one panel that the row groups of GemvGroups take in turn: they stay in L1 (32 KiB or
// more on every x86 and ARM core cpuattn targets) for the groups after the first.
inline constexpr std::int64_t kGemvChunkBytes = 16384;

// Adjacent panels walked together for R rows of vectors of `lanes` floats: the fewest that give
// 8 accumulator chains, at most 4 (4 streams of B, and the registers of AVX2).
constexpr int GemvPanels(int R, int lanes) {
  const int per_panel = R * static_cast<int>(detail::PackedMatrix::kPanel) / lanes;
  return std::clamp((8 + per_panel - 1) / per_panel, 1, 4);
}

// Row k of NP adjacent panels (K rows each, from b) into acc for the R rows a of A; with
// `prefetch`, the row `ahead` rows further of each panel as well.
template <class O, int R, int NP, class TB>
CPUATTN_ALWAYS_INLINE void GemvStep(
    const float* const* a, const TB* CPUATTN_RESTRICT b, std::int64_t K, std::int64_t k,
    bool prefetch, std::int64_t ahead,
    typename O::V (&acc)[R][NP][detail::PackedMatrix::kPanel / O::kLanes]) {
  using V = typename O::V;
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  constexpr int C = static_cast<int>(P) / O::kLanes;
  constexpr std::int64_t row_bytes = P * static_cast<std::int64_t>(sizeof(TB));
  CPUATTN_UNROLL(4)
  for (int q = 0; q < NP; ++q) {
    const TB* row = b + (q * K + k) * P;
    if (prefetch) {
      const char* pf = reinterpret_cast<const char*>(row + ahead * P);
      for (std::int64_t off = 0; off < row_bytes; off += 64) detail::Prefetch<3>(pf + off);
    }
    if constexpr (kBroadcastsFirst<R, C>) {
      V av[R];
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) av[r] = O::Set(a[r][k]);
      const TB* row_j = row;
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) {
        if (j > 0) row_j = LoadAfter<O, R>([&](int r) { return acc[r][q][j - 1]; }, row_j);
        V bv = PanelOrder::One<O, TB>(row_j, j);
        if constexpr (R > 1) bv = InRegister<O>(bv);
        CPUATTN_UNROLL(16)
        for (int r = 0; r < R; ++r) acc[r][q][j] = O::MulAdd(av[r], bv, acc[r][q][j]);
      }
    } else {
      V bv[C];
      PanelOrder::Row<O, TB, C>(row, bv);
      if constexpr (R > 1) {
        CPUATTN_UNROLL(32)
        for (int j = 0; j < C; ++j) bv[j] = InRegister<O>(bv[j]);
      }
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const V av = O::Set(a[r][k]);
        CPUATTN_UNROLL(32)
        for (int j = 0; j < C; ++j) acc[r][q][j] = O::MulAdd(av, bv[j], acc[r][q][j]);
      }
    }
  }
}

// Rows of B ahead of the one being read that a stream of NP panels of TB prefetches.
template <int NP, class TB>
constexpr std::int64_t GemvAhead() {
  constexpr std::int64_t row_bytes =
      detail::PackedMatrix::kPanel * static_cast<std::int64_t>(sizeof(TB));
  return std::max<std::int64_t>(1, kGemvPrefetchBytes / (NP * row_bytes));
}

// C rows [0, R) x panels [0, NP) from `b` (NP adjacent panels of K rows) and the rows `a` of A.
// `cols` are the valid columns of the last panel (kPanel unless it is the matrix's last).
template <class O, int R, int NP, class TB>
CPUATTN_ALWAYS_INLINE void GemvTile(const float* const* a, const TB* CPUATTN_RESTRICT b,
                                    std::int64_t K, float* const* c, const float* bias,
                                    std::int64_t cols) {
  using V = typename O::V;
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  constexpr int N = O::kLanes;
  constexpr int C = static_cast<int>(P) / N;
  constexpr std::int64_t ahead = GemvAhead<NP, TB>();
  V acc[R][NP][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int q = 0; q < NP; ++q) {
      if (bias) {
        LoadPanelRow<O, TB, C>(bias + q * P, acc[r][q]);
      } else {
        CPUATTN_UNROLL(32)
        for (int j = 0; j < C; ++j) acc[r][q][j] = O::Zero();
      }
    }
  }
  // The prefetches stay inside each panel: past its end lie the next panel's first rows, which
  // the next stream of this tile is reading now.
  const std::int64_t k_pf = std::max<std::int64_t>(0, K - ahead);
  for (std::int64_t k = 0; k < k_pf; ++k) GemvStep<O, R, NP, TB>(a, b, K, k, true, ahead, acc);
  for (std::int64_t k = k_pf; k < K; ++k) GemvStep<O, R, NP, TB>(a, b, K, k, false, ahead, acc);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int q = 0; q < NP; ++q) {
      StorePanelRow<O, TB, C>(acc[r][q], c[r] + q * P, q == NP - 1 ? cols : P);
    }
  }
}

// Rows [k0, k1) of one panel (K rows, from b) for R rows a of A, continuing the sums in part
// (R rows of kPanel floats; from the bias, or 0, when k0 is 0). Asks for the pf_lines cache lines
// from pf spread evenly over its steps.
template <class O, int R, class TB>
CPUATTN_ALWAYS_INLINE void GemvChunk(const float* const* a, const TB* CPUATTN_RESTRICT b,
                                     std::int64_t K, std::int64_t k0, std::int64_t k1,
                                     const float* bias, float* part, const char* pf,
                                     std::int64_t pf_lines) {
  using V = typename O::V;
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  constexpr int N = O::kLanes;
  constexpr int C = static_cast<int>(P) / N;
  V acc[R][1][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    if (k0 == 0 && bias) {
      LoadPanelRow<O, TB, C>(bias, acc[r][0]);
    } else {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][0][j] = k0 > 0 ? O::Load(part + r * P + j * N) : O::Zero();
    }
  }
  const std::int64_t steps = k1 - k0;
  std::int64_t due = 0;  // pf_lines per step, in units of 1 / steps
  for (std::int64_t k = k0; k < k1; ++k) {
    for (due += pf_lines; due >= steps; due -= steps, pf += 64) detail::Prefetch<3>(pf);
    GemvStep<O, R, 1, TB>(a, b, K, k, false, 0, acc);
  }
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(32)
    for (int j = 0; j < C; ++j) O::Store(acc[r][0][j], part + r * P + j * N);
  }
}

// M rows (more than O::kGemvRows, at most detail::kGemvRows) over panels [p0, p1): each chunk of
// kGemvChunkBytes of a panel is taken by groups of at most O::kGemvRows rows in turn, sizes as even
// as the count allows; the sums live in part (M x kPanel floats) between chunks and go to C once
// the panel is done. C's column 0 is panel c0's. Every group asks for its share of the next
// chunk's lines as it goes: when only the first group did (the others read L1), DRAM sat idle for
// the other groups' passes and an 8-row step pulled B at half the read bandwidth.
template <class O, class TB>
void GemvGroups(const float* const* a, int M, const detail::PackedMatrix& B, const TB* b0,
                std::int64_t p0, std::int64_t p1, std::int64_t c0, float* const* cbase,
                float* part) {
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  constexpr int T = O::kGemvRows;
  const std::int64_t K = B.K;
  const std::int64_t kc =
      std::max<std::int64_t>(1, kGemvChunkBytes / (P * static_cast<std::int64_t>(sizeof(TB))));
  const int groups = (M + T - 1) / T;
  constexpr std::int64_t kRowLines = P * static_cast<std::int64_t>(sizeof(TB)) / 64;
  for (std::int64_t p = p0; p < p1; ++p) {
    const TB* bp = b0 + p * K * P;
    const float* bias = B.has_bias ? B.bias.data() + p * P : nullptr;
    for (std::int64_t k0 = 0; k0 < K; k0 += kc) {
      const std::int64_t k1 = std::min(K, k0 + kc);
      // The next chunk: the rest of this panel, else the first chunk of the task's next panel.
      const TB* next = k1 < K ? bp + k1 * P : p + 1 < p1 ? bp + K * P : nullptr;
      const std::int64_t next_lines =
          next == nullptr ? 0 : (k1 < K ? std::min(kc, K - k1) : std::min(kc, K)) * kRowLines;
      for (int g = 0, r0 = 0; g < groups; ++g) {
        const int R = M / groups + (g < M % groups ? 1 : 0);
        const std::int64_t l0 = next_lines * g / groups, l1 = next_lines * (g + 1) / groups;
        const char* pf = next == nullptr ? nullptr : reinterpret_cast<const char*>(next) + l0 * 64;
        detail::WithCount<T>(R, [&](auto r_tag) {
          GemvChunk<O, decltype(r_tag)::value, TB>(a + r0, bp, K, k0, k1, bias, part + r0 * P, pf,
                                                   l1 - l0);
        });
        r0 += R;
      }
    }
    const std::int64_t cols = std::min(P, B.N - p * P);
    for (int r = 0; r < M; ++r) {
      UnpermutePanelRow<O, TB, static_cast<int>(P) / O::kLanes>(part + r * P,
                                                                cbase[r] + (p - c0) * P, cols);
    }
  }
}

// Panels [p, p + np) for R rows, np <= GemvPanels(R): the full groups, then the rest one panel
// at a time.
// C's column 0 is panel c0's.
template <class O, int R, class TB>
void GemvRowsOf(const float* const* a, const detail::PackedMatrix& B, const TB* b0, std::int64_t p0,
                std::int64_t p1, std::int64_t c0, float* const* cbase) {
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
    GemvTile<O, R, np, TB>(a, b0 + p * K * P, K, c, bias, cols);
  };
  for (; p + NP <= p1; p += NP) run(std::integral_constant<int, NP>{}, p);
  for (; p < p1; ++p) run(std::integral_constant<int, 1>{}, p);
}

template <class O>
void GemvTask(const detail::GemmProblem& g, std::int64_t t, detail::Scratch& scratch) {
  static_assert(simd::VectorOps<O>);
  static_assert(O::kGemvRows <= detail::kGemvRows);
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  const detail::PackedMatrix& B = *g.b;
  const std::int64_t p0 = g.p_begin + (t % g.panel_tasks) * g.panel_block;
  const std::int64_t p1 = std::min(g.p_end, p0 + g.panel_block);
  // GemvGroups' partial sums: kPanel floats per row.
  float* part = scratch.get(static_cast<std::size_t>(P * detail::kGemvRows));
  const float* a[detail::kGemvRows];
  float* c[detail::kGemvRows];
  for (std::int64_t r = 0; r < g.M; ++r) {
    a[r] = g.a.row(r);
    c[r] = g.c.row(r);
  }
  // Rows beyond one tile go in groups; B as stored (bf16 or f32).
  const auto run = [&](const auto* b0) {
    if (g.M > O::kGemvRows) {
      GemvGroups<O>(a, static_cast<int>(g.M), B, b0, p0, p1, g.p_begin, c, part);
      return;
    }
    detail::WithCount<O::kGemvRows>(g.M, [&](auto r_tag) {
      GemvRowsOf<O, decltype(r_tag)::value>(a, B, b0, p0, p1, g.p_begin, c);
    });
  };
  if (B.dtype == DType::bf16) {
    run(reinterpret_cast<const detail::Bf16*>(B.panel_bf16(0)));
  } else {
    run(B.panel(0));
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_GEMM_GEMV_INL_H_
