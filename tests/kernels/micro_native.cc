// The native units' entry points (micro_native.h), compiled as the library's avx512_bf16 unit is.
#include "simd/xsimd_ops-inl.h"
// Separate lines: the units are instantiated with this unit's provider.
#include <vector>

#include "kernels/flash/geometry-inl.h"
#include "kernels/flash/stream_dot-inl.h"
#include "kernels/flash/x86/amx_tile-inl.h"
#include "kernels/flash/x86/bf16_stream-inl.h"
#include "kernels/flash/x86/bf16_tile-inl.h"
#include "kernels/flash/x86/vnni_i8-inl.h"
#include "micro_native.h"

CPUATTN_NAMESPACE_BEGIN

namespace {

// 64-byte aligned scratch of n elements of T.
template <class T>
T* aligned(std::vector<float>& buf, std::size_t n) {
  buf.assign(n * sizeof(T) / sizeof(float) + 32, 0.0f);
  return reinterpret_cast<T*>(buf.data() +
                              (64 - reinterpret_cast<std::uintptr_t>(buf.data()) % 64) % 64 / 4);
}

using Tile = Bf16Tile<Ops>;

// Q rows and the K panels of keys [0, nk) packed as the tiled units read them (Qb, Kb).
struct PackedQK {
  std::int64_t dp2, ncols;
  std::vector<float> qb_buf, kb_buf;
  const std::uint32_t *qb, *kb;
  PackedQK(const detail::Problem& p, int rows, std::int64_t nk)
      : dp2((p.D + 1) / 2), ncols((nk + Tile::W - 1) / Tile::W * Tile::W) {
    auto* q = aligned<std::uint16_t>(qb_buf, static_cast<std::size_t>(rows * dp2 * 2));
    auto* k = aligned<std::uint32_t>(kb_buf, static_cast<std::size_t>(ncols * dp2));
    Tile::PackQ(p, 0, 0, rows, 0, rows, dp2, q);
    Tile::PackK(p, 0, 0, 0, nk, k);
    qb = reinterpret_cast<const std::uint32_t*>(q);
    kb = k;
  }
};

// The V chunks of keys [0, nk) packed (Vb) and the P rows rounded to bf16 (Pb, p_stride apart).
struct PackedPV {
  std::vector<float> vb_buf, pb_buf;
  const std::uint32_t* vb;
  const std::uint16_t* pb;
  PackedPV(const detail::Problem& p, int rows, std::int64_t nk, const float* pr,
           std::int64_t p_stride) {
    const std::int64_t dvp = (p.Dv + 15) / 16 * 16, ncols = (nk + Tile::W - 1) / Tile::W * Tile::W;
    auto* v = aligned<std::uint32_t>(vb_buf, static_cast<std::size_t>((nk + 1) / 2 * dvp));
    auto* b = aligned<std::uint16_t>(pb_buf, static_cast<std::size_t>(rows * p_stride));
    Tile::PackV(p, dvp, 0, 0, 0, nk, v);
    for (int r = 0; r < rows; ++r) Tile::RoundRow(pr + r * p_stride, ncols, b + r * p_stride);
    vb = v;
    pb = b;
  }
};

void TileScores(const detail::Problem& p, int rows, std::int64_t nk, float qscale, float* s,
                std::int64_t s_stride) {
  const PackedQK in(p, rows, nk);
  std::vector<RowMask> rm(static_cast<std::size_t>(rows),
                          RowMask{0, static_cast<std::int32_t>(nk), 0, 0.0f, nullptr});
  const MaskInfo mi{detail::MaskKind::none, 0};
  Tile::ScoreBlock(rows, in.qb, in.dp2, in.dp2, in.kb, in.ncols, 0, nk, qscale, s, s_stride,
                   rm.data(), mi, [] {});
}

bool TileProbs(const detail::Problem& p, int rows, std::int64_t nk, float qscale, float* m,
               bool first, std::uint16_t* pb, std::int64_t pb_stride, float* lsum) {
  const PackedQK in(p, rows, nk);
  return Tile::ProbBlock(rows, in.qb, in.dp2, in.dp2, in.kb, nk, qscale, m, first, pb, pb_stride,
                         lsum, 16, [] {});
}

void TilePv(const detail::Problem& p, int rows, std::int64_t nk, const float* pr,
            std::int64_t p_stride, float* acc, std::int64_t acc_stride) {
  const PackedPV in(p, rows, nk, pr, p_stride);
  Tile::PvBlock(rows, in.pb, p_stride, in.vb, nk, nk, acc, acc_stride, [] {});
}

void AmxScores(const detail::Problem& p, int rows, std::int64_t nk, float qscale, float* s,
               std::int64_t s_stride) {
  const PackedQK in(p, rows, nk);
  Bf16Amx<Ops>::Scores(rows, in.qb, in.dp2, in.dp2, in.kb, in.ncols, s, s_stride, [] {});
  Bf16Amx<Ops>::ScaleRows(rows, s, s_stride, in.ncols, qscale);
}

void AmxPv(const detail::Problem& p, int rows, std::int64_t nk, const float* pr,
           std::int64_t p_stride, float* acc, std::int64_t acc_stride) {
  const PackedPV in(p, rows, nk, pr, p_stride);
  Bf16Amx<Ops>::PvBlock(rows, in.pb, p_stride, in.vb, nk, nk, acc, acc_stride, [] {});
}

void HiloScores(int rows, float* qp, std::int64_t qs, const detail::Problem& p, std::int64_t nk,
                float* s, std::int64_t s_stride) {
  Bf16Stream<Ops>::SplitQRows(qp, rows, qs, p.D);
  DotScores<Ops, true, detail::Bf16>(rows, qp, qs, p.D, static_cast<const detail::Bf16*>(p.k.data),
                                     p.k.s[2], nk, nullptr, 0, s, s_stride, detail::ScoresAhead{});
}

void PvRuns(const detail::Problem& p, int rows, std::int64_t nk, float* pr, std::int64_t p_stride,
            float* acc, std::int64_t acc_stride) {
  std::vector<float> pb_buf;
  auto* pb = aligned<std::uint16_t>(pb_buf, static_cast<std::size_t>(rows * p_stride));
  const std::int64_t ncols = (nk + 63) / 64 * 64;
  if (p.v.dtype == DType::i8) {
    VnniI8<Ops>::PvBlock(p, 0, 0, 0, nk, 0, rows, pr, p_stride, pb, acc, acc_stride, {});
  } else {
    Bf16Stream<Ops>::PvBlock(p, 0, 0, 0, nk, ncols, 0, rows, pr, p_stride, pb, acc, acc_stride, {});
  }
  PairOrder<Ops>::UnpermuteAcc(acc, rows, acc_stride, p.Dv);
}

}  // namespace

CPUATTN_NAMESPACE_END

namespace cpuattn::detail {

const NativeMicroKernels& native_micro_kernels() {
  static const NativeMicroKernels table{
      &avx512bf16::TileScores, &avx512bf16::TileProbs,  &avx512bf16::TilePv, &avx512bf16::AmxScores,
      &avx512bf16::AmxPv,      &avx512bf16::HiloScores, &avx512bf16::PvRuns};
  return table;
}

}  // namespace cpuattn::detail
