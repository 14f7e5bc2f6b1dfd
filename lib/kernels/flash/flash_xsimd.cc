// The flash op for one xsimd architecture (compiled three times, see lib/CMakeLists.txt).
#include "simd/xsimd_ops-inl.h"
// Separate line: the kernels are instantiated with this unit's provider.
#define CPUATTN_FLASH_UNIT detail::FlashUnit::portable
#include "kernels/flash/entry-inl.h"
