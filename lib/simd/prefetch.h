// Software prefetch that the compiler keeps.
//
// GCC 12 deletes __builtin_prefetch (and _mm_prefetch, the same builtin) when the prefetch sits in
// a loop nest that does nothing else inside an outer loop: its dead-code elimination treats the
// nest as free of side effects and drops it whole, at -O1 and above. That removed every
// prefetch of RunTask (PrefetchKV, the int8 scale prefetch of paged decoding) from the release
// binary without a warning, while the ones inside the score loops survived; clang keeps all of
// them. With GCC (x86 and aarch64) the prefetch is therefore an `asm volatile`, which no pass may
// delete; its operand names the address without reading it ("m" on x86, a register on aarch64),
// so nothing is loaded and no sanitizer checks it (prefetching any address is harmless: it never
// faults).
#pragma once

#include "core/inline.h"

namespace cpuattn::detail {

// Locality as for __builtin_prefetch: 3 = all levels (prefetcht0), 2 = L2 and out (prefetcht1),
// 1 = prefetcht2, 0 = non-temporal.
template <int kLocality>
CPUATTN_ALWAYS_INLINE void Prefetch(const void* address) {
  static_assert(kLocality >= 0 && kLocality <= 3);
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
  const auto* p = static_cast<const char*>(address);
  if constexpr (kLocality == 3) {
    asm volatile("prefetcht0 %0" : : "m"(*p));
  } else if constexpr (kLocality == 2) {
    asm volatile("prefetcht1 %0" : : "m"(*p));
  } else if constexpr (kLocality == 1) {
    asm volatile("prefetcht2 %0" : : "m"(*p));
  } else {
    asm volatile("prefetchnta %0" : : "m"(*p));
  }
#elif defined(__aarch64__) && defined(__GNUC__) && !defined(__clang__)
  // The same deletion, the same cure: PRFM with the level kLocality names (keep = temporal).
  const auto* p = static_cast<const char*>(address);
  if constexpr (kLocality == 3) {
    asm volatile("prfm pldl1keep, [%0]" : : "r"(p));
  } else if constexpr (kLocality == 2) {
    asm volatile("prfm pldl2keep, [%0]" : : "r"(p));
  } else if constexpr (kLocality == 1) {
    asm volatile("prfm pldl3keep, [%0]" : : "r"(p));
  } else {
    asm volatile("prfm pldl1strm, [%0]" : : "r"(p));
  }
#else
  __builtin_prefetch(address, 0, kLocality);
#endif
}

}  // namespace cpuattn::detail
