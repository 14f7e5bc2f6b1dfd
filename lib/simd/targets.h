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

constexpr Simd ProviderOf(std::string_view name) {
  return name == "xsimd" ? Simd::xsimd : Simd::highway;
}

}  // namespace cpuattn::simd
