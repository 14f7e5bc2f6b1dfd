// The fused flash-attention op: its kernel tables per (provider, target) and per unit, and the
// lookup the driver (api/attention.cpp) calls once per call. The plan (config.h) says which unit
// runs a problem; a table runs every BlockPath its unit may be given.
//
// Files of this op (docs/architecture.md walks through them):
//   config.h/.cpp   plan_flash(): tasks, units per kind of query block, epilogue (the one choice)
//   driver-inl.h    RunTask: one task of the plan, calling the units below
//   q_pack, kv_pack, score_tile, stream_dot, stream_runs, softmax, pv, pv_skip_zero, epilogue,
//   merge
//                   -inl.h: the portable units, written against the vector contract
//   x86/            the native units of the avx512_bf16 unit (bf16 tiles and streams, int8 VNNI)
//                   and of the avx512_vnni unit (int8 VNNI)
//   entry-inl.h     the per-target table (FlashKernels) of one provider
//   flash_hwy.cc    compiled per Highway target; flash_xsimd.cc per xsimd architecture;
//   flash_bf16.cc   the avx512_bf16 unit; flash_vnni.cc the avx512_vnni unit
#pragma once

#include <cstdint>

#include "core/recorder.h"
#include "core/scratch.h"
#include "cpuattn/cpuattn.h"
#include "dispatch/dispatch.h"
#include "kernels/flash/config.h"

namespace cpuattn::detail {

struct FlashKernels {
  std::int64_t lanes;       // f32 lanes per vector
  std::int64_t block_rows;  // max query rows per block
  std::int64_t block_keys;  // keys per K/V block
  std::int64_t pv_chunk;    // V columns (floats) per column chunk of the f32 P V tiles
  // Runs task `t` of `plan`: writes out/lse directly, or partials when plan.k_splits > 1. With a
  // log (profiling), charges its time to phases there.
  void (*run_task)(const Problem&, const Plan&, std::int64_t t, Scratch&, ThreadLog* log);
  // The split-key merge of rows [row0, row1) (row = (b * H + h) * Lq + i) of a plan with
  // k_splits > 1 into out and lse (merge-inl.h).
  void (*merge_rows)(const Problem&, const Plan&, std::int64_t row0, std::int64_t row1, Scratch&);
};

// The portable unit's table for a choice.
const FlashKernels& flash_kernels(const Choice& choice);
// The avx512_bf16 unit's table (flash_bf16.cc, built where CPUATTN_HAS_NATIVE_BF16_UNIT), for
// plans that chose FlashUnit::avx512_bf16; the avx512_vnni unit's (flash_vnni.cc, built where
// CPUATTN_HAS_NATIVE_VNNI_UNIT), for FlashUnit::avx512_vnni.
const FlashKernels& native_flash_kernels();
const FlashKernels& vnni_flash_kernels();

}  // namespace cpuattn::detail

CPUATTN_DECLARE_UNIT_TABLES(FlashKernels, GetFlashKernels)
