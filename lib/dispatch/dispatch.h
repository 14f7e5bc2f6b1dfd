// The one owner of SIMD selection: which provider and which instruction set a call runs on, and
// how an op finds its kernels for that choice. Resolved once per call at the API entry; every
// task and tile of the call then runs that target's code, with no dispatch inside.
//
// Each op has a small table of kernels per (provider, target) (kernels/<op>/<op>.h), built by
// that op's units: the Highway unit exports one table per Highway target through HWY_EXPORT,
// and the xsimd unit, compiled once per architecture, defines GetXxx() in cpuattn::xsimd_sse4,
// xsimd_avx2 and xsimd_avx512. pick() turns a Choice into the right entry.
#pragma once

#include <cstddef>

#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

struct Choice {
  Simd provider;          // the provider that runs; xsimd falls back to highway below SSE4
  Target target;          // the instruction set that runs
  std::size_t hwy_index;  // index into Highway's dispatch tables for this cap
};

// The choice for a cap and a wanted provider on this CPU. Cached: CPUID runs once per process.
const Choice& choose(Target cap, Simd provider);
// The choice of a context's cap and provider (or the default context's).
const Choice& choose(const Context* context);

// Where an op's tables live: Highway's table by dispatch index, and the three xsimd units'.
template <class Table>
struct OpTables {
  const Table* (*hwy)(std::size_t index);
  const Table* (*xsimd_sse4)();
  const Table* (*xsimd_avx2)();
  const Table* (*xsimd_avx512)();
};

template <class Table>
const Table& pick(const Choice& c, const OpTables<Table>& t) {
  if (c.provider == Simd::xsimd) {
    switch (c.target) {
      case Target::avx512:
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

// Declares an op's xsimd table getter in the three xsimd namespaces (see simd/target_namespace.h).
#define CPUATTN_DECLARE_XSIMD_TABLE(Table, Getter) \
  namespace cpuattn::xsimd_sse4 {                  \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::xsimd_avx2 {                  \
  const detail::Table* Getter();                   \
  }                                                \
  namespace cpuattn::xsimd_avx512 {                \
  const detail::Table* Getter();                   \
  }

// In an op's Highway unit, under HWY_ONCE: exports Getter (defined per target) and defines
// `const Table& Lookup(const Choice&)` over both providers.
#define CPUATTN_DEFINE_OP_LOOKUP(Table, Getter, Lookup)                                     \
  namespace cpuattn {                                                                       \
  HWY_EXPORT(Getter);                                                                       \
  namespace detail {                                                                        \
  const Table& Lookup(const Choice& c) {                                                    \
    static constexpr OpTables<Table> tables{                                                \
        [](std::size_t i) { return HWY_DISPATCH_TABLE(Getter)[i](); }, &xsimd_sse4::Getter, \
        &xsimd_avx2::Getter, &xsimd_avx512::Getter};                                        \
    return pick(c, tables);                                                                 \
  }                                                                                         \
  }                                                                                         \
  }
