#include "dispatch/dispatch.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

#include <array>
#include <cstdint>
#include <cstring>

namespace cpuattn::detail {
namespace {

#if HWY_ARCH_X86
constexpr Target kOrder[] = {Target::scalar, Target::sse4,        Target::avx2,
                             Target::avx512, Target::avx512_vnni, Target::avx512_bf16};
#elif HWY_ARCH_ARM_A64
// NEON is aarch64's baseline, so Highway builds no portable unit there: a scalar cap runs (and
// reports) neon.
constexpr Target kOrder[] = {Target::scalar, Target::neon, Target::sve};
#else
constexpr Target kOrder[] = {Target::scalar};
#endif

bool in_order(Target t) {
  for (Target o : kOrder) {
    if (o == t) return true;
  }
  return false;
}

// The Highway targets a name covers (avx512_vnni and avx512_bf16: AVX-512's, plus the native
// units' CPU checks).
std::int64_t hwy_bits(Target t) {
  switch (t) {
    case Target::sse4:
      return HWY_SSE4 | HWY_SSSE3;
    case Target::avx2:
      return HWY_AVX2;
    case Target::avx512:
      return HWY_AVX3 | HWY_AVX3_DL;
    case Target::neon:
      return HWY_NEON;
    default:
      return 0;
  }
}

// Highway target bits a cap excludes: those of every target above it in this architecture's order.
std::int64_t excluded_by(Target cap) {
  std::int64_t excluded = 0;
  bool above = false;
  for (Target t : kOrder) {
    if (above) excluded |= hwy_bits(t);
    above = above || t == cap;
  }
  return excluded;
}

// Whether CPUID's vendor string (leaf 0: ebx, edx, ecx) is `vendor`; false off x86.
bool cpu_vendor_is(const char (&vendor)[13]) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, regs[3] = {0, 0, 0};
  if (__get_cpuid(0, &eax, &regs[0], &regs[2], &regs[1]) == 0) return false;
  return std::memcmp(regs, vendor, 12) == 0;
#else
  (void)vendor;
  return false;
#endif
}

// Whether the CPU has AVX512-VNNI (CPUID leaf 7 subleaf 0, ECX bit 11).
bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 11)) != 0;
#else
  return false;
#endif
}

// Whether the avx512_vnni unit runs here: built (not in a build of the host's units on a CPU
// without it, lib/CMakeLists.txt) and the CPU has AVX512-VNNI.
bool native_vnni_unit_runs() { return CPUATTN_HAS_NATIVE_VNNI_UNIT && cpu_has_avx512_vnni(); }

// Whether the avx512_bf16 unit runs here: built (not in a build of the host's units on a CPU
// without it, lib/CMakeLists.txt) and the CPU has the extensions.
bool native_bf16_unit_runs() {
#if CPUATTN_HAS_NATIVE_BF16_UNIT && (defined(__x86_64__) || defined(__i386__))
  // AVX512-VNNI too (the native unit's int8 P V uses it): every CPU with AVX512-BF16 so far has
  // it (Cooper Lake, Sapphire Rapids, Zen 4).
  if (!cpu_has_avx512_vnni()) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax & (1u << 5)) != 0;
#else
  return false;
#endif
}

// Whether the avx512_bf16 unit's vdpbf16ps is the faster way to multiply bf16 pairs on this CPU.
// One vdpbf16ps does 32 products where an FMA does 16, so it wins where it issues at least half
// as often as FMAs. AMD's Zen 4 and Zen 5 do (the native tiles run bf16 prefill at 1.7-1.9x
// f32); Intel's cores with AVX512-BF16 (an Emerald Rapids measured) issue one every 2 cycles
// against 2 FMAs a cycle, 16 products a cycle against the avx512 kernels' 32 on widened bf16, so
// there bf16 prefill and bf16-cache decoding run faster in the avx512 kernels, while the unit's
// int8 decoding (VNNI) still gains (docs/performance.md#dm-bf16-dot-intel). A vendor rule, not a
// timing: every process on a machine must choose alike, as the two paths round differently.
bool bf16_dot_outpaces_fma() { return cpu_vendor_is("AuthenticAMD"); }

// Whether a decoding step's scores prefetch the V rows of 2- and 4-byte elements into L2 rather
// than L1 (BlockPath::v_ahead_l2). On Intel a prefetcht0 that misses to DRAM likely holds one of
// the L1's fill buffers for the whole latency, and the scores ask for 4-8 lines per key that way:
// into L2, f32 and bf16 decoding ran 5-7% faster on a Sapphire Rapids-class Xeon
// (docs/performance.md#dm-decode-v-prefetch-l2). An AVX2-only Zen 3 read faster with them in L1
// (#dm-decode-prefetch-zen3), so other CPUs keep L1. A vendor rule, as bf16_dot's.
bool v_ahead_into_l2() { return cpu_vendor_is("GenuineIntel"); }

// Whether streamed blocks read K in four interleaved runs (ScoreUnit::dot_runs) where the plan
// would otherwise read it as one stream with P V asking for the next block's K (k_ahead). On a
// Sapphire Rapids-class Xeon one core pulled 9-16% more bytes per second from four streams than
// from the one stream and its software prefetches (D1, D2, M2: f32 and bf16; int8 on the native
// unit), where on a Zen 5 the split had won 10-22% over the runs
// (docs/performance.md#dm-key-runs-intel, #dm-k-ahead-in-pv, #dm-k-ahead-f32). A vendor rule,
// as bf16_dot's; both read the same sums, bit for bit.
bool keys_in_runs() { return cpu_vendor_is("GenuineIntel"); }

// An AMD CPU's family and model with their extended fields (CPUID leaf 1, EAX); family 0 for other
// vendors and architectures.
struct AmdModel {
  unsigned family = 0, model = 0;
};
AmdModel amd_model() {
  AmdModel m;
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!cpu_vendor_is("AuthenticAMD") || __get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return m;
  m.family = ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff);
  m.model = ((eax >> 4) & 0xf) | ((eax >> 12) & 0xf0);
#endif
  return m;
}

// Whether every prefetch hint fills L1 here, prefetcht1/t2/nta as prefetcht0: AMD before Zen 4
// (family 0x17, and 0x19 outside Zen 4's model ranges 0x10-0x1f, 0x60-0x7f and 0xa0-0xaf). Measured
// on a Zen 3 (docs/performance.md#dm-zen3-prefetch-levels); AMD documents T1/T2 into L2 as new
// with Zen 4. Intel's hints reach L2 only, and other architectures get false.
bool prefetch_hints_fill_l1() {
  const AmdModel m = amd_model();
  if (m.family == 0x17) return true;
  if (m.family != 0x19) return false;
  const bool zen4 = (m.model >= 0x10 && m.model <= 0x1f) || (m.model >= 0x60 && m.model <= 0x7f) ||
                    (m.model >= 0xa0 && m.model <= 0xaf);
  return !zen4;
}

// Whether decoding's scores ask only once for 2-byte K rows, leaving the rows of the next block to
// P V's ask (BlockPath::k_ahead) instead of asking again 16 keys ahead (BlockPath::scores_k_ahead):
// AMD family 0x19, Zen 3 and Zen 4. There bf16 and f16 decoding ran faster without the second
// ask (Zen 3: D1, D2, M2 and pages of 128 keys; Zen 4: D2 and M2), while f32 and int8 keys moved
// both ways (int8 gained from it on Zen 4); Intel's Xeon gained from it for every type, and Zen 5
// (family 0x1a), where it gained before P V asked, is unmeasured since
// (docs/performance.md#dm-scores-k-ahead). A vendor rule, as bf16_dot's; the sums are the same
// either way.
bool narrow_keys_asked_once() { return amd_model().family == 0x19; }

// Whether the avx512_bf16 unit's AMX tiles run here: the CPU has AMX-TILE and AMX-BF16 (CPUID
// leaf 7 subleaf 0, EDX bits 24 and 22) and Linux grants this process the tile data state, which
// it keeps off until asked (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16; it fails where the kernel
// or a hypervisor does not enable it). Asked once per process; the leave lasts for its life and
// covers every thread.
bool amx_bf16_runs() {
#if CPUATTN_HAS_NATIVE_BF16_UNIT && defined(__x86_64__) && defined(__linux__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 22)) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// The SVE vector length in bits, or 0 without SVE. The kernel reads it from the thread's state
// (prctl), which every thread of a process shares unless one changes its own: cpuattn assumes no
// thread does.
int sve_vector_bits() {
#if defined(__aarch64__) && defined(__linux__) && defined(HWCAP_SVE) && defined(PR_SVE_GET_VL)
  if ((getauxval(AT_HWCAP) & HWCAP_SVE) == 0) return 0;
  const int vl = prctl(PR_SVE_GET_VL);
  return vl < 0 ? 0 : (vl & PR_SVE_VL_LEN_MASK) * 8;
#else
  return 0;
#endif
}

// An SVE unit exists for 128, 256 and 512 bits (lib/CMakeLists.txt); other lengths run NEON.
bool sve_unit_runs(int bits) {
  return CPUATTN_HAS_SVE_UNITS && (bits == 128 || bits == 256 || bits == 512);
}

Choice compute(Target cap, Simd provider) {
  // Context::set_max_target admits only this architecture's names; the table below is filled for
  // every value, and another architecture's name caps to the portable target.
  if (cap != Target::best && !in_order(cap)) cap = Target::scalar;
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
  // None compiled that the cap admits: Highway's static target runs (EMU128 on x86-64, NEON on
  // aarch64), and the call reports it.
  const std::int64_t best = compiled != 0 ? compiled & -compiled : HWY_STATIC_TARGET;
  c.target = Target::scalar;
  for (Target t : kOrder) {
    if ((best & hwy_bits(t)) != 0) c.target = t;
  }
  // The native units need VNNI (and the bf16 one AVX512-BF16, CPUID leaf 7 subleaf 1, EAX bit 5)
  // on top of the AVX-512 target Highway found, and a cap that admits them.
  const bool above_vnni = cap == Target::avx512_bf16 || cap == Target::best;
  if (c.target == Target::avx512 && (cap == Target::avx512_vnni || above_vnni) &&
      native_vnni_unit_runs())
    c.target = Target::avx512_vnni;
  // The bf16 unit's bf16 products run where they are the faster ones, or where a cap names the
  // target (how the tests run them on every CPU that has the extensions).
  if (c.target == Target::avx512_vnni && above_vnni && native_bf16_unit_runs()) {
    c.target = Target::avx512_bf16;
    c.bf16_dot = cap == Target::avx512_bf16 || bf16_dot_outpaces_fma();
    static const bool amx = amx_bf16_runs();
    c.amx_bf16 = cap == Target::best && !c.bf16_dot && amx;
  }
  static const bool v_l2 = v_ahead_into_l2(), k_runs = keys_in_runs(),
                    fill_l1 = prefetch_hints_fill_l1(), k_once = narrow_keys_asked_once();
  c.v_ahead_l2 = v_l2;
  c.key_runs = k_runs;
  c.hints_fill_l1 = fill_l1;
  c.narrow_k_once = k_once;
  const int sve_bits = sve_vector_bits();
  if (c.target == Target::neon && (cap == Target::sve || cap == Target::best) &&
      sve_unit_runs(sve_bits)) {
    c.target = Target::sve;
    c.sve_bits = sve_bits;
  }
  // xsimd covers the x86 SIMD instruction sets; below SSE4 (and off x86) Highway's units run.
  c.provider = CPUATTN_HAS_XSIMD_UNITS && provider == Simd::xsimd && c.target != Target::scalar
                   ? Simd::xsimd
                   : Simd::highway;
  return c;
}

}  // namespace

const Choice& choose(Target cap, Simd provider) {
  static const auto table = [] {
    constexpr int kTargets = static_cast<int>(kLastTarget) + 1;
    std::array<std::array<Choice, 2>, kTargets> t{};
    for (int c = 0; c < kTargets; ++c) {
      for (Simd s : {Simd::highway, Simd::xsimd})
        t[c][static_cast<int>(s)] = compute(static_cast<Target>(c), s);
    }
    return t;
  }();
  return table[static_cast<int>(cap)][static_cast<int>(provider)];
}

std::span<const Target> architecture_targets() { return kOrder; }

const Choice& choose(const Context* context) {
  const Context& c = context != nullptr ? *context : default_context();
  return choose(c.max_target(), c.simd());
}

}  // namespace cpuattn::detail
