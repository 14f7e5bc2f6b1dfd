// The P V units of the portable paths: PvUnit::tile_f32 (rows of P times packed f32 V chunks)
// and PvUnit::runs (V read in place in runs of keys that share a page, widened as loaded), the
// micro-kernel both use, and the scaling of P by V's per-key scales (int8 and other scaled
// types: v = q * scale, so p v = (p scale) q).
#if defined(CPUATTN_KERNELS_FLASH_PV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_PV_INL_H_
#undef CPUATTN_KERNELS_FLASH_PV_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_PV_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/common/mask-inl.h"
#include "kernels/common/outer-inl.h"
#include "kernels/flash/fp8_lo-inl.h"
#include "kernels/flash/key_ahead.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// A run of V rows read in place: keys [j0, j0 + n) of the block, rows `v_stride` elements apart
// from v (one page's rows, for a paged cache).
template <class TV>
struct VRun {
  const TV* v;
  std::int64_t j0, n;
};

// Keys [s0, s1) of the block at kb0 of K/V head hk as runs that share a page (one run without
// pages) in vruns; returns their count.
template <class TV>
CPUATTN_ALWAYS_INLINE int MakeVRuns(const detail::Problem& p, std::int64_t b, std::int64_t hk,
                                    std::int64_t kb0, std::int64_t s0, std::int64_t s1,
                                    VRun<TV>* vruns) {
  int nv = 0;
  for (std::int64_t j0 = s0; j0 < s1; ++nv) {
    const std::int64_t nj = std::min(s1 - j0, p.page_run(kb0 + j0));
    vruns[nv] = {static_cast<const TV*>(p.v.data) + p.key_off(p.v.s, b, kb0 + j0) + hk * p.v.s[1],
                 j0, nj};
    j0 += nj;
  }
  return nv;
}

// Where the P V tiles of a query block's last key block also write their rows' outputs
// (BlockPath::out_in_pv): row r of the block goes to rows[r] as Acc * scale[r], through
// non-temporal stores where `stream` and the row is vector-aligned. The tile that completes a
// part of a row writes it from its accumulators, in registers: no second pass reads Acc back.
struct PvOut {
  float* const* rows;
  const float* scale;
  bool stream;
};

// Acc[R][0:C vectors] += P[R][keys of the runs] . V[those keys][c0 : c0 + C vectors]. R * C
// accumulators in registers across all runs (loaded and stored once per block, not once per
// 16-key page: at R = 4, C = 4 that was 32 memory operations per 256 FMAs); each key costs C
// loads, R broadcasts and R*C FMAs. V is f32 (packed, or in place) or, in place for decode, a
// reduced-precision TV widened as it is loaded. With `out` (rows of this tile from out->rows[0]),
// the finished rows' columns [oc, oc + C vectors) are written there as well.
template <class O, int R, int C, class TV = float>
CPUATTN_ALWAYS_INLINE void PvTile(const float* CPUATTN_RESTRICT p, std::int64_t p_stride,
                                  const VRun<TV>* runs, int nruns, std::int64_t c0,
                                  std::int64_t v_stride, float* CPUATTN_RESTRICT acc_out,
                                  std::int64_t acc_stride, const PvOut* out, std::int64_t oc) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  V acc[R][C];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(16)
    for (int c = 0; c < C; ++c) acc[r][c] = O::Load(acc_out + r * acc_stride + c * N);
  }
  for (int i = 0; i < nruns; ++i)
    AccumulateOuter<O, R, C, TV>(p + runs[i].j0, 1, p_stride, runs[i].v + c0, v_stride, runs[i].n,
                                 acc);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(16)
    for (int c = 0; c < C; ++c) O::Store(acc[r][c], acc_out + r * acc_stride + c * N);
  }
  if (out == nullptr) return;
  for (int r = 0; r < R; ++r) {
    float* dst = out->rows[r] + oc;
    const V scale = O::Set(out->scale[r]);
    if (out->stream && reinterpret_cast<std::uintptr_t>(dst) % (N * sizeof(float)) == 0) {
      CPUATTN_UNROLL(16)
      for (int c = 0; c < C; ++c) O::Stream(O::Mul(acc[r][c], scale), dst + c * N);
    } else {
      CPUATTN_UNROLL(16)
      for (int c = 0; c < C; ++c) O::StoreU(O::Mul(acc[r][c], scale), dst + c * N);
    }
  }
}

// Column vectors of the P V tiles of at most kPvFewRows rows (PvBlockRuns): the R x C
// accumulators are the tile's FMA chains, and one row of kPvCols = 2 vectors (MHA decoding on
// AVX2, SSE4 and the portable fallback) was two chains against the FMA's latency of 4 or more
// cycles, three rows (GQA groups of 3: Llama 3.2 3B) six; 4 columns give 4, 8 and 12 chains. Three
// rows fill the 16 registers as the dense product's 3 x 4 tile does: 12 accumulators, the 3
// broadcasts and one V vector at a time (kBroadcastsFirst, kernels/common/outer-inl.h), which
// leaves no register for the constants of fp8's widening (GCC kept up to four accumulators on the
// stack): fp8 V takes 4 columns for at most two rows (docs/performance.md#dm-decode-one-row-avx2,
// #dm-decode-three-rows-avx2).
template <class TV>
inline constexpr int kPvFewRows = kWidensInPlace<TV> ? 3 : 2;
template <class O>
inline constexpr int kPvFewRowsCols = O::kPvCols < 4 ? 4 : O::kPvCols;

template <class O, int C, class TV>
void PvRowsC(int R, const float* p, std::int64_t p_stride, const VRun<TV>* runs, int nruns,
             std::int64_t c0, std::int64_t v_stride, float* acc, std::int64_t acc_stride,
             const PvOut* out, std::int64_t oc) {
  switch (R) {
#define CPUATTN_PV_CASE(n)                                                                   \
  case n:                                                                                    \
    if constexpr (n <= O::kPvRows && (C <= O::kPvCols || n <= kPvFewRows<TV>))               \
      PvTile<O, n, C, TV>(p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride, out, oc); \
    break;
    CPUATTN_PV_CASE(1)
    CPUATTN_PV_CASE(2)
    CPUATTN_PV_CASE(3)
    CPUATTN_PV_CASE(4)
    CPUATTN_PV_CASE(5)
    CPUATTN_PV_CASE(6)
    CPUATTN_PV_CASE(7)
    CPUATTN_PV_CASE(8)
#undef CPUATTN_PV_CASE
    default:
      break;
  }
}

// R rows' accumulators [acc, acc + C vectors) (columns c0 on of V) += P . V over the runs; with
// `out`, also their outputs' columns [oc, oc + C vectors) (PvOut).
template <class O, class TV = float>
void PvRows(int R, int C, const float* p, std::int64_t p_stride, const VRun<TV>* runs, int nruns,
            std::int64_t c0, std::int64_t v_stride, float* acc, std::int64_t acc_stride,
            const PvOut* out = nullptr, std::int64_t oc = 0) {
  static_assert(O::kPvRows <= 8 && O::kPvCols <= 4 && kPvFewRowsCols<O> <= 4,
                "extend the switches");
  switch (C) {
    case 1:
      PvRowsC<O, 1, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride, out, oc);
      break;
    case 2:
      if constexpr (kPvFewRowsCols<O> >= 2)
        PvRowsC<O, 2, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride, out, oc);
      break;
    case 3:
      if constexpr (kPvFewRowsCols<O> >= 3)
        PvRowsC<O, 3, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride, out, oc);
      break;
    case 4:
      if constexpr (kPvFewRowsCols<O> >= 4)
        PvRowsC<O, 4, TV>(R, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride, out, oc);
      break;
    default:
      break;
  }
}

// One run of nk keys: P[R][0:nk] . vp[nk][0:C vectors], rows `cw` elements apart.
template <class O, class TV = float>
void PvRows(int R, int C, const float* p, std::int64_t p_stride, const TV* vp, std::int64_t cw,
            std::int64_t nk, float* acc, std::int64_t acc_stride, const PvOut* out = nullptr,
            std::int64_t oc = 0) {
  const VRun<TV> one{vp, 0, nk};
  PvRows<O, TV>(R, C, p, p_stride, &one, 1, 0, cw, acc, acc_stride, out, oc);
}

// PvUnit::tile_f32: Acc rows [r_lo, r_hi) += P . V over a block of nk keys (the first nk_live of
// them seen), one column chunk at a time so that the chunk stays in L1. V is the packed chunks at
// vp, or with `in_place` f32 rows v_stride apart from vp (KvUnit::k_packed): the same tiles over
// the same keys either way. With the rows' masks `rm` (a block some row does not see whole), a
// tile stops at the last key its rows see: the keys after it have weight 0 in every row (a
// causal block on the diagonal skips about half its products). With `out` (the block's rows
// from row 0; the key block that completes them), each tile writes its rows' outputs too
// (PvOut). between() runs after each tile, as in ScoreBlockTiles.
template <class O, class Between>
void PvBlockTiles(int r_lo, int r_hi, const float* s, std::int64_t s_stride, const float* vp,
                  bool in_place, std::int64_t v_stride, std::int64_t nk, std::int64_t nk_live,
                  const RowMask* rm, float* acc, std::int64_t dvp, const PvOut* out,
                  const Between& between) {
  constexpr int CW = O::kPvCols * O::kLanes;
  for (std::int64_t c0 = 0; c0 < dvp; c0 += CW) {
    const std::int64_t cw = std::min<std::int64_t>(CW, dvp - c0);
    const float* vchunk = in_place ? vp + c0 : vp + c0 * nk;
    const std::int64_t vs = in_place ? v_stride : cw;
    for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
      const int R = std::min(O::kPvRows, r_hi - r0);
      const std::int64_t keys =
          rm == nullptr ? nk_live
                        : std::clamp<std::int64_t>(SeenKeysOf(R, rm + r0).end, 0, nk_live);
      const PvOut tile_out =
          out == nullptr ? PvOut{} : PvOut{out->rows + r0, out->scale + r0, out->stream};
      PvRows<O>(R, static_cast<int>(cw / O::kLanes), s + r0 * s_stride, s_stride, vchunk, vs, keys,
                acc + r0 * dvp + c0, dvp, out == nullptr ? nullptr : &tile_out, c0);
      between();
    }
  }
}

// P rows [r_lo, r_hi) times the per-key scales of V (keys [0, nk_live) of the block at kb0, K/V
// head hk; 1 without scales), then times `factor` (a power of two: exact): the scale joins P
// after the softmax sum. Scales one per key in a row (the usual [B, Hkv, Lk] layout) go whole
// vectors first.
template <class O>
void ScalePByVScales(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                     std::int64_t nk_live, int r_lo, int r_hi, float* s, std::int64_t s_stride,
                     float factor) {
  constexpr int N = O::kLanes;
  const float one = 1.0f;
  const typename O::V vf = O::Set(factor);
  for (std::int64_t j0 = 0; j0 < nk_live;) {
    const std::int64_t nj = std::min(nk_live - j0, p.page_run(kb0 + j0));
    const bool scaled = p.v_scale != nullptr;
    const float* vs =
        scaled ? p.v_scale + p.key_off(p.v_scale_s, b, kb0 + j0) + hk * p.v_scale_s[1] : &one;
    const std::int64_t vss = scaled ? p.v_scale_s[2] : 0;
    const std::int64_t nv = vss == 1 ? nj / N * N : 0;
    for (int r = r_lo; r < r_hi; ++r) {
      float* sr = s + r * s_stride + j0;
      for (std::int64_t jj = 0; jj < nv; jj += N)
        O::StoreU(O::Mul(O::Mul(O::LoadU(sr + jj), O::LoadU(vs + jj)), vf), sr + jj);
      for (std::int64_t jj = nv; jj < nj; ++jj) sr[jj] = sr[jj] * vs[jj * vss] * factor;
    }
    j0 += nj;
  }
}

// Keys per step of the streamed P V runs: every column chunk of these rows before the next rows,
// so V is read front to back in runs that stay in L1 while their chunks are read (8 KiB of f32 at
// Dv 128) instead of one column chunk of the whole block at a time
// (docs/performance.md#dm-stream-keys).
inline constexpr std::int64_t kStreamKeys = 16;
// PvBlockRuns' steps hold the same bytes of V for narrower elements (32 bf16 or 64 int8 keys):
// each step costs a call per column chunk and row tile, which loads and stores the tile's
// accumulators (docs/performance.md#dm-stream-bytes).
template <class T>
inline constexpr std::int64_t kStepKeys = kStreamKeys* static_cast<std::int64_t>(sizeof(float) /
                                                                                 sizeof(T));

// PvUnit::runs: Acc rows [r_lo, r_hi) += P . V with V of K/V head hk read in place (keys
// [0, nk_live) of the block at kb0), widened as loaded; the runs of a step share a page, so the
// tile keeps its accumulators in registers across a paged block's pages. P is already scaled by
// V's scales where V has them (and by 2^120 where V reads as Fp8E4M3Lo, `v_lo`). The K rows read
// next (`ahead`) are prefetched a share per column chunk of each step.
template <class O>
void PvBlockRuns(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                 std::int64_t nk_live, int r_lo, int r_hi, const float* s, std::int64_t s_stride,
                 float* acc, std::int64_t dvp, bool v_lo, const detail::KeyAhead& ahead) {
  WithReadElem(p.v.dtype, v_lo, [&](auto t) {
    using T = decltype(t);
    const std::int64_t CW =
        (r_hi - r_lo <= kPvFewRows<T> ? kPvFewRowsCols<O> : O::kPvCols) * std::int64_t{O::kLanes};
    constexpr std::int64_t K = kStepKeys<T>;
    const std::int64_t steps = (nk_live + K - 1) / K, chunks = (dvp + CW - 1) / CW;
    VRun<T> vruns[K];
    for (std::int64_t s0 = 0; s0 < nk_live; s0 += K) {
      const int nv = MakeVRuns<T>(p, b, hk, kb0, s0, std::min(nk_live, s0 + K), vruns);
      for (std::int64_t c0 = 0; c0 < dvp; c0 += CW) {
        ahead.Share(s0 / K * chunks + c0 / CW, steps * chunks);
        const std::int64_t cw = std::min<std::int64_t>(CW, dvp - c0);
        for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
          const int R = std::min(O::kPvRows, r_hi - r0);
          PvRows<O, T>(R, static_cast<int>(cw / O::kLanes), s + r0 * s_stride, s_stride, vruns, nv,
                       c0, p.v.s[2], acc + r0 * dvp + c0, dvp);
        }
      }
    }
  });
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_PV_INL_H_
