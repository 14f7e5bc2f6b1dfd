// The micro-kernel entry points for one xsimd architecture.
#include "simd/xsimd_ops-inl.h"
// Separate line: instantiated with this unit's provider.
#include "micro-inl.h"
