// The additive op for every Highway target (foreach_target.h re-includes this file per target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/additive/additive_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: the kernels are instantiated with this unit's provider.
#include "kernels/additive/entry-inl.h"

#if HWY_ONCE
CPUATTN_DEFINE_OP_LOOKUP(AdditiveKernels, GetAdditiveKernels, additive_kernels)
#endif
