// The Highway provider of the vector contract (simd/contract.h): HwyOps, and `Ops`, the provider
// every kernel of a Highway unit is instantiated with. Include after <hwy/highway.h> in a unit
// compiled per target with <hwy/foreach_target.h> (see kernels/flash/flash_hwy.cc).
#if defined(CPUATTN_SIMD_HWY_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_SIMD_HWY_OPS_INL_H_
#undef CPUATTN_SIMD_HWY_OPS_INL_H_
#else
#define CPUATTN_SIMD_HWY_OPS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <limits>

#include "simd/contract.h"
#include "simd/target_namespace.h"
#include "simd/tiles.h"
#if HWY_ARCH_X86
#include "simd/x86/x86-inl.h"
#endif

CPUATTN_NAMESPACE_BEGIN
namespace hn = hwy::HWY_NAMESPACE;

// Constants are made inside functions: vectors at namespace scope would be constructed with the
// wrong target's instructions.
struct HwyOps : simd::Tiles<CPUATTN_SIMD_BITS, CPUATTN_ARM_SIMD_BITS> {
  using D = hn::ScalableTag<float>;
#if defined(CPUATTN_SVE_BITS)
  // An SVE unit is compiled for one vector length (-msve-vector-bits, lib/CMakeLists.txt): its
  // vectors have a size, so a micro-kernel can keep its register tile in an array. Highway's ops
  // take the sizeless types (their templates would not deduce these), hence R() and RM() below.
  typedef hn::Vec<D> V __attribute__((arm_sve_vector_bits(CPUATTN_SVE_BITS)));
  typedef hn::Mask<D> M __attribute__((arm_sve_vector_bits(CPUATTN_SVE_BITS)));
  static constexpr int kLanes = CPUATTN_SVE_BITS / 32;
#else
  using V = hn::Vec<D>;
  using M = hn::Mask<D>;
  static constexpr int kLanes = static_cast<int>(hn::MaxLanes(D()));
#endif
  static constexpr const char* kProvider = "highway";
  static HWY_INLINE hn::Vec<D> R(V v) { return v; }
  static HWY_INLINE hn::Mask<D> RM(M m) { return m; }

#if CPUATTN_SIMD_BITS > 0
  using Raw = decltype(V().raw);
  static HWY_INLINE V FromRaw(Raw r) { return V{r}; }
  static HWY_INLINE Raw ToRaw(V v) { return v.raw; }
#endif
  static HWY_INLINE V Zero() { return hn::Zero(D()); }
  static HWY_INLINE V Set(float x) { return hn::Set(D(), x); }
  static HWY_INLINE V Iota() { return hn::Iota(D(), 0.0f); }
  static HWY_INLINE V Load(const float* p) { return hn::Load(D(), p); }
  static HWY_INLINE V LoadU(const float* p) { return hn::LoadU(D(), p); }
  static HWY_INLINE void Store(V v, float* p) { hn::Store(R(v), D(), p); }
  static HWY_INLINE void StoreU(V v, float* p) { hn::StoreU(R(v), D(), p); }
  static HWY_INLINE void Stream(V v, float* p) { hn::Stream(R(v), D(), p); }
  static HWY_INLINE void StreamFence() {
#if HWY_ARCH_X86
    x86::StreamFence();
#endif
  }
  static HWY_INLINE V Add(V a, V b) { return hn::Add(R(a), R(b)); }
  static HWY_INLINE V Sub(V a, V b) { return hn::Sub(R(a), R(b)); }
  static HWY_INLINE V Mul(V a, V b) { return hn::Mul(R(a), R(b)); }
  static HWY_INLINE V Div(V a, V b) { return hn::Div(R(a), R(b)); }
  static HWY_INLINE V MulAdd(V a, V b, V c) { return hn::MulAdd(R(a), R(b), R(c)); }
  static HWY_INLINE V Min(V a, V b) { return hn::Min(R(a), R(b)); }
  static HWY_INLINE V Max(V a, V b) { return hn::Max(R(a), R(b)); }
  static HWY_INLINE V Abs(V a) { return hn::Abs(R(a)); }
  static HWY_INLINE V Floor(V x) { return hn::Floor(R(x)); }
  static HWY_INLINE M Lt(V a, V b) { return hn::Lt(R(a), R(b)); }
  static HWY_INLINE M Ge(V a, V b) { return hn::Ge(R(a), R(b)); }
  static HWY_INLINE M IsNaN(V a) { return hn::IsNaN(R(a)); }
  static HWY_INLINE V IfThenElse(M m, V a, V b) { return hn::IfThenElse(RM(m), R(a), R(b)); }
  static HWY_INLINE V CopySignToAbs(V a, V s) { return hn::CopySignToAbs(R(a), R(s)); }
  static HWY_INLINE float ReduceSum(V v) { return hn::GetLane(hn::SumOfLanes(D(), R(v))); }

  static HWY_INLINE float ReduceMax(V v) {
#if HWY_TARGET == HWY_EMU128
    // Highway 1.0.3's EMU128 MaxOfLanes starts from the lowest finite float, so all -inf lanes
    // give -3.4e38 and a fully masked row turned into NaN (first seen with clang, whose fallback
    // target this is).
    alignas(64) float lanes[kLanes];
    Store(v, lanes);
    float m = lanes[0];
    for (int i = 1; i < kLanes; ++i) m = lanes[i] > m ? lanes[i] : m;
    return m;
#else
    return hn::GetLane(hn::MaxOfLanes(D(), R(v)));
#endif
  }

  static HWY_INLINE V KeepIfByteSet(V s, const std::uint8_t* bytes) {
    const hn::Rebind<std::uint8_t, D> d8;
    const hn::Rebind<std::int32_t, D> di;
    const auto b = hn::PromoteTo(di, hn::LoadU(d8, bytes));
    const auto keep = hn::RebindMask(D(), hn::Ne(b, hn::Zero(di)));
    return hn::IfThenElse(keep, R(s), hn::Set(D(), -std::numeric_limits<float>::infinity()));
  }

#if CPUATTN_SIMD_BITS >= 128
  static constexpr bool kExp2Centered = x86::kExp2Centered;
  static HWY_INLINE V Exp2Frac(V x) { return V{x86::Exp2Frac(x.raw)}; }
  static HWY_INLINE V Exp2Scale(V p, V x) { return V{x86::Exp2Scale(p.raw, x.raw)}; }
#else
  // n = floor(x): frintm is one instruction on NEON and SVE.
  static constexpr bool kExp2Centered = false;
  static HWY_INLINE V Exp2Frac(V x) { return hn::Sub(R(x), hn::Floor(R(x))); }
  // floor(x) added to p's exponent field (exact for -126 < x < 128 with Exp2's p), in unsigned
  // lanes: the emulated target's signed overflow would be undefined.
  static HWY_INLINE V Exp2Scale(V p, V x) {
    const hn::RebindToSigned<D> di;
    const hn::RebindToUnsigned<D> du;
    auto fl = hn::Floor(R(x));
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
    // The emulated ConvertTo is a C++ cast: NaN or a value past int32 is undefined behaviour
    // there (UBSan caught NaN under clang). ARM's fcvtzs saturates and gives 0 for NaN, which the
    // shift keeps 0 (p carries the NaN), so NEON and SVE need no clamp.
    fl = hn::IfThenElse(hn::IsNaN(fl), hn::Zero(D()),
                        hn::Min(hn::Max(fl, hn::Set(D(), -127.0f)), hn::Set(D(), 128.0f)));
#endif
    const auto n = hn::ShiftLeft<23>(hn::BitCast(du, hn::ConvertTo(di, fl)));
    return hn::IfThenElse(hn::Le(R(x), hn::Set(D(), simd::kExp2ZeroAtOrBelow)), hn::Zero(D()),
                          hn::BitCast(D(), hn::Add(hn::BitCast(du, R(p)), n)));
  }
#endif

  // Packing K into key-major panels is a transpose; done a lane at a time it costs a store per
  // element, which for cross attention and decode rivals the arithmetic.
  static HWY_INLINE void Transpose(V* r) {
#if CPUATTN_SIMD_BITS > 0
    decltype(r[0].raw) raw[kLanes];
    for (int i = 0; i < kLanes; ++i) raw[i] = r[i].raw;
    x86::Transpose(raw);
    for (int i = 0; i < kLanes; ++i) r[i].raw = raw[i];
#else
    // Portable targets (SCALAR with 1 lane under g++, EMU128 with 4 under clang): through
    // memory. These targets are the fallback, correct rather than fast.
    alignas(64) float m[kLanes * kLanes];
    for (int i = 0; i < kLanes; ++i) Store(r[i], m + i * kLanes);
    for (int i = 0; i < kLanes; ++i) {
      alignas(64) float col[kLanes];
      for (int j = 0; j < kLanes; ++j) col[j] = m[j * kLanes + i];
      r[i] = Load(col);
    }
#endif
  }
};
static_assert(simd::VectorOps<HwyOps>);

// The provider this unit's kernels are instantiated with.
using Ops = HwyOps;

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_SIMD_HWY_OPS_INL_H_
