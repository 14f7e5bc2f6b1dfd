// Per-target dense product C = A B (+ bias) for the layers, written once against the vector
// contract (simd/contract.h) like the attention kernel.
//
// Blocking, for a task of row_block rows of A and panel_block panels of B:
//   * the task packs its rows of A once, for all of K, as micro-panels Ap[k][kGemmRows]: the
//     micro-kernel then broadcasts kGemmRows consecutive floats per k from one pointer (96 rows x
//     K = 768 is 288 KiB, well inside the 2 MiB L2);
//   * for each panel, K is cut into blocks of kKc = 256 rows: the panel block, 256 x 32 x 4 B =
//     32 KiB, stays in the 48 KiB L1d while every micro-panel of the task sweeps it;
//   * the micro-kernel keeps kGemmRows x 32 accumulators in registers (12 x 2 vectors on
//     AVX-512: 24 of the 32 registers, plus 2 for B and 1 broadcast): per k, 2 aligned loads,
//     12 broadcasts and 24 FMAs. bf16 panels are widened as loaded, on AVX2 and AVX-512 by
//     parity: the accumulators then hold a panel row in pair order
//     (kernels/gemm/panel_order-inl.h).
// Every C element is bias + sum over k in increasing k blocks, whatever the task blocking.
#if defined(CPUATTN_KERNELS_GEMM_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_GEMM_GEMM_INL_H_
#undef CPUATTN_KERNELS_GEMM_GEMM_INL_H_
#else
#define CPUATTN_KERNELS_GEMM_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "kernels/common/outer-inl.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/panel_order-inl.h"
#include "simd/contract.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

inline constexpr std::int64_t kGemmKc = 256;
inline constexpr std::int64_t kGemmMaxRowBlock = detail::kGemmRowPanels * 12;

// Panel rows ahead of the one being read that GemmTile asks for: 1 KiB of bf16 (2 KiB of f32),
// enough in flight to cover DRAM latency at one 64-byte line per k.
inline constexpr std::int64_t kGemmPrefetchRows = 16;

// AccumulateOuter over a panel, prefetching panel rows kGemmPrefetchRows ahead while at most
// `ahead` rows exist past bp (the panels after this one follow it in memory, so the prefetches
// run on into the next panel and never past the matrix). With few rows of A (decoding) the
// product streams B from memory once, doing little work per line: the hardware prefetcher alone
// kept one core well below its read bandwidth (docs/performance.md#dm-gemm-prefetch).
template <class O, int R, int C, class TB>
CPUATTN_ALWAYS_INLINE void AccumulatePanel(const float* CPUATTN_RESTRICT a, std::int64_t a_k,
                                           const TB* CPUATTN_RESTRICT b, std::int64_t b_stride,
                                           std::int64_t K, std::int64_t ahead,
                                           typename O::V (&acc)[R][C]) {
  const std::int64_t row_bytes = b_stride * static_cast<std::int64_t>(sizeof(TB));
  for (std::int64_t k = 0; k < K; ++k) {
    if (k + kGemmPrefetchRows < ahead) {
      const char* pf = reinterpret_cast<const char*>(b + (k + kGemmPrefetchRows) * b_stride);
      for (std::int64_t off = 0; off < row_bytes; off += 64) detail::Prefetch<3>(pf + off);
    }
    OuterStep<O, R, C, TB, PanelOrder>(a + k * a_k, 1, b + k * b_stride, acc);
  }
}

// C rows [0, R) x one panel (32 columns) += Ap micro-panel . B panel rows [k0, k0 + kc), with
// `ahead` rows of B existing past bp. `init` is the starting value: the bias panel (first k block
// with a bias), nullptr for zero on the first k block, or C itself (load_c) for later k blocks.
// Between k blocks C holds the panel in the accumulators' order (kernels/gemm/panel_order-inl.h);
// the `last` block stores it in column order.
template <class O, int R, class TB>
CPUATTN_ALWAYS_INLINE void GemmTile(const float* CPUATTN_RESTRICT ap, const TB* CPUATTN_RESTRICT bp,
                                    std::int64_t kc, std::int64_t ahead, float* const* c,
                                    const float* bias, bool load_c, bool last) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  constexpr int C = static_cast<int>(detail::PackedMatrix::kPanel) / N;
  constexpr int MR = O::kGemmRows;
  V acc[R][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    if (load_c) {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][j] = O::LoadU(c[r] + j * N);
    } else if (bias) {
      LoadPanelRow<O, TB, C>(bias, acc[r]);
    } else {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][j] = O::Zero();
    }
  }
  AccumulatePanel<O, R, C, TB>(ap, MR, bp, detail::PackedMatrix::kPanel, kc, ahead, acc);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    if (last) {
      StorePanelRow<O, TB, C>(acc[r], c[r], detail::PackedMatrix::kPanel);
    } else {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) O::StoreU(acc[r][j], c[r] + j * N);
    }
  }
}

template <class O, class TB>
void GemmRows(int R, const float* ap, const TB* bp, std::int64_t kc, std::int64_t ahead,
              float* const* c, const float* bias, bool load_c, bool last) {
  detail::WithCount<O::kGemmRows>(R, [&](auto r_tag) {
    GemmTile<O, decltype(r_tag)::value, TB>(ap, bp, kc, ahead, c, bias, load_c, last);
  });
}

template <class O>
void GemmTask(const detail::GemmProblem& g, std::int64_t t, detail::Scratch& scratch) {
  static_assert(simd::VectorOps<O>);
  constexpr std::int64_t MR = O::kGemmRows;
  static_assert(MR <= 12, "kGemmMaxRowBlock assumes at most 12 rows per micro-panel");
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  const detail::PackedMatrix& B = *g.b;
  const std::int64_t K = B.K;
  const std::int64_t row0 = (t / g.panel_tasks) * g.row_block;
  const std::int64_t rows = std::min(g.row_block, g.M - row0);
  const std::int64_t p0 = g.p_begin + (t % g.panel_tasks) * g.panel_block;
  const std::int64_t p1 = std::min(g.p_end, p0 + g.panel_block);
  const std::int64_t micro = (rows + MR - 1) / MR;

  // Ap: micro-panels [micro][K][MR]; then a tile [micro * MR][P] for the ragged last panel.
  const std::int64_t ap_floats = (micro * K * MR + 15) / 16 * 16;
  float* ap = scratch.get(static_cast<std::size_t>(ap_floats + micro * MR * P));
  float* tile = ap + ap_floats;
  // Writes run sequentially through Ap, reads along MR rows at once: a row at a time instead
  // strides the writes by MR floats (docs/performance.md#dm-gemm-pack-a).
  for (std::int64_t i = 0; i < micro; ++i) {
    const std::int64_t R = std::min(MR, rows - i * MR);
    float* CPUATTN_RESTRICT dst = ap + i * K * MR;
    const float* src[MR];
    for (std::int64_t r = 0; r < MR; ++r) src[r] = g.a.row(row0 + i * MR + std::min(r, R - 1));
    for (std::int64_t k = 0; k < K; ++k) {
      CPUATTN_UNROLL(12)
      for (std::int64_t r = 0; r < MR; ++r) dst[k * MR + r] = src[r][k];
    }
  }

  // Row addresses once per task: Rows::row divides twice, too often per micro-kernel call
  // (docs/performance.md#dm-gemm-row-addresses).
  float* cbase[kGemmMaxRowBlock];
  for (std::int64_t r = 0; r < rows; ++r) cbase[r] = g.c.row(row0 + r);
  float* crow[MR];
  for (std::int64_t p = p0; p < p1; ++p) {
    const std::int64_t cols = std::min(P, B.N - p * P);
    const float* bias = B.has_bias ? B.bias.data() + p * P : nullptr;
    for (std::int64_t k0 = 0; k0 < K; k0 += kGemmKc) {
      const std::int64_t kc = std::min(kGemmKc, K - k0);
      for (std::int64_t i = 0; i < micro; ++i) {
        const int R = static_cast<int>(std::min(MR, rows - i * MR));
        const float* a = ap + i * K * MR + k0 * MR;
        const float* init = k0 == 0 ? bias : nullptr;
        const bool last = k0 + kc == K;
        // Rows of B past this block's first, to the end of the matrix (the panels are adjacent):
        // prefetched by the first micro-panel only, which brings the block into L1 for the rest.
        const std::int64_t ahead = i == 0 ? (B.panels - p) * K - k0 : 0;
        for (int r = 0; r < R; ++r) crow[r] = cbase[i * MR + r] + (p - g.p_begin) * P;
        // One switch per micro-kernel call: the panel's element type.
        const auto rows_of_b = [&](float* const* out) {
          if (B.dtype == DType::bf16) {
            GemmRows<O, detail::Bf16>(
                R, a, reinterpret_cast<const detail::Bf16*>(B.panel_bf16(p) + k0 * P), kc, ahead,
                out, init, k0 > 0, last);
          } else {
            GemmRows<O, float>(R, a, B.panel(p) + k0 * P, kc, ahead, out, init, k0 > 0, last);
          }
        };
        if (cols == P) {
          rows_of_b(crow);
        } else {
          // The last panel is narrower than the vectors: its sums live in a full-width tile over
          // every k block, so no store touches C past column N, and go to C after the last.
          float* trow[MR];
          for (int r = 0; r < R; ++r) trow[r] = tile + (i * MR + r) * P;
          rows_of_b(trow);
          if (last) {
            for (int r = 0; r < R; ++r) std::copy(trow[r], trow[r] + cols, crow[r]);
          }
        }
      }
    }
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_GEMM_GEMM_INL_H_
