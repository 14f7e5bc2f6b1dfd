// Machine probes (FMA peak, the score micro-kernel and one flash block on cached data, read
// bandwidth) and the unfused three-pass baseline, written against the vector contract like the
// kernels they judge, so each runs on the provider and target of the case it is compared with.
#if defined(CPUATTN_BENCH_SUPPORT_PROBES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_BENCH_SUPPORT_PROBES_INL_H_
#undef CPUATTN_BENCH_SUPPORT_PROBES_INL_H_
#else
#define CPUATTN_BENCH_SUPPORT_PROBES_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>

#include "core/problem.h"
#include "core/scratch.h"
#include "core/softmax.h"
#include "kernels/flash/pv-inl.h"
#include "kernels/flash/score_tile-inl.h"
#include "probes.h"
#include "simd/math-inl.h"
#include "simd/target_namespace.h"
#include "simd/targets.h"

CPUATTN_NAMESPACE_BEGIN

// Independent FMA chains: enough of them to cover the FMA latency (4 cycles) on both ports, few
// enough that they and the two constants stay in registers (16 of them below AVX-512: with 16
// chains the AVX2 probe spilled and read 88 GFLOP/s where the score micro-kernel reached 111).
template <class O>
double FmaProbe(std::int64_t iters) {
  using V = typename O::V;
#if CPUATTN_SIMD_BITS == 512
  constexpr int kChains = 16;
#else
  constexpr int kChains = 12;
#endif
  V acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = O::Set(1.0f + static_cast<float>(j) * 1e-3f);
  const V a = O::Set(0.999999f), b = O::Set(1e-7f);
  for (std::int64_t it = 0; it < iters; ++it) {
    CPUATTN_UNROLL(16)
    for (int j = 0; j < kChains; ++j) acc[j] = O::MulAdd(acc[j], a, b);
  }
  V sum = acc[0];
  for (int j = 1; j < kChains; ++j) sum = O::Add(sum, acc[j]);
  volatile float sink = O::ReduceSum(sum);
  (void)sink;
  return static_cast<double>(iters) * kChains * O::kLanes * 2.0;
}

// The fused kernel's score micro-kernel on L1-resident operands, as the kernel calls it: D = 64,
// one packed K panel (16 KiB with AVX-512) against 5 row tiles of a Q block (7.5 KiB).
// Nothing misses a cache and nothing else runs, so this is the ceiling of the kernel's arithmetic
// on this machine, below the register-only FmaProbe because every FMA also waits on loads.
template <class O>
double TileProbe(std::int64_t reps) {
  constexpr int N = O::kLanes, W = O::kScoreCols * N, R = O::kScoreRows, kTiles = 5;
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
      ScoreTile<Ops, R, Ops::kScoreCols, false>(qp + t * R * D, D, D, kp, W, s, W, 0, nullptr, mi);
  }
  volatile float sink = s[0];
  (void)sink;
  return static_cast<double>(reps) * kTiles * R * W * D * 2.0;
}

// One K/V block of the fused loop as it runs on a long sequence, on cached operands: the one-pass
// scores and softmax of 64 rows against 128 keys (ProbBlockTiles: products, max, exp2 and sums in
// registers), then P V into the rows' accumulators (PvBlockTiles), D = Dv = 64. Its operands take
// about 130 KiB (Q 16, K 32, V 32, P 32, accumulators 16): L2 on every CPU here, as the kernel's
// own blocks are sized to be. No packing, cold read, prefetch, rescale or output runs, so this is
// the ceiling of the fused loop with its softmax: a call's distance from it is those, or the
// work beside the loop. Rows that have seen a block keep their max (m = 0 against scores near
// 0), so no block is refused.
template <class O>
double BlockProbe(std::int64_t reps) {
  constexpr int N = O::kLanes, W = O::kScoreCols * N;
  constexpr int rows = 64;
  constexpr std::int64_t D = 64, keys = (128 + W - 1) / W * W;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  const std::size_t floats = rows * D + 2 * keys * D + rows * keys + rows * D + rows * N + rows;
  std::unique_ptr<float, Free> buf(
      static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64)));
  if (!buf) throw std::bad_alloc();
  float* qp = buf.get();
  float* kp = qp + rows * D;
  float* vp = kp + keys * D;
  float* s = vp + keys * D;
  float* acc = s + rows * keys;
  float* lsum = acc + rows * D;
  float* m = lsum + rows * N;
  for (std::int64_t i = 0; i < rows * D + 2 * keys * D; ++i)
    qp[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 13) - 6);
  std::fill(acc, acc + rows * D, 0.0f);
  std::fill(m, m + rows, 0.0f);
  const auto nothing = [] {};
  for (std::int64_t rep = 0; rep < reps; ++rep) {
    if (!ProbBlockTiles<O>(rows, qp, D, D, kp, keys, m, /*first=*/false, s, keys, lsum, N,
                           nothing)) {
      throw std::logic_error("BlockProbe: the one-pass tiles refused the probe's block");
    }
    PvBlockTiles<O>(0, rows, s, keys, vp, /*in_place=*/false, 0, keys, keys, nullptr, acc, D,
                    nullptr, nothing);
  }
  volatile float sink = acc[0];
  (void)sink;
  return static_cast<double>(reps) * rows * keys * D * 4.0;
}

template <class O>
float ReadProbe(const float* data, std::size_t n) {
  using V = typename O::V;
  constexpr std::size_t N = O::kLanes;
  V a0 = O::Zero(), a1 = O::Zero(), a2 = O::Zero(), a3 = O::Zero();
  for (std::size_t i = 0; i + 4 * N <= n; i += 4 * N) {
    a0 = O::Add(a0, O::Load(data + i));
    a1 = O::Add(a1, O::Load(data + i + N));
    a2 = O::Add(a2, O::Load(data + i + 2 * N));
    a3 = O::Add(a3, O::Load(data + i + 3 * N));
  }
  return O::ReduceSum(O::Add(O::Add(a0, a1), O::Add(a2, a3)));
}

// ReadProbe with each of the four sums kept in memory: per vector, a load of the sum, the add of
// the data, a store of the sum (the barrier, which sees the sums' address, keeps the compiler
// from holding them in registers).
// On some CPUs this streams faster than ReadProbe, whose loads all go out at once
// (docs/performance.md#dm-read-probe-forms); the probe takes the better of the two.
template <class O>
float ReadProbeSpilled(const float* data, std::size_t n) {
  constexpr std::size_t N = O::kLanes;
  alignas(64) float sums[4][N] = {};
  for (std::size_t i = 0; i + 4 * N <= n; i += 4 * N) {
    for (std::size_t k = 0; k < 4; ++k) {
      O::Store(O::Add(O::Load(sums[k]), O::Load(data + i + k * N)), sums[k]);
      asm volatile("" : : "r"(sums) : "memory");
    }
  }
  return O::ReduceSum(O::Add(O::Add(O::Load(sums[0]), O::Load(sums[1])),
                             O::Add(O::Load(sums[2]), O::Load(sums[3]))));
}

// The unfused baseline the benchmarks compare against: three passes over a materialized
// [Lq, Lk] score matrix per head (scores as SIMD dot products, softmax, then P V), no tiling.
// Handles the scale and GQA; masks are out of its scope (it exists to be measured).
template <class O>
void RunUnfusedHead(const detail::Problem& p, std::int64_t b, std::int64_t h,
                    detail::Scratch& scratch) {
  constexpr int N = O::kLanes;
  const std::int64_t hk = h / p.group;
  const std::int64_t LkP = (p.Lk + N - 1) / N * N, DvP = (p.Dv + N - 1) / N * N;
  float* s = scratch.get(static_cast<std::size_t>(p.Lq * LkP + DvP + N));
  float* acc = s + p.Lq * LkP;
  const float* Q = static_cast<const float*>(p.q.data) + b * p.q.s[0] + h * p.q.s[1];
  const float* K = static_cast<const float*>(p.k.data) + b * p.k.s[0] + hk * p.k.s[1];
  const float* V = static_cast<const float*>(p.v.data) + b * p.v.s[0] + hk * p.v.s[1];
  const float qscale = static_cast<float>(p.scale) * detail::kLog2e;
  const std::int64_t Dvec = p.D / N * N;
  for (std::int64_t i = 0; i < p.Lq; ++i) {  // pass 1: scores
    const float* q = Q + i * p.q.s[2];
    for (std::int64_t j = 0; j < p.Lk; ++j) {
      const float* k = K + j * p.k.s[2];
      typename O::V dot = O::Zero();
      for (std::int64_t d = 0; d < Dvec; d += N)
        dot = O::MulAdd(O::LoadU(q + d), O::LoadU(k + d), dot);
      float tail = 0;
      for (std::int64_t d = Dvec; d < p.D; ++d) tail += q[d] * k[d];
      s[i * LkP + j] = (O::ReduceSum(dot) + tail) * qscale;
    }
    for (std::int64_t j = p.Lk; j < LkP; ++j)
      s[i * LkP + j] = -std::numeric_limits<float>::infinity();
  }
  for (std::int64_t i = 0; i < p.Lq; ++i) {  // pass 2: softmax, normalized
    float* row = s + i * LkP;
    typename O::V vmax = O::Set(-std::numeric_limits<float>::infinity());
    for (std::int64_t j = 0; j < LkP; j += N) vmax = O::Max(vmax, O::Load(row + j));
    const typename O::V vm = O::Set(O::ReduceMax(vmax));
    typename O::V vsum = O::Zero();
    for (std::int64_t j = 0; j < LkP; j += N) {
      const typename O::V e = Exp2<O>(O::Sub(O::Load(row + j), vm));
      O::Store(e, row + j);
      vsum = O::Add(vsum, e);
    }
    const typename O::V inv = O::Set(1.0f / O::ReduceSum(vsum));
    for (std::int64_t j = 0; j < LkP; j += N) O::Store(O::Mul(O::Load(row + j), inv), row + j);
  }
  for (std::int64_t i = 0; i < p.Lq; ++i) {  // pass 3: out = P V
    std::fill(acc, acc + DvP, 0.0f);
    for (std::int64_t j = 0; j < p.Lk; ++j) {
      const typename O::V w = O::Set(s[i * LkP + j]);
      const float* v = V + j * p.v.s[2];
      std::int64_t d = 0;
      for (; d + N <= p.Dv; d += N)
        O::Store(O::MulAdd(w, O::LoadU(v + d), O::Load(acc + d)), acc + d);
      for (; d < p.Dv; ++d) acc[d] += s[i * LkP + j] * v[d];
    }
    float* dst = static_cast<float*>(p.out) + b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
    std::copy(acc, acc + p.Dv, dst);
  }
}

void RunUnfusedHeadOps(const detail::Problem& p, std::int64_t b, std::int64_t h,
                       detail::Scratch& scratch) {
  RunUnfusedHead<Ops>(p, b, h, scratch);
}

const detail::ProbeKernels* GetProbeKernels() {
  static const detail::ProbeKernels table{.target = CPUATTN_UNIT_TARGET,
                                          .provider = simd::ProviderOf(Ops::kProvider),
                                          .fma = &FmaProbe<Ops>,
                                          .tile = &TileProbe<Ops>,
                                          .block = &BlockProbe<Ops>,
                                          .read = &ReadProbe<Ops>,
                                          .read_spilled = &ReadProbeSpilled<Ops>,
                                          .unfused_head = &RunUnfusedHeadOps};
  return &table;
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_BENCH_SUPPORT_PROBES_INL_H_
