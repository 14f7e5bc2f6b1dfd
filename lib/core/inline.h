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

// f(r, i, h) for rows [r0, r1) of a query block whose row r is position i = pos0 + r / nh, head
// h = h0 + r % nh (the heads of one K/V group folded into the block): one 64-bit division for
// the first row, not one per row (a block's 64 of them cost as much as copying its Q rows).
template <class F>
CPUATTN_ALWAYS_INLINE void ForQueryRows(std::int64_t pos0, std::int64_t h0, std::int64_t nh,
                                        std::int64_t r0, std::int64_t r1, const F& f) {
  if (r0 >= r1) return;  // nh may be 0 then (InputsAhead with nothing to read)
  std::int64_t i = pos0 + r0 / nh, h = h0 + r0 % nh;
  for (std::int64_t r = r0; r < r1; ++r) {
    f(r, i, h);
    if (++h == h0 + nh) {
      h = h0;
      ++i;
    }
  }
}

}  // namespace cpuattn::detail
