// The flash op's avx512_bf16 unit: the task driver with the native units (x86/), compiled once
// with AVX-512 + AVX512-BF16 + AVX512-VNNI flags (and AMX's, whose tiles run only where
// Choice::amx_bf16 says) in namespace cpuattn::avx512bf16 (see
// lib/CMakeLists.txt); the f32 parts (softmax, masks) use the xsimd AVX-512 provider. plan_flash
// chooses this unit (FlashUnit::avx512_bf16) only when the call's target is avx512_bf16.
#include "simd/xsimd_ops-inl.h"
// Separate lines: the units are instantiated with this unit's provider.
#include "kernels/flash/x86/amx_tile-inl.h"
#include "kernels/flash/x86/bf16_stream-inl.h"
#include "kernels/flash/x86/bf16_tile-inl.h"
#include "kernels/flash/x86/pair_order-inl.h"
#include "kernels/flash/x86/vnni_i8-inl.h"
#define CPUATTN_FLASH_UNIT detail::FlashUnit::avx512_bf16
#include "kernels/flash/entry-inl.h"

namespace cpuattn::detail {

const FlashKernels& native_flash_kernels() { return *avx512bf16::GetFlashKernels(); }

}  // namespace cpuattn::detail
