// The flash op for one SVE vector length (compiled three times, see lib/CMakeLists.txt).
#include <hwy/highway.h>

#include "simd/hwy_ops-inl.h"
// Separate line: the kernels are instantiated with this unit's provider.
#define CPUATTN_FLASH_UNIT detail::FlashUnit::portable
#include "kernels/flash/entry-inl.h"
