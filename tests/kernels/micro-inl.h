// The per-target half of tests/kernels/micro.h (include after a provider header).
#if defined(CPUATTN_TESTS_MICRO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_TESTS_MICRO_INL_H_
#undef CPUATTN_TESTS_MICRO_INL_H_
#else
#define CPUATTN_TESTS_MICRO_INL_H_
#endif

#include "kernels/common/mask-inl.h"
#include "kernels/flash/epilogue-inl.h"
#include "kernels/flash/keys_rows-inl.h"
#include "kernels/flash/kv_pack-inl.h"
#include "kernels/flash/merge-inl.h"
#include "kernels/flash/pv-inl.h"
#include "kernels/flash/pv_skip_zero-inl.h"
#include "kernels/flash/q_pack-inl.h"
#include "kernels/flash/score_tile-inl.h"
#include "kernels/flash/softmax-inl.h"
#include "kernels/flash/stream_dot-inl.h"
#include "kernels/flash/stream_runs-inl.h"
#include "micro.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"
#include "simd/targets.h"

CPUATTN_NAMESPACE_BEGIN

void MicroExp2(const float* in, float* out, std::size_t n) {
  MapArray<Ops>(in, out, n, [](Ops::V x) { return Exp2<Ops>(x); });
}

void MicroExp2Bf16(const float* in, float* out, std::size_t n) {
  MapArray<Ops>(in, out, n, [](Ops::V x) { return Exp2Bf16<Ops>(x); });
}

void MicroTanh(const float* in, float* out, std::size_t n) {
  MapArray<Ops>(in, out, n, [](Ops::V x) { return Tanh<Ops>(x); });
}

void MicroSoftCap(const float* in, float* out, std::size_t n, float cap) {
  const float k = static_cast<float>(2.0 * 1.4426950408889634 / cap);
  MapArray<Ops>(in, out, n, [cap, k](Ops::V x) {
    // The kernels' choice (TransformTile): the exact small branch for large caps.
    return cap > kSoftCapExactAbove ? SoftCap<Ops, true>(x, Ops::Set(cap), Ops::Set(k))
                                    : SoftCap<Ops, false>(x, Ops::Set(cap), Ops::Set(k));
  });
}

void MicroTranspose(float* m) {
  constexpr int N = Ops::kLanes;
  Ops::V r[N];
  for (int i = 0; i < N; ++i) r[i] = Ops::LoadU(m + i * N);
  Ops::Transpose(r);
  for (int i = 0; i < N; ++i) Ops::StoreU(r[i], m + i * N);
}

void MicroScoreTile(int R, const float* q, std::int64_t qs, std::int64_t D, const float* kp,
                    float* s, std::int64_t s_stride, std::int32_t col0, bool masked,
                    const std::int32_t* ends, const void* const* masks, detail::MaskKind kind,
                    std::int64_t mask_stride) {
  RowMask rm[Ops::kScoreRows];
  for (int r = 0; r < R; ++r) rm[r] = {0, ends[r], 0, 0.0f, masks[r]};
  const MaskInfo mi{kind, mask_stride};
  if (masked) {
    ScoreRows<Ops, true>(R, q, qs, D, kp, s, s_stride, col0, rm, mi);
  } else {
    ScoreRows<Ops, false>(R, q, qs, D, kp, s, s_stride, col0, rm, mi);
  }
}

bool MicroProbBlock(int rows, const float* q, std::int64_t qs, std::int64_t D, const float* kp,
                    std::int64_t ncols, float* m, bool first, float* s, std::int64_t s_stride,
                    float* lsum) {
  return ProbBlockTiles<Ops>(rows, q, qs, D, kp, ncols, m, first, s, s_stride, lsum, Ops::kLanes,
                             [] {});
}

void MicroKrScoreBlock(const float* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                       const float* qt, int qp, const float* m, float* st, float* mnew) {
  KeysAsRows<Ops>::ScoreBlock(k, ks, D, nk, qt, qp, m, st, mnew, [] {});
}

bool MicroKrProbBlock(const float* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                      const float* qt, int qp, const float* m, float* st, float* sums) {
  return KeysAsRows<Ops>::ProbBlock(k, ks, D, nk, qt, qp, m, st, sums, [] {});
}

void MicroKrPvBlock(const float* v, std::int64_t vs, std::int64_t Dv, std::int64_t nk,
                    const float* st, int qp, float* acct) {
  KeysAsRows<Ops>::PvBlock(v, vs, Dv, nk, st, qp, acct, [] {});
}

void MicroPvTile(int R, int C, const float* p, std::int64_t p_stride, const float* vp,
                 std::int64_t cw, std::int64_t nk, float* acc, std::int64_t acc_stride,
                 float* const* out_rows, const float* scale, bool stream) {
  const PvOut out{out_rows, scale, stream};
  PvRows<Ops>(R, C, p, p_stride, vp, cw, nk, acc, acc_stride, out_rows == nullptr ? nullptr : &out,
              0);
  if (stream) Ops::StreamFence();
}

void MicroPackKV(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0,
                 std::int64_t nk, float kscale, float* kp, float* vp) {
  PackKV<Ops>(p, Geometry<Ops>(p, Ops::kBlockKeys), b, hk, j0, nk, kscale, kp, vp);
}

void MicroSoftmaxRow(float* srow, std::int64_t ncols, float* m, float* lrow, float* arow,
                     std::int64_t dvp) {
  OnlineSoftmaxRow<Ops>(srow, ncols, *m, lrow, arow, dvp);
}

void MicroWiden(DType dtype, const void* in, float* out, std::size_t n) {
  detail::with_elem(dtype, [&](auto e) {
    using T = decltype(e);
    const T* x = static_cast<const T*>(in);
    constexpr std::size_t N = Ops::kLanes;
    std::size_t i = 0;
    for (; i + 3 * N <= n; i += 3 * N) {  // LoadWideN: a pair, then one
      typename Ops::V v[3];
      LoadWideN<Ops, 3>(x + i, v);
      for (std::size_t j = 0; j < 3; ++j) Ops::StoreU(v[j], out + i + j * N);
    }
    for (; i + N <= n; i += N) Ops::StoreU(LoadWide<Ops>(x + i), out + i);
    if (i < n) {
      alignas(64) float tail[N];
      Ops::Store(LoadWidePartial<Ops>(x + i, static_cast<std::int64_t>(n - i)), tail);
      for (std::size_t j = i; j < n; ++j) out[j] = tail[j - i];
    }
  });
}

void MicroWidenFp8Lo(const std::uint8_t* in, float* out, std::size_t n) {
  const auto* x = reinterpret_cast<const detail::Fp8E4M3Lo*>(in);
  constexpr std::size_t N = Ops::kLanes;
  std::size_t i = 0;
  for (; i + 3 * N <= n; i += 3 * N) {
    typename Ops::V v[3];
    LoadWideN<Ops, 3>(x + i, v);
    for (std::size_t j = 0; j < 3; ++j) Ops::StoreU(v[j], out + i + j * N);
  }
  for (; i + N <= n; i += N) Ops::StoreU(LoadWide<Ops>(x + i), out + i);
}

bool MicroWidenBf16Parity(const std::uint16_t* in, float* out, std::size_t n) {
#if CPUATTN_SIMD_BITS == 256 || CPUATTN_SIMD_BITS == 512
  const auto* x = reinterpret_cast<const detail::Bf16*>(in);
  constexpr std::size_t N = Ops::kLanes;
  alignas(64) float even[N], odd[N];
  for (std::size_t i = 0; i + 2 * N <= n; i += 2 * N) {
    Ops::Store(LoadWideEven<Ops>(x + i), even);
    Ops::Store(LoadWideOdd<Ops>(x + i), odd);
    for (std::size_t l = 0; l < N; ++l) {
      out[i + 2 * l] = even[l];
      out[i + 2 * l + 1] = odd[l];
    }
  }
  return true;
#else
  (void)in, (void)out, (void)n;
  return false;
#endif
}

void MicroPackQ(const detail::Problem& p, std::int64_t b, std::int64_t h0, std::int64_t nh,
                std::int64_t pos0, int rows, float qscale, std::int64_t qs, float* qp) {
  PackQ<Ops>(p, b, h0, nh, pos0, rows, qscale, qs, qp);
}

void MicroStreamDot(DType kdt, int R, const float* qp, std::int64_t qs, std::int64_t D,
                    const void* k, std::int64_t ks, std::int64_t nk, const float* kscale,
                    std::int64_t kss, float* s, std::int64_t s_stride) {
  detail::with_elem(kdt, [&](auto e) {
    using T = decltype(e);
    DotScores<Ops, false, T>(R, qp, qs, D, static_cast<const T*>(k), ks, nk, kscale, kss, s,
                             s_stride, detail::ScoresAhead{});
  });
}

void MicroStreamRuns(DType kdt, int R, const float* qp, std::int64_t qs, std::int64_t D, int nruns,
                     const void* const* k, const float* const* kscale, const std::int64_t* off,
                     const std::int64_t* n, std::int64_t ks, std::int64_t kss, float* s,
                     std::int64_t s_stride) {
  detail::with_elem(kdt, [&](auto e) {
    using T = decltype(e);
    KeyRun<T> runs[16];
    for (int i = 0; i < nruns; ++i)
      runs[i] = {static_cast<const T*>(k[i]),
                 kscale[i],
                 static_cast<const char*>(k[i]),
                 off[i],
                 n[i],
                 n[i]};
    DotScoresRuns<Ops, false, T>(R, qp, qs, D, runs, nruns, 0, ks, kss, s, s_stride, 0, 0);
  });
}

void MicroPvRuns(DType vdt, int R, int C, const float* p, std::int64_t p_stride, int nruns,
                 const void* const* v, const std::int64_t* j0, const std::int64_t* n,
                 std::int64_t c0, std::int64_t v_stride, float* acc, std::int64_t acc_stride) {
  detail::with_elem(vdt, [&](auto e) {
    using T = decltype(e);
    VRun<T> runs[16];
    for (int i = 0; i < nruns; ++i) runs[i] = {static_cast<const T*>(v[i]), j0[i], n[i]};
    PvRows<Ops, T>(R, C, p, p_stride, runs, nruns, c0, v_stride, acc, acc_stride);
  });
}

void MicroWriteRow(const detail::Problem& p, detail::OutUnit unit, float m, float l, float sink,
                   const float* arow, std::int64_t b, std::int64_t h, std::int64_t i) {
  WriteRow<Ops>(p, unit, detail::RowState{m, l, sink}, arow, b, h, i);
  if (unit == detail::OutUnit::f32_stream) Ops::StreamFence();
}

bool MicroAccFinite(const float* acc, std::int64_t n) { return AccFinite<Ops>(acc, n); }

void MicroMergeRows(const detail::Problem& p, const detail::Plan& pl, std::int64_t row0,
                    std::int64_t row1, float* buf) {
  MergeRows<Ops>(p, pl, row0, row1, buf);
}

const detail::MicroKernels* GetMicroKernels() {
  static const detail::MicroKernels table{.target = CPUATTN_UNIT_TARGET,
                                          .provider = simd::ProviderOf(Ops::kProvider),
                                          .lanes = Ops::kLanes,
                                          .score_rows = Ops::kScoreRows,
                                          .score_cols = Ops::kScoreCols,
                                          .pv_rows = Ops::kPvRows,
                                          .pv_cols = Ops::kPvCols,
                                          .block_keys = Ops::kBlockKeys,
                                          .exp2 = &MicroExp2,
                                          .exp2_bf16 = &MicroExp2Bf16,
                                          .tanh = &MicroTanh,
                                          .softcap = &MicroSoftCap,
                                          .transpose = &MicroTranspose,
                                          .prob_block = &MicroProbBlock,
                                          .score_tile = &MicroScoreTile,
                                          .pv_tile = &MicroPvTile,
                                          .pack_kv = &MicroPackKV,
                                          .softmax_row = &MicroSoftmaxRow,
                                          .widen = &MicroWiden,
                                          .widen_fp8_lo = &MicroWidenFp8Lo,
                                          .widen_bf16_parity = &MicroWidenBf16Parity,
                                          .pack_q = &MicroPackQ,
                                          .kr_chunk = KeysAsRows<Ops>::kChunk,
                                          .kr_score_block = &MicroKrScoreBlock,
                                          .kr_prob_block = &MicroKrProbBlock,
                                          .kr_pv_block = &MicroKrPvBlock,
                                          .stream_dot = &MicroStreamDot,
                                          .stream_runs = &MicroStreamRuns,
                                          .pv_runs = &MicroPvRuns,
                                          .write_row = &MicroWriteRow,
                                          .acc_finite = &MicroAccFinite,
                                          .merge_rows = &MicroMergeRows};
  return &table;
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_TESTS_MICRO_INL_H_
