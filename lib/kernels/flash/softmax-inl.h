// The online softmax of the flash kernel: after each K/V block, fold the block's scores into each
// row's running state (max m, sum l, unnormalized accumulator), turning the scores into the
// probabilities P V then multiplies. Everything is in log2 units (see core/softmax.h).
#if defined(CPUATTN_KERNELS_FLASH_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_SOFTMAX_INL_H_
#undef CPUATTN_KERNELS_FLASH_SOFTMAX_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "simd/math-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// How far above a row's running max m a clean block's scores may go and still be weighed against
// m in one pass with the scores (lazy rescaling: ProbBlockTiles, Bf16Tile::ProbBlock): weights up
// to 2^8, which f32 sums hold with room to spare. A higher score sends the block through the two
// passes (scores, then OnlineSoftmaxRow), which move m to the block's max.
inline constexpr float kLazyMaxSlack = 8.0f;

// The panel loop of a one-pass block (ProbBlockTiles; Bf16Tile::ProbBlock): panels of W keys in
// order, each over the block's rows in tiles of up to kRows. tile(r0, R, c0, first_panel) runs
// one tile and returns false if it refuses the block; first_panel is std::true_type for the
// first panel of rows that have seen no key (`first`: that panel sets their m, and the later
// ones are weighed against it), std::false_type otherwise. between() runs after each tile.
// accept() runs after the last tile and returns false if the block is refused after all (what
// the tiles folded together, such as their largest s - m, is checked once per block). False as
// soon as a tile refuses, or if accept() does; with `first`, m[0, rows) is then -inf again, as it
// was before.
template <int W, int kRows, class Tile, class Accept, class Between>
CPUATTN_ALWAYS_INLINE bool LazyPanels(int rows, std::int64_t ncols, bool first, float* m,
                                      const Tile& tile, const Accept& accept,
                                      const Between& between) {
  const auto refuse = [&] {
    if (first) std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
    return false;
  };
  for (std::int64_t c0 = 0; c0 < ncols; c0 += W) {
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      const int R = std::min(kRows, rows - r0);
      const bool ok =
          first && c0 == 0 ? tile(r0, R, c0, std::true_type{}) : tile(r0, R, c0, std::false_type{});
      between();
      if (!ok) return refuse();
    }
  }
  return accept() ? true : refuse();
}

// One row's online-softmax step over `ncols` scores of a block (a whole number of score panels,
// so an even number of vectors: two accumulators per pass halve the dependency chains).
//   srow  the row's scores in
//   m     the running max, updated; the accumulator is rescaled only when it grows
//   lrow  the running sum, kept as a vector of partial sums (summed across lanes once, at the end)
//   arow  the unnormalized output, dvp floats
//   put   put(c, p0, p1) takes the probabilities 2^(s - m) of columns [c, c + 2N) (0 for masked
//         keys), which Put::Exp computes: F32Probs puts them back into srow with Exp2; the
//         native bf16 tiles round them to bf16 there and then, so P V reads them once, and take
//         Exp2Bf16 (x86/bf16_tile-inl.h, Bf16Tile::PutRounded).
template <class O, class Put>
CPUATTN_ALWAYS_INLINE void OnlineSoftmaxRow(const float* CPUATTN_RESTRICT srow, std::int64_t ncols,
                                            float& m, float* CPUATTN_RESTRICT lrow,
                                            float* CPUATTN_RESTRICT arow, std::int64_t dvp,
                                            const Put& put) {
  using V = typename O::V;
  constexpr int N = O::kLanes;
  static_assert(O::kScoreCols % 2 == 0, "the passes below take vectors in pairs");
  const float neg_inf = -std::numeric_limits<float>::infinity();
  V vmax0 = O::Set(neg_inf), vmax1 = vmax0;
  for (std::int64_t c = 0; c < ncols; c += 2 * N) {
    vmax0 = O::Max(vmax0, O::Load(srow + c));
    vmax1 = O::Max(vmax1, O::Load(srow + c + N));
  }
  const float block_max = O::ReduceMax(O::Max(vmax0, vmax1));
  // A NaN score poisons its row (as in the reference); std::max would drop it.
  const float m_new = (block_max > m || std::isnan(block_max)) ? block_max : m;
  if (m_new == neg_inf) {
    // Nothing visible yet, unless the vector max dropped a NaN (x86 max returns its second
    // operand when either is NaN): then the row is poisoned, as in the reference.
    if (std::any_of(srow, srow + ncols, [](float x) { return std::isnan(x); })) {
      m = std::numeric_limits<float>::quiet_NaN();
      O::Store(O::Set(m), lrow);
    }
    for (std::int64_t c = 0; c < ncols; c += 2 * N) put(c, O::Zero(), O::Zero());
    return;
  }
  if (!(m_new == m)) {
    // Nothing accumulated while m was -inf; otherwise rescale l and Acc. A factor of exactly 0
    // (Exp2 at or below kExp2ZeroAtOrBelow) sets Acc to 0 instead: the keys so far weigh nothing
    // against the new max, and 0 times an inf or NaN they brought in (a V row whose weight is 0
    // only now) must not stay in the row, as the reference skips keys of weight 0. l is still
    // multiplied: a NaN score left NaN there, and poisons the row as in the reference.
    if (m != neg_inf) {
      const V va = Exp2<O>(O::Set(m - m_new));
      O::Store(O::Mul(O::Load(lrow), va), lrow);
      if (m - m_new <= simd::kExp2ZeroAtOrBelow) {
        for (std::int64_t c = 0; c < dvp; c += N) O::Store(O::Zero(), arow + c);
      } else {
        for (std::int64_t c = 0; c < dvp; c += N) O::Store(O::Mul(O::Load(arow + c), va), arow + c);
      }
    }
    m = m_new;
  }
  const V vm = O::Set(m);
  V vsum0 = O::Zero(), vsum1 = O::Zero();
  for (std::int64_t c = 0; c < ncols; c += 2 * N) {
    const V e0 = Put::Exp(O::Sub(O::Load(srow + c), vm));
    const V e1 = Put::Exp(O::Sub(O::Load(srow + c + N), vm));
    put(c, e0, e1);
    vsum0 = O::Add(vsum0, e0);
    vsum1 = O::Add(vsum1, e1);
  }
  O::Store(O::Add(O::Load(lrow), O::Add(vsum0, vsum1)), lrow);
}

// The probabilities as f32, back into the scores' row.
template <class O>
struct F32Probs {
  float* s;
  static CPUATTN_ALWAYS_INLINE typename O::V Exp(typename O::V x) { return Exp2<O>(x); }
  CPUATTN_ALWAYS_INLINE void operator()(std::int64_t c, typename O::V p0, typename O::V p1) const {
    O::Store(p0, s + c);
    O::Store(p1, s + c + O::kLanes);
  }
};

template <class O>
CPUATTN_ALWAYS_INLINE void OnlineSoftmaxRow(float* CPUATTN_RESTRICT srow, std::int64_t ncols,
                                            float& m, float* CPUATTN_RESTRICT lrow,
                                            float* CPUATTN_RESTRICT arow, std::int64_t dvp) {
  OnlineSoftmaxRow<O>(srow, ncols, m, lrow, arow, dvp, F32Probs<O>{srow});
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_SOFTMAX_INL_H_
