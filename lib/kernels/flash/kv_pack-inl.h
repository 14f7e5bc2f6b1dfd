// The K/V units of the f32 tiled path (KvUnit::packed_f32, and k_packed: K alone): a K/V block
// converted to f32 and packed into the layouts the tile micro-kernels stream (driver-inl.h lists
// them), and the prefetch of the rows a task packs next.
#if defined(CPUATTN_KERNELS_FLASH_KV_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CPUATTN_KERNELS_FLASH_KV_PACK_INL_H_
#undef CPUATTN_KERNELS_FLASH_KV_PACK_INL_H_
#else
#define CPUATTN_KERNELS_FLASH_KV_PACK_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/dtypes.h"
#include "core/problem.h"
#include "kernels/flash/geometry-inl.h"
#include "simd/prefetch.h"
#include "simd/target_namespace.h"
#include "simd/widen-inl.h"

CPUATTN_NAMESPACE_BEGIN

// Prefetches (into L2) the K and V rows of keys [j0, j0 + nk) of one K/V head.
inline void PrefetchKV(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t j0,
                       std::int64_t nk) {
  const auto ek = static_cast<std::int64_t>(dtype_size(p.k.dtype));
  const auto ev = static_cast<std::int64_t>(dtype_size(p.v.dtype));
  const char* K = static_cast<const char*>(p.k.data) + hk * p.k.s[1] * ek;
  const char* V = static_cast<const char*>(p.v.data) + hk * p.v.s[1] * ev;
  for (std::int64_t j = j0; j < j0 + nk; ++j) {
    const char* krow = K + p.key_off(p.k.s, b, j) * ek;
    const char* vrow = V + p.key_off(p.v.s, b, j) * ev;
    for (std::int64_t off = 0; off < p.D * ek; off += 64) detail::Prefetch<2>(krow + off);
    for (std::int64_t off = 0; off < p.Dv * ev; off += 64) detail::Prefetch<2>(vrow + off);
  }
}

// The per-key scale of an int8 K or V row (1 for other dtypes, which need none).
CPUATTN_ALWAYS_INLINE float KeyScale(const detail::Problem& p, const float* scale,
                                     const std::int64_t* s, std::int64_t b, std::int64_t hk,
                                     std::int64_t j) {
  return scale == nullptr ? 1.0f : scale[p.key_off(s, b, j) + hk * s[1]];
}

// Packs the V rows of keys [j0, j0 + nk) into column chunks of CW values, zero-padded, converted
// to f32 (rows of a scaled type times their scale).
template <class O, class T>
void PackVAs(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
             std::int64_t j0, std::int64_t nk, float* CPUATTN_RESTRICT vp) {
  constexpr int N = O::kLanes;
  constexpr int CW = Geometry<O>::CW;
  const T* Vs = static_cast<const T*>(p.v.data) + hk * p.v.s[1];
  for (std::int64_t c0 = 0; c0 < g.DvP; c0 += CW) {
    const std::int64_t cw = std::min<std::int64_t>(CW, g.DvP - c0);
    float* dst = vp + c0 * nk;  // chunk c0 holds nk rows of cw values
    const std::int64_t valid = std::max<std::int64_t>(0, std::min(cw, g.Dv - c0));
    for (std::int64_t k = 0; k < nk; ++k) {
      const T* src = Vs + p.key_off(p.v.s, b, j0 + k) + c0;
      float* row = dst + k * cw;
      std::int64_t c = 0;
      if constexpr (detail::ElemTraits<T>::kScaled) {
        const typename O::V vs = O::Set(KeyScale(p, p.v_scale, p.v_scale_s, b, hk, j0 + k));
        for (; c + N <= valid; c += N) O::Store(O::Mul(LoadWide<O>(src + c), vs), row + c);
        if (c < valid) O::Store(O::Mul(LoadWidePartial<O>(src + c, valid - c), vs), row + c);
      } else {
        for (; c + N <= valid; c += N) O::Store(LoadWide<O>(src + c), row + c);
        if (c < valid) O::Store(LoadWidePartial<O>(src + c, valid - c), row + c);
      }
      // Whole vectors were stored up to the next multiple of N; zero the rest of the chunk row.
      for (c = (valid + N - 1) / N * N; c < cw; ++c) row[c] = 0.0f;
    }
  }
}

template <class O>
void PackV(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
           std::int64_t j0, std::int64_t nk, float* CPUATTN_RESTRICT vp) {
  detail::with_elem(p.v.dtype, [&](auto t) { PackVAs<O, decltype(t)>(p, g, b, hk, j0, nk, vp); });
}

// Packs keys [j0, j0 + nk) of one K/V head into Kp panels (zero-padded), times kscale: 1, or
// scale * log2 e where the tiles read Q in place (QUnit::f32_in_place).
template <class O, class T>
void PackKAs(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
             std::int64_t j0, std::int64_t nk, float kscale, float* CPUATTN_RESTRICT kp) {
  constexpr int W = Geometry<O>::W;
  const T* K = static_cast<const T*>(p.k.data) + hk * p.k.s[1];
  constexpr int N = O::kLanes;
  const std::int64_t panels = (nk + W - 1) / W;
  const typename O::V vk = O::Set(kscale);
  // K: N x N squares (N keys x N dims) transposed in registers; missing keys are zero rows and
  // dims past D are never stored.
  for (std::int64_t pi = 0; pi < panels; ++pi) {
    float* dst = kp + pi * g.D * W;
    for (int part = 0; part < O::kScoreCols; ++part) {
      const std::int64_t w0 = pi * W + part * N;  // first key of this square, within the block
      const std::int64_t keys = std::clamp<std::int64_t>(nk - w0, 0, N);
      const T* rows[N];
      for (int w = 0; w < keys; ++w) rows[w] = K + p.key_off(p.k.s, b, j0 + w0 + w);
      for (std::int64_t d0 = 0; d0 < g.D; d0 += N) {
        const std::int64_t dims = std::min<std::int64_t>(N, g.D - d0);
        typename O::V r[N];
        for (int w = 0; w < N; ++w) {
          if (w >= keys) {
            // A padding key: no address is formed for it (with a huge key stride, legal when
            // Lk = 1, K + key * stride overflowed the pointer; found by fuzz_validate).
            r[w] = O::Zero();
            continue;
          }
          const T* src = rows[w] + d0;
          r[w] = dims == N ? LoadWide<O>(src) : LoadWidePartial<O>(src, dims);
          if constexpr (detail::ElemTraits<T>::kScaled) {
            r[w] = O::Mul(r[w],
                          O::Set(kscale * KeyScale(p, p.k_scale, p.k_scale_s, b, hk, j0 + w0 + w)));
          } else {
            r[w] = O::Mul(r[w], vk);
          }
        }
        O::Transpose(r);
        for (std::int64_t d = 0; d < dims; ++d) O::Store(r[d], dst + (d0 + d) * W + part * N);
      }
    }
  }
}

template <class O>
void PackK(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
           std::int64_t j0, std::int64_t nk, float kscale, float* CPUATTN_RESTRICT kp) {
  detail::with_elem(p.k.dtype,
                    [&](auto t) { PackKAs<O, decltype(t)>(p, g, b, hk, j0, nk, kscale, kp); });
}

// Packs keys [j0, j0 + nk) of one K/V head into Kp panels (times kscale, as PackKAs) and Vp
// chunks (zero-padded, f32).
template <class O>
void PackKV(const detail::Problem& p, const Geometry<O>& g, std::int64_t b, std::int64_t hk,
            std::int64_t j0, std::int64_t nk, float kscale, float* CPUATTN_RESTRICT kp,
            float* CPUATTN_RESTRICT vp) {
  PackK<O>(p, g, b, hk, j0, nk, kscale, kp);
  PackV<O>(p, g, b, hk, j0, nk, vp);
}

CPUATTN_NAMESPACE_END

#endif  // CPUATTN_KERNELS_FLASH_KV_PACK_INL_H_
