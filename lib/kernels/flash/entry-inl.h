// The flash op's kernel table for the target being compiled, with the provider `Ops` of this unit
// (simd/hwy_ops-inl.h or simd/xsimd_ops-inl.h, included first).
#if defined(CPUATTN_KERNELS_FLASH_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_ENTRY_INL_H_
#undef CPUATTN_KERNELS_FLASH_ENTRY_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_ENTRY_INL_H_
#endif

#include "kernels/flash/driver-inl.h"
#include "kernels/flash/flash.h"
#include "kernels/flash/merge-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

void RunFlashTask(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
                  detail::Scratch& scratch, detail::ThreadLog* log) {
  RunTask<Ops, CPUATTN_FLASH_UNIT>(p, pl, t, scratch, log);
}

void MergeFlashRows(const detail::Problem& p, const detail::Plan& pl, std::int64_t row0,
                    std::int64_t row1, detail::Scratch& scratch) {
  MergeRows<Ops>(p, pl, row0, row1, scratch.get(static_cast<std::size_t>(p.Dv + Ops::kLanes)));
}

const detail::FlashKernels* GetFlashKernels() {
  static const detail::FlashKernels table{.lanes = Ops::kLanes,
                                          .block_rows = Ops::kBlockRows,
                                          .block_keys = Ops::kBlockKeys,
                                          .pv_chunk = Ops::kPvCols * Ops::kLanes,
                                          .run_task = &RunFlashTask,
                                          .merge_rows = &MergeFlashRows};
  return &table;
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_ENTRY_INL_H_
