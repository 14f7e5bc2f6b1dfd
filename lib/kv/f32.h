// K/V element type f32: the compute type itself (see kv/elem.h for the two parts of a type file).
#ifndef CPUATTN_KV_F32_H_
#define CPUATTN_KV_F32_H_

namespace cpuattn::detail {

template <>
struct ElemOf<DType::f32> {
  using type = float;
};
template <>
struct ElemTraits<float> {
  static constexpr DType kDType = DType::f32;
  static constexpr bool kScaled = false;
  static constexpr NativeDot kNative = NativeDot::none;
  static CPUATTN_ALWAYS_INLINE float ToFloat(float x) { return x; }
};

}  // namespace cpuattn::detail

#endif  // CPUATTN_KV_F32_H_

#ifdef CPUATTN_KV_TARGET_PART
CPUATTN_NAMESPACE_BEGIN

template <class O>
CPUATTN_ALWAYS_INLINE typename O::V LoadWide(const float* p) {
  return O::LoadU(p);
}

CPUATTN_NAMESPACE_END
#endif  // CPUATTN_KV_TARGET_PART
