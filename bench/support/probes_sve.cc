// The probes and the unfused baseline for one SVE vector length.
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: the probes are instantiated with this unit's provider.
#include "probes-inl.h"
