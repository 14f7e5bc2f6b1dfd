// The vector contract: every operation and constant a kernel may use. Kernels are templates over
// a provider type `O` (Highway's HwyOps in simd/hwy_ops-inl.h, xsimd's XsimdOps in
// simd/xsimd_ops-inl.h) and use nothing else from a SIMD library, so a kernel is written once and
// compiled for every target of every provider. Each kernel checks `static_assert(VectorOps<O>)`.
//
// f32 vectors of O::kLanes lanes, type O::V; lane masks of type O::M. Exactness each provider
// must give (tests/kernels checks them per target and provider):
//   Zero, Set, Iota            exact; Iota() holds 0, 1, ..., kLanes - 1.
//   Load, Store, Stream        `p` aligned to a whole vector; exact. Stream is a non-temporal
//                              store, ordered before later stores only by StreamFence().
//   LoadU, StoreU              any alignment; exact.
//   Add, Sub, Mul, Div         IEEE-754 binary32, round to nearest even.
//   MulAdd(a, b, c)            a * b + c: fused (one rounding) where the target has FMA, two
//                              roundings on SSE4 and the portable targets. Kernels must not
//                              depend on which.
//   Min, Max, Abs              exact for non-NaN lanes. With a NaN operand Min/Max return one of
//                              the operands (unspecified which): kernels that must propagate NaN
//                              test for it (IsNaN) themselves.
//   Floor                      exact, for finite lanes.
//   Exp2Frac(x)                x - n for Exp2's integer n: n = floor(x), so x - n in [0, 1),
//                              where O::kExp2Centered is false; n = x rounded to nearest, so
//                              x - n in [-0.5, 0.5], where it is true. Exact for |x| < 2^22; NaN
//                              for NaN.
//   Exp2Scale(p, x)            p * 2^n, n as Exp2Frac's: exact where x > -126, p is in [0.5, 2)
//                              and the product is a normal float; exactly 0 where x <= -126 (also
//                              -inf, whatever p is); NaN where x and p are NaN (Exp2's p is, for
//                              a NaN x). Other lanes: unspecified value, never undefined
//                              behaviour.
//   ReduceSum                  sum of the lanes, association order unspecified.
//   ReduceMax                  the largest lane, exactly; -inf when every lane is -inf.
//   Lt, Ge, IsNaN, IfThenElse  lane masks and selection, exact (comparisons with NaN are false).
//   CopySignToAbs(a, s)        |a| with the sign of s, for a >= 0.
//   KeepIfByteSet(s, bytes)    lanes whose byte bytes[lane] is 0 become -inf; reads kLanes
//                              bytes.
//   Transpose(r)               r[i] lane j <- r[j] lane i for a kLanes x kLanes block.
// Tile shape (simd/tiles.h): kScoreRows, kScoreCols (even), kPvRows, kPvCols, kGemmRows,
// kBlockKeys, kBlockRows.
#pragma once

#include <concepts>
#include <cstdint>

namespace cpuattn::simd {

// Exp2Scale (and so Exp2) gives exactly 0 for x at or below this, on every target. The online
// softmax relies on it: a rescale factor Exp2(m - m_new) of 0 clears the accumulator instead of
// multiplying it (kernels/flash/softmax-inl.h). Above it, Exp2's p times 2^n is a normal float;
// at -126 itself it would be a denormal.
inline constexpr float kExp2ZeroAtOrBelow = -126.0f;

template <class O>
concept VectorOps = requires(typename O::V v, typename O::M m, float* p, const float* cp,
                             const std::uint8_t* bytes, typename O::V* regs, float x) {
  requires O::kLanes >= 1 && O::kLanes <= 16;
  requires O::kScoreRows >= 1 && O::kScoreRows <= 12 && O::kScoreCols % 2 == 0;
  requires O::kPvRows >= 1 && O::kPvRows <= 8 && O::kPvCols >= 1 && O::kPvCols <= 4;
  requires O::kGemmRows >= 1 && O::kGemmRows <= 12;
  requires O::kBlockKeys % (O::kScoreCols * O::kLanes) == 0;
  { O::Zero() } -> std::same_as<typename O::V>;
  { O::Set(x) } -> std::same_as<typename O::V>;
  { O::Iota() } -> std::same_as<typename O::V>;
  { O::Load(cp) } -> std::same_as<typename O::V>;
  { O::LoadU(cp) } -> std::same_as<typename O::V>;
  O::Store(v, p);
  O::StoreU(v, p);
  O::Stream(v, p);
  O::StreamFence();
  { O::Add(v, v) } -> std::same_as<typename O::V>;
  { O::Sub(v, v) } -> std::same_as<typename O::V>;
  { O::Mul(v, v) } -> std::same_as<typename O::V>;
  { O::Div(v, v) } -> std::same_as<typename O::V>;
  { O::MulAdd(v, v, v) } -> std::same_as<typename O::V>;
  { O::Min(v, v) } -> std::same_as<typename O::V>;
  { O::Max(v, v) } -> std::same_as<typename O::V>;
  { O::Abs(v) } -> std::same_as<typename O::V>;
  { O::Floor(v) } -> std::same_as<typename O::V>;
  requires std::same_as<decltype(O::kExp2Centered), const bool>;
  { O::Exp2Frac(v) } -> std::same_as<typename O::V>;
  { O::Exp2Scale(v, v) } -> std::same_as<typename O::V>;
  { O::ReduceSum(v) } -> std::same_as<float>;
  { O::ReduceMax(v) } -> std::same_as<float>;
  { O::Lt(v, v) } -> std::same_as<typename O::M>;
  { O::Ge(v, v) } -> std::same_as<typename O::M>;
  { O::IsNaN(v) } -> std::same_as<typename O::M>;
  { O::IfThenElse(m, v, v) } -> std::same_as<typename O::V>;
  { O::CopySignToAbs(v, v) } -> std::same_as<typename O::V>;
  { O::KeepIfByteSet(v, bytes) } -> std::same_as<typename O::V>;
  O::Transpose(regs);
};

}  // namespace cpuattn::simd
