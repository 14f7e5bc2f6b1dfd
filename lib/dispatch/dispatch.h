// The one owner of SIMD selection: which provider and which instruction set a call runs on, and
// how an op finds its kernels for that choice. Resolved once per call at the API entry; every
// task and tile of the call then runs that target's code, with no dispatch inside.
//
// Each op has a small table of kernels per (provider, target) (kernels/<op>/<op>.h), built by
// that op's units: the Highway unit exports one table per Highway target through HWY_EXPORT,
// the xsimd unit, compiled once per architecture, defines GetXxx() in cpuattn::xsimd_sse4,
// xsimd_avx2 and xsimd_avx512, and on aarch64 the SVE unit, compiled once per vector length, in
// cpuattn::sve128, sve256 and sve512. pick() turns a Choice into the right entry.
#pragma once

#include <cstddef>
#include <span>

#include "cpuattn/cpuattn.h"

// The xsimd units exist on x86-64 only (lib/CMakeLists.txt): elsewhere a call that asks for xsimd
// runs Highway's units.
#if defined(__x86_64__)
#define CPUATTN_HAS_XSIMD_UNITS 1
#else
#define CPUATTN_HAS_XSIMD_UNITS 0
#endif
// The SVE units, one per vector length, exist on aarch64 only (lib/CMakeLists.txt).
#if defined(__aarch64__)
#define CPUATTN_HAS_SVE_UNITS 1
#else
#define CPUATTN_HAS_SVE_UNITS 0
#endif

namespace cpuattn::detail {

// The last value of Target (the C API checks its integers against it).
inline constexpr Target kLastTarget = Target::avx512_vnni;

// The targets of the architecture this library was built for, worst to best: what a cap may
// name besides `best`, and the order in which a cap admits them.
std::span<const Target> architecture_targets();

struct Choice {
  Simd provider;          // the provider that runs; xsimd falls back to highway below SSE4 and
                          // off x86
  Target target;          // the instruction set that runs
  std::size_t hwy_index;  // index into Highway's dispatch tables for this cap
  int sve_bits = 0;       // the SVE unit's vector length when target is sve
  // With target avx512_bf16: whether its units multiply bf16 pairs (vdpbf16ps: the bf16 tiles and
  // the bf16-cache decoding units) or leave bf16 to the avx512 kernels, which widen it for FMAs.
  // The unit's int8 decoding (VNNI) runs either way (dispatch.cpp, bf16_dot_outpaces_fma).
  bool bf16_dot = false;
  // With target avx512_bf16 and no cap naming it: whether the tiled blocks of bf16 Q, K and V run
  // on AMX tiles (AMX-BF16, with the OS's leave to use the tile state: dispatch.cpp,
  // amx_bf16_runs), where vdpbf16ps does not outpace the FMAs.
  bool amx_bf16 = false;
  // Whether decoding's scores prefetch V rows of 2- and 4-byte elements into L2, not L1 (Intel:
  // dispatch.cpp, v_ahead_into_l2).
  bool v_ahead_l2 = false;
  // Whether streamed blocks read K in four runs where the plan would read one stream and have
  // P V ask for the next block's K (Intel: dispatch.cpp, keys_in_runs).
  bool key_runs = false;
  // Whether every prefetch hint fills L1 (AMD before Zen 4: dispatch.cpp, prefetch_hints_fill_l1),
  // so that the plan's "into L2" asks compete for L1's misses too.
  bool hints_fill_l1 = false;
  // Whether decoding's scores leave 2-byte K rows that P V asked for unasked (AMD family 0x19:
  // dispatch.cpp, narrow_keys_asked_once).
  bool narrow_k_once = false;
};

// The choice for a cap and a wanted provider on this CPU. Cached: CPUID runs once per process.
const Choice& choose(Target cap, Simd provider);
// The choice of a context's cap and provider (or the default context's).
const Choice& choose(const Context* context);

// Where an op's tables live: Highway's table by dispatch index, the three xsimd units' and the
// three SVE units' (null where the architecture has none).
template <class Table>
struct OpTables {
  const Table* (*hwy)(std::size_t index);
  const Table* (*xsimd_sse4)();
  const Table* (*xsimd_avx2)();
  const Table* (*xsimd_avx512)();
  const Table* (*sve128)();
  const Table* (*sve256)();
  const Table* (*sve512)();
};

template <class Table>
const Table& pick(const Choice& c, const OpTables<Table>& t) {
  if (c.target == Target::sve) {
    return c.sve_bits == 512 ? *t.sve512() : c.sve_bits == 256 ? *t.sve256() : *t.sve128();
  }
  if (c.provider == Simd::xsimd) {
    switch (c.target) {
      case Target::avx512:
      case Target::avx512_vnni:
      case Target::avx512_bf16:
        return *t.xsimd_avx512();
      case Target::avx2:
        return *t.xsimd_avx2();
      default:
        return *t.xsimd_sse4();
    }
  }
  return *t.hwy(c.hwy_index);
}

}  // namespace cpuattn::detail

// Declares an op's table getter in the three xsimd and the three SVE namespaces (see
// simd/target_namespace.h); only the architecture's own are defined and referenced.
#define CPUATTN_DECLARE_UNIT_TABLES(Table, Getter) \
  namespace cpuattn::xsimd_sse4 {                  \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::xsimd_avx2 {                  \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::xsimd_avx512 {                \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::sve128 {                      \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::sve256 {                      \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::sve512 {                      \
  const detail::Table* Getter();                   \
  }

// A build of the host's units only (CPUATTN_SIMD_UNITS=host in lib/CMakeLists.txt, which defines
// CPUATTN_HAS_AVX512_UNITS for the library and the tests that compile kernels) on a CPU without
// AVX-512 has no 512-bit xsimd unit; it never chooses AVX-512, whose Highway target it lacks too.
#if CPUATTN_HAS_XSIMD_UNITS
#if !defined(CPUATTN_HAS_AVX512_UNITS)
// A unit without lib/CMakeLists.txt's CPUATTN_HWY_DEFINITIONS may declare tables, not look them up.
#define CPUATTN_XSIMD_GETTERS(Getter) CPUATTN_HAS_AVX512_UNITS_is_not_defined
#elif CPUATTN_HAS_AVX512_UNITS
#define CPUATTN_XSIMD_GETTERS(Getter) \
  &xsimd_sse4::Getter, &xsimd_avx2::Getter, &xsimd_avx512::Getter
#else
#define CPUATTN_XSIMD_GETTERS(Getter) &xsimd_sse4::Getter, &xsimd_avx2::Getter, nullptr
#endif
#else
#define CPUATTN_XSIMD_GETTERS(Getter) nullptr, nullptr, nullptr
#endif
#if CPUATTN_HAS_SVE_UNITS
#define CPUATTN_SVE_GETTERS(Getter) &sve128::Getter, &sve256::Getter, &sve512::Getter
#else
#define CPUATTN_SVE_GETTERS(Getter) nullptr, nullptr, nullptr
#endif

// In an op's Highway unit, under HWY_ONCE: exports Getter (defined per target) and defines
// `const Table& Lookup(const Choice&)` over both providers.
#define CPUATTN_DEFINE_OP_LOOKUP(Table, Getter, Lookup)                \
  namespace cpuattn {                                                  \
  HWY_EXPORT(Getter);                                                  \
  namespace detail {                                                   \
  const Table& Lookup(const Choice& c) {                               \
    static constexpr OpTables<Table> tables{                           \
        [](std::size_t i) { return HWY_DISPATCH_TABLE(Getter)[i](); }, \
        CPUATTN_XSIMD_GETTERS(Getter), CPUATTN_SVE_GETTERS(Getter)};   \
    return pick(c, tables);                                            \
  }                                                                    \
  }                                                                    \
  }
