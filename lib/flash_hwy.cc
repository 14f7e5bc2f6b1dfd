// Highway translation unit of the fused kernel: compiled once per SIMD target (foreach_target.h),
// exported through one dispatch table. The driver resolves the table entry once per call
// (kernels_for), so no dispatch happens per task or tile.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "flash_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace cpuattn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The vector operations the kernel is written against. A second SIMD provider supplies the same
// members. Constants are made inside functions: vectors at namespace scope would be constructed
// with the wrong target's instructions.
struct Ops {
  using D = hn::ScalableTag<float>;
  using V = hn::Vec<D>;
  static constexpr int kLanes = static_cast<int>(hn::MaxLanes(D()));
#if HWY_TARGET <= HWY_AVX3
  // 32 registers: 12x2 score accumulators + 2 K vectors; 6x4 P V accumulators + 4 V vectors.
  static constexpr int kScoreRows = 12, kPvRows = 6, kPvCols = 4;
#elif HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  static constexpr int kScoreRows = 4, kPvRows = 4, kPvCols = 2;
#else
  // 16 registers: 6x2 accumulators + 2 operands + 1 broadcast in both micro-kernels.
  static constexpr int kScoreRows = 6, kPvRows = 6, kPvCols = 2;
#endif
  // Keys per K/V block. With 64 query rows the score tile is 64 x 128 x 4 B = 32 KiB and one V
  // chunk 128 x 64 x 4 B = 32 KiB: each stays in the 48 KiB L1d while a micro-kernel sweeps it,
  // and the whole block's Kp + Vp (128 x (D + Dv) x 4 B <= 128 KiB for D = Dv = 128) in L2.
  static constexpr std::int64_t kBlockKeys = 128;
  // Query rows per block (positions x heads of one K/V group): each packed K/V block is reused
  // by 64 rows, i.e. 64 x 2 flops per loaded float, far above what L2 must deliver.
  static constexpr std::int64_t kBlockRows = 64;

  static HWY_INLINE V Zero() { return hn::Zero(D()); }
  static HWY_INLINE V Set(float x) { return hn::Set(D(), x); }
  static HWY_INLINE V Load(const float* p) { return hn::Load(D(), p); }
  static HWY_INLINE V LoadU(const float* p) { return hn::LoadU(D(), p); }
  static HWY_INLINE void Store(V v, float* p) { hn::Store(v, D(), p); }
  static HWY_INLINE void StoreU(V v, float* p) { hn::StoreU(v, D(), p); }
  static HWY_INLINE V MulAdd(V a, V b, V c) { return hn::MulAdd(a, b, c); }
  static HWY_INLINE V Mul(V a, V b) { return hn::Mul(a, b); }
  static HWY_INLINE V Add(V a, V b) { return hn::Add(a, b); }
  static HWY_INLINE V Sub(V a, V b) { return hn::Sub(a, b); }
  static HWY_INLINE V Max(V a, V b) { return hn::Max(a, b); }
  static HWY_INLINE float ReduceMax(V v) { return hn::GetLane(hn::MaxOfLanes(D(), v)); }
  static HWY_INLINE float ReduceSum(V v) { return hn::GetLane(hn::SumOfLanes(D(), v)); }

  // Lanes whose key index col0 + lane is >= end become -inf.
  static HWY_INLINE V KeepBelow(V s, std::int32_t col0, std::int32_t end) {
    const hn::RebindToSigned<D> di;
    const auto idx = hn::Add(hn::Iota(di, 0), hn::Set(di, col0));
    const auto keep = hn::RebindMask(D(), hn::Lt(idx, hn::Set(di, end)));
    return hn::IfThenElse(keep, s, Set(-std::numeric_limits<float>::infinity()));
  }
  // Lanes whose mask byte is 0 become -inf.
  static HWY_INLINE V KeepIfByteSet(V s, const std::uint8_t* bytes) {
    const hn::Rebind<std::uint8_t, D> d8;
    const hn::Rebind<std::int32_t, D> di;
    const auto b = hn::PromoteTo(di, hn::LoadU(d8, bytes));
    const auto keep = hn::RebindMask(D(), hn::Ne(b, hn::Zero(di)));
    return hn::IfThenElse(keep, s, Set(-std::numeric_limits<float>::infinity()));
  }

  // 2^x. Maximum relative error 3e-7 (2.5 ulp) for x in [-126, 127] (asserted by
  // tests/test_exp.cpp against a double-precision reference); x < -126.5 gives 0 (never a
  // denormal), so a masked score of -inf gives exactly 0; NaN gives NaN.
  // Method: x = n + f with n = round(x), |f| <= 1/2; 2^f by a degree-5 polynomial fitted for
  // minimum relative error on [-1/2, 1/2] (1.96 ulp in f32 Horner form); 2^n from the exponent
  // bits, where n = -127 encodes exactly 0.
  static HWY_INLINE V Exp2(V x) {
    const D d;
    const hn::RebindToSigned<D> di;
    // Clamp from below, keeping NaN: x86 max returns its second operand when either is NaN.
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
    x = hn::Max(hn::Set(d, -127.0f), x);
#else
    x = hn::IfThenElse(hn::Lt(x, hn::Set(d, -127.0f)), hn::Set(d, -127.0f), x);
#endif
    const V n = hn::Round(x);
    const V f = hn::Sub(x, n);
    V p = hn::Set(d, 1.327647013e-03f);
    p = hn::MulAdd(p, f, hn::Set(d, 9.675540961e-03f));
    p = hn::MulAdd(p, f, hn::Set(d, 5.550713465e-02f));
    p = hn::MulAdd(p, f, hn::Set(d, 2.402212024e-01f));
    p = hn::MulAdd(p, f, hn::Set(d, 6.931469440e-01f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.000000119e+00f));
    const auto bits = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
    return hn::Mul(p, hn::BitCast(d, bits));
  }
  static HWY_INLINE float Exp2Scalar(float x) { return std::exp2(x); }
};

#include "flash-inl.h"

void RunTask(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
             detail::Scratch& scratch) {
  RunTaskImpl<Ops>(p, pl, t, scratch);
}

void RunUnfusedHead(const detail::Problem& p, std::int64_t b, std::int64_t h,
                    detail::Scratch& scratch) {
  RunUnfusedHeadImpl<Ops>(p, b, h, scratch);
}

void Exp2Array(const float* in, float* out, std::size_t n) {
  constexpr std::size_t N = Ops::kLanes;
  std::size_t i = 0;
  for (; i + N <= n; i += N) Ops::StoreU(Ops::Exp2(Ops::LoadU(in + i)), out + i);
  if (i < n) {
    alignas(64) float buf[N] = {};
    std::copy(in + i, in + n, buf);
    Ops::Store(Ops::Exp2(Ops::Load(buf)), buf);
    std::copy(buf, buf + (n - i), out + i);
  }
}

// Independent FMA chains: enough of them (16) to cover the FMA latency on both ports.
double FmaProbe(std::int64_t iters) {
  using V = Ops::V;
  V acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = Ops::Set(1.0f + static_cast<float>(j) * 1e-3f);
  const V a = Ops::Set(0.999999f), b = Ops::Set(1e-7f);
  for (std::int64_t it = 0; it < iters; ++it) {
    HWY_UNROLL(16)
    for (int j = 0; j < 16; ++j) acc[j] = Ops::MulAdd(acc[j], a, b);
  }
  V sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = Ops::Add(sum, acc[j]);
  volatile float sink = Ops::ReduceSum(sum);
  (void)sink;
  return static_cast<double>(iters) * 16.0 * Ops::kLanes * 2.0;
}

float ReadProbe(const float* data, std::size_t n) {
  using V = Ops::V;
  constexpr std::size_t N = Ops::kLanes;
  V a0 = Ops::Zero(), a1 = Ops::Zero(), a2 = Ops::Zero(), a3 = Ops::Zero();
  for (std::size_t i = 0; i + 4 * N <= n; i += 4 * N) {
    a0 = Ops::Add(a0, Ops::Load(data + i));
    a1 = Ops::Add(a1, Ops::Load(data + i + N));
    a2 = Ops::Add(a2, Ops::Load(data + i + 2 * N));
    a3 = Ops::Add(a3, Ops::Load(data + i + 3 * N));
  }
  return Ops::ReduceSum(Ops::Add(Ops::Add(a0, a1), Ops::Add(a2, a3)));
}

Target ThisTarget() {
#if HWY_TARGET <= HWY_AVX3
  return Target::avx512;
#elif HWY_TARGET == HWY_AVX2
  return Target::avx2;
#elif HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
  return Target::sse4;
#else
  return Target::scalar;
#endif
}

const detail::KernelInfo* GetKernels() {
  static const detail::KernelInfo info{.target = ThisTarget(),
                                       .name = hwy::TargetName(HWY_TARGET),
                                       .lanes = Ops::kLanes,
                                       .block_rows = Ops::kBlockRows,
                                       .block_keys = Ops::kBlockKeys,
                                       .run_task = &RunTask,
                                       .exp2 = &Exp2Array,
                                       .fma_probe = &FmaProbe,
                                       .read_probe = &ReadProbe,
                                       .run_unfused_head = &RunUnfusedHead};
  return &info;
}

}  // namespace HWY_NAMESPACE
}  // namespace cpuattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cpuattn {
HWY_EXPORT(GetKernels);

namespace detail {

const KernelInfo& kernels_for(Target cap) {
  // Highway target bits a cap excludes (a lower bit is a better target on x86).
  std::int64_t excluded = 0;
  switch (cap) {
    case Target::scalar:
      excluded |= HWY_SSE4 | HWY_SSSE3;
      [[fallthrough]];
    case Target::sse4:
      excluded |= HWY_AVX2;
      [[fallthrough]];
    case Target::avx2:
      excluded |= HWY_AVX3 | HWY_AVX3_DL;
      [[fallthrough]];
    case Target::avx512:
    case Target::best:
      break;
  }
  const std::int64_t allowed = hwy::SupportedTargets() & ~excluded;
  // The same index arithmetic as hwy::ChosenTarget, but per call and without global state, so
  // concurrent calls may use different caps. The fallback entry (EMU128) is always present.
  const std::int64_t mask = (HWY_CHOSEN_TARGET_SHIFT(allowed) | HWY_CHOSEN_TARGET_MASK_SCALAR) &
                            HWY_CHOSEN_TARGET_MASK_TARGETS;
  const std::size_t index = hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<std::uint64_t>(mask));
  return *HWY_DISPATCH_TABLE(GetKernels)[index]();
}

}  // namespace detail
}  // namespace cpuattn
#endif  // HWY_ONCE
