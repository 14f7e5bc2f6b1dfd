// The micro-kernel entry points for every Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "micro_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: instantiated with this unit's provider.
#include "micro-inl.h"

#if HWY_ONCE
CPUATTN_DEFINE_OP_LOOKUP(MicroKernels, GetMicroKernels, micro_kernels)
#endif
