// The contexts the fuzz targets run the fast path on: one per (SIMD provider, target cap, thread
// count), made on first use and kept for the process, so that a decision read from the input
// picks one without creating a context (and its thread arena) per input.
#pragma once

#include <memory>
#include <vector>

#include "cpuattn/cpuattn.h"

namespace cpuattn::fuzz {

// cap: any Target (best included; a cap the CPU lacks falls back as in Context); threads 1 or 2.
inline Context* fuzz_context(Simd simd, Target cap, int threads) {
  constexpr int kCaps = static_cast<int>(Target::avx512_vnni) + 1;  // the last Target
  static const std::vector<std::unique_ptr<Context>> all = [] {
    std::vector<std::unique_ptr<Context>> v;
    for (Simd s : {Simd::highway, Simd::xsimd})
      for (int t = 1; t <= 2; ++t)
        for (int c = 0; c < kCaps; ++c) {
          auto ctx = std::make_unique<Context>(t);
          ctx->set_simd(s);
          try {
            ctx->set_max_target(static_cast<Target>(c));
          } catch (const Error&) {
            // Another architecture's target (x86's names on aarch64): that context runs uncapped.
          }
          v.push_back(std::move(ctx));
        }
    return v;
  }();
  return all[static_cast<std::size_t>((static_cast<int>(simd) * 2 + threads - 1) * kCaps +
                                      static_cast<int>(cap))]
      .get();
}

}  // namespace cpuattn::fuzz
