// The probes and the unfused baseline for every Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "probes_hwy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: the probes are instantiated with this unit's provider.
#include "probes-inl.h"

#if HWY_ONCE
#include "dispatch/dispatch.h"
CPUATTN_DECLARE_UNIT_TABLES(ProbeKernels, GetProbeKernels)
CPUATTN_DEFINE_OP_LOOKUP(ProbeKernels, GetProbeKernels, probe_kernels)
#endif
