// The micro-kernel entry points for one SVE vector length.
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: instantiated with this unit's provider.
#include "micro-inl.h"
