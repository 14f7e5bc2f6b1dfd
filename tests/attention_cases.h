// The attention test cases shared by the fast-path suites (test_fast.cpp, test_dtypes.cpp): a case
// (shape, layout, misalignment, mask kind, dtypes), its random inputs, and the comparison of the
// fast path with the double-precision reference run on the same (already rounded) input values.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace cpuattn::test {

enum class MaskCase {
  none,
  causal_tl,
  causal_br,
  bool_full,
  bool_2d,
  bool_keys,
  additive_full,
  additive_inf,
  key_lengths,
  combo
};
inline const char* mask_name(MaskCase m) {
  static const char* names[] = {"none",        "causal_tl", "causal_br",     "bool_full",
                                "bool_2d",     "bool_keys", "additive_full", "additive_inf",
                                "key_lengths", "combo"};
  return names[static_cast<int>(m)];
}

struct Case {
  std::int64_t B = 1, H = 2, Hkv = 1, Lq = 7, Lk = 65, D = 17, Dv = 17;
  bool blhd = false;
  int misalign = 0;
  MaskCase mask = MaskCase::none;
  bool lse = true;
  bool out_aligned64 = false;  // the output (only) starts on a 64-byte boundary
  double scale = 0;            // softmax scale; 0: the default 1 / sqrt(D)
  int key_ramp = 0;  // +1: K row j scaled by 0.2 + 2 j / Lk, scores grow along the keys; -1: fall
  // Storage dtypes: Q f32/bf16/f16, K and V f32/bf16/f16/i8, out f32/bf16/f16.
  DType q_dtype = DType::f32, kv_dtype = DType::f32, out_dtype = DType::f32;
  // Plants special values (needs H >= 2, Lq >= 4, Lk >= 8, D >= 3): NaN in a Q row of head 0,
  // +inf in one K row of K/V head 0, the largest finite value of the dtype in one V row of the
  // last K/V head, and subnormals in Q and K.
  bool specials = false;
  // AttentionOptions' variants: window sides (-1 unbounded), soft-cap (0 off), ALiBi (0 off,
  // 1 default slopes, 2 given random slopes), sinks (random per head, the last head -inf).
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  int alibi = 0;
  bool sinks = false;
  std::string str() const {
    std::ostringstream s;
    s << "B" << B << " H" << H << " Hkv" << Hkv << " Lq" << Lq << " Lk" << Lk << " D" << D << " Dv"
      << Dv << (blhd ? " blhd" : " bhld") << " misalign" << misalign << " mask " << mask_name(mask)
      << (out_aligned64 ? " out aligned 64" : "")
      << (scale > 0 ? " scale " + std::to_string(scale) : "")
      << (key_ramp ? " key ramp " + std::to_string(key_ramp) : "");
    if (specials) s << " specials";
    if (window_left >= 0 || window_right >= 0)
      s << " window " << window_left << "," << window_right;
    if (softcap != 0) s << " softcap " << softcap;
    if (alibi) s << (alibi == 1 ? " alibi" : " alibi slopes");
    if (sinks) s << " sinks";
    if (q_dtype != DType::f32 || kv_dtype != DType::f32 || out_dtype != DType::f32)
      s << " dtypes q " << dtype_name(q_dtype) << " kv " << dtype_name(kv_dtype) << " out "
        << dtype_name(out_dtype);
    return s.str();
  }
};

// Inputs and options of one case; masks are owned here so views stay valid.
struct Inputs {
  Tensor4 q, k, v;
  std::vector<std::uint8_t> bmask;
  std::vector<float> amask;
  std::vector<std::int32_t> lengths;
  std::vector<float> slopes, sinks;
  AttentionOptions opts;
  explicit Inputs(const Case& c, std::uint32_t seed = 1)
      : q(c.B, c.H, c.Lq, c.D, c.blhd, c.misalign),
        k(c.B, c.Hkv, c.Lk, c.D, c.blhd, c.misalign),
        v(c.B, c.Hkv, c.Lk, c.Dv, c.blhd, c.misalign) {
    q.fill_random(seed);
    k.fill_random(seed + 1);
    v.fill_random(seed + 2);
    if (c.scale > 0) opts.scale = c.scale;
    if (c.key_ramp) {
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hkv; ++h)
          for (std::int64_t j = 0; j < c.Lk; ++j)
            for (std::int64_t d = 0; d < c.D; ++d)
              k.at(b, h, j, d) *=
                  static_cast<float>(0.2 + 2.0 * (c.key_ramp > 0 ? j : c.Lk - 1 - j) / c.Lk);
    }
    opts.window_left = c.window_left;
    opts.window_right = c.window_right;
    opts.softcap = c.softcap;
    opts.alibi = c.alibi == 1;
    if (c.alibi == 2) {
      slopes = random_floats(c.H, seed + 6, 0.01f, 0.5f);
      opts.alibi_slopes = f32_view(slopes.data(), {c.H});
    }
    if (c.sinks) {
      sinks = random_floats(c.H, seed + 7, -2.0f, 4.0f);
      sinks.back() = -std::numeric_limits<float>::infinity();
      opts.sinks = f32_view(sinks.data(), {c.H});
    }
    std::mt19937 rng(seed + 3);
    auto coin = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
    const std::int64_t full = c.B * c.H * c.Lq * c.Lk;
    switch (c.mask) {
      case MaskCase::none:
        break;
      case MaskCase::causal_tl:
        opts.causal = Causal::top_left;
        break;
      case MaskCase::causal_br:
        opts.causal = Causal::bottom_right;
        break;
      case MaskCase::bool_full:
        bmask.resize(full);
        for (auto& x : bmask) x = coin(70);
        opts.mask = TensorView::contiguous(bmask.data(), DType::boolean, {c.B, c.H, c.Lq, c.Lk});
        break;
      case MaskCase::bool_2d:
        bmask.resize(c.Lq * c.Lk);
        for (auto& x : bmask) x = coin(50);
        opts.mask = TensorView::contiguous(bmask.data(), DType::boolean, {c.Lq, c.Lk});
        break;
      case MaskCase::bool_keys:  // [B, 1, 1, Lk]: padding-style mask
        bmask.resize(c.B * c.Lk);
        for (auto& x : bmask) x = coin(80);
        opts.mask = TensorView::contiguous(bmask.data(), DType::boolean, {c.B, 1, 1, c.Lk});
        break;
      case MaskCase::additive_full:
        amask = random_floats(full, seed + 4, -3.0f, 3.0f);
        opts.mask = f32_view(amask.data(), {c.B, c.H, c.Lq, c.Lk});
        break;
      case MaskCase::additive_inf:  // [Lq, Lk] with -inf holes, some rows fully masked
        amask = random_floats(c.Lq * c.Lk, seed + 4, -2.0f, 2.0f);
        for (std::int64_t i = 0; i < c.Lq; ++i) {
          for (std::int64_t j = 0; j < c.Lk; ++j) {
            if (i % 5 == 3 || coin(30))
              amask[i * c.Lk + j] = -std::numeric_limits<float>::infinity();
          }
        }
        opts.mask = f32_view(amask.data(), {c.Lq, c.Lk});
        break;
      case MaskCase::key_lengths:
        lengths.resize(c.B);
        for (std::int64_t b = 0; b < c.B; ++b)
          lengths[b] = static_cast<std::int32_t>((b * 7919 + c.Lk / 2) % (c.Lk + 1));
        opts.key_lengths = TensorView::contiguous(lengths.data(), DType::i32, {c.B});
        break;
      case MaskCase::combo:
        opts.causal = Causal::bottom_right;
        lengths.resize(c.B);
        for (std::int64_t b = 0; b < c.B; ++b) lengths[b] = static_cast<std::int32_t>(c.Lk - b % 3);
        opts.key_lengths = TensorView::contiguous(lengths.data(), DType::i32, {c.B});
        amask = random_floats(c.H * c.Lq * c.Lk, seed + 5, -1.0f, 1.0f);
        opts.mask = f32_view(amask.data(), {c.H, c.Lq, c.Lk});
        break;
    }
  }
};

// A Tensor4's values stored in another dtype at the same element offsets (so the same strides and
// misalignment): bf16/f16 rounded to nearest even, i8 quantized per (b, h, l) row with its
// f32 scales [B, H, L]. The Tensor4 is then overwritten with the values the stored tensor holds,
// so that the reference (and any f32 check) sees exactly what the fast path reads.
struct Stored {
  std::vector<std::uint16_t> half;
  std::vector<std::int8_t> i8;
  std::vector<float> scales;
  TensorView view;
  std::optional<TensorView> scales_view;
  Stored(Tensor4& t, DType dtype) {
    view = t.view();
    view.dtype = dtype;
    if (dtype == DType::bf16 || dtype == DType::f16) {
      half.resize(t.buf.size());
      for (std::size_t i = 0; i < half.size(); ++i) {
        half[i] = dtype == DType::bf16 ? to_bf16(t.buf[i]) : to_f16(t.buf[i]);
        t.buf[i] = dtype == DType::bf16 ? from_bf16(half[i]) : from_f16(half[i]);
      }
      view.data = half.data() + t.misalign;
    } else if (dtype == DType::i8) {
      i8.resize(t.buf.size());
      scales.resize(static_cast<std::size_t>(t.B * t.H * t.L));
      std::vector<float> row(static_cast<std::size_t>(t.D));
      std::vector<std::int8_t> qrow(row.size());
      for (std::int64_t b = 0; b < t.B; ++b)
        for (std::int64_t h = 0; h < t.H; ++h)
          for (std::int64_t l = 0; l < t.L; ++l) {
            for (std::int64_t d = 0; d < t.D; ++d) row[d] = t.at(b, h, l, d);
            const float sc = quantize_int8(row.data(), t.D, qrow.data());
            scales[(b * t.H + h) * t.L + l] = sc;
            for (std::int64_t d = 0; d < t.D; ++d) {
              i8[t.offset(b, h, l, d) + t.misalign] = qrow[d];
              t.at(b, h, l, d) = static_cast<float>(qrow[d]) * sc;
            }
          }
      view.data = i8.data() + t.misalign;
      scales_view = f32_view(scales.data(), {t.B, t.H, t.L});
    }
  }
};

// Unit roundoff of a storage dtype: the largest relative error of rounding to it.
inline double unit_roundoff(DType t) {
  return t == DType::bf16  ? std::ldexp(1.0, -8)
         : t == DType::f16 ? std::ldexp(1.0, -11)
                           : std::ldexp(1.0, -24);
}

// The tolerances of case c's out (atol per unit of the head's largest |v|, and rtol) and lse, on a
// context that runs `native_path` (native_products).
struct Tolerance {
  double out_atol, out_rtol, lse_atol, lse_rtol;
};
inline Tolerance tolerance_of(const Case& c, bool native_path) {
  // With bf16 K and V on AVX512-BF16 (the native kernel: bf16 Q, or a decoding step with any Q)
  // the probabilities are rounded to bf16 before P V: each term of sum_j p_j v_j / l is off by at
  // most u_bf16 = 2^-8 relative, so out by at most u_bf16 * max |v| (V here is in [-1, 1]).
  // Decoding steps split the scaled Q into bf16 hi + lo, |q - hi - lo| < 2^-16 |q|: each score
  // moves by at most 2^-16 scale sum_d |q_d k_d| <= 2^-16 D scale max|k| (|q| <= 1), and the
  // weights by a factor within exp(+-2 that), so out by 2^-15 D scale max|k| max|v|.
  // int8 V in those decoding steps runs P V on VNNI: each block's weights p_j vscale_j are
  // quantized to int16 against the block's largest, off by at most 2^-16 of it, so out moves by
  // at most (block keys, 128) 2^-16 max|v| = 2^-9 max|v| (NativeBf16::QuantWeightRow).
  // The native prefill tiles (bf16 Q too) take P from Exp2Bf16, 3e-6 relative: the weights move
  // by twice that, and the lse by that.
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  const double ramp = c.key_ramp != 0 ? 2.2 : 1.0;
  const bool native_tiles = native_path && c.q_dtype == DType::bf16 && c.kv_dtype == DType::bf16;
  const double exp_bf16 = native_tiles ? 3e-6 : 0.0;
  const double p_round = !native_path ? 0.0
                         : c.kv_dtype == DType::bf16
                             ? unit_roundoff(DType::bf16) +
                                   std::ldexp(1.0, -15) * double(c.D) * scale * ramp + 2 * exp_bf16
                         : c.kv_dtype == DType::i8 ? std::ldexp(1.0, -9)
                                                   : 0.0;
  const double out_round = c.out_dtype == DType::f32 ? 0.0 : unit_roundoff(c.out_dtype);

  // Error model: rounding of the D-long dot products (scaled by the score magnitude, <= D * scale
  // for inputs in [-1, 1]) perturbs the weights; the Lk-long weighted sum adds its own rounding.
  // Both grow like sqrt(length); exp2 adds 3e-7 relative. Outputs are averages of V in [-1, 1].
  const double eps = std::numeric_limits<float>::epsilon();
  // ALiBi moves scores by up to slope * Lk (slopes <= 0.5), and f32 rounds them relative to that.
  const double alibi_mag = c.alibi != 0 ? 0.5 * double(c.Lk) : 0.0;
  const double score_mag =
      std::sqrt(double(c.D)) * scale * ramp * 3.0 + 3.0 + alibi_mag;  // masks add <= 3
  const double atol =
      8 * eps * (std::sqrt(double(c.Lk)) + std::sqrt(double(c.D)) * score_mag) + 1e-6;
  const double lse_tol =
      8 * eps * (std::sqrt(double(c.D)) * score_mag + std::log(double(c.Lk)) + 8) + exp_bf16;
  return {atol + p_round, out_round, lse_tol, 4 * eps};
}

// Runs the case on the fast path (one target) and the reference; compares out and lse.
inline void check_case(const Case& c, const Backend& backend, int threads = 0) {
  SCOPED_TRACE(c.str() + " on " + backend.name());
  Inputs in(c);
  Tensor4 out(c.B, c.H, c.Lq, c.Dv, c.blhd, c.out_aligned64 ? 15 : c.misalign),
      want(c.B, c.H, c.Lq, c.Dv);
  if (c.out_aligned64) {
    const auto addr = reinterpret_cast<std::uintptr_t>(out.buf.data());
    out.misalign = static_cast<int>((64 - addr % 64) % 64 / sizeof(float));
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(out.data()) % 64, 0u);
  }
  std::vector<float> lse(c.B * c.H * c.Lq), want_lse(c.B * c.H * c.Lq);
  AttentionOptions fast_opts = in.opts, ref_opts = in.opts;
  if (c.lse) {
    fast_opts.lse = f32_view(lse.data(), {c.B, c.H, c.Lq});
    ref_opts.lse = f32_view(want_lse.data(), {c.B, c.H, c.Lq});
  }
  Context ctx(threads);
  backend.apply(ctx);
  if (c.specials) {
    const auto largest = [](DType t) {
      return t == DType::bf16  ? from_bf16(0x7f7f)
             : t == DType::f16 ? 65504.0f
             : t == DType::i8  ? 1e30f
                               : std::numeric_limits<float>::max();
    };
    in.q.at(0, 0, 3, 0) = std::numeric_limits<float>::quiet_NaN();
    in.q.at(0, 1, 1, 2) = 1e-40f;  // subnormal in f32 and bf16 (0 in f16)
    if (c.kv_dtype != DType::i8)
      in.k.at(0, 0, c.Lk - 3, 1) = std::numeric_limits<float>::infinity();
    in.k.at(0, c.Hkv - 1, 2, 0) = 3e-41f;
    in.v.at(0, c.Hkv - 1, 5, 0) = largest(c.kv_dtype);
  }
  const Stored sq(in.q, c.q_dtype), sk(in.k, c.kv_dtype), sv(in.v, c.kv_dtype);
  fast_opts.k_scales = sk.scales_view;
  fast_opts.v_scales = sv.scales_view;
  // A reduced-precision out is written into `half` at out's offsets, then widened into `out`.
  std::vector<std::uint16_t> half(c.out_dtype == DType::f32 ? 0 : out.buf.size(), 0x7fc0);
  OutputView out_view = out.out_view();
  if (c.out_dtype != DType::f32) {
    out_view.dtype = c.out_dtype;
    out_view.data = half.data() + out.misalign;
  }
  attention(sq.view, sk.view, sv.view, out_view, fast_opts, &ctx);
  for (std::size_t i = 0; i < half.size(); ++i)
    out.buf[i] = c.out_dtype == DType::bf16 ? from_bf16(half[i]) : from_f16(half[i]);
  // The reference runs on the values the fast path read (in.q/k/v now hold them), in f32.
  reference_attention(in.q.view(), in.k.view(), in.v.view(), want.out_view(), ref_opts);
  if (c.q_dtype != DType::f32 || c.kv_dtype != DType::f32) {
    // The reference reads every dtype itself, to the same values.
    Tensor4 want2(c.B, c.H, c.Lq, c.Dv);
    AttentionOptions o = in.opts;
    o.k_scales = sk.scales_view;
    o.v_scales = sv.scales_view;
    reference_attention(sq.view, sk.view, sv.view, want2.out_view(), o);
    EXPECT_EQ(std::memcmp(want.buf.data(), want2.buf.data(), want.buf.size() * 4), 0)
        << "the reference on stored dtypes differs from the reference on their f32 values";
  }
  const Tolerance tol = tolerance_of(c, native_products(&ctx, c.kv_dtype));
  // Per (b, h): the error is relative to that head's largest finite |v| (1 for the random inputs,
  // more where a case plants large values).
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      double vmax = 1.0;
      for (std::int64_t j = 0; j < c.Lk; ++j)
        for (std::int64_t d = 0; d < c.Dv; ++d) {
          const double x = std::abs(in.v.at(b, h / (c.H / c.Hkv), j, d));
          if (std::isfinite(x)) vmax = std::max(vmax, x);
        }
      std::vector<float> got_flat, want_flat;
      for (std::int64_t i = 0; i < c.Lq; ++i)
        for (std::int64_t d = 0; d < c.Dv; ++d) {
          got_flat.push_back(out.at(b, h, i, d));
          want_flat.push_back(want.at(b, h, i, d));
        }
      EXPECT_TRUE(all_close(got_flat.data(), want_flat.data(), got_flat.size(), tol.out_atol * vmax,
                            tol.out_rtol))
          << "b " << b << " h " << h;
    }
  if (c.lse) {
    EXPECT_TRUE(all_close(lse.data(), want_lse.data(), lse.size(), tol.lse_atol, tol.lse_rtol));
  }
}

}  // namespace cpuattn::test
