// The probes and the unfused baseline for one xsimd architecture.
#include "simd/xsimd_ops-inl.h"
// Separate line: the probes are instantiated with this unit's provider.
#include "probes-inl.h"
