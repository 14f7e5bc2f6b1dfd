// CPUATTN_API marks what the shared library exports. The library is compiled with hidden
// visibility (CMake's CXX_VISIBILITY_PRESET hidden), so only declarations carrying this macro
// leave libcpuattn.so: the public C++ API of include/cpuattn and the C API of cpuattn_c.h, and
// nothing of Highway, oneTBB or xsimd. On ELF the same attribute serves the library's build and
// its users, and is harmless in the static library.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define CPUATTN_API __attribute__((visibility("default")))
#else
#define CPUATTN_API
#endif
