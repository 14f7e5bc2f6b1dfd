// The gemm op's kernel table for the target being compiled, with the provider `Ops` of this unit
// (simd/hwy_ops-inl.h or simd/xsimd_ops-inl.h, included first).
#if defined(CPUATTN_KERNELS_GEMM_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_GEMM_ENTRY_INL_H_
#undef CPUATTN_KERNELS_GEMM_ENTRY_INL_H_
#else
#define CPUATTN_KERNELS_GEMM_ENTRY_INL_H_
#endif

#include "kernels/gemm/gemm-inl.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemv-inl.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

void RunGemmTask(const detail::GemmProblem& g, std::int64_t t, detail::Scratch& scratch) {
  GemmTask<Ops>(g, t, scratch);
}

void RunGemvTask(const detail::GemmProblem& g, std::int64_t t, detail::Scratch& scratch) {
  GemvTask<Ops>(g, t, scratch);
}

const detail::GemmKernels* GetGemmKernels() {
  static const detail::GemmKernels table{
      .rows = Ops::kGemmRows, .task = &RunGemmTask, .gemv_task = &RunGemvTask};
  return &table;
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_GEMM_ENTRY_INL_H_
