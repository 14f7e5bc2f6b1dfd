// The names of the dtypes in cpuattn.h's list.
#include "kv/elem.h"

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

bool parse_dtype(const std::string& name, DType& out) {
#define CPUATTN_DTYPE_PARSE(id, bytes, long_name, short_name, role) \
  if (name == #id || name == short_name || name == long_name) {     \
    out = DType::id;                                                \
    return true;                                                    \
  }
  CPUATTN_DTYPES(CPUATTN_DTYPE_PARSE)
#undef CPUATTN_DTYPE_PARSE
  return false;
}

namespace detail {

NativeDot native_dot(DType t) {
  return with_elem(t, [](auto e) { return ElemTraits<decltype(e)>::kNative; });
}

}  // namespace detail
}  // namespace cpuattn
