// The score unit ScoreUnit::dot: streamed blocks of few query rows (decoding), K read in place
// where packing it would cost more than it saves. One stream per block; stream_runs-inl.h
// reads four at once.
#if defined(CPUATTN_KERNELS_FLASH_STREAM_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_STREAM_DOT_INL_H_
#undef CPUATTN_KERNELS_FLASH_STREAM_DOT_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_STREAM_DOT_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/common/outer-inl.h"
#include "kernels/flash/fp8_lo-inl.h"
#include "kernels/flash/key_ahead.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"
#if CPUATTN_SIMD_BITS > 0
#include "simd/x86/x86-inl.h"
#endif

CPUATTN_NAMESPACE_BEGIN

// Where the bf16 hi and lo copies of a Qp row start (QUnit::f32_hilo, x86/bf16_stream-inl.h):
// after the row's D floats rounded up to 16.
inline std::int64_t QHiLoOffset(std::int64_t D) { return (D + 15) / 16 * 16; }

// The native hi/lo dot (x86/bf16_stream-inl.h), defined only in the avx512_bf16 unit.
template <class O>
struct Bf16Stream;

#if CPUATTN_SIMD_BITS >= 256
// Rows of Q that Dot4 takes at once: AVX-512's 32 registers hold its 4R accumulators up to 6 rows;
// AVX2's 16 hold 4 rows because each pair of keys is folded as soon as it is complete (2R
// accumulators, R folded pairs and the K vectors).
inline constexpr int kDot4Rows = CPUATTN_SIMD_BITS == 512 ? 6 : 4;

// Whether DotKeys reads its G keys side by side, d by d, so that each Q vector load serves every
// key, instead of key after key, each row front to back, whose addresses ascend as in a plain
// stream the hardware prefetchers follow (interleaving four f32/bf16 rows per d lost from DRAM
// with AVX-512: docs/performance.md#dm-decode-key-order). 1-byte rows are short runs (128 bytes at
// D = 128), so side by side still moves through memory in order. 2-byte and f32 rows on AVX2 as
// well: key after key, each step is R Q loads and a K load for R FMAs, more loads than a core
// serves beside two FMA pipes, in only R chains against the FMA's latency (one chain for one row);
// G keys side by side take R + G loads for GR FMAs in GR chains, the same sums bit for bit
// (docs/performance.md#dm-decode-bf16-side-by-side, #dm-decode-f32-side-by-side-avx2,
// #dm-decode-one-row-avx2). Keys of four runs (kRuns: RunsStep4) lie in four streams whatever the
// order, so they go side by side too: key after key, AVX-512's f32 step was R Q loads and a K load
// for R FMAs, 5 loads for 4 FMAs at R = 4 (docs/performance.md#dm-runs-side-by-side).
template <class T, int R, bool kRuns>
inline constexpr bool kKeysSideBySide = kRuns || sizeof(T) == 1 ||
                                        (sizeof(T) <= 4 && CPUATTN_SIMD_BITS == 256);

// Keys Dot4 takes side by side in one pass on AVX2: all four where its 4R accumulators fit the 16
// registers beside four K vectors and a Q vector (R <= 2) or beside R Q vectors and one key
// widened in its own register (R = 3, every type but fp8), else two pairs one after the other.
// One row (MHA decoding) with a pair per pass was two FMA chains against the FMA's 4-cycle
// latency, one row key after key one chain, three rows six. fp8's widening constants take
// registers of their own, so three rows of fp8 keys keep pairs
// (docs/performance.md#dm-decode-one-row-avx2, #dm-decode-three-rows-avx2).
template <int R, class T>
inline constexpr int kDot4KeysAtOnce = R <= 2 || (R == 3 && kWidensInPlace<T>) ? 4 : 2;

// Whether DotKeys' side-by-side step holds its G K vectors and loads one Q vector at a time, or,
// where R * G accumulators, G keys and a Q vector overflow the registers (AVX2's 3 x 4), holds
// the R Q vectors and widens one key at a time (kBroadcastsFirst's choice, outer-inl.h). Holding
// the keys GCC kept an accumulator on the stack, its FMA chain through a store and a reload.
template <int R, int G>
inline constexpr bool kKeysHeld = (G * (R + 1) + 1 <= (CPUATTN_SIMD_BITS == 512 ? 32 : 16));

// Keys k[0..G) into acc[r][g] over d < dv, in the order kKeysSideBySide chooses (the same FMAs
// into each accumulator in the same order whichever operands kKeysHeld keeps in registers).
template <class O, int R, int G, class T, bool kRuns>
CPUATTN_ALWAYS_INLINE void DotKeys(const float* CPUATTN_RESTRICT qd, std::int64_t dp,
                                   std::int64_t dv, const T* const* k, typename O::V (&acc)[R][G]) {
  constexpr int N = O::kLanes;
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int g = 0; g < G; ++g) acc[r][g] = O::Zero();
  }
  if constexpr (kKeysSideBySide<T, R, kRuns>) {
    const T* kk[G];
    CPUATTN_UNROLL(4)
    for (int g = 0; g < G; ++g) kk[g] = k[g];
    for (std::int64_t d = 0; d < dv; d += N) {
      if constexpr (kKeysHeld<R, G>) {
        typename O::V kv[G];
        CPUATTN_UNROLL(4)
        for (int g = 0; g < G; ++g) kv[g] = LoadWide<O>(k[g] + d);
        CPUATTN_UNROLL(16)
        for (int r = 0; r < R; ++r) {
          const typename O::V qv = InRegister<O>(O::Load(qd + r * dp + d));  // one load, G FMAs
          CPUATTN_UNROLL(4)
          for (int g = 0; g < G; ++g) acc[r][g] = O::MulAdd(qv, kv[g], acc[r][g]);
        }
      } else {
        typename O::V qv[R];
        CPUATTN_UNROLL(16)
        for (int r = 0; r < R; ++r) qv[r] = InRegister<O>(O::Load(qd + r * dp + d));
        CPUATTN_UNROLL(4)
        for (int g = 0; g < G; ++g) {
          if (g > 0) kk[g] = LoadAfter<O, R>([&](int r) { return acc[r][g - 1]; }, kk[g]);
          const typename O::V kv = InRegister<O>(LoadWide<O>(kk[g] + d));  // one load, R FMAs
          CPUATTN_UNROLL(16)
          for (int r = 0; r < R; ++r) acc[r][g] = O::MulAdd(qv[r], kv, acc[r][g]);
        }
      }
    }
  } else {
    CPUATTN_UNROLL(4)
    for (int g = 0; g < G; ++g) {
      for (std::int64_t d = 0; d < dv; d += N) {
        const typename O::V kv = LoadWide<O>(k[g] + d);
        CPUATTN_UNROLL(16)
        for (int r = 0; r < R; ++r) acc[r][g] = O::MulAdd(O::Load(qd + r * dp + d), kv, acc[r][g]);
      }
    }
  }
}

// R rows' dot products with four keys (rows k[0..3] of D elements), one 128-bit vector per row
// whose lane g is key g: one 4-way reduction per row instead of four (per-key reductions made the
// score loop compute-bound: docs/performance.md#dm-dot4-reduction), and four independent FMA
// chains per row where one key at a time waits on one (a single row, MHA decoding, was bound by
// the FMA latency on AVX2).
// kHiLo: the Qp rows carry bf16 hi/lo copies (QUnit::f32_hilo) and bf16 K runs on vdpbf16ps.
// kRuns: the four keys come from four runs (kKeysSideBySide).
template <class O, bool kHiLo, int R, class T, bool kRuns>
CPUATTN_ALWAYS_INLINE void Dot4(const float* CPUATTN_RESTRICT qd, std::int64_t dp, std::int64_t D,
                                const T* const (&k)[4], __m128 (&sum)[R]) {
  static_assert(R <= kDot4Rows);
#if CPUATTN_SIMD_BITS == 512
  if constexpr (kHiLo && std::is_same_v<T, detail::Bf16> && R >= 2) {
    Bf16Stream<O>::template Dot4HiLo<R>(qd, dp, D, k, sum);
    return;
  }
#endif
  const std::int64_t dv = D / O::kLanes * O::kLanes;
#if CPUATTN_SIMD_BITS == 512
  typename O::V acc[R][4];
  DotKeys<O, R, 4, T, kRuns>(qd, dp, dv, k, acc);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    sum[r] = x86::ReduceSum4(O::ToRaw(acc[r][0]), O::ToRaw(acc[r][1]), O::ToRaw(acc[r][2]),
                             O::ToRaw(acc[r][3]));
  }
#else
  // Each key's accumulator takes the same FMAs in the same order either way: the same sums.
  constexpr int G = kDot4KeysAtOnce<R, T>;
  __m256 pairs[2][R];
  CPUATTN_UNROLL(2)
  for (int h = 0; h < 4; h += G) {
    typename O::V acc[R][G];
    DotKeys<O, R, G, T, kRuns>(qd, dp, dv, k + h, acc);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(2)
      for (int g = 0; g < G; g += 2)
        pairs[(h + g) / 2][r] = x86::PairSum(O::ToRaw(acc[r][g]), O::ToRaw(acc[r][g + 1]));
    }
  }
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) sum[r] = x86::ReducePairSums(pairs[0][r], pairs[1][r]);
#endif
  if (dv < D) {
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      alignas(16) float tail[4] = {};
      for (int g = 0; g < 4; ++g)
        for (std::int64_t d = dv; d < D; ++d) tail[g] += qd[r * dp + d] * detail::to_float(k[g][d]);
      sum[r] = _mm_add_ps(sum[r], _mm_load_ps(tail));
    }
  }
}

// Dot4 for up to twice its rows: more than kDot4Rows take it in two halves over the same four keys
// (the second half reads them from L1). One key at a time instead (8 rows per K/V head: Llama 3
// 70B, Qwen2 72B) was a horizontal sum per row and key, 9 loads per 8 FMAs on AVX2, and none of
// the four-key loop's prefetches, so P V read V from DRAM:
// docs/performance.md#dm-decode-dot4-halves.
template <class O, bool kHiLo, int R, class T>
CPUATTN_ALWAYS_INLINE void Dot4Rows(const float* CPUATTN_RESTRICT qd, std::int64_t dp,
                                    std::int64_t D, const T* const (&k)[4], __m128 (&sum)[R]) {
  static_assert(R <= 2 * kDot4Rows);
  if constexpr (R <= kDot4Rows) {
    Dot4<O, kHiLo, R, T, false>(qd, dp, D, k, sum);
  } else {
    constexpr int R0 = (R + 1) / 2;
    __m128 lo[R0], hi[R - R0];
    Dot4<O, kHiLo, R0, T, false>(qd, dp, D, k, lo);
    Dot4<O, kHiLo, R - R0, T, false>(qd + R0 * dp, dp, D, k, hi);
    CPUATTN_UNROLL(8)
    for (int r = 0; r < R0; ++r) sum[r] = lo[r];
    CPUATTN_UNROLL(8)
    for (int r = R0; r < R; ++r) sum[r] = hi[r - R0];
  }
}
#endif

// Streaming scores for a few query rows (decode): S[r][j] = Qd[r] . K[j] with K read in place,
// row after row, so the stream runs at memory speed and nothing is packed. One K vector load
// serves R rows; a horizontal sum per score is affordable because there are few rows. K of a
// reduced-precision dtype is widened in registers as it is loaded (each element is used by all
// R rows of that load); an int8 key's score is multiplied by its scale, kscale[j * kss]. With
// `ahead.v`, the V rows of the same keys are prefetched, and K rows ahead (detail::ScoresAhead).
template <class O, bool kHiLo, int R, class T>
CPUATTN_ALWAYS_INLINE void DotScoresR(const float* CPUATTN_RESTRICT qd, std::int64_t dp,
                                      std::int64_t D, const T* CPUATTN_RESTRICT k, std::int64_t ks,
                                      std::int64_t nk, const float* kscale, std::int64_t kss,
                                      float* CPUATTN_RESTRICT s, std::int64_t s_stride,
                                      const detail::ScoresAhead& ahead) {
  constexpr int N = O::kLanes;
  const std::int64_t dv = D / N * N;
  std::int64_t j = 0;
#if CPUATTN_SIMD_BITS >= 256
  if constexpr (R <= 2 * kDot4Rows) {
    for (; j + 4 <= nk; j += 4) {
      const T* const k4[4] = {k + j * ks, k + (j + 1) * ks, k + (j + 2) * ks, k + (j + 3) * ks};
      __m128 sum[R];
      Dot4Rows<O, kHiLo, R, T>(qd, dp, D, k4, sum);
      // Ask for these keys' V rows now (into L1 or L2: ScoresAhead): P V reads them right after
      // this block's scores, and a second stream in flight beside K's raises what one core pulls
      // from DRAM (docs/performance.md#dm-decode-v-prefetch-l1). Whole blocks ahead into L2 as well
      // (PrefetchKV) slowed contiguous int8 decoding, so streamed blocks skip it
      // (docs/performance.md#dm-prefetchkv-streamed). With it, the K rows 16 keys ahead (of the
      // k_valid keys from k on that exist, so across the block's end but never past the task's
      // keys: no address outside K is formed): the hardware prefetcher alone left a
      // one-row-per-block decode (M2) latency-bound
      // (docs/performance.md#dm-decode-k-prefetch-ahead).
      if (ahead.v != nullptr) {
        for (int g = 0; g < 4 && j + 16 + g < ahead.k_valid; ++g)
          for (std::int64_t off = 0; off < D * static_cast<std::int64_t>(sizeof(T)); off += 64)
            detail::Prefetch<3>(reinterpret_cast<const char*>(k + (j + 16 + g) * ks) + off);
        for (int g = 0; g < 4; ++g) {
          const char* vrow = ahead.v + (j + g) * ahead.v_stride;
          for (std::int64_t off = 0; off < ahead.v_bytes; off += 64) {
            if (ahead.v_l2) {
              detail::Prefetch<1>(vrow + off);
            } else {
              detail::Prefetch<3>(vrow + off);
            }
          }
        }
      }
      // The four scores of each row leave as one 128-bit vector: the epilogue per key (tail,
      // scale, store) cost as many operations as the key's FMAs (int8 K, D2 on one thread).
      const __m128 sc = kscale == nullptr
                            ? _mm_set1_ps(1.0f)
                            : _mm_setr_ps(kscale[j * kss], kscale[(j + 1) * kss],
                                          kscale[(j + 2) * kss], kscale[(j + 3) * kss]);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r)
        _mm_storeu_ps(s + r * s_stride + j, kscale == nullptr ? sum[r] : _mm_mul_ps(sum[r], sc));
    }
  }
#endif
  for (; j < nk; ++j) {
    const T* krow = k + j * ks;
    typename O::V acc[R];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) acc[r] = O::Zero();
    // fp8 read as Fp8E4M3Lo two vectors per step (LoadWideN widens a pair for less), each
    // accumulator taking its products in the same order as one vector per step; the other types
    // one vector per step (two per step ran f32 keys a little slower).
    std::int64_t d = 0;
    constexpr bool kPairs = std::is_same_v<T, detail::Fp8E4M3Lo>;
    for (; kPairs && d + 2 * N <= dv; d += 2 * N) {
      typename O::V kv[2];
      LoadWideN<O, 2>(krow + d, kv);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) acc[r] = O::MulAdd(O::Load(qd + r * dp + d), kv[0], acc[r]);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) acc[r] = O::MulAdd(O::Load(qd + r * dp + d + N), kv[1], acc[r]);
    }
    for (; d < dv; d += N) {
      const typename O::V kv = LoadWide<O>(krow + d);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) acc[r] = O::MulAdd(O::Load(qd + r * dp + d), kv, acc[r]);
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      float tail = 0.0f;
      for (std::int64_t d = dv; d < D; ++d) tail += qd[r * dp + d] * detail::to_float(krow[d]);
      const float dot = O::ReduceSum(acc[r]) + tail;
      s[r * s_stride + j] = kscale == nullptr ? dot : dot * kscale[j * kss];
    }
  }
}

template <class O, bool kHiLo, class T>
void DotScores(int R, const float* qd, std::int64_t dp, std::int64_t D, const T* k, std::int64_t ks,
               std::int64_t nk, const float* kscale, std::int64_t kss, float* s,
               std::int64_t s_stride, const detail::ScoresAhead& ahead) {
  switch (R) {
#define CPUATTN_DOT_CASE(n)                                                            \
  case n:                                                                              \
    DotScoresR<O, kHiLo, n, T>(qd, dp, D, k, ks, nk, kscale, kss, s, s_stride, ahead); \
    break;
    CPUATTN_DOT_CASE(1)
    CPUATTN_DOT_CASE(2)
    CPUATTN_DOT_CASE(3)
    CPUATTN_DOT_CASE(4)
    CPUATTN_DOT_CASE(5)
    CPUATTN_DOT_CASE(6)
    CPUATTN_DOT_CASE(7)
    CPUATTN_DOT_CASE(8)
#undef CPUATTN_DOT_CASE
    default:
      break;
  }
}

// ScoreUnit::dot for the `rows` Qp rows (stride qs) of K/V head hk: keys [0, nk_live) of the
// contiguous block at kb0 (task keys end at k1; a paged block lies in one page, whose end also
// ends the K rows prefetched ahead) into S rows of s_stride. V rows are prefetched
// beside K, f32 V as well: with P V prefetching the next block's K (BlockPath::k_ahead) each
// phase keeps one block of bytes in flight (docs/performance.md#dm-k-ahead-f32). k_asked: P V
// asked for this block's K rows already and the plan has the scores ask for none ahead of their
// own (BlockPath::scores_k_ahead false: 2-byte K on AMD's Zen 3 and Zen 4,
// docs/performance.md#dm-scores-k-ahead). k_lo: Qp was multiplied by 2^120 and an fp8 K reads as
// Fp8E4M3Lo (fp8_lo-inl.h). v_l2: V rows into L2 (BlockPath::v_ahead_l2).
template <class O, bool kHiLo>
void ScoreBlockDot(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t kb0,
                   std::int64_t nk_live, std::int64_t k1, int rows, const float* qp,
                   std::int64_t qs, float* s, std::int64_t s_stride, bool k_lo, bool k_asked,
                   bool v_l2) {
  WithReadElem(p.k.dtype, k_lo, [&](auto t) {
    using T = decltype(t);
    const auto ev = static_cast<std::int64_t>(dtype_size(p.v.dtype));
    const T* K = static_cast<const T*>(p.k.data) + p.key_off(p.k.s, b, kb0) + hk * p.k.s[1];
    const float* kscale = p.k_scale == nullptr
                              ? nullptr
                              : p.k_scale + p.key_off(p.k_scale_s, b, kb0) + hk * p.k_scale_s[1];
    detail::ScoresAhead ahead;
    ahead.v = static_cast<const char*>(p.v.data) + (p.key_off(p.v.s, b, kb0) + hk * p.v.s[1]) * ev;
    ahead.v_stride = p.v.s[2] * ev;
    ahead.v_bytes = p.Dv * ev;
    ahead.k_valid = k_asked ? 0 : std::min(k1 - kb0, p.page_run(kb0));
    ahead.v_l2 = v_l2;
    DotScores<O, kHiLo, T>(rows, qp, qs, p.D, K, p.k.s[2], nk_live, kscale, p.k_scale_s[2], s,
                           s_stride, ahead);
    if constexpr (std::is_same_v<T, detail::Fp8E4M3Lo>)
      SetNanKeyScores<O>(&K->bits, p.k.s[2], p.D, nk_live, rows, s, s_stride);
  });
}

// K rows [j0, j1) of head hk (in one page of a paged cache), for P V to prefetch as the rows
// the scores read next (BlockPath::k_ahead).
inline detail::KeyAhead KeyAheadOf(const detail::Problem& p, std::int64_t b, std::int64_t hk,
                                   std::int64_t j0, std::int64_t j1) {
  detail::KeyAhead ahead;
  if (j0 >= j1) return ahead;
  const auto ek = static_cast<std::int64_t>(dtype_size(p.k.dtype));
  ahead.first = static_cast<const char*>(p.k.data) + (p.key_off(p.k.s, b, j0) + hk * p.k.s[1]) * ek;
  ahead.rows = j1 - j0;
  ahead.stride = p.k.s[2] * ek;
  ahead.bytes = p.D * ek;
  return ahead;
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_STREAM_DOT_INL_H_
