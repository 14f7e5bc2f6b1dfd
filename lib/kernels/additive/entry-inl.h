// The additive op's kernel table for the target being compiled, with the provider `Ops` of this
// unit (simd/hwy_ops-inl.h or simd/xsimd_ops-inl.h, included first).
#if defined(CPUATTN_KERNELS_ADDITIVE_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_ADDITIVE_ENTRY_INL_H_
#undef CPUATTN_KERNELS_ADDITIVE_ENTRY_INL_H_
#else
#define CPUATTN_KERNELS_ADDITIVE_ENTRY_INL_H_
#endif

#include "kernels/additive/additive-inl.h"
#include "kernels/additive/additive.h"
#include "simd/target_namespace.h"

CPUATTN_NAMESPACE_BEGIN

void RunAdditiveTask(const detail::AdditiveProblem& a, std::int64_t t, detail::Scratch& scratch) {
  AdditiveTask<Ops>(a, t, scratch);
}

const detail::AdditiveKernels* GetAdditiveKernels() {
  static const detail::AdditiveKernels table{.task = &RunAdditiveTask};
  return &table;
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_ADDITIVE_ENTRY_INL_H_
