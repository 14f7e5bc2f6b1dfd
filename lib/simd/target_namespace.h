// Where per-target code lives, for both SIMD providers.
//
// Every kernel header (`*-inl.h`) is compiled once per SIMD target, inside that target's own
// namespace, so the same template instantiated for AVX2 and for AVX-512 never meets at link time:
//   * a Highway unit includes <hwy/foreach_target.h>, which re-includes the unit once per
//     Highway target; the namespace is cpuattn::HWY_NAMESPACE (cpuattn::N_AVX3, ...) and
//     HWY_BEFORE_NAMESPACE attaches that target's instruction set to every function in it;
//   * an xsimd unit is compiled once per architecture with that architecture's compiler flags
//     (lib/CMakeLists.txt defines CPUATTN_XSIMD_ARCH = 128, 256 or 512); the namespace is
//     cpuattn::xsimd_sse4, xsimd_avx2 or xsimd_avx512.
// A kernel header wraps its body in CPUATTN_NAMESPACE_BEGIN / _END and uses the per-target include
// guard of Highway's skeleton-inl.h:
//   #if defined(MY_INL_H_) == defined(HWY_TARGET_TOGGLE)
//   #ifdef MY_INL_H_ / #undef MY_INL_H_ / #else / #define MY_INL_H_ / #endif
// HWY_TARGET_TOGGLE is flipped by foreach_target.h before each Highway pass and never defined in
// an xsimd unit, where the guard is therefore an ordinary include guard.
#pragma once

// Function attributes the kernels use (CPUATTN_ALWAYS_INLINE is core/inline.h's); plain
// GCC/Clang spellings so that xsimd units need no Highway header.
#include "core/inline.h"
#define CPUATTN_RESTRICT __restrict__
#define CPUATTN_PRAGMA(tokens) _Pragma(#tokens)
#if defined(__clang__)
#define CPUATTN_UNROLL(n) CPUATTN_PRAGMA(unroll n)
#else
#define CPUATTN_UNROLL(n) CPUATTN_PRAGMA(GCC unroll n)
#endif

#if defined(CPUATTN_XSIMD_ARCH)
#define CPUATTN_SIMD_BITS CPUATTN_XSIMD_ARCH
#if CPUATTN_XSIMD_ARCH == 512 && defined(CPUATTN_NATIVE_BF16_UNIT)
// The native bf16 unit (kernels/flash/flash_bf16.cc): xsimd's AVX-512 plus AVX512-BF16 flags.
#define CPUATTN_TARGET_NS avx512bf16
#elif CPUATTN_XSIMD_ARCH == 512 && defined(CPUATTN_NATIVE_VNNI_UNIT)
// The native VNNI unit (kernels/flash/flash_vnni.cc): xsimd's AVX-512 plus AVX512-VNNI flags.
#define CPUATTN_TARGET_NS avx512vnni
#elif CPUATTN_XSIMD_ARCH == 512
#define CPUATTN_TARGET_NS xsimd_avx512
#elif CPUATTN_XSIMD_ARCH == 256
#define CPUATTN_TARGET_NS xsimd_avx2
#elif CPUATTN_XSIMD_ARCH == 128
#define CPUATTN_TARGET_NS xsimd_sse4
#else
#error "CPUATTN_XSIMD_ARCH must be 128, 256 or 512"
#endif
#define CPUATTN_NAMESPACE_BEGIN \
  namespace cpuattn {           \
  namespace CPUATTN_TARGET_NS {
#define CPUATTN_NAMESPACE_END \
  }                           \
  }
#elif defined(CPUATTN_SVE_BITS)
// An SVE unit (kernels/<op>/<op>_sve.cc): Highway's static target, compiled once per vector length
// with -march=armv8.2-a+sve -msve-vector-bits=<bits> (lib/CMakeLists.txt), run only on a CPU of
// that length (dispatch/dispatch.cpp). Its own namespace: the 128- and 512-bit units are both
// Highway's SVE target, and each must keep its own copy of every kernel.
#define CPUATTN_SIMD_BITS 0
#define CPUATTN_ARM_SIMD_BITS CPUATTN_SVE_BITS
#if CPUATTN_SVE_BITS == 128
#define CPUATTN_TARGET_NS sve128
#elif CPUATTN_SVE_BITS == 256
#define CPUATTN_TARGET_NS sve256
#elif CPUATTN_SVE_BITS == 512
#define CPUATTN_TARGET_NS sve512
#else
#error "CPUATTN_SVE_BITS must be 128, 256 or 512"
#endif
#define CPUATTN_NAMESPACE_BEGIN \
  namespace cpuattn {           \
  namespace CPUATTN_TARGET_NS {
#define CPUATTN_NAMESPACE_END \
  }                           \
  }
#else
// A Highway unit: the including file has included <hwy/highway.h> for the current target.
// Vector width of the x86 target being compiled (0 for the portable EMU128/SCALAR targets and
// other architectures); evaluated anew in every foreach_target pass.
#define CPUATTN_SIMD_BITS                                                      \
  (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3                                ? 512 \
   : HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2                              ? 256 \
   : HWY_ARCH_X86 && (HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3) ? 128 \
                                                                         : 0)
// Vector width of the ARM target being compiled: 128 for NEON, 0 elsewhere (and for the portable
// EMU128/SCALAR targets).
#define CPUATTN_ARM_SIMD_BITS (HWY_ARCH_ARM && HWY_TARGET == HWY_NEON ? 128 : 0)
#define CPUATTN_TARGET_NS HWY_NAMESPACE
#define CPUATTN_NAMESPACE_BEGIN \
  HWY_BEFORE_NAMESPACE();       \
  namespace cpuattn {           \
  namespace HWY_NAMESPACE {
#define CPUATTN_NAMESPACE_END \
  }                           \
  }                           \
  HWY_AFTER_NAMESPACE();
#endif
