// The streaming score path for blocks of few query rows (decode), where packing K would cost
// more than it saves.
#if defined(CPUATTN_KERNELS_FLASH_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_DECODE_INL_H_
#undef CPUATTN_KERNELS_FLASH_DECODE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_DECODE_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/dtypes.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"
#include "simd/x86-inl.h"

CPUATTN_NAMESPACE_BEGIN

// The native bf16 unit's decoding steps multiply bf16 K rows as stored with vdpbf16ps, which
// pairs adjacent dimensions, so K needs no packing; Q, scaled f32 rows, is split into two bf16
// rows hi + lo kept beside each f32 row in the Qp scratch (qp_stride leaves room): hi from
// qd + QHiLoOffset(D), lo D32 elements after it, D32 = D rounded up to 32 (zero-padded).
// Two instructions per 32 dimensions instead of the f32 path's two FMAs, two widening loads and
// two Q loads (a micro-benchmark on Zen 4, four rows in L1: 13.7 -> 11.8 ns per key; hi alone,
// Q rounded to bf16, would be 7.9 but adds 2^-9 relative to every score).
// Error: hi = q truncated to bf16 (|q - hi| < 2^-7 |q|, same sign), lo = bf16(q - hi) rounded to
// nearest, so |q - hi - lo| < 2^-16 |q|; the products of bf16 pairs are exact in f32. Where lo
// rounds to 0 (q a bf16 already, or subnormal: vdpbf16ps flushes those) it is 2^-126 with q's
// sign instead, so that q * inf stays an infinity of the right sign (hi * inf + 0 * inf would
// be NaN); that adds at most 2^-126 |k| per term. Infinite q: lo as for a bf16 q; NaN q: hi NaN.
// (NativeBf16::SplitQRows in bf16-inl.h writes them.)
inline std::int64_t QHiLoOffset(std::int64_t D) { return (D + 15) / 16 * 16; }

#if CPUATTN_SIMD_BITS == 512
// R rows' dot products with four keys (rows k[0..3] of D elements), one 128-bit vector per row
// whose lane g is key g: R x 4 accumulators (<= 24 of the 32 registers, plus 4 K vectors), and
// one 4-way reduction per row instead of four (measured: the per-key reductions made the score
// loop compute-bound at 50-70 cycles per key, twice the memory time of int8 K).
template <class O, int R, class T>
CPUATTN_INLINE void Dot4(const float* CPUATTN_RESTRICT qd, std::int64_t dp, std::int64_t D,
                         const T* const (&k)[4], __m128 (&sum)[R]) {
#if defined(CPUATTN_NATIVE_BF16_UNIT)
  // (One row per K/V head keeps the f32 path: task-inl.h, native_pv.)
  if constexpr (std::is_same_v<T, detail::Bf16> && R >= 2) {
    // d by d across the four keys: each Q hi/lo load serves four keys (SplitQRows).
    const std::int64_t d32 = (D + 31) / 32 * 32;
    __m512 acc[R][4];
    // With two rows, hi and lo go into separate accumulators: a chain of two dependent
    // vdpbf16ps (6 cycles each on Zen 4) per 32 dimensions leaves few rows latency-bound.
    constexpr int kSplit = R <= 2 ? 2 : 1;
    __m512 acc2[kSplit == 2 ? R : 1][4];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_setzero_ps();
    }
    if constexpr (kSplit == 2) {
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int g = 0; g < 4; ++g) acc2[r][g] = _mm512_setzero_ps();
      }
    }
    for (std::int64_t d = 0; d < d32; d += 32) {
      // The row's last partial 32 dimensions by a masked load: nothing past D is read.
      const auto m =
          static_cast<__mmask32>(d + 32 <= D ? ~0u : (1u << static_cast<unsigned>(D - d)) - 1u);
      __m512bh kv[4];
      CPUATTN_UNROLL(4)
      for (int g = 0; g < 4; ++g) kv[g] = (__m512bh)_mm512_maskz_loadu_epi16(m, k[g] + d);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const auto* hi = reinterpret_cast<const std::uint16_t*>(qd + r * dp + QHiLoOffset(D));
        const auto qh = (__m512bh)_mm512_loadu_si512(hi + d);
        const auto ql = (__m512bh)_mm512_loadu_si512(hi + d32 + d);
        CPUATTN_UNROLL(4)
        for (int g = 0; g < 4; ++g) {
          if constexpr (kSplit == 2) {
            acc[r][g] = _mm512_dpbf16_ps(acc[r][g], qh, kv[g]);
            acc2[r][g] = _mm512_dpbf16_ps(acc2[r][g], ql, kv[g]);
          } else {
            acc[r][g] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][g], qh, kv[g]), ql, kv[g]);
          }
        }
      }
    }
    if constexpr (kSplit == 2) {
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_add_ps(acc[r][g], acc2[r][g]);
      }
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r)
      sum[r] = x86::ReduceSum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    return;
  }
#endif
  constexpr int N = O::kLanes;
  const std::int64_t dv = D / N * N;
  typename O::V acc[R][4];
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int g = 0; g < 4; ++g) acc[r][g] = O::Zero();
  }
  if constexpr (sizeof(T) == 1) {
    // int8: the four rows are four short runs (128 bytes at D = 128), so reading them d by d
    // still moves through memory in order, and each Q vector load serves four keys.
    for (std::int64_t d = 0; d < dv; d += N) {
      typename O::V kv[4];
      CPUATTN_UNROLL(4)
      for (int g = 0; g < 4; ++g) kv[g] = LoadWide<O>(k[g] + d);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        const typename O::V qv = O::Load(qd + r * dp + d);
        CPUATTN_UNROLL(4)
        for (int g = 0; g < 4; ++g) acc[r][g] = O::MulAdd(qv, kv[g], acc[r][g]);
      }
    }
  } else {
    // Key after key, each row front to back: the addresses ascend as in a plain stream, which
    // the hardware prefetchers follow (interleaving the four rows per d cost 15-50% on D2 with
    // f32 and bf16 K, from DRAM; with int8 K it gained nothing).
    CPUATTN_UNROLL(4)
    for (int g = 0; g < 4; ++g) {
      for (std::int64_t d = 0; d < dv; d += N) {
        const typename O::V kv = LoadWide<O>(k[g] + d);
        CPUATTN_UNROLL(16)
        for (int r = 0; r < R; ++r) acc[r][g] = O::MulAdd(O::Load(qd + r * dp + d), kv, acc[r][g]);
      }
    }
  }
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    sum[r] = x86::ReduceSum4(O::ToRaw(acc[r][0]), O::ToRaw(acc[r][1]), O::ToRaw(acc[r][2]),
                             O::ToRaw(acc[r][3]));
    if (dv < D) {
      alignas(16) float tail[4] = {};
      for (int g = 0; g < 4; ++g)
        for (std::int64_t d = dv; d < D; ++d) tail[g] += qd[r * dp + d] * detail::to_float(k[g][d]);
      sum[r] = _mm_add_ps(sum[r], _mm_load_ps(tail));
    }
  }
}
#endif

// Streaming scores for a few query rows (decode): S[r][j] = Qd[r] . K[j] with K read in place,
// row after row, so the stream runs at memory speed and nothing is packed. One K vector load
// serves R rows; a horizontal sum per score is affordable because there are few rows. K of a
// reduced-precision dtype is widened in registers as it is loaded (each element is used by all
// R rows of that load); an int8 key's score is multiplied by its scale, kscale[j * kss]. With
// `vpf`, the V rows of the same keys (vpf + j * vpf_stride, vpf_bytes long) are prefetched, and
// K rows ahead among the k_valid keys that exist from k on.
template <class O, int R, class T>
CPUATTN_INLINE void DotScoresR(const float* CPUATTN_RESTRICT qd, std::int64_t dp, std::int64_t D,
                               const T* CPUATTN_RESTRICT k, std::int64_t ks, std::int64_t nk,
                               const float* kscale, std::int64_t kss, float* CPUATTN_RESTRICT s,
                               std::int64_t s_stride, const char* vpf, std::int64_t vpf_stride,
                               std::int64_t vpf_bytes, std::int64_t k_valid) {
  constexpr int N = O::kLanes;
  const std::int64_t dv = D / N * N;
  std::int64_t j = 0;
#if CPUATTN_SIMD_BITS == 512
  if constexpr (R <= 6) {
    for (; j + 4 <= nk; j += 4) {
      const T* const k4[4] = {k + j * ks, k + (j + 1) * ks, k + (j + 2) * ks, k + (j + 3) * ks};
      __m128 sum[R];
      Dot4<O, R, T>(qd, dp, D, k4, sum);
      // Ask for these keys' V rows (vpf_bytes each) into L1 now: P V reads them right after this
      // block's scores, and a second stream in flight beside K's nearly doubles what one core
      // pulls from DRAM (D2 with bf16 K/V, 1 thread: 33 -> 26.5 ms). Whole blocks ahead into L2
      // as well (PrefetchKV) cost contiguous int8 decoding 15% (Zen 5), so streamed blocks skip it.
      // With it, the K rows 16 keys ahead (of the k_valid keys from k on that exist, so across the
      // block's end but never past the task's keys: no address outside K is formed): the
      // hardware prefetcher alone left a one-row-per-block decode (M2) latency-bound (bf16 cache:
      // M2 4.7 -> 4.3 ms, D2 26.5 -> 24.5 ms, 1 thread).
      if (vpf != nullptr) {
        for (int g = 0; g < 4 && j + 16 + g < k_valid; ++g)
          for (std::int64_t off = 0; off < D * static_cast<std::int64_t>(sizeof(T)); off += 64)
            detail::Prefetch<3>(reinterpret_cast<const char*>(k + (j + 16 + g) * ks) + off);
        for (int g = 0; g < 4; ++g)
          for (std::int64_t off = 0; off < vpf_bytes; off += 64)
            detail::Prefetch<3>(vpf + (j + g) * vpf_stride + off);
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
    for (std::int64_t d = 0; d < dv; d += N) {
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

template <class O, class T>
void DotScores(int R, const float* qd, std::int64_t dp, std::int64_t D, const T* k, std::int64_t ks,
               std::int64_t nk, const float* kscale, std::int64_t kss, float* s,
               std::int64_t s_stride, const char* vpf = nullptr, std::int64_t vpf_stride = 0,
               std::int64_t vpf_bytes = 0, std::int64_t k_valid = 0) {
  switch (R) {
#define CPUATTN_DOT_CASE(n)                                                              \
  case n:                                                                                \
    DotScoresR<O, n, T>(qd, dp, D, k, ks, nk, kscale, kss, s, s_stride, vpf, vpf_stride, \
                        vpf_bytes, k_valid);                                             \
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

// One page's run of keys for the streaming scores of a paged cache: K rows k + t * ks for t in
// [0, n) (int8 scales kscale[t * kss]), their V rows v + t * v_stride (bytes), and their scores
// at s + s_off + t of each row; `valid` keys from k on exist in its page (for prefetches).
template <class T>
struct KeyRun {
  const T* k;
  const float* kscale;
  const char* v;
  std::int64_t s_off, n, valid;
};

#if CPUATTN_SIMD_BITS == 512
// Row t of the four runs g4[0..3]: the R rows' scores of those four keys, and their V rows
// prefetched into L2 for the P V that follows (prefetcht2: 17 GB/s in a page-shaped read test on
// Zen 4, 15 with prefetcht0).
template <class O, int R, class T>
CPUATTN_INLINE void RunsStep4(const float* qd, std::int64_t dp, std::int64_t D, const KeyRun<T>* g4,
                              std::int64_t t, std::int64_t ks, std::int64_t kss, float* s,
                              std::int64_t s_stride, std::int64_t v_stride, std::int64_t v_bytes) {
  const T* const k4[4] = {g4[0].k + t * ks, g4[1].k + t * ks, g4[2].k + t * ks, g4[3].k + t * ks};
  __m128 sum[R];
  Dot4<O, R, T>(qd, dp, D, k4, sum);
  for (int g = 0; g < 4; ++g)
    for (std::int64_t off = 0; off < v_bytes; off += 64)
      detail::Prefetch<1>(g4[g].v + t * v_stride + off);
  const bool scaled = g4[0].kscale != nullptr;
  const __m128 sc = !scaled ? _mm_set1_ps(1.0f)
                            : _mm_setr_ps(g4[0].kscale[t * kss], g4[1].kscale[t * kss],
                                          g4[2].kscale[t * kss], g4[3].kscale[t * kss]);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    alignas(16) float out[4];
    _mm_store_ps(out, scaled ? _mm_mul_ps(sum[r], sc) : sum[r]);
    for (int g = 0; g < 4; ++g) s[r * s_stride + g4[g].s_off + t] = out[g];
  }
}
#endif

// Keys [from, n) of one run by DotScoresR, V rows prefetched beside K (for reduced-precision V
// only, as for contiguous K/V) when prefetch_v.
template <class O, int R, class T>
CPUATTN_INLINE void RunRest(const float* qd, std::int64_t dp, std::int64_t D, const KeyRun<T>& run,
                            std::int64_t from, std::int64_t ks, std::int64_t kss, float* s,
                            std::int64_t s_stride, std::int64_t v_stride, std::int64_t v_bytes,
                            bool prefetch_v) {
  const char* vpf = prefetch_v && !std::is_same_v<T, float> ? run.v + from * v_stride : nullptr;
  DotScoresR<O, R, T>(qd, dp, D, run.k + from * ks, ks, run.n - from,
                      run.kscale == nullptr ? nullptr : run.kscale + from * kss, kss,
                      s + run.s_off + from, s_stride, vpf, v_stride, v_bytes, run.valid - from);
}

// DotScores over runs of keys that lie in different pages (or quarter blocks of contiguous K).
// Runs are read in lock-step, row t of each at step t: a run is short (one head's 8 KiB of a
// 16-token page at D = 128, f32) and starts where the hardware prefetcher has no stream yet, so
// runs read one after another went at 8 GB/s on Zen 4 where four interleaved went at 15-17 and
// eight at 16-20 (a page-shaped read test, beside 28 for one long stream). Their V rows are
// prefetched as their K rows are read (RunsStep4), and so are the K rows of the `nahead` runs
// after them (those read next: the next block's, or the next head's of a paged task). Runs past
// the last whole four, and keys past the shortest run, go one run at a time.
template <class O, int R, class T>
void DotScoresRunsR(const float* qd, std::int64_t dp, std::int64_t D, const KeyRun<T>* runs,
                    int nruns, int nahead, std::int64_t ks, std::int64_t kss, float* s,
                    std::int64_t s_stride, std::int64_t v_stride, std::int64_t v_bytes) {
  int i = 0;
#if CPUATTN_SIMD_BITS == 512
  if constexpr (R <= 6) {
    const int whole = nruns / 4 * 4;
    std::int64_t common = whole > 0 ? runs[0].n : 0;
    for (int q = 1; q < whole; ++q) common = std::min(common, runs[q].n);
    const auto kbytes = D * static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t t = 0; t < common; ++t) {
      for (int q = 0; q < whole; q += 4)
        RunsStep4<O, R, T>(qd, dp, D, runs + q, t, ks, kss, s, s_stride, v_stride, v_bytes);
      for (int g = whole; g < nruns + nahead; ++g)
        if (t < runs[g].n)
          for (std::int64_t off = 0; off < kbytes; off += 64)
            detail::Prefetch<1>(reinterpret_cast<const char*>(runs[g].k + t * ks) + off);
    }
    for (int q = 0; q < whole; ++q)
      if (runs[q].n > common)
        RunRest<O, R, T>(qd, dp, D, runs[q], common, ks, kss, s, s_stride, v_stride, v_bytes,
                         false);
    i = whole;
  }
#endif
  for (; i < nruns; ++i)
    RunRest<O, R, T>(qd, dp, D, runs[i], 0, ks, kss, s, s_stride, v_stride, v_bytes, true);
}

template <class O, class T>
void DotScoresRuns(int R, const float* qd, std::int64_t dp, std::int64_t D, const KeyRun<T>* runs,
                   int nruns, int nahead, std::int64_t ks, std::int64_t kss, float* s,
                   std::int64_t s_stride, std::int64_t v_stride, std::int64_t v_bytes) {
  switch (R) {
#define CPUATTN_RUNS_CASE(n)                                                                \
  case n:                                                                                   \
    DotScoresRunsR<O, n, T>(qd, dp, D, runs, nruns, nahead, ks, kss, s, s_stride, v_stride, \
                            v_bytes);                                                       \
    break;
    CPUATTN_RUNS_CASE(1)
    CPUATTN_RUNS_CASE(2)
    CPUATTN_RUNS_CASE(3)
    CPUATTN_RUNS_CASE(4)
    CPUATTN_RUNS_CASE(5)
    CPUATTN_RUNS_CASE(6)
    CPUATTN_RUNS_CASE(7)
    CPUATTN_RUNS_CASE(8)
#undef CPUATTN_RUNS_CASE
    default:
      break;
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_DECODE_INL_H_
