// The score unit ScoreUnit::dot_runs: streamed K in runs of keys read four at a time (the keys
// of a paged block lie in different pages; a contiguous block is cut into quarters), and the
// cutting of a block into those runs.
#if defined(CPUATTN_KERNELS_FLASH_STREAM_RUNS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_STREAM_RUNS_INL_H_
#undef CPUATTN_KERNELS_FLASH_STREAM_RUNS_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_STREAM_RUNS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/flash/config.h"
#include "kernels/flash/stream_dot-inl.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

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

#if CPUATTN_SIMD_BITS >= 256
// Row t of the four runs g4[0..3]: the R rows' scores of those four keys, and their V rows
// prefetched into L2 for the P V that follows (prefetcht2 read faster than prefetcht0 there:
// docs/performance.md#dm-runs-prefetcht2).
template <class O, bool kHiLo, int R, class T>
CPUATTN_ALWAYS_INLINE void RunsStep4(const float* qd, std::int64_t dp, std::int64_t D,
                                     const KeyRun<T>* g4, std::int64_t t, std::int64_t ks,
                                     std::int64_t kss, float* s, std::int64_t s_stride,
                                     std::int64_t v_stride, std::int64_t v_bytes) {
  const T* const k4[4] = {g4[0].k + t * ks, g4[1].k + t * ks, g4[2].k + t * ks, g4[3].k + t * ks};
  __m128 sum[R];
  Dot4<O, kHiLo, R, T, true>(qd, dp, D, k4, sum);
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
template <class O, bool kHiLo, int R, class T>
CPUATTN_ALWAYS_INLINE void RunRest(const float* qd, std::int64_t dp, std::int64_t D,
                                   const KeyRun<T>& run, std::int64_t from, std::int64_t ks,
                                   std::int64_t kss, float* s, std::int64_t s_stride,
                                   std::int64_t v_stride, std::int64_t v_bytes, bool prefetch_v) {
  detail::ScoresAhead ahead;
  ahead.v = prefetch_v && !std::is_same_v<T, float> ? run.v + from * v_stride : nullptr;
  ahead.v_stride = v_stride;
  ahead.v_bytes = v_bytes;
  ahead.k_valid = run.valid - from;
  DotScoresR<O, kHiLo, R, T>(qd, dp, D, run.k + from * ks, ks, run.n - from,
                             run.kscale == nullptr ? nullptr : run.kscale + from * kss, kss,
                             s + run.s_off + from, s_stride, ahead);
}

// DotScores over runs of keys that lie in different pages (or quarter blocks of contiguous K).
// Runs are read in lock-step, row t of each at step t: a run is short (one head's 8 KiB of a
// 16-token page at D = 128, f32) and starts where the hardware prefetcher has no stream yet, so
// runs read one after another read about half as fast as four interleaved
// (docs/performance.md#dm-runs-lockstep). Their V rows are
// prefetched as their K rows are read (RunsStep4), and so are the K rows of the `nahead` runs
// after them (those read next: the next block's, or the next head's of a paged task). Runs past
// the last whole four, and keys past the shortest run, go one run at a time.
template <class O, bool kHiLo, int R, class T>
void DotScoresRunsR(const float* qd, std::int64_t dp, std::int64_t D, const KeyRun<T>* runs,
                    int nruns, int nahead, std::int64_t ks, std::int64_t kss, float* s,
                    std::int64_t s_stride, std::int64_t v_stride, std::int64_t v_bytes) {
  int i = 0;
#if CPUATTN_SIMD_BITS >= 256
  if constexpr (R <= kDot4Rows) {
    const int whole = nruns / 4 * 4;
    std::int64_t common = whole > 0 ? runs[0].n : 0;
    for (int q = 1; q < whole; ++q) common = std::min(common, runs[q].n);
    const auto kbytes = D * static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t t = 0; t < common; ++t) {
      for (int q = 0; q < whole; q += 4)
        RunsStep4<O, kHiLo, R, T>(qd, dp, D, runs + q, t, ks, kss, s, s_stride, v_stride, v_bytes);
      for (int g = whole; g < nruns + nahead; ++g)
        if (t < runs[g].n)
          for (std::int64_t off = 0; off < kbytes; off += 64)
            detail::Prefetch<1>(reinterpret_cast<const char*>(runs[g].k + t * ks) + off);
    }
    for (int q = 0; q < whole; ++q)
      if (runs[q].n > common)
        RunRest<O, kHiLo, R, T>(qd, dp, D, runs[q], common, ks, kss, s, s_stride, v_stride, v_bytes,
                                false);
    i = whole;
  }
#endif
  for (; i < nruns; ++i)
    RunRest<O, kHiLo, R, T>(qd, dp, D, runs[i], 0, ks, kss, s, s_stride, v_stride, v_bytes, true);
}

template <class O, bool kHiLo, class T>
void DotScoresRuns(int R, const float* qd, std::int64_t dp, std::int64_t D, const KeyRun<T>* runs,
                   int nruns, int nahead, std::int64_t ks, std::int64_t kss, float* s,
                   std::int64_t s_stride, std::int64_t v_stride, std::int64_t v_bytes) {
  switch (R) {
#define CPUATTN_RUNS_CASE(n)                                                                       \
  case n:                                                                                          \
    DotScoresRunsR<O, kHiLo, n, T>(qd, dp, D, runs, nruns, nahead, ks, kss, s, s_stride, v_stride, \
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

// Appends the keys [j0, j1) of a block (offsets from kb0; the task's keys end at k1) of K/V head
// `head` to runs[n, ...) as runs that share a page, of at most a quarter block each (four are
// read at once), at most `most` runs. Returns the new count.
template <class O, class T>
CPUATTN_ALWAYS_INLINE int CutKeyRuns(const detail::Problem& p, std::int64_t b, std::int64_t kb0,
                                     std::int64_t k1, std::int64_t j0, std::int64_t j1, int most,
                                     std::int64_t head, KeyRun<T>* runs, int n) {
  const auto ev = static_cast<std::int64_t>(dtype_size(p.v.dtype));
  for (int added = 0; j0 < j1 && added < most; ++added, ++n) {
    const std::int64_t kj = kb0 + j0;
    const std::int64_t nj = std::min({j1 - j0, p.page_run(kj), O::kBlockKeys / 4});
    runs[n] = {
        static_cast<const T*>(p.k.data) + p.key_off(p.k.s, b, kj) + head * p.k.s[1],
        p.k_scale == nullptr ? nullptr
                             : p.k_scale + p.key_off(p.k_scale_s, b, kj) + head * p.k_scale_s[1],
        static_cast<const char*>(p.v.data) + (p.key_off(p.v.s, b, kj) + head * p.v.s[1]) * ev,
        j0,
        nj,
        std::min(k1 - kj, p.page_run(kj))};
    j0 += nj;
  }
  return n;
}

// Prefetches the K and V scales of keys [j0, j1) of a paged block: each (page, head) has its own
// run of scales at its own place in the scale pools, which no hardware prefetcher predicts, so
// without this every page cost two demand misses from memory (K's scale in the scores, V's in
// the scaling of P).
inline void PrefetchRunScales(const detail::Problem& p, std::int64_t b, std::int64_t kb0,
                              std::int64_t j0, std::int64_t j1, std::int64_t head) {
  if (p.k_scale == nullptr || p.pages == nullptr) return;
  for (const auto& [sc, ss] :
       {std::pair{p.k_scale, p.k_scale_s}, std::pair{p.v_scale, p.v_scale_s}}) {
    if (sc == nullptr) continue;
    for (std::int64_t jj = j0; jj < j1;) {
      const std::int64_t nj = std::min(j1 - jj, p.page_run(kb0 + jj));
      const char* first =
          reinterpret_cast<const char*>(sc + p.key_off(ss, b, kb0 + jj) + head * ss[1]);
      const std::int64_t bytes = ((nj - 1) * ss[2] + 1) * 4;
      for (std::int64_t off = 0; off < bytes; off += 64) detail::Prefetch<1>(first + off);
      jj += nj;
    }
  }
}

// ScoreUnit::dot_runs for the `rows` Qp rows (stride qs) of K/V head hk + j of a task that
// covers heads [hk, hk + nhk): keys [0, nk_live) of the block at kb0 (task keys end at k1) into
// S rows of s_stride. After the block's runs come the first `most_ahead` runs read next, to
// prefetch: the next head's in this block, or after the last head the next block's (nk keys per
// block).
template <class O, bool kHiLo>
void ScoreBlockRuns(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t nhk,
                    std::int64_t j, std::int64_t kb0, std::int64_t nk_live, std::int64_t Nk,
                    std::int64_t k1, int rows, const float* qp, std::int64_t qs, float* s,
                    std::int64_t s_stride, int most_ahead) {
  detail::with_elem(p.k.dtype, [&](auto t) {
    using T = decltype(t);
    KeyRun<T> runs[O::kBlockKeys + detail::kMaxRunsAhead];
    const std::int64_t hkj = hk + j;
    int n = CutKeyRuns<O, T>(p, b, kb0, k1, 0, nk_live, O::kBlockKeys, hkj, runs, 0);
    const int nruns = n;
    if (j + 1 < nhk) {
      n = CutKeyRuns<O, T>(p, b, kb0, k1, 0, nk_live, most_ahead, hkj + 1, runs, n);
      PrefetchRunScales(p, b, kb0, 0, nk_live, hkj + 1);
    } else {
      const std::int64_t ahead = std::min(k1 - kb0, 2 * Nk);
      n = CutKeyRuns<O, T>(p, b, kb0, k1, Nk, ahead, most_ahead, hk, runs, n);
      PrefetchRunScales(p, b, kb0, Nk, ahead, hk);
    }
    const auto ev = static_cast<std::int64_t>(dtype_size(p.v.dtype));
    DotScoresRuns<O, kHiLo, T>(rows, qp, qs, p.D, runs, nruns, n - nruns, p.k.s[2], p.k_scale_s[2],
                               s, s_stride, p.v.s[2] * ev, p.Dv * ev);
  });
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_STREAM_RUNS_INL_H_
