// The names of the dtypes in cpuattn.h's list.
#include "kv/elem.h"

#include <cstring>
#include <string>

namespace cpuattn {

const char* dtype_name(DType dtype) {
  switch (dtype) {
#define CPUATTN_DTYPE_NAME(name, bytes, long_name, short_name, role) \
  case DType::name:                                                  \
    return long_name;
    CPUATTN_DTYPES(CPUATTN_DTYPE_NAME)
#undef CPUATTN_DTYPE_NAME
  }
  return "unknown";
}

namespace detail {

const char* dtype_short_name(DType dtype) {
  switch (dtype) {
#define CPUATTN_DTYPE_SHORT(name, bytes, long_name, short_name, role) \
  case DType::name:                                                   \
    return short_name;
    CPUATTN_DTYPES(CPUATTN_DTYPE_SHORT)
#undef CPUATTN_DTYPE_SHORT
  }
  return "unknown";
}

NativeDot native_dot(DType t) {
  return with_elem(t, [](auto e) { return ElemTraits<decltype(e)>::kNative; });
}

bool dtype_of_name(const char* name, DType& out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    if (std::strcmp(name, dtype_short_name(d)) == 0 || std::strcmp(name, dtype_name(d)) == 0) {
      out = d;
      return true;
    }
  }
  return false;
}

}  // namespace detail
}  // namespace cpuattn
