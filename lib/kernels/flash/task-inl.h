// The task driver of the fused flash-attention kernel: decodes a task of the plan (core/plan.h),
// lays out its scratch, and runs pack -> scores (+ masks) -> online softmax -> P V -> output over
// its query and key blocks. Written once against the vector contract (simd/contract.h), for any
// provider `O`.
//
// Layout of one task's work (all f32):
//   Qp  [rows][DP]          query rows of one block, DP = D rounded up to a vector, pre-multiplied
//                           by scale * log2(e) so that the softmax runs in base 2 (exp2 is
//                           cheaper than exp).
//   Kp  [panels][D][W]      a K block transposed into panels of W = kScoreCols vectors of
//                           keys, so the score micro-kernel streams W contiguous keys per d.
//   Vp  [chunks][nk][CW]    a V block split into column chunks of CW = kPvCols vectors, so the
//                           P V micro-kernel streams one contiguous chunk per key.
//   S   [rows][Nk]          the scores of one (Q block, K block) pair, then the probabilities.
//   Acc [rows][DvP]         the unnormalized output, DvP = Dv rounded up to a vector.
#if defined(CPUATTN_KERNELS_FLASH_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_TASK_INL_H_
#undef CPUATTN_KERNELS_FLASH_TASK_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_TASK_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/plan.h"
#include "core/recorder.h"
#include "core/scratch.h"
#include "core/softmax.h"
#include "kernels/common/mask-inl.h"
#include "kernels/flash/decode-inl.h"
#include "kernels/flash/pack-inl.h"
#include "kernels/flash/pv-inl.h"
#include "kernels/flash/pv_skip_zero-inl.h"
#include "kernels/flash/score-inl.h"
#include "kernels/flash/softmax-inl.h"
#include "simd/contract.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

using detail::kStreamRows;
// Keys per step of the in-place P V of streamed bf16/f16/int8 blocks: every column chunk of these
// rows before the next rows, so V is read front to back in 16-key runs (2-4 KiB) instead of one
// column chunk of the whole block at a time (D2, 1 thread: bf16 38 -> 32 ms, int8 28 -> 22 ms;
// 8, 32 and 64 keys measured worse). f32 keeps whole blocks: no gain measured there.
inline constexpr std::int64_t kStreamKeys = 16;

// Runs task t of the plan: one (batch, K/V head, head split, chunk of query blocks, key split), or
// for paged decoding several K/V heads (Plan::kv_heads_per_task).
// K/V blocks are packed once per task: kept for all query blocks when the chunk has several,
// else packed into one reused slot (decode), so K/V far larger than the caches stream once.
// With a log (profiling on), the time is split into phases at every step of every key block
// (one time-stamp read each); without one, each step's check is a predicted branch.
// The native bf16 pieces (bf16-inl.h); defined only in the avx512_bf16 unit, the one unit that
// instantiates RunTask with kNative = true.
template <class O>
struct NativeBf16;

// kNative: K and V are bf16 and the CPU has AVX512-BF16. Blocks this task packs run on vdpbf16ps
// (bf16-inl.h) when Q is bf16 too (else on the f32 path); streamed blocks (decode) of any Q run
// their scores on vdpbf16ps over K in place with Q split into bf16 hi + lo (decode-inl.h), and
// their P V on vdpbf16ps over V in place when Dv is whole groups of 32 (bf16-inl.h).
template <class O, bool kNative = false>
void RunTask(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
             detail::Scratch& scratch, detail::ThreadLog* log) {
  detail::PhaseClock clock(log);
  static_assert(simd::VectorOps<O>);
  constexpr int N = O::kLanes;
  constexpr int W = Geometry<O>::W;
  constexpr int CW = Geometry<O>::CW;
  const Geometry<O> g(p, O::kBlockKeys);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  const std::int64_t ks = t % pl.k_splits;
  t /= pl.k_splits;
  const std::int64_t qc = t % pl.q_chunks;
  t /= pl.q_chunks;
  const std::int64_t hs = t % pl.head_splits;
  t /= pl.head_splits;
  const std::int64_t kv_tasks = (p.Hkv + pl.kv_heads_per_task - 1) / pl.kv_heads_per_task;
  const std::int64_t hk = t % kv_tasks * pl.kv_heads_per_task;  // the task's first K/V head
  const std::int64_t b = t / kv_tasks;
  // K/V heads of the task; with several, the block's rows are their query heads, head-major, at
  // one position (make_plan), and each head's rows stream on their own K/V rows.
  const std::int64_t nhk = std::min(pl.kv_heads_per_task, p.Hkv - hk);

  const std::int64_t nh =
      nhk > 1 ? nhk * p.group : std::min(pl.heads_per_block, p.group - hs * pl.heads_per_block);
  const std::int64_t h0 = hk * p.group + hs * pl.heads_per_block;
  const std::int64_t qb0 = qc * pl.blocks_per_chunk;
  const std::int64_t qb1 = std::min(pl.q_blocks, qb0 + pl.blocks_per_chunk);
  const std::int64_t k0 = ks * pl.keys_per_split;
  const std::int64_t k1 = std::min(p.Lk, k0 + pl.keys_per_split);
  const bool keep_packed = qb1 - qb0 > 1;

  // Scratch: Qp, S, Acc, m, l, row masks, then the packed K/V blocks.
  const detail::TaskScratch ts(p, pl, k1 - k0, g.Nk, g.DvP, keep_packed, kNative);
  float* base = scratch.get(ts.total);
  float* qp = base + ts.qp;
  const std::int64_t qs = static_cast<std::int64_t>(ts.qp_stride);
  float* s = base + ts.s;
  float* acc = base + ts.acc;
  float* m = base + ts.m;
  float* l = base + ts.l;
  RowMask* rm = reinterpret_cast<RowMask*>(base + ts.rm);
  static_assert(sizeof(RowMask) <= 8 * sizeof(float) && alignof(RowMask) <= 64);
  float* kv = base + ts.kv;
  auto* pb = reinterpret_cast<std::uint16_t*>(base + ts.pb);
  // Native layouts, in 32-bit words (bf16 pairs): Qb rows of qs2 words, Pb rows of Nk / 2.
  const std::int64_t qs2 = (p.D + 1) / 2;
  const std::int64_t dp2 = qs2;
  std::int64_t packed_blocks = 0;  // with keep_packed: blocks [0, packed_blocks) are ready

  MaskInfo mi{p.mask_kind, p.mask.s[3]};
  if (p.softcap != 0) {
    mi.softcap = true;
    mi.cap = static_cast<float>(p.softcap * detail::kLog2e);
    mi.k = static_cast<float>(2.0 / p.softcap);  // 2 log2(e) / (softcap log2(e))
  }
  mi.alibi = p.has_alibi();
  const float qscale = static_cast<float>(p.scale) * detail::kLog2e;

  for (std::int64_t qb = qb0; qb < qb1; ++qb) {
    const std::int64_t pos0 = qb * pl.pos_per_block;
    const std::int64_t pos1 = std::min(p.Lq, pos0 + pl.pos_per_block);
    const int rows = static_cast<int>((pos1 - pos0) * nh);
    const int head_rows = rows / static_cast<int>(nhk);  // rows of one K/V head
    // Few rows (decode) and no K/V reuse across query blocks: stream K/V in place.
    const bool stream = !keep_packed && head_rows <= kStreamRows;
    // Streamed K in four interleaved runs (DotScoresRuns): always for pages, and for contiguous
    // K/V of f32, bf16 or f16 with several rows per block (1 thread, Zen 4, same-run A/B against
    // one stream per block: D2 f32 -4%, bf16 -23%, D1 f32 -30%; int8 K +8% and M2 (one row per
    // block, bound by its instructions) +16%, so those keep one stream).
    const bool runs_path = p.pages != nullptr || (rows >= 2 && p.k.dtype != DType::i8);
    const bool native = kNative && !stream && p.q.dtype == DType::bf16 && p.k.dtype == DType::bf16;
    // P V of streamed blocks on vdpbf16ps: the accumulators are in its column order until the
    // output (NativeBf16::PvRuns). Not for one row per K/V head (MHA decoding, M2): that step is
    // bound by memory (83% of the read probe), and the native scores and P V measured 5-10%
    // slower there (Zen 4, B8 H12 Lk4097 D64, 4 alternating runs), so it keeps the f32 path.
    // int8 V there goes on VNNI (NativeBf16::PvRunsI8), with the same column order.
    const bool native_pv_ok = kNative && stream && head_rows >= 2 &&
                              (p.v.dtype == DType::bf16 || p.v.dtype == DType::i8) &&
                              g.Dv % 32 == 0;
    if constexpr (kNative) {
      if (native) {
        NativeBf16<O>::PackQ(p, b, h0, nh, pos0, rows, qs2, reinterpret_cast<std::uint16_t*>(qp));
      } else {
        PackQ<O>(p, b, h0, nh, pos0, rows, qscale, qs, qp);
        if (stream && head_rows >= 2 && p.k.dtype == DType::bf16)
          NativeBf16<O>::SplitQRows(qp, rows, qs, p.D);
      }
    } else {
      PackQ<O>(p, b, h0, nh, pos0, rows, qscale, qs, qp);
    }
    clock.lap(Phase::pack_q);
    // Causal, key-length and window limits: rows see keys [begin(i), end(i)), both
    // non-decreasing in i, so key blocks before the first row's begin are skipped whole.
    const std::int64_t end_lo = std::min(k1, p.key_end(b, pos0));
    const std::int64_t end_hi = std::min(k1, p.key_end(b, pos1 - 1));
    const std::int64_t begin_lo = std::clamp(p.key_begin(pos0), k0, k1);
    const std::int64_t begin_hi = std::clamp(p.key_begin(pos1 - 1), k0, k1);
    const std::int64_t kb_first = k0 + (begin_lo - k0) / g.Nk * g.Nk;
    for (std::int64_t i = pos0, r = 0; i < pos1; ++i)
      for (std::int64_t h = h0; h < h0 + nh; ++h, ++r)
        rm[r].slope = mi.alibi ? static_cast<float>(p.alibi_slope(b, h) * detail::kLog2e) : 0.0f;

    // Runs the key blocks into m, l and acc. exact_pv: P V skips the keys of weight 0
    // (PvSkipZero), for a block whose first run met a non-finite V in a key it excludes.
    const auto accumulate = [&](bool exact_pv) {
      const bool native_pv = native_pv_ok && !exact_pv;
      // l is kept per row as a vector of partial sums and summed across lanes once, at the end,
      // instead of a horizontal sum per row and block.
      for (int r = 0; r < rows; ++r) {
        m[r] = neg_inf;
        O::Store(O::Zero(), l + r * N);
      }
      std::fill(acc, acc + rows * g.DvP, 0.0f);
      for (std::int64_t kb0 = kb_first; kb0 < end_hi; kb0 += g.Nk) {
        const std::int64_t nk = std::min(g.Nk, k1 - kb0);
        const std::int64_t slot = keep_packed ? (kb0 - k0) / g.Nk : 0;
        float* kp = kv + slot * g.kv_block_floats();
        float* vp = kp + g.k_block_floats();
        // V is read in place when its rows are whole vectors; otherwise packed (zero-padded).
        // Other dtypes are widened in the P V tile as they are loaded (int8's scale goes into P).
        const bool v_in_place = stream && g.DvP == g.Dv;
        const bool first_use = !keep_packed || slot >= packed_blocks;
        // Ask for the K/V rows two blocks ahead now, so that their misses overlap this block's
        // work instead of stalling a later one. Streamed blocks (decode) prefetch their own rows
        // as they read them (DotScores, DotScoresRuns): this on top cost contiguous int8 decoding
        // 15% (G1c, Zen 5, 1 and 2 threads), its instructions and the second request per line.
        if (first_use && !stream) {
          if (kb0 == kb_first)
            PrefetchKV(p, b, hk, kb0 + g.Nk, std::clamp<std::int64_t>(k1 - kb0 - g.Nk, 0, g.Nk));
          if (kb0 + 2 * g.Nk < k1)
            PrefetchKV(p, b, hk, kb0 + 2 * g.Nk, std::min(g.Nk, k1 - kb0 - 2 * g.Nk));
        }
        if (stream) {
          // (With several heads, each head's V is packed just before its P V.)
          if (!v_in_place && nhk == 1) PackV<O>(p, g, b, hk, kb0, nk, vp);
        } else if (first_use) {
          bool packed = false;
          if constexpr (kNative) {
            if (native) {
              NativeBf16<O>::PackK(p, b, hk, kb0, nk, reinterpret_cast<std::uint32_t*>(kp));
              NativeBf16<O>::PackV(p, g.DvP, b, hk, kb0, nk, reinterpret_cast<std::uint32_t*>(vp));
              packed = true;
            }
          }
          if (!packed) PackKV<O>(p, g, b, hk, kb0, nk, kp, vp);
          if (keep_packed) packed_blocks = slot + 1;
        }
        clock.lap(Phase::pack_kv);
        // Keys of this block that some row may see, rounded up to whole panels.
        const std::int64_t nk_live = std::min(nk, end_hi - kb0);
        const std::int64_t ncols = (nk_live + W - 1) / W * W;
        // Columns [clean_lo, clean_hi) need no per-element mask for any row.
        const std::int64_t clean_hi = p.mask_kind != detail::MaskKind::none
                                          ? 0
                                          : std::max<std::int64_t>(0, std::min(nk, end_lo - kb0));
        const std::int64_t clean_lo = std::clamp<std::int64_t>(begin_hi - kb0, 0, nk);
        // Row r is (position pos0 + r / nh, head h0 + r % nh); nested loops avoid a 64-bit
        // division per row and block.
        for (std::int64_t i = pos0, r = 0; i < pos1; ++i) {
          const auto end = static_cast<std::int32_t>(
              std::clamp<std::int64_t>(std::min(k1, p.key_end(b, i)) - kb0, 0, nk));
          const auto begin =
              static_cast<std::int32_t>(std::clamp<std::int64_t>(p.key_begin(i) - kb0, 0, nk));
          // Relative to this block, for ALiBi; clamped far outside it (the distance only grows).
          const auto pos = static_cast<std::int32_t>(std::clamp<std::int64_t>(
              p.pos(i) - kb0, -(std::int64_t{1} << 30), std::int64_t{1} << 30));
          for (std::int64_t h = h0; h < h0 + nh; ++h, ++r) {
            rm[r].begin = begin;
            rm[r].end = end;
            rm[r].pos = pos;
            rm[r].mask = p.mask_kind == detail::MaskKind::none
                             ? nullptr
                             : static_cast<const char*>(p.mask.data) +
                                   (b * p.mask.s[0] + h * p.mask.s[1] + i * p.mask.s[2] +
                                    kb0 * p.mask.s[3]) *
                                       static_cast<std::int64_t>(dtype_size(p.mask.dtype));
          }
        }
        clock.lap(Phase::mask);

        // Steps 1-3 run once per K/V head of the task, on that head's rows [r_lo, r_hi) (all rows
        // with one head). Several heads (paged decoding): head after head through the same pages,
        // so each page's [Hkv, P, D] is read front to back over the block, and a head's V rows are
        // used while the prefetch has them in L2.
        for (std::int64_t j = 0; j < nhk; ++j) {
          const std::int64_t hkj = hk + j;
          const int r_lo = static_cast<int>(j) * head_rows, r_hi = r_lo + head_rows;
          // 1. Scores, masked in the micro-kernel epilogue where needed.
          if (stream) {
            detail::with_elem(p.k.dtype, [&](auto t) {
              using T = decltype(t);
              const auto ev = static_cast<std::int64_t>(dtype_size(p.v.dtype));
              if (runs_path) {
                // The block's keys in runs that share a page, of at most a quarter block each (four
                // are read at once), then the first runs to be read next, to prefetch: the next
                // head's in this block, or after the last head the next block's.
                KeyRun<T> runs[O::kBlockKeys + 8];
                int n = 0;
                // Keys [j0, j1) of this block (offsets from kb0) of K/V head `head` in runs; at
                // most `most` of them.
                const auto cut = [&](std::int64_t j0, std::int64_t j1, int most,
                                     std::int64_t head) {
                  for (int added = 0; j0 < j1 && added < most; ++added, ++n) {
                    const std::int64_t kj = kb0 + j0;
                    const std::int64_t nj = std::min({j1 - j0, p.page_run(kj), O::kBlockKeys / 4});
                    runs[n] = {
                        static_cast<const T*>(p.k.data) + p.key_off(p.k.s, b, kj) + head * p.k.s[1],
                        p.k_scale == nullptr
                            ? nullptr
                            : p.k_scale + p.key_off(p.k_scale_s, b, kj) + head * p.k_scale_s[1],
                        static_cast<const char*>(p.v.data) +
                            (p.key_off(p.v.s, b, kj) + head * p.v.s[1]) * ev,
                        j0,
                        nj,
                        std::min(k1 - kj, p.page_run(kj))};
                    j0 += nj;
                  }
                };
                // int8 scales of the keys read next: with pages, each (page, head) has its own
                // P * 4 bytes at its own place in the scale pools, which no hardware prefetcher
                // predicts, so without this every page cost two demand misses from DRAM (K's scale
                // in the scores, V's in scale_p_by_v).
                const auto prefetch_scales = [&](std::int64_t j0, std::int64_t j1,
                                                 std::int64_t head) {
                  if (p.k_scale == nullptr || p.pages == nullptr) return;
                  for (const auto& [sc, ss] :
                       {std::pair{p.k_scale, p.k_scale_s}, std::pair{p.v_scale, p.v_scale_s}}) {
                    if (sc == nullptr) continue;
                    for (std::int64_t jj = j0; jj < j1;) {
                      const std::int64_t nj = std::min(j1 - jj, p.page_run(kb0 + jj));
                      const char* first = reinterpret_cast<const char*>(
                          sc + p.key_off(ss, b, kb0 + jj) + head * ss[1]);
                      const std::int64_t bytes = ((nj - 1) * ss[2] + 1) * 4;
                      for (std::int64_t off = 0; off < bytes; off += 64)
                        detail::Prefetch<1>(first + off);
                      jj += nj;
                    }
                  }
                };
                cut(0, nk_live, O::kBlockKeys, hkj);
                const int nruns = n;
                if (j + 1 < nhk) {
                  cut(0, nk_live, 8, hkj + 1);
                  prefetch_scales(0, nk_live, hkj + 1);
                } else {
                  cut(g.Nk, std::min(k1 - kb0, 2 * g.Nk), 8, hk);
                  prefetch_scales(g.Nk, std::min(k1 - kb0, 2 * g.Nk), hk);
                }
                const int nahead = n - nruns;
                DotScoresRuns<O, T>(r_hi - r_lo, qp + r_lo * qs, qs, g.D, runs, nruns, nahead,
                                    p.k.s[2], p.k_scale_s[2], s + r_lo * g.Nk, g.Nk, p.v.s[2] * ev,
                                    p.Dv * ev);
                return;
              }
              const T* K =
                  static_cast<const T*>(p.k.data) + p.key_off(p.k.s, b, kb0) + hkj * p.k.s[1];
              const float* kscale =
                  p.k_scale == nullptr
                      ? nullptr
                      : p.k_scale + p.key_off(p.k_scale_s, b, kb0) + hkj * p.k_scale_s[1];
              // V rows are prefetched beside K for reduced-precision V only: with f32 V it moved
              // the same time from P V into the scores (M2, one row per block: 4% slower overall).
              const char* vpf = p.v.dtype == DType::f32
                                    ? nullptr
                                    : static_cast<const char*>(p.v.data) +
                                          (p.key_off(p.v.s, b, kb0) + hkj * p.v.s[1]) * ev;
              DotScores<O, T>(rows, qp, qs, g.D, K, p.k.s[2], nk_live, kscale, p.k_scale_s[2], s,
                              g.Nk, vpf, p.v.s[2] * ev, p.Dv * ev, k1 - kb0);
            });
            clock.lap(Phase::scores);
            // A row with no mask tensor that sees every column needs no pass (decoding's usual
            // case: the pass cost D2 7% of its time with an int8 cache).
            for (int r = r_lo; r < r_hi; ++r) {
              if (rm[r].mask != nullptr || rm[r].end < ncols || rm[r].begin > 0 || mi.transforms())
                MaskScoreRow<O>(s + r * g.Nk, ncols, rm[r], mi);
            }
            clock.lap(Phase::mask);
          } else if (native) {
            if constexpr (kNative) {
              for (std::int64_t c0 = 0; c0 < ncols; c0 += W) {
                const auto* panel = reinterpret_cast<const std::uint32_t*>(kp) + (c0 / W) * dp2 * W;
                const bool masked = c0 < clean_lo || c0 + W > clean_hi;
                for (int r0 = 0; r0 < rows; r0 += O::kScoreRows) {
                  const int R = std::min(O::kScoreRows, rows - r0);
                  const auto* qrows = reinterpret_cast<const std::uint32_t*>(qp) + r0 * qs2;
                  if (masked) {
                    NativeBf16<O>::template ScoreRows<true>(
                        R, qrows, qs2, dp2, panel, qscale, s + r0 * g.Nk + c0, g.Nk,
                        static_cast<std::int32_t>(c0), rm + r0, mi);
                  } else {
                    NativeBf16<O>::template ScoreRows<false>(
                        R, qrows, qs2, dp2, panel, qscale, s + r0 * g.Nk + c0, g.Nk,
                        static_cast<std::int32_t>(c0), rm + r0, mi);
                  }
                }
              }
            }
            clock.lap(Phase::scores);
          } else {
            for (std::int64_t c0 = 0; c0 < ncols; c0 += W) {
              const float* panel = kp + (c0 / W) * g.D * W;
              const bool masked = c0 < clean_lo || c0 + W > clean_hi;
              for (int r0 = 0; r0 < rows; r0 += O::kScoreRows) {
                const int R = std::min(O::kScoreRows, rows - r0);
                if (masked) {
                  ScoreRows<O, true>(R, qp + r0 * qs, qs, g.D, panel, s + r0 * g.Nk + c0, g.Nk,
                                     static_cast<std::int32_t>(c0), rm + r0, mi);
                } else {
                  ScoreRows<O, false>(R, qp + r0 * qs, qs, g.D, panel, s + r0 * g.Nk + c0, g.Nk,
                                      static_cast<std::int32_t>(c0), rm + r0, mi);
                }
              }
            }
            clock.lap(Phase::scores);
          }

          // 2. Online softmax: fold the block into each row's running state.
          for (int r = r_lo; r < r_hi; ++r)
            OnlineSoftmaxRow<O>(s + r * g.Nk, ncols, m[r], l + r * N, acc + r * g.DvP, g.DvP);
          clock.lap(Phase::softmax);

          // 3. Acc += P V, one column chunk of V at a time so the chunk stays in L1.
          if (exact_pv) {
            PvSkipZero<O>(p, b, hkj, kb0, nk_live, r_hi - r_lo, s + r_lo * g.Nk, g.Nk,
                          acc + r_lo * g.DvP, g.DvP);
            clock.lap(Phase::pv);
            continue;
          }
          if constexpr (kNative) {
            if (native) {
              for (int r = 0; r < rows; ++r)
                NativeBf16<O>::RoundRow(s + r * g.Nk, ncols, pb + r * g.Nk);
              const std::int64_t nk2 = (nk + 1) / 2, live2 = (nk_live + 1) / 2;
              for (std::int64_t c0 = 0; c0 < g.DvP; c0 += CW) {
                const std::int64_t cw = std::min<std::int64_t>(CW, g.DvP - c0);
                const auto* vchunk = reinterpret_cast<const std::uint32_t*>(vp) + c0 * nk2;
                for (int r0 = 0; r0 < rows; r0 += O::kPvRows) {
                  const int R = std::min(O::kPvRows, rows - r0);
                  NativeBf16<O>::PvRows(R, static_cast<int>(cw / O::kLanes),
                                        reinterpret_cast<const std::uint32_t*>(pb + r0 * g.Nk),
                                        g.Nk / 2, vchunk, cw, live2, acc + r0 * g.DvP + c0, g.DvP);
                }
              }
              clock.lap(Phase::pv);
              continue;
            }
          }
          // int8 V: v = q * scale, so p v = (p scale) q; the scale joins P after the softmax sum.
          const auto scale_p_by_v = [&] {
            for (std::int64_t j0 = 0; j0 < nk_live;) {
              const std::int64_t nj = std::min(nk_live - j0, p.page_run(kb0 + j0));
              const float* vs =
                  p.v_scale + p.key_off(p.v_scale_s, b, kb0 + j0) + hkj * p.v_scale_s[1];
              // Scales one per key in a row (the usual [B, Hkv, Lk] layout): whole vectors first
              // (a scalar loop was about 4% of D2's time with an int8 cache, 1 thread).
              const std::int64_t nv = p.v_scale_s[2] == 1 ? nj / N * N : 0;
              for (int r = r_lo; r < r_hi; ++r) {
                float* sr = s + r * g.Nk + j0;
                for (std::int64_t jj = 0; jj < nv; jj += N)
                  O::StoreU(O::Mul(O::LoadU(sr + jj), O::LoadU(vs + jj)), sr + jj);
                for (std::int64_t jj = nv; jj < nj; ++jj) sr[jj] *= vs[jj * p.v_scale_s[2]];
              }
              j0 += nj;
            }
          };
          if constexpr (kNative) {
            if (native_pv && p.v.dtype == DType::i8) {
              scale_p_by_v();
              auto* w = reinterpret_cast<std::int16_t*>(pb);
              float f[kStreamRows];
              unsigned exact_rows = 0;  // rows with a non-finite weight: PvRunsI8Exact
              for (int r = r_lo; r < r_hi; ++r) {
                f[r - r_lo] = NativeBf16<O>::QuantWeightRow(s + r * g.Nk, nk_live, w + r * g.Nk);
                if (std::isnan(f[r - r_lo])) f[r - r_lo] = 0.0f, exact_rows |= 1u << (r - r_lo);
              }
              // The block's runs in one call per 64 columns: the int32 sums span the block.
              VRun<std::int8_t> vruns[O::kBlockKeys];
              int nv = 0;
              for (std::int64_t j0 = 0; j0 < nk_live; ++nv) {
                const std::int64_t nj = std::min(nk_live - j0, p.page_run(kb0 + j0));
                vruns[nv] = {static_cast<const std::int8_t*>(p.v.data) +
                                 p.key_off(p.v.s, b, kb0 + j0) + hkj * p.v.s[1],
                             j0, nj};
                j0 += nj;
              }
              for (std::int64_t c0 = 0; c0 < g.Dv; c0 += 64) {
                const int groups = g.Dv - c0 >= 64 ? 2 : 1;
                for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
                  const int R = std::min(O::kPvRows, r_hi - r0);
                  NativeBf16<O>::PvRunsI8(R, groups, w + r0 * g.Nk, g.Nk, f + (r0 - r_lo), vruns,
                                          nv, c0, p.v.s[2], acc + r0 * g.DvP + c0, g.DvP);
                }
              }
              for (int r = r_lo; r < r_hi; ++r)
                if ((exact_rows >> (r - r_lo)) & 1u)
                  NativeBf16<O>::PvRunsI8Exact(s + r * g.Nk, vruns, nv, g.Dv, p.v.s[2],
                                               acc + r * g.DvP);
              continue;
            }
            if (native_pv) {
              for (int r = r_lo; r < r_hi; ++r)
                NativeBf16<O>::RoundRow(s + r * g.Nk, ncols, pb + r * g.Nk);
              // Steps of kStreamKeys keys, each step's runs in one call per column range, as the
              // f32 path below does.
              VRun<detail::Bf16> vruns[O::kBlockKeys];
              for (std::int64_t s0 = 0; s0 < nk_live; s0 += kStreamKeys) {
                const std::int64_t s1 = std::min(nk_live, s0 + kStreamKeys);
                int nv = 0;
                for (std::int64_t j0 = s0; j0 < s1; ++nv) {
                  const std::int64_t nj = std::min(s1 - j0, p.page_run(kb0 + j0));
                  vruns[nv] = {static_cast<const detail::Bf16*>(p.v.data) +
                                   p.key_off(p.v.s, b, kb0 + j0) + hkj * p.v.s[1],
                               j0, nj};
                  j0 += nj;
                }
                for (std::int64_t c0 = 0; c0 < g.Dv; c0 += 64) {
                  const int groups = g.Dv - c0 >= 64 ? 2 : 1;
                  for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
                    const int R = std::min(O::kPvRows, r_hi - r0);
                    NativeBf16<O>::PvRuns(R, groups, pb + r0 * g.Nk, g.Nk, vruns, nv, c0, p.v.s[2],
                                          acc + r0 * g.DvP + c0, g.DvP);
                  }
                }
              }
              continue;
            }
          }
          if (v_in_place) {
            if (p.v_scale != nullptr) scale_p_by_v();
            detail::with_elem(p.v.dtype, [&](auto t) {
              using T = decltype(t);
              const std::int64_t step = std::is_same_v<T, float> ? nk_live : kStreamKeys;
              // A step's keys in runs that share a page (one run without pages), so the P V tile
              // keeps its accumulators in registers across a paged block's pages.
              VRun<T> vruns[O::kBlockKeys];
              for (std::int64_t s0 = 0; s0 < nk_live; s0 += step) {
                const std::int64_t s1 = std::min(nk_live, s0 + step);
                int nv = 0;
                for (std::int64_t j0 = s0; j0 < s1; ++nv) {
                  const std::int64_t nj = std::min(s1 - j0, p.page_run(kb0 + j0));
                  vruns[nv] = {static_cast<const T*>(p.v.data) + p.key_off(p.v.s, b, kb0 + j0) +
                                   hkj * p.v.s[1],
                               j0, nj};
                  j0 += nj;
                }
                for (std::int64_t c0 = 0; c0 < g.DvP; c0 += CW) {
                  const std::int64_t cw = std::min<std::int64_t>(CW, g.DvP - c0);
                  for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
                    const int R = std::min(O::kPvRows, r_hi - r0);
                    PvRows<O, T>(R, static_cast<int>(cw / O::kLanes), s + r0 * g.Nk, g.Nk, vruns,
                                 nv, c0, p.v.s[2], acc + r0 * g.DvP + c0, g.DvP);
                  }
                }
              }
            });
            continue;
          }
          if (stream && nhk > 1) PackV<O>(p, g, b, hkj, kb0, nk, vp);
          for (std::int64_t c0 = 0; c0 < g.DvP; c0 += CW) {
            const std::int64_t cw = std::min<std::int64_t>(CW, g.DvP - c0);
            const float* vchunk = vp + c0 * nk;
            for (int r0 = r_lo; r0 < r_hi; r0 += O::kPvRows) {
              const int R = std::min(O::kPvRows, r_hi - r0);
              PvRows<O>(R, static_cast<int>(cw / O::kLanes), s + r0 * g.Nk, g.Nk, vchunk, cw,
                        nk_live, acc + r0 * g.DvP + c0, g.DvP);
            }
          }
        }
        clock.lap(Phase::pv);
      }
      if constexpr (kNative) {
        if (native_pv) NativeBf16<O>::UnpermuteAcc(acc, rows, g.DvP, g.Dv);
      }
    };
    accumulate(false);
    if (!AccFinite<O>(acc, rows * g.DvP)) accumulate(true);

    // 4. Normalize once, or hand the unnormalized state to the merge.
    for (int r = 0; r < rows; ++r) {
      const std::int64_t i = pos0 + r / nh, h = h0 + r % nh;
      const float* arow = acc + r * g.DvP;
      const detail::RowState st{m[r], O::ReduceSum(O::Load(l + r * N)),
                                static_cast<float>(p.sink(h) * detail::kLog2e)};
      if (pl.k_splits > 1) {
        float* dst = detail::partial_row(p, pl, b, h, i, ks);
        dst[0] = st.m;
        dst[1] = st.l;
        std::copy(arow, arow + g.Dv, dst + 2);
        continue;
      }
      const std::int64_t out_off = b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
      const float scale = st.out_scale();
      if (p.out_dtype != DType::f32) {
        const typename O::V vscale = O::Set(scale);
        const std::int64_t dv = g.Dv / N * N;
        detail::with_elem(p.out_dtype, [&](auto t) {
          using T = decltype(t);
          if constexpr (std::is_same_v<T, detail::Bf16> || std::is_same_v<T, detail::F16>) {
            T* dst = static_cast<T*>(p.out) + out_off;
            for (std::int64_t d = 0; d < dv; d += N)
              StoreNarrow<O>(O::Mul(O::Load(arow + d), vscale), dst + d);
          }
        });
        for (std::int64_t d = dv; d < g.Dv; ++d)
          detail::store_float(p.out, p.out_dtype, out_off + d, arow[d] * scale);
      } else if (float* dst = static_cast<float*>(p.out) + out_off;
                 pl.stream_out && g.Dv == g.DvP &&
                 reinterpret_cast<std::uintptr_t>(dst) % (N * sizeof(float)) == 0) {
        const typename O::V vscale = O::Set(scale);
        for (std::int64_t d = 0; d < g.Dv; d += N)
          O::Stream(O::Mul(O::Load(arow + d), vscale), dst + d);
      } else {
        for (std::int64_t d = 0; d < g.Dv; ++d) dst[d] = arow[d] * scale;
      }
      if (p.lse != nullptr)
        static_cast<float*>(p.lse)[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] = st.lse();
    }
    clock.lap(Phase::output);
  }
  // Non-temporal stores are weakly ordered: complete them before the task reports done.
  if (pl.stream_out) O::StreamFence();
  clock.lap(Phase::output);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_TASK_INL_H_
