// Highway translation unit of every SIMD kernel (fused attention, the layers' dense product,
// tanh and additive attention): compiled once per SIMD target (foreach_target.h), exported
// through one dispatch table. Drivers resolve the table entry once per call (kernels_for), so no
// dispatch happens per task or tile.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "gemm.h"
#include "kernel.h"
#include "layers_kernel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels_hwy.cc"
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
  // 32 registers: 6x4 score accumulators + 4 K vectors; 6x4 P V accumulators + 4 V vectors.
  // (Measured on L1 data, 1 thread: 6x4 and 8x3 score tiles reach 185-191 GFLOP/s where 12x2
  // reaches 179; 6x4 keeps panels of 64 keys, which divide the 128-key block.)
  static constexpr int kScoreRows = 6, kScoreCols = 4, kPvRows = 6, kPvCols = 4;
  // Dense product: 12 rows x 32 columns = 24 accumulators (see gemm-inl.h).
  static constexpr int kGemmRows = 12;
#elif HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  static constexpr int kScoreRows = 4, kScoreCols = 2, kPvRows = 4, kPvCols = 2;
  static constexpr int kGemmRows = 1;
#else
  // 16 registers: 6x2 accumulators + 2 operands + 1 broadcast in both micro-kernels.
  static constexpr int kScoreRows = 6, kScoreCols = 2, kPvRows = 6, kPvCols = 2;
  // Dense product: a 32-column panel is 4 AVX2 vectors (3 rows: 12 accumulators) or 8 SSE4
  // vectors (1 row: 8 accumulators).
  static constexpr int kGemmRows = kLanes == 8 ? 3 : 1;
#endif
  // Keys per K/V block. With 64 query rows the score tile is 64 x 128 x 4 B = 32 KiB and one V
  // chunk 128 x 64 x 4 B = 32 KiB: each stays in the 48 KiB L1d while a micro-kernel sweeps it,
  // and the whole block's Kp + Vp (128 x (D + Dv) x 4 B <= 128 KiB for D = Dv = 128) in L2.
  // (Measured: 64, 256 and 512 keys, and 48, 72 or 96 rows, are within noise of this on P1, P2,
  // S1 and X1.)
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
  // Non-temporal store to a vector-aligned address; StreamFence orders them before later stores.
  static HWY_INLINE void Stream(V v, float* p) { hn::Stream(v, D(), p); }
  static HWY_INLINE void StreamFence() {
#if HWY_ARCH_X86
    _mm_sfence();
#endif
  }
  static HWY_INLINE V MulAdd(V a, V b, V c) { return hn::MulAdd(a, b, c); }
  static HWY_INLINE V Mul(V a, V b) { return hn::Mul(a, b); }
  static HWY_INLINE V Add(V a, V b) { return hn::Add(a, b); }
  static HWY_INLINE V Sub(V a, V b) { return hn::Sub(a, b); }
  static HWY_INLINE V Max(V a, V b) { return hn::Max(a, b); }
  // The largest lane; -inf when every lane is -inf (a fully masked row depends on it).
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
    return hn::GetLane(hn::MaxOfLanes(D(), v));
#endif
  }
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
#if HWY_TARGET <= HWY_AVX3
    // x = n + f with n = floor(x) and f in [0, 1): vreduceps gives f in one instruction and
    // vscalefps applies 2^floor(x) from x itself, so n is never formed (one operation fewer than
    // round, subtract). 2^f by a degree-5 polynomial fitted for minimum relative error on [0, 1)
    // (1.45e-7 in f32 Horner form). Lanes below -126.5 are zeroed by vscalefps's mask (the
    // comparison is true for NaN, so NaN stays NaN).
    const __m512 f = _mm512_reduce_ps(x.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(1.8762338e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.992582e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5823606e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4015453e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9315296e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9999994e-01f));
    const __mmask16 keep = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(-126.5f), _CMP_NLT_UQ);
    return V{_mm512_maskz_scalef_ps(keep, p, x.raw)};
#else
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
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
    // The emulated ConvertTo is a C++ cast: NaN or a value past int32 is undefined behaviour
    // there (UBSan caught NaN under clang), where x86's cvttps returns 0x80000000. p carries the
    // NaN either way, and above 128 the result is outside the stated range.
    const V n_int = hn::IfThenElse(hn::IsNaN(n), hn::Zero(d), hn::Min(n, hn::Set(d, 128.0f)));
#else
    const V n_int = n;
#endif
    const auto bits = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n_int), hn::Set(di, 127)));
    return hn::Mul(p, hn::BitCast(d, bits));
#endif
  }
  static HWY_INLINE float Exp2Scalar(float x) { return std::exp2(x); }

  // tanh(x). Maximum relative error 4e-7 over all finite floats (asserted by
  // Tanh.StatedErrorOnEveryTarget against double precision); tanh(+-inf) = +-1; NaN gives NaN.
  // Method: for |x| < 0.625, x + x^3 P(x^2) with P of degree 4 fitted for minimum relative error
  // on [0, 0.625] (1.3 ulp in f32); above, 1 - 2 / (2^(2 log2(e) |x|) + 1), which has no
  // cancellation once tanh >= 0.55, with Exp2's 3e-7; |x| >= 9 gives exactly +-1 (the true value
  // rounds to 1 there). The sign is copied back from x.
  static HWY_INLINE V Tanh(V x) {
    const D d;
    const V ax = hn::Abs(x);
    const V x2 = hn::Mul(ax, ax);
    V p = hn::Set(d, -0.0057049766182899475f);
    p = hn::MulAdd(p, x2, hn::Set(d, 0.020639078691601753f));
    p = hn::MulAdd(p, x2, hn::Set(d, -0.05373971164226532f));
    p = hn::MulAdd(p, x2, hn::Set(d, 0.13331441581249237f));
    p = hn::MulAdd(p, x2, hn::Set(d, -0.3333328068256378f));
    const V small = hn::MulAdd(hn::Mul(ax, x2), p, ax);
    const V e = Exp2(hn::Mul(hn::Min(ax, hn::Set(d, 9.0f)), hn::Set(d, 2.8853900817779268f)));
    const V large =
        hn::Sub(hn::Set(d, 1.0f), hn::Div(hn::Set(d, 2.0f), hn::Add(e, hn::Set(d, 1.0f))));
    V t = hn::IfThenElse(hn::Lt(ax, hn::Set(d, 0.625f)), small, large);
    t = hn::IfThenElse(hn::Ge(ax, hn::Set(d, 9.0f)), hn::Set(d, 1.0f), t);
    t = hn::IfThenElse(hn::IsNaN(x), x, t);
    return hn::CopySignToAbs(t, x);
  }

  // Transposes kLanes x kLanes floats in registers: r[i] lane j <- r[j] lane i. Packing K into
  // key-major panels is a transpose; done a lane at a time it costs a store per element, which
  // for cross attention and decode rivals the arithmetic.
  static HWY_INLINE void Transpose(V* r) {
#if HWY_TARGET <= HWY_AVX3
    // 32-bit and 64-bit unpacks within 128-bit blocks, then two rounds of 128-bit block shuffles.
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i].raw, r[2 * i + 1].raw);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].raw, r[2 * i + 1].raw);
    }
    for (int g = 0; g < 4; ++g) {  // u[4g + k], block m: column 4m + k of rows 4g..4g+3
      const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
      const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
      u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int k = 0; k < 4; ++k) {
      const __m512 x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
      const __m512 x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
      const __m512 y0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
      const __m512 y1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
      r[k].raw = _mm512_shuffle_f32x4(x0, y0, 0x88);
      r[4 + k].raw = _mm512_shuffle_f32x4(x1, y1, 0x88);
      r[8 + k].raw = _mm512_shuffle_f32x4(x0, y0, 0xdd);
      r[12 + k].raw = _mm512_shuffle_f32x4(x1, y1, 0xdd);
    }
#elif HWY_TARGET == HWY_AVX2
    __m256 t[8], s[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i].raw, r[2 * i + 1].raw);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i].raw, r[2 * i + 1].raw);
    }
    for (int g = 0; g < 2; ++g) {
      s[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
      s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int k = 0; k < 4; ++k) {
      r[k].raw = _mm256_permute2f128_ps(s[k], s[4 + k], 0x20);
      r[4 + k].raw = _mm256_permute2f128_ps(s[k], s[4 + k], 0x31);
    }
#elif HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
    _MM_TRANSPOSE4_PS(r[0].raw, r[1].raw, r[2].raw, r[3].raw);
#else
    // Portable targets (SCALAR with 1 lane under g++, EMU128 with 4 under clang, and whatever
    // Highway picks on other architectures): through memory. These targets are the fallback,
    // correct rather than fast.
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

// outer-inl.h first: flash-inl.h and gemm-inl.h use its micro-kernel loop.
// clang-format off
#include "outer-inl.h"
#include "flash-inl.h"
#include "gemm-inl.h"
#include "layers-inl.h"
// clang-format on

void GemmTask(const detail::GemmProblem& g, std::int64_t t, detail::Scratch& scratch) {
  GemmTaskImpl<Ops>(g, t, scratch);
}

void AdditiveTask(const detail::AdditiveProblem& a, std::int64_t t, detail::Scratch& scratch) {
  AdditiveTaskImpl<Ops>(a, t, scratch);
}

// out[i] = f(in[i]) for a vector function f; the tail goes through a zero-padded vector.
template <class F>
void MapArray(const float* in, float* out, std::size_t n, F f) {
  constexpr std::size_t N = Ops::kLanes;
  std::size_t i = 0;
  for (; i + N <= n; i += N) Ops::StoreU(f(Ops::LoadU(in + i)), out + i);
  if (i < n) {
    alignas(64) float buf[N] = {};
    std::copy(in + i, in + n, buf);
    Ops::Store(f(Ops::Load(buf)), buf);
    std::copy(buf, buf + (n - i), out + i);
  }
}

void TanhArray(const float* in, float* out, std::size_t n) {
  MapArray(in, out, n, [](Ops::V x) { return Ops::Tanh(x); });
}

void RunTask(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
             detail::Scratch& scratch) {
  RunTaskImpl<Ops>(p, pl, t, scratch);
}

void RunUnfusedHead(const detail::Problem& p, std::int64_t b, std::int64_t h,
                    detail::Scratch& scratch) {
  RunUnfusedHeadImpl<Ops>(p, b, h, scratch);
}

void Exp2Array(const float* in, float* out, std::size_t n) {
  MapArray(in, out, n, [](Ops::V x) { return Ops::Exp2(x); });
}

// Independent FMA chains: enough of them to cover the FMA latency (4 cycles) on both ports, few
// enough that they and the two constants stay in registers (16 of them below AVX-512: with 16
// chains the AVX2 probe spilled and read 88 GFLOP/s where the score micro-kernel reached 111).
double FmaProbe(std::int64_t iters) {
  using V = Ops::V;
#if HWY_TARGET <= HWY_AVX3
  constexpr int kChains = 16;
#else
  constexpr int kChains = 12;
#endif
  V acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = Ops::Set(1.0f + static_cast<float>(j) * 1e-3f);
  const V a = Ops::Set(0.999999f), b = Ops::Set(1e-7f);
  for (std::int64_t it = 0; it < iters; ++it) {
    HWY_UNROLL(16)
    for (int j = 0; j < kChains; ++j) acc[j] = Ops::MulAdd(acc[j], a, b);
  }
  V sum = acc[0];
  for (int j = 1; j < kChains; ++j) sum = Ops::Add(sum, acc[j]);
  volatile float sink = Ops::ReduceSum(sum);
  (void)sink;
  return static_cast<double>(iters) * kChains * Ops::kLanes * 2.0;
}

// The fused kernel's score micro-kernel on L1-resident operands, as the kernel calls it: D = 64,
// one packed K panel (16 KiB with AVX-512) against 5 row tiles of a Q block (7.5 KiB).
// Nothing misses a cache and nothing else runs, so this is the ceiling of the kernel's arithmetic
// on this machine, below the register-only FmaProbe because every FMA also waits on loads.
double TileProbe(std::int64_t reps) {
  constexpr int N = Ops::kLanes, W = Ops::kScoreCols * N, R = Ops::kScoreRows, kTiles = 5;
  constexpr std::int64_t D = 64;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  const std::size_t floats = kTiles * R * D + D * W + R * W;
  std::unique_ptr<float, Free> buf(
      static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64)));
  if (!buf) throw std::bad_alloc();
  float* qp = buf.get();
  float* kp = qp + kTiles * R * D;
  float* s = kp + D * W;
  for (std::size_t i = 0; i < kTiles * R * D + D * W; ++i)
    buf.get()[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 13) - 6);
  const MaskInfo mi{detail::MaskKind::none, 0};
  for (std::int64_t rep = 0; rep < reps; ++rep) {
    for (int t = 0; t < kTiles; ++t)
      ScoreTile<Ops, R, false>(qp + t * R * D, D, D, kp, s, W, 0, nullptr, mi);
  }
  volatile float sink = s[0];
  (void)sink;
  return static_cast<double>(reps) * kTiles * R * W * D * 2.0;
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
                                       .tile_probe = &TileProbe,
                                       .read_probe = &ReadProbe,
                                       .run_unfused_head = &RunUnfusedHead,
                                       .gemm_rows = Ops::kGemmRows,
                                       .gemm_task = &GemmTask,
                                       .tanh = &TanhArray,
                                       .additive_task = &AdditiveTask};
  return &info;
}

}  // namespace HWY_NAMESPACE
}  // namespace cpuattn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cpuattn {
HWY_EXPORT(GetKernels);

namespace detail {

namespace {
const KernelInfo& resolve_kernels(Target cap) {
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
}  // namespace

const KernelInfo& kernels_for(Target cap) {
  // hwy::SupportedTargets() runs CPUID, which traps to the hypervisor in a VM: resolve each cap
  // once per process instead of once per call.
  static const std::array<const KernelInfo*, 5> table = [] {
    std::array<const KernelInfo*, 5> t{};
    for (Target c : {Target::scalar, Target::sse4, Target::avx2, Target::avx512, Target::best}) {
      t[static_cast<int>(c)] = &resolve_kernels(c);
    }
    return t;
  }();
  return *table[static_cast<int>(cap)];
}

}  // namespace detail
}  // namespace cpuattn
#endif  // HWY_ONCE
