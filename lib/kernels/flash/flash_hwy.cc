// The flash op for every Highway target (foreach_target.h re-includes this file per target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/flash/flash_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: the kernels are instantiated with this unit's provider.
#define CPUATTN_FLASH_UNIT detail::FlashUnit::portable
#include "kernels/flash/entry-inl.h"

#if HWY_ONCE
CPUATTN_DEFINE_OP_LOOKUP(FlashKernels, GetFlashKernels, flash_kernels)
#endif
