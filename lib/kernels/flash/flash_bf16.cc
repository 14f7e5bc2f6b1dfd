// The flash op's native bf16 kernel: the task driver with the vdpbf16ps pieces (bf16-inl.h),
// compiled once with AVX-512 + AVX512-BF16 flags in namespace cpuattn::avx512bf16 (see
// lib/CMakeLists.txt). The driver (api/attention.cpp) runs it when the call's target is
// avx512_bf16 and Q, K and V are bf16; the f32 parts (softmax, masks) use the xsimd AVX-512
// provider.
#include "simd/xsimd_ops-inl.h"
// Separate line: the pieces are instantiated with this unit's provider.
#include "kernels/flash/bf16-inl.h"
#include "kernels/flash/flash.h"
#include "kernels/flash/task-inl.h"

CPUATTN_NAMESPACE_BEGIN

void RunFlashTaskBf16(const detail::Problem& p, const detail::Plan& pl, std::int64_t t,
                      detail::Scratch& scratch, detail::ThreadLog* log) {
  RunTask<Ops, true>(p, pl, t, scratch, log);
}

CPUATTN_NAMESPACE_END

namespace cpuattn::detail {

FlashTaskFn native_bf16_flash_task() { return &avx512bf16::RunFlashTaskBf16; }

}  // namespace cpuattn::detail
