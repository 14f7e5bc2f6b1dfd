// Masks of the attention kernels, applied to a row of scores while they are in registers (the tiled
// path, in the score micro-kernel's epilogue) or in memory (the streaming decode path). Scores
// are in log2 units: an additive mask is multiplied by log2(e) as it is added.
#if defined(CPUATTN_KERNELS_COMMON_MASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_COMMON_MASK_INL_H_
#undef CPUATTN_KERNELS_COMMON_MASK_INL_H_
#else
#define CPUATTN_KERNELS_COMMON_MASK_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/problem.h"
#include "core/softmax.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// Lanes whose key index col0 + lane is outside [begin, end) become -inf. Float lane indices are
// exact: they stay within the 128-key block.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V KeepInRange(typename O::V s, std::int32_t col0,
                                                std::int32_t begin, std::int32_t end) {
  const auto col = O::Add(O::Iota(), O::Set(static_cast<float>(col0)));
  const auto neg_inf = O::Set(-std::numeric_limits<float>::infinity());
  s = O::IfThenElse(O::Lt(col, O::Set(static_cast<float>(end))), s, neg_inf);
  if (begin > col0) s = O::IfThenElse(O::Lt(col, O::Set(static_cast<float>(begin))), neg_inf, s);
  return s;
}

// Masking of one score row inside the score micro-kernel's epilogue, while the scores are still in
// registers. [begin, end) are the keys (relative to the tile's block) this row may see: causal,
// key lengths and window; `mask` points at the row's mask entries for the block's first key
// (nullptr: no mask tensor). For ALiBi, `pos` is the row's position relative to the block's first
// key and `slope` its head's slope in log2 units.
struct RowMask {
  std::int32_t begin, end;
  std::int32_t pos;
  float slope;
  const void* mask;
};

// What the epilogue does to every score of a call: the masks' kind, and the variants that change
// scores before masking (AttentionOptions: soft-cap, then ALiBi).
struct MaskInfo {
  detail::MaskKind kind;
  std::int64_t stride;  // element stride of the mask along keys (0 = broadcast)
  bool softcap = false;
  bool alibi = false;
  float cap = 0,
        k = 0;  // softcap * log2(e) (scores are in log2 units) and SoftCap's 2 log2(e) / cap
  bool transforms() const { return softcap || alibi; }
};

// Local copies of a tile's row masks for its epilogue: as far as the compiler knows, each store of
// scores may change a float of a RowMask (or MaskInfo) in memory, so reading them there made it
// reload and re-broadcast them for every vector. `rows` is read only when `needed` (a masked or
// transformed tile): callers without masks, such as the micro-kernel probes, pass nullptr.
template <int R>
CPUATTN_ALWAYS_INLINE void CopyRowMasks(const RowMask* rows, bool needed, RowMask (&rm)[R]) {
  if (!needed) return;
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) rm[r] = rows[r];
}

// Soft-cap, then the ALiBi bias (AttentionOptions' order), of a tile of R x C score vectors in
// registers, x[r][c] holding keys col0 + c * kLanes + lane of row r. The capped score is within
// 4e-7 cap of cap * tanh(s / cap) (simd/math-inl.h, SoftCap). One branch per variant for the
// whole tile, so that the unrolled epilogue is one straight run in which the broadcast constants
// are formed once (a branch per vector made the compiler form them again for every vector).
template <class O, int R, int C>
CPUATTN_ALWAYS_INLINE void TransformTile(typename O::V (&x)[R][C], std::int32_t col0,
                                         const RowMask (&rm)[R], const MaskInfo& mi) {
  constexpr int N = O::kLanes;
  if (mi.softcap) {
    const auto cap = O::Set(mi.cap), k = O::Set(mi.k);
    const auto cap_all = [&](auto exact_small) {
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) {
        CPUATTN_UNROLL(4)
        for (int c = 0; c < C; ++c)
          x[r][c] = SoftCap<O, decltype(exact_small)::value>(x[r][c], cap, k);
      }
    };
    if (mi.cap > kSoftCapExactAbove) {
      cap_all(std::true_type{});
    } else {
      cap_all(std::false_type{});
    }
  }
  if (mi.alibi) {
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      const auto slope = O::Set(rm[r].slope);
      const auto pos = O::Set(static_cast<float>(rm[r].pos - col0));
      CPUATTN_UNROLL(4)
      for (int c = 0; c < C; ++c) {
        // |pos - j|, exact in float below 2^24 keys.
        const auto j = O::Add(O::Iota(), O::Set(static_cast<float>(c * N)));
        x[r][c] = O::Sub(x[r][c], O::Mul(slope, O::Abs(O::Sub(pos, j))));
      }
    }
  }
}

// Only lanes below rm.end are read from the mask: past it lies the end of the mask row (or of
// the tensor), and those lanes become -inf anyway.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V ApplyRowMask(typename O::V s, std::int32_t col0,
                                                 const RowMask& rm, const MaskInfo& mi) {
  constexpr int N = O::kLanes;
  if (rm.mask != nullptr && col0 < rm.end) {
    const bool full = mi.stride == 1 && col0 + N <= rm.end;
    const int valid = std::min(N, rm.end - col0);
    if (mi.kind == detail::MaskKind::additive) {
      const float* m = static_cast<const float*>(rm.mask) + col0 * mi.stride;
      typename O::V add;
      if (full) {
        add = O::LoadU(m);
      } else {
        alignas(64) float tmp[N] = {};
        for (int i = 0; i < valid; ++i) tmp[i] = m[i * mi.stride];
        add = O::Load(tmp);
      }
      // A -inf entry excludes its key whatever the score holds (NaN from a garbage K row too);
      // finite entries saturate at +-kMaxLog2 (core/softmax.h); NaN stays NaN.
      const auto excluded = O::Lt(add, O::Set(-std::numeric_limits<float>::max()));
      auto t = O::Mul(add, O::Set(detail::kLog2e));
      const auto bound = O::Set(detail::kMaxLog2);
      t = O::IfThenElse(O::Ge(O::Abs(t), bound), O::CopySignToAbs(bound, t), t);
      s = O::IfThenElse(excluded, O::Set(-std::numeric_limits<float>::infinity()), O::Add(s, t));
    } else {
      const std::uint8_t* m = static_cast<const std::uint8_t*>(rm.mask) + col0 * mi.stride;
      if (full) {
        s = O::KeepIfByteSet(s, m);
      } else {
        alignas(64) std::uint8_t tmp[N] = {};
        for (int i = 0; i < valid; ++i) tmp[i] = m[i * mi.stride];
        s = O::KeepIfByteSet(s, tmp);
      }
    }
  }
  return KeepInRange<O>(s, col0, rm.begin, rm.end);
}

// The vectors [lo, hi) of a masked tile of C vectors of keys from col0 that one of its R rows may
// see: each row sees keys [begin, end) of the block, and a score outside them is -inf whatever
// Q . K holds. On the causal diagonal a 6-row tile sees its panel only up to its last row's key,
// and with a window only from its first row's first key.
struct LiveVectors {
  int lo, hi;
};

// The keys [begin, end) of a block that span what rows[0, R) see (R >= 1): the first key any of
// them sees and one past the last. Score tiles compute only these (LiveVectorsOf); P V tiles stop
// at end (PvBlockTiles).
struct SeenKeys {
  std::int32_t begin, end;
};

CPUATTN_ALWAYS_INLINE SeenKeys SeenKeysOf(int R, const RowMask* rows) {
  SeenKeys k{rows[0].begin, rows[0].end};
  for (int r = 1; r < R; ++r) {
    k.begin = std::min(k.begin, rows[r].begin);
    k.end = std::max(k.end, rows[r].end);
  }
  return k;
}

template <class O, int C>
CPUATTN_ALWAYS_INLINE LiveVectors LiveVectorsOf(int R, const RowMask* rows, std::int32_t col0) {
  constexpr int N = O::kLanes;
  const auto [begin, end] = SeenKeysOf(R, rows);
  const int lo = begin <= col0 ? 0 : std::min<std::int32_t>((begin - col0) / N, C);
  const int hi = end <= col0 ? 0 : std::min<std::int32_t>((end - col0 + N - 1) / N, C);
  return {lo, std::max(lo, hi)};
}

// -inf into the vectors of an R x C tile of scores outside `live` (what the masked epilogue
// stores there), for a tile that computes only its live vectors.
template <class O, int C>
CPUATTN_ALWAYS_INLINE void StoreDeadVectors(int R, LiveVectors live, float* CPUATTN_RESTRICT s,
                                            std::int64_t s_stride) {
  constexpr int N = O::kLanes;
  const auto neg_inf = O::Set(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < live.lo; ++c) O::Store(neg_inf, s + r * s_stride + c * N);
    for (int c = live.hi; c < C; ++c) O::Store(neg_inf, s + r * s_stride + c * N);
  }
}

// The score epilogue, once for every score unit: soft-cap and ALiBi (TransformTile), then the
// row masks where kMasked, and the store of R x C vectors x[r][c] (keys col0 + c * kLanes + lane
// of row r) to s + r * s_stride + c * kLanes (aligned). rm and m are the caller's local copies
// (CopyRowMasks): as far as the compiler knows, each store of scores may change a float of a
// RowMask or MaskInfo in memory, so reading them in place made it reload and re-broadcast them
// for every vector.
template <class O, int R, int C, bool kMasked>
CPUATTN_ALWAYS_INLINE void StoreScores(typename O::V (&x)[R][C], float* CPUATTN_RESTRICT s,
                                       std::int64_t s_stride, std::int32_t col0,
                                       const RowMask (&rm)[R], const MaskInfo& m) {
  constexpr int N = O::kLanes;
  if (m.transforms()) TransformTile<O, R, C>(x, col0, rm, m);
  CPUATTN_UNROLL(16)
  for (int r = 0; r < R; ++r) {
    CPUATTN_UNROLL(4)
    for (int c = 0; c < C; ++c) {
      if constexpr (kMasked) x[r][c] = ApplyRowMask<O>(x[r][c], col0 + c * N, rm[r], m);
      O::Store(x[r][c], s + r * s_stride + c * N);
    }
  }
}

// The epilogue of a score tile in registers: local copies of its rows' masks (read only when the
// tile is masked or transformed: callers without masks, such as the micro-kernel probes, pass
// nullptr), then StoreScores.
template <class O, int R, int C, bool kMasked>
CPUATTN_ALWAYS_INLINE void ScoreEpilogue(typename O::V (&x)[R][C], float* CPUATTN_RESTRICT s,
                                         std::int64_t s_stride, std::int32_t col0,
                                         const RowMask* rows, const MaskInfo& mi) {
  const MaskInfo m = mi;
  RowMask rm[R] = {};
  CopyRowMasks<R>(rows, kMasked || m.transforms(), rm);
  StoreScores<O, R, C, kMasked>(x, s, s_stride, col0, rm, m);
}

// The same epilogue over one streamed score row of ncols (whole vectors) in memory.
template <class O>
CPUATTN_ALWAYS_INLINE void MaskScoreRow(float* CPUATTN_RESTRICT srow, std::int64_t ncols,
                                        const RowMask& row, const MaskInfo& info) {
  constexpr int N = O::kLanes;
  const RowMask rm[1] = {row};
  const MaskInfo mi = info;
  for (std::int64_t c = 0; c < ncols; c += N) {
    typename O::V x[1][1] = {{O::Load(srow + c)}};
    StoreScores<O, 1, 1, true>(x, srow + c, 0, static_cast<std::int32_t>(c), rm, mi);
  }
}

// The masks of one score row in memory, element by element (the additive attention layer, whose
// rows are not whole vectors; no window or variants there).
inline void MaskScoreRowScalar(float* CPUATTN_RESTRICT srow, std::int64_t ncols, const RowMask& rm,
                               const MaskInfo& mi) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < ncols; ++j) {
    if (j >= rm.end) {
      srow[j] = neg_inf;
    } else if (rm.mask != nullptr) {
      if (mi.kind == detail::MaskKind::additive) {
        const float add = static_cast<const float*>(rm.mask)[j * mi.stride];
        const float t = std::clamp(add * detail::kLog2e, -detail::kMaxLog2, detail::kMaxLog2);
        srow[j] = add == neg_inf ? neg_inf : srow[j] + (std::isnan(add) ? add : t);
      } else if (static_cast<const std::uint8_t*>(rm.mask)[j * mi.stride] == 0) {
        srow[j] = neg_inf;
      }
    }
  }
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_COMMON_MASK_INL_H_
