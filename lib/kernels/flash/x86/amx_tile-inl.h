// The AMX units of tiled blocks with bf16 Q, K and V (ScoreUnit::tile_amx, PvUnit::tile_amx), for
// CPUs with AMX-BF16 (Sapphire Rapids and later Xeons): tdpbf16ps multiplies a 16 x 32 bf16 tile
// by a 32 x 16 one into 16 x 16 f32, 8192 multiply-adds per instruction, where vdpbf16ps does 32
// and issues every other cycle on those cores (docs/performance.md#dm-bf16-dot-intel). Compiled
// only in the avx512_bf16 unit (flash_bf16.cc), which adds the AMX flags.
//
// The packed layouts are Bf16Tile's (x86/bf16_tile-inl.h), which are the tiles' own: a Kb panel's
// row of one pair of dims holds W keys x 2 dims, so 16 of its rows (32 dims) by 16 keys is a B
// tile of the scores; a Vb chunk's row of one pair of keys holds CW columns x 2 keys, so 16 of its
// rows (32 keys) by 16 columns is a B tile of P V; Qb and Pb rows are A tiles as they lie.
// Scores leave the tiles as raw dot products into S (a tile's results live in tile registers,
// which only a store reads): Bf16Tile's probability tiles read them there (SavedDots) for a
// block that needs no mask, and the scale joins in them; the other blocks take the softmax's
// two passes after ScaleRows and the mask pass.
// Error: as Bf16Tile's. Products of two bf16 are exact in f32 and summed in f32 (round to
// nearest even, bf16 and f32 subnormals flushed to zero, as vdpbf16ps does); only the order of
// the additions differs, so the bounds of docs/precision.md hold unchanged.
// The row tail of a block (fewer than 16 rows) runs on tiles configured to that many rows; Dp2
// must be whole 16s (D a multiple of 32: the plan chooses these units only then), and the key
// pairs of P V past the last whole 16 go to Bf16Tile's P V tile.
#if defined(CPUATTN_KERNELS_FLASH_X86_AMX_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_X86_AMX_TILE_INL_H_
#undef CPUATTN_KERNELS_FLASH_X86_AMX_TILE_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_X86_AMX_TILE_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/inline.h"
#include "kernels/flash/x86/bf16_tile-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

// GCC names the AMX flags' macros __AMX_TILE__ and __AMX_BF16__, clang __AMXTILE__ and __AMXBF16__.
#if defined(__AVX512BF16__) && (defined(__AMX_TILE__) || defined(__AMXTILE__)) && \
    (defined(__AMX_BF16__) || defined(__AMXBF16__))

template <class O>
struct Bf16Amx {
  using Tile = Bf16Tile<O>;
  static constexpr int W = Tile::W;
  static constexpr int CW = Tile::CW;
  static_assert(W % 32 == 0 && CW % 16 == 0, "tiles take 16 keys or 16 columns at a time");

  // Pairs of dims (or of keys) per tile step: 64 bytes of a tile row.
  static constexpr int kStep = 16;

  // Two row groups of up to 16 rows each (m1, m2; m2 may be 0), each with two accumulator tiles
  // of 16 columns (C: 0, 1 for the first group, 2, 3 for the second), an A tile per group (4, 5)
  // and two B tiles (6, 7) shared by both: four products per four tile loads.
  struct TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  };

  // The compilers' tile loads (and ldtilecfg, declared to read 8 bytes of its 64) are asm that
  // does not say which memory it reads: a barrier makes every store before it visible to them.
  static CPUATTN_ALWAYS_INLINE void MemoryBarrier(const void* p) {
    __asm__ volatile("" : : "r"(p) : "memory");
  }

  static CPUATTN_ALWAYS_INLINE void Configure(int m1, int m2) {
    TileConfig c;  // ldtilecfg reads 64 bytes, at any alignment
    const int m[8] = {m1, m1, m2, m2, m1, m2, kStep, kStep};
    for (int t = 0; t < 8; ++t) {
      c.rows[t] = static_cast<std::uint8_t>(m[t]);
      c.colsb[t] = m[t] == 0 ? 0 : 64;
    }
    MemoryBarrier(&c);
    _tile_loadconfig(&c);
  }

  // Raw dot products of Qb rows [0, rows) (qs2 pairs apart) with the Kb panels' first ncols keys
  // (whole panels), into S rows of s_stride: s[r][j] = q_r . k_j, unscaled. between() after each
  // 32 keys of a pair of row groups.
  template <class Between>
  static void Scores(int rows, const std::uint32_t* qb, std::int64_t qs2, std::int64_t dp2,
                     const std::uint32_t* kb, std::int64_t ncols, float* s, std::int64_t s_stride,
                     const Between& between) {
    const auto qstride = static_cast<long>(qs2 * 4), kstride = static_cast<long>(W * 4),
               sstride = static_cast<long>(s_stride * 4);
    for (int r0 = 0; r0 < rows; r0 += 2 * kStep) {
      const int m1 = std::min(kStep, rows - r0), m2 = std::clamp(rows - r0 - kStep, 0, kStep);
      Configure(m1, m2);
      const std::uint32_t* q1 = qb + r0 * qs2;
      const std::uint32_t* q2 = q1 + kStep * qs2;
      float* s1 = s + r0 * s_stride;
      float* s2 = s1 + kStep * s_stride;
      for (std::int64_t n0 = 0; n0 < ncols; n0 += 32) {
        const std::uint32_t* panel = kb + (n0 / W) * dp2 * W + n0 % W;
        _tile_zero(0);
        _tile_zero(1);
        if (m2 > 0) {
          _tile_zero(2);
          _tile_zero(3);
        }
        for (std::int64_t k0 = 0; k0 < dp2; k0 += kStep) {
          _tile_loadd(6, panel + k0 * W, kstride);
          _tile_loadd(7, panel + k0 * W + 16, kstride);
          _tile_loadd(4, q1 + k0, qstride);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if (m2 > 0) {
            _tile_loadd(5, q2 + k0, qstride);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, s1 + n0, sstride);
        _tile_stored(1, s1 + n0 + 16, sstride);
        if (m2 > 0) {
          _tile_stored(2, s2 + n0, sstride);
          _tile_stored(3, s2 + n0 + 16, sstride);
        }
        between();
      }
    }
    _tile_release();
  }

  // S rows [0, rows) of the first ncols columns times qscale (the scale of the scores, kept out
  // of Q so that packing Q adds no rounding).
  static void ScaleRows(int rows, float* s, std::int64_t s_stride, std::int64_t ncols,
                        float qscale) {
    const typename O::V vs = O::Set(qscale);
    for (int r = 0; r < rows; ++r) {
      float* sr = s + r * s_stride;
      for (std::int64_t c = 0; c < ncols; c += O::kLanes)
        O::Store(O::Mul(O::Load(sr + c), vs), sr + c);
    }
  }

  // Acc rows [r0, r0 + m1 + m2) columns [n0, n0 + 16 * nc) (nc 1 or 2) += Pb . Vb chunk over the
  // first kw key pairs (whole 16s).
  static CPUATTN_ALWAYS_INLINE void PvColumns(int m2, int nc, const std::uint16_t* p1, long pstride,
                                              const std::uint32_t* vchunk, std::int64_t cw,
                                              std::int64_t kw, float* a1, long astride,
                                              std::int64_t a2_off) {
    const auto vstride = static_cast<long>(cw * 4);
    const std::uint16_t* p2 = p1 + kStep * (pstride / 2);
    float* a2 = a1 + a2_off;
    _tile_loadd(0, a1, astride);
    if (nc == 2) _tile_loadd(1, a1 + 16, astride);
    if (m2 > 0) {
      _tile_loadd(2, a2, astride);
      if (nc == 2) _tile_loadd(3, a2 + 16, astride);
    }
    for (std::int64_t k2 = 0; k2 < kw; k2 += kStep) {
      _tile_loadd(6, vchunk + k2 * cw, vstride);
      _tile_loadd(4, p1 + 2 * k2, pstride);
      _tile_dpbf16ps(0, 4, 6);
      if (nc == 2) {
        _tile_loadd(7, vchunk + k2 * cw + 16, vstride);
        _tile_dpbf16ps(1, 4, 7);
      }
      if (m2 > 0) {
        _tile_loadd(5, p2 + 2 * k2, pstride);
        _tile_dpbf16ps(2, 5, 6);
        if (nc == 2) _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, a1, astride);
    if (nc == 2) _tile_stored(1, a1 + 16, astride);
    if (m2 > 0) {
      _tile_stored(2, a2, astride);
      if (nc == 2) _tile_stored(3, a2 + 16, astride);
    }
  }

  // PvUnit::tile_amx: Acc rows [0, rows) += Pb rows (pb_stride apart) . Vb chunks of a block of
  // nk keys, the first nk_live seen; as Bf16Tile::PvBlock, whose tile takes the key pairs past the
  // last whole 16. between() after each 32 columns of a pair of row groups.
  template <class Between>
  static void PvBlock(int rows, const std::uint16_t* pb, std::int64_t pb_stride,
                      const std::uint32_t* vb, std::int64_t nk, std::int64_t nk_live, float* acc,
                      std::int64_t dvp, const Between& between) {
    const std::int64_t nk2 = Tile::Pairs(nk), live2 = Tile::Pairs(nk_live);
    const std::int64_t kw = live2 / kStep * kStep;
    const auto pstride = static_cast<long>(pb_stride * 2), astride = static_cast<long>(dvp * 4);
    for (int r0 = 0; r0 < rows; r0 += 2 * kStep) {
      const int m1 = std::min(kStep, rows - r0), m2 = std::clamp(rows - r0 - kStep, 0, kStep);
      if (kw > 0) Configure(m1, m2);
      for (std::int64_t c0 = 0; c0 < dvp; c0 += CW) {
        const std::int64_t cw = std::min<std::int64_t>(CW, dvp - c0);
        const std::uint32_t* vchunk = vb + c0 * nk2;
        for (std::int64_t n0 = 0; kw > 0 && n0 < cw; n0 += 32) {
          PvColumns(m2, n0 + 16 < cw ? 2 : 1, pb + r0 * pb_stride, pstride, vchunk + n0, cw, kw,
                    acc + r0 * dvp + c0 + n0, astride, kStep * dvp);
          between();
        }
        if (kw < live2) {
          for (int t0 = r0; t0 < r0 + m1 + m2; t0 += O::kPvRows) {
            const int R = std::min(O::kPvRows, r0 + m1 + m2 - t0);
            Tile::PvRows(R, static_cast<int>(cw / O::kLanes),
                         reinterpret_cast<const std::uint32_t*>(pb + t0 * pb_stride) + kw,
                         pb_stride / 2, vchunk + kw * cw, cw, live2 - kw, acc + t0 * dvp + c0, dvp);
          }
        }
        between();
      }
    }
    if (kw > 0) _tile_release();
  }
};

#endif  // __AVX512BF16__ and AMX-TILE and AMX-BF16

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_X86_AMX_TILE_INL_H_
