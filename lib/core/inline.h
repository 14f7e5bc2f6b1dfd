// The core helpers per-target kernels call are always inlined. An xsimd unit is compiled with
// -mavx512* (or -mavx2) for the whole file: an out-of-line copy it emitted of a shared inline
// function could be the copy the linker keeps for the whole program, and then run on a CPU
// without those instructions. tests/unit_odr_check.sh asserts that no such copy exists.
#pragma once

#include <cstdint>
#include <type_traits>

#define CPUATTN_ALWAYS_INLINE inline __attribute__((always_inline))

namespace cpuattn::detail {

// f(std::integral_constant<int, n>{}) for a count n known only at run time, 1 <= n <= kMax (no
// call otherwise): the micro-kernels take their rows and columns as template arguments.
template <int kMax, int k = 1, class F>
CPUATTN_ALWAYS_INLINE void WithCount(std::int64_t n, const F& f) {
  if constexpr (k <= kMax) {
    if (n == k) {
      f(std::integral_constant<int, k>{});
    } else {
      WithCount<kMax, k + 1>(n, f);
    }
  }
}

}  // namespace cpuattn::detail
