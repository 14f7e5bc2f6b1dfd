// The reference implementation: the oracle every fast path is tested against.
// Deliberately plain: one query row at a time, every score materialized, double accumulation.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtypes.h"
#include "core/problem.h"
#include "core/softmax.h"

namespace cpuattn {
namespace detail {
namespace {

// Every K/V element type's values are exact in double; a scaled type's element is
// float(x) * scale rounded to f32, the value the fast path computes with (kv/elem.h).
double load(const void* base, DType dtype, std::int64_t offset, float scale = 1.0f) {
  if (dtype == DType::f64) return static_cast<const double*>(base)[offset];
  if (needs_scales(dtype)) return load_as_float(base, dtype, offset) * scale;
  return load_as_float(base, dtype, offset);
}

// f32/bf16/f16 outputs get the double rounded to f32 and then (for bf16/f16) to nearest even.
void store(void* base, DType dtype, std::int64_t offset, double value) {
  if (dtype == DType::f64) {
    static_cast<double*>(base)[offset] = value;
  } else {
    store_float(base, dtype, offset, static_cast<float>(value));
  }
}

float scale_of(const Problem& p, const float* scale, const std::int64_t* s, std::int64_t b,
               std::int64_t hk, std::int64_t j) {
  return scale == nullptr ? 1.0f : scale[p.key_off(s, b, j) + hk * s[1]];
}

// Returns -inf for a masked key, else the additive mask term (0 without one).
double mask_term(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  if (j < p.key_begin(i) || j >= p.key_end(b, i)) return -std::numeric_limits<double>::infinity();
  if (p.mask_kind == MaskKind::none) return 0.0;
  const std::int64_t off = b * p.mask.s[0] + h * p.mask.s[1] + i * p.mask.s[2] + j * p.mask.s[3];
  if (p.mask_kind == MaskKind::boolean) {
    return static_cast<const std::uint8_t*>(p.mask.data)[off] != 0
               ? 0.0
               : -std::numeric_limits<double>::infinity();
  }
  // Finite values saturate as the kernels' do (kMaxNatural, core/softmax.h); NaN stays NaN.
  const double add = load(p.mask.data, p.mask.dtype, off);
  if (std::isnan(add) || add == -std::numeric_limits<double>::infinity()) return add;
  return std::clamp(add, -kMaxNatural, kMaxNatural);
}

void reference_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                   std::vector<double>& s) {
  const std::int64_t hk = h / p.group;
  const std::int64_t q_off = b * p.q.s[0] + h * p.q.s[1] + i * p.q.s[2];
  const double neg_inf = -std::numeric_limits<double>::infinity();

  // Scores in the order AttentionOptions documents: scale, soft-cap, ALiBi, masks. The maximum
  // includes the sink and propagates NaN, so that a NaN score poisons its row, as it should.
  const double slope = p.alibi_slope(b, h);
  const double sink = p.sink(h);
  double m = sink;
  for (std::int64_t j = 0; j < p.Lk; ++j) {
    const double term = mask_term(p, b, h, i, j);
    if (term == neg_inf) {
      s[j] = neg_inf;
      continue;
    }
    const std::int64_t k_off = p.key_off(p.k.s, b, j) + hk * p.k.s[1];
    const float ksc = scale_of(p, p.k_scale, p.k_scale_s, b, hk, j);
    double dot = 0;
    for (std::int64_t d = 0; d < p.D; ++d) {
      dot += load(p.q.data, p.q.dtype, q_off + d) * load(p.k.data, p.k.dtype, k_off + d, ksc);
    }
    double x = p.scale * dot;
    if (p.softcap != 0) x = p.softcap * std::tanh(x / p.softcap);
    if (slope != 0) x -= slope * static_cast<double>(std::abs(p.pos(i) - j));
    s[j] = x + term;
    if (std::isnan(s[j]) || std::isnan(m)) {
      m = std::numeric_limits<double>::quiet_NaN();
    } else if (s[j] > m) {
      m = s[j];
    }
  }

  const std::int64_t o_off = b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
  if (m == neg_inf) {  // every key masked and no sink: out 0, lse -inf, weights 0
    for (std::int64_t d = 0; d < p.Dv; ++d) store(p.out, p.out_dtype, o_off + d, 0.0);
    if (p.lse) store(p.lse, p.lse_dtype, b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2], neg_inf);
    if (p.weights) {
      const std::int64_t w_off = b * p.weights_s[0] + h * p.weights_s[1] + i * p.weights_s[2];
      for (std::int64_t j = 0; j < p.Lk; ++j)
        store(p.weights, p.weights_dtype, w_off + j * p.weights_s[3], 0.0);
    }
    return;
  }

  double l = std::exp(sink - m);  // 0 without a sink
  for (std::int64_t j = 0; j < p.Lk; ++j) {
    s[j] = std::exp(s[j] - m);  // exp(-inf) = 0 for masked keys
    l += s[j];
  }
  std::vector<double> acc(static_cast<std::size_t>(p.Dv), 0.0);
  for (std::int64_t j = 0; j < p.Lk; ++j) {
    if (s[j] == 0.0) continue;
    const std::int64_t v_off = p.key_off(p.v.s, b, j) + hk * p.v.s[1];
    const float vsc = scale_of(p, p.v_scale, p.v_scale_s, b, hk, j);
    for (std::int64_t d = 0; d < p.Dv; ++d)
      acc[d] += s[j] * load(p.v.data, p.v.dtype, v_off + d, vsc);
  }
  for (std::int64_t d = 0; d < p.Dv; ++d) store(p.out, p.out_dtype, o_off + d, acc[d] / l);
  if (p.lse) {
    store(p.lse, p.lse_dtype, b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2], m + std::log(l));
  }
  if (p.weights) {
    const std::int64_t w_off = b * p.weights_s[0] + h * p.weights_s[1] + i * p.weights_s[2];
    for (std::int64_t j = 0; j < p.Lk; ++j)
      store(p.weights, p.weights_dtype, w_off + j * p.weights_s[3], s[j] / l);
  }
}

}  // namespace

void run_reference(const Problem& p) {
  // Rows are independent, so any thread count gives identical results.
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, p.B * p.H * p.Lq, 16),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      std::vector<double> s(static_cast<std::size_t>(p.Lk));
                      for (std::int64_t row = r.begin(); row < r.end(); ++row) {
                        const std::int64_t i = row % p.Lq;
                        const std::int64_t h = (row / p.Lq) % p.H;
                        const std::int64_t b = row / (p.Lq * p.H);
                        reference_row(p, b, h, i, s);
                      }
                    });
}

}  // namespace detail

void reference_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                         const OutputView& out, const AttentionOptions& opts) {
  const detail::Problem p = detail::validate(q, k, v, out, opts, /*allow_f64=*/true);
  detail::run_reference(p);
}

}  // namespace cpuattn
