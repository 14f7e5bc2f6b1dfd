// The inner loop of the register-blocked micro-kernels (attention scores, P V, the layers' dense
// product): R x C vector accumulators += a(k, r) (broadcast) x b[k][0:C vectors], for k < K,
// with a(k, r) = a[k * a_k + r * a_r] and the C vectors of each k contiguous, `b_stride` floats
// apart. Per k: C loads, R broadcasts, R * C FMAs. Inlined, so the accumulators stay in
// registers.
#if defined(CPUATTN_KERNELS_COMMON_OUTER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_COMMON_OUTER_INL_H_
#undef CPUATTN_KERNELS_COMMON_OUTER_INL_H_
#else
#define CPUATTN_KERNELS_COMMON_OUTER_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "simd/target_namespace.h"
#include "simd/widen-inl.h"
#if CPUATTN_SIMD_BITS > 0
#include "simd/x86/x86-inl.h"
#endif

CPUATTN_NAMESPACE_BEGIN

// v, held in a register from here on, for an operand that several FMAs take: on x86, GCC 12 folds
// such a load into each FMA as a memory operand and reads it once per use (x86::InRegister,
// docs/performance.md#dm-q-in-register); elsewhere no FMA takes a memory operand.
template <class O>
CPUATTN_ALWAYS_INLINE typename O::V InRegister(typename O::V v) {
#if CPUATTN_SIMD_BITS > 0
  return O::FromRaw(x86::InRegister(O::ToRaw(v)));
#else
  return v;
#endif
}

// p, for the load of the next vector after R FMAs into acc_of_row(0..R) (the accumulators the
// current vector fed), made to come after them (x86::After: no instruction). Where R held
// operands, R x C accumulators and one widened vector at a time fill AVX2's 16 registers (the
// 3 x 4 tiles of OuterStep, GemvStep and DotKeys with bf16, f16 or int8 data), clang 14's pre-RA
// scheduler hoisted the next vector's load and widening above the current vector's last FMAs
// (or kept one load for both vectors of a bf16 pair, PanelOrder): two vectors live, one register
// short, and an accumulator spilled, its FMA chain through a store and a reload
// (docs/performance.md#dm-clang-next-vector). An f32 vector has no widening to hoist.
template <class O, int R, class AccOfRow, class P>
CPUATTN_ALWAYS_INLINE P* LoadAfter(AccOfRow acc_of_row, P* p) {
#if CPUATTN_SIMD_BITS > 0
  if constexpr (!std::is_same_v<std::remove_const_t<P>, float>) {
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) p = x86::After(O::ToRaw(acc_of_row(r)), p);
  }
#else
  static_cast<void>(acc_of_row);
#endif
  return p;
}

// The operand order of one k step beside R x C vector accumulators (OuterStep, GemvStep): the
// smaller operand set stays live. True: R broadcasts of A held and one vector of B at a time;
// false: B's C vectors held and one broadcast at a time. AVX2's 3 x 4 dense-product tile needs
// the first (12 + 3 + 1 of 16 registers): with B's 4 widened vectors held it needs 17, and GCC
// keeps an accumulator on the stack, its FMA chain through a store and a reload every k.
// AVX-512's 12 x 2 needs the second (24 + 2 + 1 of 32; 12 broadcasts held would spill).
template <int R, int C>
inline constexpr bool kBroadcastsFirst = R < C;

// B's vectors in memory order: vector j alone, or all C of them. The dense product passes its own
// order for bf16 panels instead (PanelOrder, kernels/gemm/panel_order-inl.h).
struct ColumnOrder {
  template <class O, class TB>
  static CPUATTN_ALWAYS_INLINE typename O::V One(const TB* b, int j) {
    return LoadWide<O>(b + j * O::kLanes);
  }
  template <class O, class TB, int C>
  static CPUATTN_ALWAYS_INLINE void Row(const TB* b, typename O::V (&v)[C]) {
    LoadWideN<O, C>(b, v);
  }
};

// One k: acc[r][j] += a[r * a_r] x b[j vectors], `b` of a reduced-precision storage type or f32
// (TB = Bf16, F16 or int8 are widened as loaded, simd/widen-inl.h), its vectors in Order.
template <class O, int R, int C, class TB = float, class Order = ColumnOrder>
CPUATTN_ALWAYS_INLINE void OuterStep(const float* CPUATTN_RESTRICT a, std::int64_t a_r,
                                     const TB* CPUATTN_RESTRICT b, typename O::V (&acc)[R][C]) {
  using V = typename O::V;
  if constexpr (kBroadcastsFirst<R, C>) {
    V av[R];
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) av[r] = O::Set(a[r * a_r]);
    const TB* bj = b;
    CPUATTN_UNROLL(32)
    for (int j = 0; j < C; ++j) {
      if (j > 0) bj = LoadAfter<O, R>([&](int r) { return acc[r][j - 1]; }, bj);
      V bv = Order::template One<O, TB>(bj, j);
      if constexpr (R > 1) bv = InRegister<O>(bv);
      CPUATTN_UNROLL(16)
      for (int r = 0; r < R; ++r) acc[r][j] = O::MulAdd(av[r], bv, acc[r][j]);
    }
  } else {
    V bv[C];
    Order::template Row<O, TB, C>(b, bv);
    if constexpr (R > 1) {
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) bv[j] = InRegister<O>(bv[j]);
    }
    CPUATTN_UNROLL(16)
    for (int r = 0; r < R; ++r) {
      const V av = O::Set(a[r * a_r]);
      CPUATTN_UNROLL(32)
      for (int j = 0; j < C; ++j) acc[r][j] = O::MulAdd(av, bv[j], acc[r][j]);
    }
  }
}

template <class O, int R, int C, class TB = float>
CPUATTN_ALWAYS_INLINE void AccumulateOuter(const float* CPUATTN_RESTRICT a, std::int64_t a_k,
                                           std::int64_t a_r, const TB* CPUATTN_RESTRICT b,
                                           std::int64_t b_stride, std::int64_t K,
                                           typename O::V (&acc)[R][C]) {
  for (std::int64_t k = 0; k < K; ++k)
    OuterStep<O, R, C, TB>(a + k * a_k, a_r, b + k * b_stride, acc);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_COMMON_OUTER_INL_H_
