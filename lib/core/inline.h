// The core helpers per-target kernels call are always inlined. An xsimd unit is compiled with
// -mavx512* (or -mavx2) for the whole file: an out-of-line copy it emitted of a shared inline
// function could be the copy the linker keeps for the whole program, and then run on a CPU
// without those instructions. tests/unit_odr_check.sh asserts that no such copy exists.
#pragma once

#define CPUATTN_ALWAYS_INLINE inline __attribute__((always_inline))
