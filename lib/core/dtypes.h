// Scalar element access by run-time dtype for the reference, validation and the layers: the K/V
// element types and their conversions are in lib/kv/ (one file each, kv/elem.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/inline.h"
#include "cpuattn/cpuattn.h"
#include "kv/elem.h"

namespace cpuattn::detail {

// One element of a tensor of dtype `t` at `base[offset]`, as float (a scaled type without its
// scale); other dtypes than K/V ones and f64 are read as f32.
CPUATTN_ALWAYS_INLINE float load_as_float(const void* base, DType t, std::int64_t offset) {
#define CPUATTN_LOAD_CASE_tensor(name)                                  \
  case DType::name: {                                                   \
    using T = ElemOf<DType::name>::type;                                \
    return ElemTraits<T>::ToFloat(static_cast<const T*>(base)[offset]); \
  }
#define CPUATTN_LOAD_CASE_scaled(name) CPUATTN_LOAD_CASE_tensor(name)
#define CPUATTN_LOAD_CASE_other(name)
#define CPUATTN_LOAD_CASE(name, bytes, long_name, short_name, role) CPUATTN_LOAD_CASE_##role(name)
  switch (t) {
    CPUATTN_DTYPES(CPUATTN_LOAD_CASE)
    case DType::f64:
      return static_cast<float>(static_cast<const double*>(base)[offset]);
    default:
      return static_cast<const float*>(base)[offset];
  }
#undef CPUATTN_LOAD_CASE
#undef CPUATTN_LOAD_CASE_other
#undef CPUATTN_LOAD_CASE_scaled
#undef CPUATTN_LOAD_CASE_tensor
}

// Stores `value` (rounded to nearest even) into a float output of dtype f32, bf16, f16 or f64.
CPUATTN_ALWAYS_INLINE void store_float(void* base, DType t, std::int64_t offset, float value) {
  switch (t) {
    case DType::bf16:
      static_cast<std::uint16_t*>(base)[offset] = f32_to_bf16(value);
      break;
    case DType::f16:
      static_cast<std::uint16_t*>(base)[offset] = f32_to_f16(value);
      break;
    case DType::f64:
      static_cast<double*>(base)[offset] = value;
      break;
    default:
      static_cast<float*>(base)[offset] = value;
      break;
  }
}

}  // namespace cpuattn::detail
