// What a compiled unit reports about itself in its kernel tables.
#pragma once

#include <string_view>

#include "cpuattn/cpuattn.h"

namespace cpuattn::simd {

constexpr Target TargetOfBits(int bits) {
  return bits == 512   ? Target::avx512
         : bits == 256 ? Target::avx2
         : bits == 128 ? Target::sse4
                       : Target::scalar;
}

}  // namespace cpuattn::simd

// The target a unit's code is compiled for, by capability (evaluated where it is used: in every
// foreach_target pass of a Highway unit anew).
#if defined(CPUATTN_SVE_BITS)
#define CPUATTN_UNIT_TARGET ::cpuattn::Target::sve
#elif defined(CPUATTN_XSIMD_ARCH)
#define CPUATTN_UNIT_TARGET ::cpuattn::simd::TargetOfBits(CPUATTN_SIMD_BITS)
#else
#define CPUATTN_UNIT_TARGET                                         \
  (HWY_ARCH_ARM && HWY_TARGET == HWY_NEON ? ::cpuattn::Target::neon \
                                          : ::cpuattn::simd::TargetOfBits(CPUATTN_SIMD_BITS))
#endif

namespace cpuattn::simd {

constexpr Simd ProviderOf(std::string_view name) {
  return name == "xsimd" ? Simd::xsimd : Simd::highway;
}

}  // namespace cpuattn::simd
