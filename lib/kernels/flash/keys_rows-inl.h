// The keys-as-rows task (FlashPath::keys_as_rows): a task whose K/V blocks one query block reads
// (X1: 64 query rows against 1024 keys) runs its blocks with keys in the rows of the tiles and
// query rows in the lanes, so K and V are read where they lie and only Q is transposed, once per
// query block, where the tiled path transposes every K block into panels for those 64 rows
// (13% of X1: docs/performance.md#dm-keys-as-rows). In that orientation a query's running max over
// keys is a lane-wise max across the tile's rows, and its softmax needs no horizontal reduction.
//   Qt  [D][qp]   the block's query rows times scale * log2 e, transposed; lanes past the
//                 block's rows are zero (their results are never written)
//   St  [Nk][qp]  one key block's scores in log2 units, then its weights 2^(s - m)
//   Acct [Dv][qp] the unnormalised output, transposed
// Written once against the vector contract (simd/contract.h) for any provider `O`.
#if defined(CPUATTN_KERNELS_FLASH_KEYS_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_KEYS_ROWS_INL_H_
#undef CPUATTN_KERNELS_FLASH_KEYS_ROWS_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_KEYS_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/problem.h"
#include "kernels/common/outer-inl.h"
#include "kernels/flash/config.h"
#include "kernels/flash/softmax-inl.h"
#include "simd/contract.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

template <class O>
struct KeysAsRows {
  using V = typename O::V;
  static constexpr int N = O::kLanes;
  // Tiles of kRows keys (scores) or kRows output columns (P V) x kCols vectors of queries: the
  // accumulators, kCols operand vectors and one broadcast fill the registers as the tiled path's
  // score and P V tiles do (simd/tiles.h).
  static constexpr int kRows = O::kScoreRows, kCols = O::kScoreCols;
  static constexpr int kChunk = kCols * N;  // query lanes per tile
  static_assert(kRows <= 6, "extend the row switches");

  // The query block's geometry: rows [0, rows) are positions pos0 + r of head h; qp lanes (rows
  // rounded up to whole tile chunks).
  struct Block {
    std::int64_t b, h, pos0;
    int rows, qp;
  };

  // Qt from Q's rows, times `scale`; zero lanes past the rows.
  static void TransposeQ(const detail::Problem& p, const Block& blk, float* CPUATTN_RESTRICT qt) {
    const float* Q = static_cast<const float*>(p.q.data) + blk.b * p.q.s[0] + blk.h * p.q.s[1];
    const V scale = O::Set(detail::log2_scale(p));
    for (int r0 = 0; r0 < blk.qp; r0 += N) {
      for (std::int64_t d0 = 0; d0 < p.D; d0 += N) {
        V reg[N];
        for (int w = 0; w < N; ++w) {
          reg[w] = r0 + w < blk.rows
                       ? O::Mul(O::LoadU(Q + (blk.pos0 + r0 + w) * p.q.s[2] + d0), scale)
                       : O::Zero();
        }
        O::Transpose(reg);
        for (int d = 0; d < N; ++d) O::Store(reg[d], qt + (d0 + d) * blk.qp + r0);
      }
    }
  }

  // St rows [0, R) of one chunk: keys k (rows ks apart) dot Qt's chunk at qt (lanes qp apart
  // per dimension); their lane-wise max joins mx.
  template <int R>
  static CPUATTN_ALWAYS_INLINE void ScoreTile(const float* CPUATTN_RESTRICT k, std::int64_t ks,
                                              std::int64_t D, const float* CPUATTN_RESTRICT qt,
                                              int qp, float* CPUATTN_RESTRICT st, V (&mx)[kCols]) {
    V acc[R][kCols];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) acc[r][c] = O::Zero();
    }
    AccumulateOuter<O, R, kCols>(k, 1, ks, qt, qp, D, acc);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) {
        O::Store(acc[r][c], st + r * qp + c * N);
        mx[c] = O::Max(mx[c], acc[r][c]);
      }
    }
  }

  // Acct rows [0, R) of one chunk += V's columns v[0, R) of keys [0, nk) (rows vs apart) times
  // St's weights (rows qp apart).
  template <int R>
  static CPUATTN_ALWAYS_INLINE void PvTile(const float* CPUATTN_RESTRICT v, std::int64_t vs,
                                           std::int64_t nk, const float* CPUATTN_RESTRICT st,
                                           int qp, float* CPUATTN_RESTRICT acct) {
    V acc[R][kCols];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) acc[r][c] = O::Load(acct + r * qp + c * N);
    }
    AccumulateOuter<O, R, kCols>(v, vs, 1, st, qp, nk, acc);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) O::Store(acc[r][c], acct + r * qp + c * N);
    }
  }

  // The lazy step's tile (ProbBlock): St rows [0, R) of one chunk as weights 2^(s - m), from
  // accumulators that start at -m (neg_m, per lane) and so end as s - m; their sums by lane (keys
  // in order) join `sum`, and their largest s - m joins `over`.
  template <int R>
  static CPUATTN_ALWAYS_INLINE void ProbTile(const float* CPUATTN_RESTRICT k, std::int64_t ks,
                                             std::int64_t D, const float* CPUATTN_RESTRICT qt,
                                             int qp, float* CPUATTN_RESTRICT st,
                                             const V (&neg_m)[kCols], V (&sum)[kCols],
                                             V (&over)[kCols]) {
    V acc[R][kCols];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) acc[r][c] = neg_m[c];
    }
    AccumulateOuter<O, R, kCols>(k, 1, ks, qt, qp, D, acc);
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) {
        over[c] = O::Max(over[c], acc[r][c]);
        const V e = Exp2<O>(acc[r][c]);
        O::Store(e, st + r * qp + c * N);
        sum[c] = O::Add(sum[c], e);
      }
    }
  }

  // The tiles of R = 1..kRows rows, R known at run time (the block's last keys, Dv's last columns).
  static void ScoreRows(int R, const float* k, std::int64_t ks, std::int64_t D, const float* qt,
                        int qp, float* st, V (&mx)[kCols]) {
    switch (R) {
#define CPUATTN_KR_SCORE(n)                                           \
  case n:                                                             \
    if constexpr (n <= kRows) ScoreTile<n>(k, ks, D, qt, qp, st, mx); \
    break;
      CPUATTN_KR_SCORE(1)
      CPUATTN_KR_SCORE(2)
      CPUATTN_KR_SCORE(3)
      CPUATTN_KR_SCORE(4)
      CPUATTN_KR_SCORE(5)
      CPUATTN_KR_SCORE(6)
#undef CPUATTN_KR_SCORE
      default:
        break;
    }
  }
  static void ProbRows(int R, const float* k, std::int64_t ks, std::int64_t D, const float* qt,
                       int qp, float* st, const V (&neg_m)[kCols], V (&sum)[kCols],
                       V (&over)[kCols]) {
    switch (R) {
#define CPUATTN_KR_PROB(n)                                                         \
  case n:                                                                          \
    if constexpr (n <= kRows) ProbTile<n>(k, ks, D, qt, qp, st, neg_m, sum, over); \
    break;
      CPUATTN_KR_PROB(1)
      CPUATTN_KR_PROB(2)
      CPUATTN_KR_PROB(3)
      CPUATTN_KR_PROB(4)
      CPUATTN_KR_PROB(5)
      CPUATTN_KR_PROB(6)
#undef CPUATTN_KR_PROB
      default:
        break;
    }
  }
  static void PvRows(int R, const float* v, std::int64_t vs, std::int64_t nk, const float* st,
                     int qp, float* acct) {
    switch (R) {
#define CPUATTN_KR_PV(n)                                          \
  case n:                                                         \
    if constexpr (n <= kRows) PvTile<n>(v, vs, nk, st, qp, acct); \
    break;
      CPUATTN_KR_PV(1)
      CPUATTN_KR_PV(2)
      CPUATTN_KR_PV(3)
      CPUATTN_KR_PV(4)
      CPUATTN_KR_PV(5)
      CPUATTN_KR_PV(6)
#undef CPUATTN_KR_PV
      default:
        break;
    }
  }

  // One key block of nk keys (K's rows ks apart from k): its scores into St, and mnew = the
  // lane-wise max of m and of them. between() runs after each tile (the next task's drip).
  template <class Between>
  static void ScoreBlock(const float* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                         const float* qt, int qp, const float* m, float* st, float* mnew,
                         const Between& between) {
    for (int c0 = 0; c0 < qp; c0 += kChunk) {
      V mx[kCols];
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) mx[c] = O::Load(m + c0 + c * N);
      for (std::int64_t j0 = 0; j0 < nk; j0 += kRows) {
        const auto R = static_cast<int>(std::min<std::int64_t>(kRows, nk - j0));
        ScoreRows(R, k + j0 * ks, ks, D, qt + c0, qp, st + j0 * qp + c0, mx);
        between();
      }
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) O::Store(mx[c], mnew + c0 + c * N);
    }
  }

  // One key block for lanes that have each seen a block (m finite), scores and softmax in one pass
  // (lazy rescaling, as the tiled path's ProbBlockTiles): St's nk rows become 2^(s - m) against
  // the lanes' running max m as the tiles leave the registers, and `sums` gets their sums by lane,
  // which l takes (AddSums) without a rescale, as Acct needs none: m stays. That drops the
  // separate pass over St and Acct (Softmax) from every block but a task's first. False if a
  // score is above m + kLazyMaxSlack (known after the last tile): the block then takes
  // ScoreBlock and Softmax, which overwrite St. NaN scores pass as NaN weights, which the
  // driver's check of Acct and l sends to the tiled units.
  template <class Between>
  static bool ProbBlock(const float* k, std::int64_t ks, std::int64_t D, std::int64_t nk,
                        const float* qt, int qp, const float* m, float* st, float* sums,
                        const Between& between) {
    V over_all = O::Set(-std::numeric_limits<float>::infinity());
    for (int c0 = 0; c0 < qp; c0 += kChunk) {
      V neg_m[kCols], sum[kCols], over[kCols];
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) {
        neg_m[c] = O::Sub(O::Zero(), O::Load(m + c0 + c * N));
        sum[c] = O::Zero();
        over[c] = O::Set(-std::numeric_limits<float>::infinity());
      }
      for (std::int64_t j0 = 0; j0 < nk; j0 += kRows) {
        const auto R = static_cast<int>(std::min<std::int64_t>(kRows, nk - j0));
        ProbRows(R, k + j0 * ks, ks, D, qt + c0, qp, st + j0 * qp + c0, neg_m, sum, over);
        between();
      }
      CPUATTN_UNROLL(4)
      for (int c = 0; c < kCols; ++c) {
        O::Store(sum[c], sums + c0 + c * N);
        over_all = O::Max(over_all, over[c]);
      }
    }
    return !(O::ReduceMax(over_all) > kLazyMaxSlack);
  }

  // l += ProbBlock's sums.
  static void AddSums(int qp, const float* CPUATTN_RESTRICT sums, float* CPUATTN_RESTRICT l) {
    for (int v0 = 0; v0 < qp; v0 += N)
      O::Store(O::Add(O::Load(l + v0), O::Load(sums + v0)), l + v0);
  }

  // The online softmax step of a block, lane by lane: St's nk rows become 2^(s - mnew), l becomes
  // l 2^(m - mnew) plus their sum (keys in order), Acct's Dv rows are rescaled by 2^(m - mnew),
  // and m becomes mnew. From m = -inf the factor is exactly 0 (Exp2), Acct starting at 0.
  static void Softmax(std::int64_t nk, std::int64_t Dv, int qp, float* CPUATTN_RESTRICT st,
                      float* CPUATTN_RESTRICT m, const float* CPUATTN_RESTRICT mnew,
                      float* CPUATTN_RESTRICT l, float* CPUATTN_RESTRICT acct) {
    for (int v0 = 0; v0 < qp; v0 += N) {
      const V mn = O::Load(mnew + v0);
      const V alpha = Exp2<O>(O::Sub(O::Load(m + v0), mn));
      V sum = O::Zero();
      for (std::int64_t j = 0; j < nk; ++j) {
        const V e = Exp2<O>(O::Sub(O::Load(st + j * qp + v0), mn));
        O::Store(e, st + j * qp + v0);
        sum = O::Add(sum, e);
      }
      O::Store(O::MulAdd(O::Load(l + v0), alpha, sum), l + v0);
      for (std::int64_t dv = 0; dv < Dv; ++dv)
        O::Store(O::Mul(O::Load(acct + dv * qp + v0), alpha), acct + dv * qp + v0);
      O::Store(mn, m + v0);
    }
  }

  // Acct += the block's weights times V's rows (vs apart from v, Dv columns). between() as in
  // ScoreBlock.
  template <class Between>
  static void PvBlock(const float* v, std::int64_t vs, std::int64_t Dv, std::int64_t nk,
                      const float* st, int qp, float* acct, const Between& between) {
    for (int c0 = 0; c0 < qp; c0 += kChunk) {
      for (std::int64_t dv0 = 0; dv0 < Dv; dv0 += kRows) {
        const auto R = static_cast<int>(std::min<std::int64_t>(kRows, Dv - dv0));
        PvRows(R, v + dv0, vs, nk, st + c0, qp, acct + dv0 * qp + c0);
        between();
      }
    }
  }

  // The block's output rows: Acct transposed back and divided by l (Dv whole vectors), through
  // non-temporal stores where `stream` and the row is vector-aligned.
  static void WriteOut(const detail::Problem& p, const Block& blk, const float* acct,
                       const float* l, bool stream) {
    float* out = static_cast<float*>(p.out) + blk.b * p.out_s[0] + blk.h * p.out_s[1];
    for (int r0 = 0; r0 < blk.rows; r0 += N) {
      const V inv = O::Div(O::Set(1.0f), O::Load(l + r0));
      for (std::int64_t dv0 = 0; dv0 < p.Dv; dv0 += N) {
        V reg[N];
        for (int d = 0; d < N; ++d) reg[d] = O::Mul(O::Load(acct + (dv0 + d) * blk.qp + r0), inv);
        O::Transpose(reg);
        for (int w = 0; w < N && r0 + w < blk.rows; ++w) {
          float* dst = out + (blk.pos0 + r0 + w) * p.out_s[2] + dv0;
          if (stream && reinterpret_cast<std::uintptr_t>(dst) % (N * sizeof(float)) == 0) {
            O::Stream(reg[w], dst);
          } else {
            O::StoreU(reg[w], dst);
          }
        }
      }
    }
  }
};

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_KEYS_ROWS_INL_H_
