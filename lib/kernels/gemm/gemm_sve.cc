// The gemm op for one SVE vector length (compiled three times, see lib/CMakeLists.txt).
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: the kernels are instantiated with this unit's provider.
#include "kernels/gemm/entry-inl.h"
