// The block geometry the flash units share: panel and chunk widths from the provider's tile shape
// (simd/tiles.h), and the padded sizes of a problem's rows.
#if defined(CPUATTN_KERNELS_FLASH_GEOMETRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_GEOMETRY_INL_H_
#undef CPUATTN_KERNELS_FLASH_GEOMETRY_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_GEOMETRY_INL_H_
#endif

#include <cstdint>

#include "core/problem.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

template <class O>
struct Geometry {
  static constexpr int N = O::kLanes;
  static constexpr int W = O::kScoreCols * N;  // keys per score panel
  static constexpr int CW = O::kPvCols * N;    // values per P V chunk
  std::int64_t D, Dv, DvP, Nk;                 // DvP: Dv rounded up to a vector; Nk: keys per block
  std::int64_t k_block_floats() const { return Nk * D; }    // Kp of one block
  std::int64_t v_block_floats() const { return Nk * DvP; }  // Vp of one block
  std::int64_t kv_block_floats() const { return k_block_floats() + v_block_floats(); }
  // The tiles of a whole block over `rows` rows, as the tile loops walk it (ScoreBlockTiles,
  // ProbBlockTiles, PvBlockTiles and the native bf16 ones): score tiles x panels + P V tiles x
  // column chunks; each calls between() once.
  std::int64_t block_tiles(std::int64_t rows) const {
    return (rows + O::kScoreRows - 1) / O::kScoreRows * (Nk / W) +
           (rows + O::kPvRows - 1) / O::kPvRows * ((DvP + CW - 1) / CW);
  }
  // The same for the AMX tiles (x86/amx_tile-inl.h), which call between() once per 32 keys of a
  // pair of 16-row groups and once per 32 columns of P V.
  std::int64_t amx_block_tiles(std::int64_t rows) const {
    return (rows + 31) / 32 * (Nk / 32 + (DvP + 31) / 32);
  }
  explicit Geometry(const detail::Problem& p, std::int64_t block_keys)
      : D(p.D), Dv(p.Dv), DvP((p.Dv + N - 1) / N * N), Nk(block_keys) {}
};

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_GEOMETRY_INL_H_
