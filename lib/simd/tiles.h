// Register and cache blocking of the micro-kernels, by vector width. Both SIMD providers take
// their tile shape from here, so a Highway and an xsimd kernel for the same instruction set run
// the same tiling and differ only in the instructions the provider emits.
#pragma once

#include <cstdint>

namespace cpuattn::simd {

// Shared by every width.
struct BlockShape {
  // Keys per K/V block. With 64 query rows the score tile is 64 x 128 x 4 B = 32 KiB and one V
  // chunk 128 x 64 x 4 B = 32 KiB: each stays in a 32-48 KiB L1d while a micro-kernel sweeps it,
  // and the whole block's Kp + Vp (128 x (D + Dv) x 4 B <= 128 KiB for D = Dv = 128) in L2.
  // Other sizes measured within noise (docs/performance.md#dm-block-shape).
  static constexpr std::int64_t kBlockKeys = 128;
  // Query rows per block (positions x heads of one K/V group): each packed K/V block is reused
  // by 64 rows, i.e. 64 x 2 flops per loaded float, far above what L2 must deliver.
  static constexpr std::int64_t kBlockRows = 64;
};

// kScoreRows x kScoreCols: vectors of the score micro-kernel's accumulator tile (rows of Q x
// vectors of keys); kPvRows x kPvCols the same for P V; kGemmRows the rows of the dense
// product's tile (its columns are one 32-float panel); kGemvRows the rows of the matrix-vector
// tile (kernels/gemm/gemv-inl.h: one panel row of B in registers beside the accumulators).
// Keyed by the x86 vector width (0 off x86) and the ARM one (0 off ARM's vector targets).
template <int kBits, int kArmBits = 0>
struct Tiles;

// AVX-512, 32 registers: 6x4 score accumulators + 4 K vectors; 6x4 P V accumulators + 4 V
// vectors (6x4 and 8x3 measured best, docs/performance.md#dm-score-tile-shape; 6x4 keeps panels of
// 64 keys, which divide the 128-key block). Dense product: 12 rows x 32 columns = 24 accumulators.
template <>
struct Tiles<512> : BlockShape {
  static constexpr int kScoreRows = 6, kScoreCols = 4, kPvRows = 6, kPvCols = 4, kGemmRows = 12;
  static constexpr int kGemvRows = kGemmRows;
};

// AVX2, 16 registers: 6x2 accumulators + 2 operands + 1 broadcast in both micro-kernels. Dense
// product: a 32-column panel is 4 vectors, 3 rows = 12 accumulators + 3 broadcasts + 1 vector of
// B, which its step (OuterStep) and the matrix-vector tile's (GemvStep, the same 3 rows) load one
// at a time for so few rows (docs/performance.md#dm-gemv-groups).
template <>
struct Tiles<256> : BlockShape {
  static constexpr int kScoreRows = 6, kScoreCols = 2, kPvRows = 6, kPvCols = 2, kGemmRows = 3;
  static constexpr int kGemvRows = kGemmRows;
};

// SSE4, 16 registers: as AVX2; a 32-column panel is 8 vectors, so 1 row = 8 accumulators.
template <>
struct Tiles<128> : BlockShape {
  static constexpr int kScoreRows = 6, kScoreCols = 2, kPvRows = 6, kPvCols = 2, kGemmRows = 1;
  static constexpr int kGemvRows = kGemmRows;
};

// NEON and SVE at 128 bits, 32 registers of 4 floats: the AVX-512 score and P V tiles (6x4
// accumulators + 4 operands + 1 broadcast = 29), i.e. 16-key panels. Dense product: a 32-column
// panel is 8 vectors, 3 rows = 24 accumulators.
template <>
struct Tiles<0, 128> : BlockShape {
  static constexpr int kScoreRows = 6, kScoreCols = 4, kPvRows = 6, kPvCols = 4, kGemmRows = 3;
  static constexpr int kGemvRows = kGemmRows;
};

// SVE at 256 bits (Neoverse V1), 32 registers of 8 floats: the same 6x4 tiles (32-key panels).
// Dense product: a 32-column panel is 4 vectors, 6 rows = 24 accumulators.
template <>
struct Tiles<0, 256> : BlockShape {
  static constexpr int kScoreRows = 6, kScoreCols = 4, kPvRows = 6, kPvCols = 4, kGemmRows = 6;
  static constexpr int kGemvRows = kGemmRows;
};

// SVE at 512 bits (A64FX), 32 registers of 16 floats: AVX-512's tiles (64-key panels).
template <>
struct Tiles<0, 512> : BlockShape {
  static constexpr int kScoreRows = 6, kScoreCols = 4, kPvRows = 6, kPvCols = 4, kGemmRows = 12;
  static constexpr int kGemvRows = kGemmRows;
};

// The portable fallback targets (Highway's EMU128 and SCALAR): correct rather than fast.
template <>
struct Tiles<0> : BlockShape {
  static constexpr int kScoreRows = 4, kScoreCols = 2, kPvRows = 4, kPvCols = 2, kGemmRows = 1;
  static constexpr int kGemvRows = kGemmRows;
};

}  // namespace cpuattn::simd
