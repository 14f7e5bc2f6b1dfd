#include "dispatch/dispatch.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <array>
#include <cstdint>

namespace cpuattn::detail {
namespace {

// Highway target bits a cap excludes (a lower bit is a better target on x86).
std::int64_t excluded_by(Target cap) {
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
    case Target::avx512_bf16:
    case Target::best:
      break;
  }
  return excluded;
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // AVX512-VNNI too (leaf 7 subleaf 0, ECX bit 11; the native unit's int8 P V uses it):
  // every CPU with AVX512-BF16 so far has it (Cooper Lake, Sapphire Rapids, Zen 4).
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 11)) == 0) return false;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax & (1u << 5)) != 0;
#else
  return false;
#endif
}

Choice compute(Target cap, Simd provider) {
  // CPU support comes from Highway's CPUID for both providers: the xsimd units are built for
  // exactly the instruction sets of Highway's SSE4, AVX2 and AVX3 targets (lib/CMakeLists.txt).
  const std::int64_t allowed = hwy::SupportedTargets() & ~excluded_by(cap);
  // The same index arithmetic as hwy::ChosenTarget, but per cap and without global state, so
  // concurrent calls may use different caps. The fallback entry (EMU128/SCALAR) always exists.
  const std::int64_t mask = (HWY_CHOSEN_TARGET_SHIFT(allowed) | HWY_CHOSEN_TARGET_MASK_SCALAR) &
                            HWY_CHOSEN_TARGET_MASK_TARGETS;
  Choice c;
  c.hwy_index = hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<std::uint64_t>(mask));
  const std::int64_t compiled = allowed & HWY_TARGETS;
  const std::int64_t best = compiled & -compiled;
  c.target = (best & (HWY_AVX3 | HWY_AVX3_DL)) != 0 ? Target::avx512
             : (best & HWY_AVX2) != 0               ? Target::avx2
             : (best & (HWY_SSE4 | HWY_SSSE3)) != 0 ? Target::sse4
                                                    : Target::scalar;
  // The native bf16 kernel needs AVX512-BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) and VNNI on top of
  // the AVX-512 target Highway found, and a cap that admits it.
  if (c.target == Target::avx512 && (cap == Target::avx512_bf16 || cap == Target::best) &&
      cpu_has_avx512_bf16())
    c.target = Target::avx512_bf16;
  // xsimd covers the x86 SIMD instruction sets; below SSE4 the portable Highway target runs.
  c.provider = provider == Simd::xsimd && c.target != Target::scalar ? Simd::xsimd : Simd::highway;
  return c;
}

}  // namespace

const Choice& choose(Target cap, Simd provider) {
  static const auto table = [] {
    std::array<std::array<Choice, 2>, 6> t{};
    for (Target c : {Target::scalar, Target::sse4, Target::avx2, Target::avx512,
                     Target::avx512_bf16, Target::best}) {
      for (Simd s : {Simd::highway, Simd::xsimd})
        t[static_cast<int>(c)][static_cast<int>(s)] = compute(c, s);
    }
    return t;
  }();
  return table[static_cast<int>(cap)][static_cast<int>(provider)];
}

const Choice& choose(const Context* context) {
  const Context& c = context != nullptr ? *context : default_context();
  return choose(c.max_target(), c.simd());
}

}  // namespace cpuattn::detail
