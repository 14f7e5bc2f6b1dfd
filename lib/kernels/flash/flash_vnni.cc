// The flash op's avx512_vnni unit: the task driver with the native int8 P V (x86/vnni_i8-inl.h),
// compiled once with AVX-512 + AVX512-VNNI flags in namespace cpuattn::avx512vnni (see
// lib/CMakeLists.txt), for the AVX-512 cores without AVX512-BF16 (Cascade Lake, Ice Lake); the
// f32 parts use the xsimd AVX-512 provider. plan_flash chooses this unit
// (FlashUnit::avx512_vnni) only when the call's target is avx512_vnni, and only for int8
// decoding steps (choose_unit): everything else runs the avx512 kernels.
#include "simd/xsimd_ops-inl.h"
// Separate lines: the units are instantiated with this unit's provider.
#include "kernels/flash/x86/pair_order-inl.h"
#include "kernels/flash/x86/vnni_i8-inl.h"
#define CPUATTN_FLASH_UNIT detail::FlashUnit::avx512_vnni
#include "kernels/flash/entry-inl.h"

namespace cpuattn::detail {

const FlashKernels& vnni_flash_kernels() { return *avx512vnni::GetFlashKernels(); }

}  // namespace cpuattn::detail
