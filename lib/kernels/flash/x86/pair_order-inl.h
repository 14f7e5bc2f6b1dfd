// The column order of the native P V runs of streamed blocks (PvUnit::runs_bf16 in
// x86/bf16_stream-inl.h, PvUnit::runs_vnni in x86/vnni_i8-inl.h): both interleave the elements of
// two V rows (keys) with vpunpckl/hwd, so that one 32-bit lane holds a pair of keys of one
// column, and the accumulators of a group of 32 columns come out permuted within the group. The
// online softmax only scales them, so the natural order is restored once, before the output.
// Compiled only in the native units (flash_bf16.cc, flash_vnni.cc): AVX-512F alone.
#if defined(CPUATTN_KERNELS_FLASH_X86_PAIR_ORDER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_X86_PAIR_ORDER_INL_H_
#undef CPUATTN_KERNELS_FLASH_X86_PAIR_ORDER_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_X86_PAIR_ORDER_INL_H_
#endif

#include <immintrin.h>

#include <cstdint>

#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

#if defined(__AVX512F__)

template <class O>
struct PairOrder {
  static_assert(O::kLanes == 16, "the native units are AVX-512 only");
  static constexpr int N = 16;

  // The natural column order of `rows` accumulator rows (`stride` floats apart) of n columns,
  // whole groups of 32, as the pair runs left them.
  static void UnpermuteAcc(float* acc, int rows, std::int64_t stride, std::int64_t n) {
    // Natural column c of a group: lo lane 4 (c / 8) + c % 8 when c % 8 < 4, else hi lane
    // 4 (c / 8) + c % 8 - 4 (index + 16 in vpermt2ps).
    alignas(64) std::int32_t idx[32];
    for (int c = 0; c < 32; ++c) idx[c] = 4 * (c / 8) + c % 4 + (c % 8 < 4 ? 0 : 16);
    const __m512i i0 = _mm512_load_si512(idx), i1 = _mm512_load_si512(idx + 16);
    for (int r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < n; c += 32) {
        float* a = acc + r * stride + c;
        const __m512 lo = _mm512_load_ps(a), hi = _mm512_load_ps(a + N);
        _mm512_store_ps(a, _mm512_permutex2var_ps(lo, i0, hi));
        _mm512_store_ps(a + N, _mm512_permutex2var_ps(lo, i1, hi));
      }
  }
};

#endif  // __AVX512F__

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_X86_PAIR_ORDER_INL_H_
