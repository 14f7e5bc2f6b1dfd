// The xsimd provider of the vector contract (simd/contract.h): XsimdOps, and `Ops`, the provider
// every kernel of an xsimd unit is instantiated with. An xsimd unit is compiled once per
// architecture, with that architecture's flags and CPUATTN_XSIMD_ARCH (lib/CMakeLists.txt):
//   128  SSE4.2        xsimd::sse4_2          (no FMA: MulAdd rounds twice, as Highway's SSE4)
//   256  AVX2 + FMA    xsimd::fma3<avx2>
//   512  AVX-512 F/VL/DQ/BW  xsimd::avx512bw  (the instruction set of Highway's AVX3 target)
// What xsimd 8.1 lacks (transposes, a horizontal max, byte masks, streaming stores, the exp2
// steps of AVX2 and AVX-512) comes from simd/x86/x86-inl.h on the raw registers, shared with the
// Highway provider.
#if defined(CPUATTN_SIMD_XSIMD_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_SIMD_XSIMD_OPS_INL_H_
#undef CPUATTN_SIMD_XSIMD_OPS_INL_H_
#else
#define CPUATTN_SIMD_XSIMD_OPS_INL_H_
#endif

#include <cstdint>
#include <limits>
#include <xsimd/xsimd.hpp>

#include "simd/contract.h"
#include "simd/target_namespace.h"
#include "simd/tiles.h"
#include "simd/x86/x86-inl.h"

CPUATTN_NAMESPACE_BEGIN

#if CPUATTN_XSIMD_ARCH == 512
using XsimdArch = xsimd::avx512bw;
#elif CPUATTN_XSIMD_ARCH == 256
using XsimdArch = xsimd::fma3<xsimd::avx2>;
#else
using XsimdArch = xsimd::sse4_2;
#endif

struct XsimdOps : simd::Tiles<CPUATTN_XSIMD_ARCH> {
  using V = xsimd::batch<float, XsimdArch>;
  using M = typename V::batch_bool_type;
  using Raw = typename V::register_type;
  static constexpr int kLanes = static_cast<int>(V::size);
  static constexpr const char* kProvider = "xsimd";

  static CPUATTN_ALWAYS_INLINE V FromRaw(Raw r) { return V(r); }
  static CPUATTN_ALWAYS_INLINE Raw ToRaw(V v) { return Raw(v); }
  static CPUATTN_ALWAYS_INLINE V Zero() { return V(0.0f); }
  static CPUATTN_ALWAYS_INLINE V Set(float x) { return V(x); }
  static CPUATTN_ALWAYS_INLINE V Iota() {
    alignas(64) static constexpr float kIota[16] = {0, 1, 2,  3,  4,  5,  6,  7,
                                                    8, 9, 10, 11, 12, 13, 14, 15};
    return V::load_aligned(kIota);
  }
  static CPUATTN_ALWAYS_INLINE V Load(const float* p) { return V::load_aligned(p); }
  static CPUATTN_ALWAYS_INLINE V LoadU(const float* p) { return V::load_unaligned(p); }
  static CPUATTN_ALWAYS_INLINE void Store(V v, float* p) { v.store_aligned(p); }
  static CPUATTN_ALWAYS_INLINE void StoreU(V v, float* p) { v.store_unaligned(p); }
  static CPUATTN_ALWAYS_INLINE void Stream(V v, float* p) { x86::Stream(Raw(v), p); }
  static CPUATTN_ALWAYS_INLINE void StreamFence() { x86::StreamFence(); }
  static CPUATTN_ALWAYS_INLINE V Add(V a, V b) { return a + b; }
  static CPUATTN_ALWAYS_INLINE V Sub(V a, V b) { return a - b; }
  static CPUATTN_ALWAYS_INLINE V Mul(V a, V b) { return a * b; }
  static CPUATTN_ALWAYS_INLINE V Div(V a, V b) { return a / b; }
#if CPUATTN_XSIMD_ARCH == 128
  // Without FMA xsimd::fma is emulated exactly (slowly); Highway's SSE4 rounds twice, and so does
  // this, which the contract allows.
  static CPUATTN_ALWAYS_INLINE V MulAdd(V a, V b, V c) { return a * b + c; }
#else
  static CPUATTN_ALWAYS_INLINE V MulAdd(V a, V b, V c) { return xsimd::fma(a, b, c); }
#endif
  static CPUATTN_ALWAYS_INLINE V Min(V a, V b) { return xsimd::min(a, b); }
  static CPUATTN_ALWAYS_INLINE V Max(V a, V b) { return xsimd::max(a, b); }
  static CPUATTN_ALWAYS_INLINE V Abs(V a) { return xsimd::abs(a); }
  static CPUATTN_ALWAYS_INLINE V Floor(V x) { return xsimd::floor(x); }
  static CPUATTN_ALWAYS_INLINE M Lt(V a, V b) { return a < b; }
  static CPUATTN_ALWAYS_INLINE M Ge(V a, V b) { return a >= b; }
  static CPUATTN_ALWAYS_INLINE M IsNaN(V a) { return xsimd::isnan(a); }
  static CPUATTN_ALWAYS_INLINE V IfThenElse(M m, V a, V b) { return xsimd::select(m, a, b); }
  static CPUATTN_ALWAYS_INLINE V CopySignToAbs(V a, V s) { return xsimd::copysign(a, s); }
  static CPUATTN_ALWAYS_INLINE float ReduceSum(V v) { return xsimd::hadd(v); }
  static CPUATTN_ALWAYS_INLINE float ReduceMax(V v) { return x86::ReduceMax(Raw(v)); }
  static CPUATTN_ALWAYS_INLINE V KeepIfByteSet(V s, const std::uint8_t* bytes) {
    return V(x86::KeepIfByteSet(Raw(s), bytes));
  }

  static constexpr bool kExp2Centered = x86::kExp2Centered;
  static CPUATTN_ALWAYS_INLINE V Exp2Frac(V x) { return V(x86::Exp2Frac(Raw(x))); }
  static CPUATTN_ALWAYS_INLINE V Exp2Scale(V p, V x) { return V(x86::Exp2Scale(Raw(p), Raw(x))); }

  static CPUATTN_ALWAYS_INLINE void Transpose(V* r) {
    Raw raw[kLanes];
    for (int i = 0; i < kLanes; ++i) raw[i] = Raw(r[i]);
    x86::Transpose(raw);
    for (int i = 0; i < kLanes; ++i) r[i] = V(raw[i]);
  }
};
static_assert(simd::VectorOps<XsimdOps>);

// The provider this unit's kernels are instantiated with.
using Ops = XsimdOps;

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_SIMD_XSIMD_OPS_INL_H_
