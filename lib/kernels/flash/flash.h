// The fused flash-attention op: its kernel table per (provider, target) and the lookup the
// driver (api/attention.cpp) calls once per call.
//
// Files of this op:
//   pack-inl.h, score-inl.h, decode-inl.h, pv-inl.h, softmax-inl.h   the pieces
//   task-inl.h     one task of the plan, from those pieces
//   entry-inl.h    the per-target table (FlashKernels) of the pieces above, for one provider
//   flash_hwy.cc   compiled per Highway target; flash_xsimd.cc per xsimd architecture
// A new dtype adds a task driver instantiation and a field (or a table) here, not a new file
// layout.
#pragma once

#include <cstdint>

#include "core/plan.h"
#include "core/recorder.h"
#include "core/scratch.h"
#include "cpuattn/cpuattn.h"
#include "dispatch/dispatch.h"

namespace cpuattn::detail {

using FlashTaskFn = void (*)(const Problem&, const Plan&, std::int64_t t, Scratch&, ThreadLog* log);

// The native bf16 task (kernels/flash/flash_bf16.cc): Q, K and V bf16, on a CPU with
// AVX512-BF16 (target avx512_bf16); block sizes are those of the AVX-512 tables.
FlashTaskFn native_bf16_flash_task();

struct FlashKernels {
  Target target;
  Simd provider;
  std::int64_t lanes;       // f32 lanes per vector
  std::int64_t block_rows;  // max query rows per block
  std::int64_t block_keys;  // keys per K/V block
  // Runs task `t` of `plan` on f32 Q/K/V/out. Writes out/lse directly, or partials when
  // plan.k_splits > 1. With a log (profiling), charges its time to phases there.
  void (*run_task_f32)(const Problem&, const Plan&, std::int64_t t, Scratch&, ThreadLog* log);
};

const FlashKernels& flash_kernels(const Choice& choice);

}  // namespace cpuattn::detail

CPUATTN_DECLARE_XSIMD_TABLE(FlashKernels, GetFlashKernels)
