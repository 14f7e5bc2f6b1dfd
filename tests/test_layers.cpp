// The attention family: MultiHeadAttention (self, causal, cross, GQA, incremental decoding with a
// KvCache), additive (Bahdanau) and multiplicative (Luong) attention, against references built
// from double-precision products and the reference attention kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

using Dvec = std::vector<double>;

// y [M, N] = x [M, K] w [K, N] + b, in double.
Dvec matmul(const Dvec& x, const std::vector<float>& w, const std::vector<float>* b, std::int64_t M,
            std::int64_t K, std::int64_t N) {
  Dvec y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = b ? (*b)[n] : 0.0;
      for (std::int64_t k = 0; k < K; ++k) acc += x[m * K + k] * w[k * N + n];
      y[m * N + n] = acc;
    }
  }
  return y;
}

Dvec to_double(const std::vector<float>& v) { return Dvec(v.begin(), v.end()); }

std::vector<float> to_float(const Dvec& v) { return std::vector<float>(v.begin(), v.end()); }

// Uniform in [-1, 1] / sqrt(fan_in): projections keep unit magnitudes.
std::vector<float> weights(std::int64_t fan_in, std::int64_t fan_out, std::uint32_t seed) {
  auto w = random_floats(static_cast<std::size_t>(fan_in * fan_out), seed);
  for (auto& x : w) x /= std::sqrt(static_cast<float>(fan_in));
  return w;
}

struct MhaCase {
  std::int64_t d_model, heads, kv_heads, head_dim, value_dim;
  bool bias;
};

struct MhaSetup {
  MhaConfig cfg;
  std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;
  bool bias;
  explicit MhaSetup(MhaCase c, std::uint32_t seed = 1) : bias(c.bias) {
    if (c.head_dim == 0) c.head_dim = c.d_model / c.heads;
    if (c.value_dim == 0) c.value_dim = c.head_dim;
    cfg = {c.d_model, c.heads, c.kv_heads, c.head_dim, c.value_dim};
    wq = weights(c.d_model, c.heads * c.head_dim, seed);
    wk = weights(c.d_model, c.kv_heads * c.head_dim, seed + 1);
    wv = weights(c.d_model, c.kv_heads * c.value_dim, seed + 2);
    wo = weights(c.heads * c.value_dim, c.d_model, seed + 3);
    bq = random_floats(c.heads * c.head_dim, seed + 4);
    bk = random_floats(c.kv_heads * c.head_dim, seed + 5);
    bv = random_floats(c.kv_heads * c.value_dim, seed + 6);
    bo = random_floats(c.d_model, seed + 7);
  }
  MultiHeadAttention layer() const {
    MhaWeights w{f32_view(wq.data(), {cfg.d_model, cfg.heads * cfg.head_dim}),
                 f32_view(wk.data(), {cfg.d_model, cfg.kv_heads * cfg.head_dim}),
                 f32_view(wv.data(), {cfg.d_model, cfg.kv_heads * cfg.value_dim}),
                 f32_view(wo.data(), {cfg.heads * cfg.value_dim, cfg.d_model})};
    if (bias) {
      w.bq = f32_view(bq.data(), {cfg.heads * cfg.head_dim});
      w.bk = f32_view(bk.data(), {cfg.kv_heads * cfg.head_dim});
      w.bv = f32_view(bv.data(), {cfg.kv_heads * cfg.value_dim});
      w.bo = f32_view(bo.data(), {cfg.d_model});
    }
    return MultiHeadAttention(cfg, w);
  }
  // The layer in double: projections, reference attention on f64 [B, L, H, D] views, output.
  std::vector<float> reference(const std::vector<float>& xq, std::int64_t B, std::int64_t Lq,
                               const std::vector<float>& xkv, std::int64_t Lk, Causal causal,
                               const std::vector<std::int64_t>* key_lengths = nullptr) const {
    const MhaConfig& c = cfg;
    const auto* nb = static_cast<const std::vector<float>*>(nullptr);
    const Dvec q =
        matmul(to_double(xq), wq, bias ? &bq : nb, B * Lq, c.d_model, c.heads * c.head_dim);
    const Dvec k =
        matmul(to_double(xkv), wk, bias ? &bk : nb, B * Lk, c.d_model, c.kv_heads * c.head_dim);
    const Dvec v =
        matmul(to_double(xkv), wv, bias ? &bv : nb, B * Lk, c.d_model, c.kv_heads * c.value_dim);
    Dvec a(static_cast<std::size_t>(B * Lq * c.heads * c.value_dim));
    AttentionOptions opts;
    opts.causal = causal;
    if (key_lengths)
      opts.key_lengths = TensorView::contiguous(key_lengths->data(), DType::i64, {B});
    reference_attention(TensorView::blhd(q.data(), DType::f64, B, Lq, c.heads, c.head_dim),
                        TensorView::blhd(k.data(), DType::f64, B, Lk, c.kv_heads, c.head_dim),
                        TensorView::blhd(v.data(), DType::f64, B, Lk, c.kv_heads, c.value_dim),
                        OutputView::blhd(a.data(), DType::f64, B, Lq, c.heads, c.value_dim), opts);
    return to_float(matmul(a, wo, bias ? &bo : nb, B * Lq, c.heads * c.value_dim, c.d_model));
  }
};

// Three chained products of width ~d_model and a softmax over Lk: the error of each stage is
// bounded by ~eps * sqrt(reduction) per unit magnitude; this adds them with a safety factor.
double mha_atol(const MhaConfig& c, std::int64_t Lk) {
  return 16 * std::numeric_limits<float>::epsilon() *
         (c.d_model + c.heads * c.value_dim + std::sqrt(double(Lk)) * 8);
}

class MhaTargets : public ::testing::TestWithParam<Backend> {};

TEST_P(MhaTargets, SelfCausalCrossAndGqaMatchReference) {
  Context ctx(2);
  GetParam().apply(ctx);
  std::uint32_t seed = 10;
  for (const MhaCase& mc : {MhaCase{40, 4, 2, 10, 12, true}, MhaCase{33, 3, 1, 11, 0, false},
                            MhaCase{64, 8, 8, 0, 0, true}, MhaCase{24, 6, 3, 5, 7, true}}) {
    const MhaSetup s(mc, ++seed);
    const MultiHeadAttention layer = s.layer();
    const MhaConfig& c = layer.config();
    for (std::int64_t B : {1, 2}) {
      for (std::int64_t L : {1, 13, 70}) {
        auto x = random_floats(B * L * c.d_model, ++seed);
        for (Causal causal : {Causal::none, Causal::top_left}) {
          std::vector<float> out(B * L * c.d_model, 9.0f);
          AttentionOptions opts;
          opts.causal = causal;
          layer.forward(f32_view(x.data(), {B, L, c.d_model}),
                        f32_view(out.data(), {B, L, c.d_model}), opts, &ctx);
          const auto want = s.reference(x, B, L, x, L, causal);
          ASSERT_TRUE(all_close(out.data(), want.data(), out.size(), mha_atol(c, L), 0))
              << "self d_model=" << c.d_model << " H=" << c.heads << " Hkv=" << c.kv_heads
              << " B=" << B << " L=" << L << " causal=" << int(causal);
        }
        // Cross attention to an encoder output of another length, with padded batches.
        const std::int64_t Lk = L + 6;
        auto enc = random_floats(B * Lk * c.d_model, ++seed);
        std::vector<std::int64_t> lengths(B);
        for (std::int64_t b = 0; b < B; ++b) lengths[b] = Lk - 3 * b;
        AttentionOptions opts;
        opts.key_lengths = TensorView::contiguous(lengths.data(), DType::i64, {B});
        std::vector<float> out(B * L * c.d_model);
        layer.forward_cross(f32_view(x.data(), {B, L, c.d_model}),
                            f32_view(enc.data(), {B, Lk, c.d_model}),
                            f32_view(out.data(), {B, L, c.d_model}), opts, &ctx);
        const auto want = s.reference(x, B, L, enc, Lk, Causal::none, &lengths);
        ASSERT_TRUE(all_close(out.data(), want.data(), out.size(), mha_atol(c, Lk), 0))
            << "cross d_model=" << c.d_model << " B=" << B << " Lq=" << L << " Lk=" << Lk;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MhaTargets, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

// Prefill, single tokens and a chunk through a KvCache give the rows of one causal pass over the
// whole sequence.
TEST(MhaDecode, IncrementalEqualsFullCausalPass) {
  const MhaSetup s(MhaCase{48, 6, 2, 8, 0, true}, 77);
  const MultiHeadAttention layer = s.layer();
  const MhaConfig& c = layer.config();
  const std::int64_t B = 2, T = 12;
  auto x = random_floats(B * T * c.d_model, 78);
  const auto want = s.reference(x, B, T, x, T, Causal::top_left);
  for (bool growable : {false, true}) {
    KvCache cache = layer.make_cache(B, growable ? 2 : T, growable);
    Context ctx(2);
    std::int64_t pos = 0;
    for (std::int64_t n : {5, 1, 1, 1, 1, 3}) {
      // x's tokens [pos, pos + n) of every batch: a strided slice of the whole sequence.
      TensorView xs = f32_view(x.data() + pos * c.d_model, {B, n, c.d_model});
      xs.strides = {T * c.d_model, c.d_model, 1, 0};
      std::vector<float> out(B * n * c.d_model);
      layer.decode(xs, cache, f32_view(out.data(), {B, n, c.d_model}), {}, &ctx);
      for (std::int64_t b = 0; b < B; ++b) {
        ASSERT_TRUE(all_close(out.data() + b * n * c.d_model,
                              want.data() + (b * T + pos) * c.d_model, n * c.d_model,
                              mha_atol(c, T), 0))
            << "tokens [" << pos << ", " << pos + n << ") batch " << b << " growable " << growable;
      }
      pos += n;
      ASSERT_EQ(cache.length(), pos);
    }
    EXPECT_GE(cache.capacity(), T);
  }
}

// wq, wk and wv are packed as one matrix: their dtypes must agree, and the error names them.
TEST(Mha, QkvWeightsOfMixedDtypesAreAnErrorNamingThem) {
  const MhaSetup s(MhaCase{16, 2, 1, 8, 0, false}, 9);
  std::vector<std::uint16_t> wk16(s.wk.size());
  for (std::size_t i = 0; i < wk16.size(); ++i) wk16[i] = to_bf16(s.wk[i]);
  MhaWeights w{f32_view(s.wq.data(), {16, 16}),
               TensorView::contiguous(wk16.data(), DType::bf16, {16, 8}),
               f32_view(s.wv.data(), {16, 8}), f32_view(s.wo.data(), {16, 16})};
  expect_error_mentioning([&] { MultiHeadAttention(s.cfg, w); }, "wk has dtype bfloat16 but wq");
}

TEST(MhaDecode, FullFixedCacheIsAnErrorThatChangesNothing) {
  const MhaSetup s(MhaCase{16, 2, 1, 8, 0, false}, 5);
  const MultiHeadAttention layer = s.layer();
  KvCache cache = layer.make_cache(1, 4);
  auto x = random_floats(3 * 16, 6);
  std::vector<float> out(3 * 16, 0.5f);
  layer.decode(f32_view(x.data(), {1, 3, 16}), cache, f32_view(out.data(), {1, 3, 16}));
  const std::vector<float> keys_before(static_cast<const float*>(cache.keys().data),
                                       static_cast<const float*>(cache.keys().data) + 3 * 8);
  std::fill(out.begin(), out.end(), 0.5f);
  try {
    layer.decode(f32_view(x.data(), {1, 2, 16}), cache, f32_view(out.data(), {1, 2, 16}));
    ADD_FAILURE() << "appending 2 tokens to 3 of capacity 4 must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(), 3);
  EXPECT_EQ(cache.capacity(), 4);
  for (float v : out) ASSERT_EQ(v, 0.5f);
  const auto* k = static_cast<const float*>(cache.keys().data);
  EXPECT_EQ(std::vector<float>(k, k + 3 * 8), keys_before);
  EXPECT_THROW(cache.reserve(8), Error);
  // A bad mask is caught before the cache changes.
  std::vector<std::uint8_t> mask(5, 1);
  AttentionOptions opts;
  opts.mask = TensorView::contiguous(mask.data(), DType::boolean, {5});
  KvCache big = layer.make_cache(1, 16);
  EXPECT_THROW(
      layer.decode(f32_view(x.data(), {1, 1, 16}), big, f32_view(out.data(), {1, 1, 16}), opts),
      Error);
  EXPECT_EQ(big.length(), 0);
}

TEST(KvCache, AppendGrowClearAndViews) {
  KvCache cache(2, 3, 4, 5, 2, /*growable=*/true);
  std::vector<float> k1 = random_floats(2 * 3 * 3 * 4, 1), v1 = random_floats(2 * 3 * 3 * 5, 2);
  cache.append(f32_view(k1.data(), {2, 3, 3, 4}), f32_view(v1.data(), {2, 3, 3, 5}));
  EXPECT_EQ(cache.length(), 3);
  EXPECT_GE(cache.capacity(), 3);
  const TensorView kv = cache.keys(), vv = cache.values();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t l = 0; l < 3; ++l) {
        const auto* kr = static_cast<const float*>(kv.data) + b * kv.strides[0] +
                         h * kv.strides[1] + l * kv.strides[2];
        const auto* vr = static_cast<const float*>(vv.data) + b * vv.strides[0] +
                         h * vv.strides[1] + l * vv.strides[2];
        for (int d = 0; d < 4; ++d) ASSERT_EQ(kr[d], k1[((b * 3 + h) * 3 + l) * 4 + d]);
        for (int d = 0; d < 5; ++d) ASSERT_EQ(vr[d], v1[((b * 3 + h) * 3 + l) * 5 + d]);
      }
  EXPECT_THROW(cache.append(f32_view(k1.data(), {2, 3, 3, 5}), f32_view(v1.data(), {2, 3, 3, 5})),
               Error);
  EXPECT_THROW(cache.truncate(4), Error);
  cache.truncate(1);
  EXPECT_EQ(cache.length(), 1);
  EXPECT_EQ(cache.keys().shape[2], 1);
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_THROW(KvCache(0, 1, 1, 1, 1), Error);
}

// ------------------------------------------------------------------ additive / multiplicative

struct AlignRef {
  std::int64_t B, Lq, Lk, d_dec, d_enc, A, dv;
  std::vector<float> h, s, w1, w2, v, b1, b2, values, wmul;
  std::vector<std::uint8_t> mask;  // [B, Lq, Lk] or empty
  std::vector<std::int32_t> lengths;

  // softmax over visible keys of `score(b, i, j)`, then the weighted sum of values (or s).
  template <class Score>
  void finish(Score score, bool use_values, std::vector<float>& ctx_out,
              std::vector<float>& w_out) const {
    const std::int64_t width = use_values ? dv : d_enc;
    const std::vector<float>& val = use_values ? values : s;
    ctx_out.assign(B * Lq * width, 0.0f);
    w_out.assign(B * Lq * Lk, 0.0f);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < Lq; ++i) {
        Dvec sc(Lk, -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Lk; ++j) {
          if (!lengths.empty() && j >= lengths[b]) continue;
          if (!mask.empty() && !mask[(b * Lq + i) * Lk + j]) continue;
          sc[j] = score(b, i, j);
          mx = std::max(mx, sc[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // all masked: zeros
        double l = 0;
        for (auto& x : sc) l += (x = std::exp(x - mx));
        for (std::int64_t j = 0; j < Lk; ++j) {
          w_out[(b * Lq + i) * Lk + j] = static_cast<float>(sc[j] / l);
          for (std::int64_t d = 0; d < width; ++d) {
            ctx_out[(b * Lq + i) * width + d] +=
                static_cast<float>(sc[j] / l * val[(b * Lk + j) * width + d]);
          }
        }
      }
    }
  }

  void additive(bool use_values, std::vector<float>& c, std::vector<float>& w) const {
    std::vector<float> nb;
    const Dvec e1 = matmul(to_double(h), w1, &b1, B * Lq, d_dec, A);
    const Dvec e2 = matmul(to_double(s), w2, &b2, B * Lk, d_enc, A);
    finish(
        [&](std::int64_t b, std::int64_t i, std::int64_t j) {
          double acc = 0;
          for (std::int64_t a = 0; a < A; ++a)
            acc += v[a] * std::tanh(e1[(b * Lq + i) * A + a] + e2[(b * Lk + j) * A + a]);
          return acc;
        },
        use_values, c, w);
  }

  void multiplicative(bool scaled, bool use_values, std::vector<float>& c,
                      std::vector<float>& w) const {
    const Dvec g = matmul(to_double(h), wmul, nullptr, B * Lq, d_dec, d_enc);
    finish(
        [&](std::int64_t b, std::int64_t i, std::int64_t j) {
          double acc = 0;
          for (std::int64_t e = 0; e < d_enc; ++e)
            acc += g[(b * Lq + i) * d_enc + e] * s[(b * Lk + j) * d_enc + e];
          return scaled ? acc / std::sqrt(double(d_dec)) : acc;
        },
        use_values, c, w);
  }
};

AlignRef make_align(std::int64_t B, std::int64_t Lq, std::int64_t Lk, std::int64_t d_dec,
                    std::int64_t d_enc, std::int64_t A, std::int64_t dv, std::uint32_t seed) {
  AlignRef r{B, Lq, Lk, d_dec, d_enc, A, dv};
  r.h = random_floats(B * Lq * d_dec, seed);
  r.s = random_floats(B * Lk * d_enc, seed + 1);
  r.w1 = weights(d_dec, A, seed + 2);
  r.w2 = weights(d_enc, A, seed + 3);
  r.v = random_floats(A, seed + 4);
  r.b1 = random_floats(A, seed + 5, -0.1f, 0.1f);
  r.b2 = random_floats(A, seed + 6, -0.1f, 0.1f);
  r.values = random_floats(B * Lk * dv, seed + 7);
  r.wmul = weights(d_dec, d_enc, seed + 8);
  return r;
}

class AlignTargets : public ::testing::TestWithParam<Backend> {};

TEST_P(AlignTargets, AdditiveAndMultiplicativeMatchReference) {
  Context ctx(2);
  GetParam().apply(ctx);
  std::uint32_t seed = 300;
  for (std::int64_t B : {1, 3}) {
    for (std::int64_t Lq : {1, 5}) {
      for (std::int64_t Lk : {1, 7, 19}) {
        for (std::int64_t A : {1, 5, 17, 33}) {
          for (int variant = 0; variant < 3; ++variant) {  // plain, values + mask, lengths
            AlignRef r = make_align(B, Lq, Lk, 9, 13, A, 6, seed += 10);
            AlignOptions opts;
            const bool use_values = variant == 1;
            if (use_values) {
              opts.values = f32_view(r.values.data(), {B, Lk, 6});
              r.mask.resize(B * Lq * Lk);
              std::mt19937 rng(seed);
              for (auto& m : r.mask) m = rng() % 4 != 0;
              opts.mask = TensorView::contiguous(r.mask.data(), DType::boolean, {B, Lq, Lk});
            }
            if (variant == 2) {
              for (std::int64_t b = 0; b < B; ++b)
                r.lengths.push_back(
                    static_cast<std::int32_t>(std::max<std::int64_t>(0, Lk - 2 * b)));
              opts.key_lengths = TensorView::contiguous(r.lengths.data(), DType::i32, {B});
            }
            const std::int64_t width = use_values ? 6 : 13;
            std::vector<float> c(B * Lq * width), w(B * Lq * Lk), want_c, want_w;
            opts.weights = f32_view(w.data(), {B, Lq, Lk});
            const std::string where = "B=" + std::to_string(B) + " Lq=" + std::to_string(Lq) +
                                      " Lk=" + std::to_string(Lk) + " A=" + std::to_string(A) +
                                      " variant=" + std::to_string(variant);

            AdditiveAttention add({f32_view(r.w1.data(), {9, A}), f32_view(r.w2.data(), {13, A}),
                                   f32_view(r.v.data(), {A}), f32_view(r.b1.data(), {A}),
                                   f32_view(r.b2.data(), {A})});
            add.forward(f32_view(r.h.data(), {B, Lq, 9}), f32_view(r.s.data(), {B, Lk, 13}),
                        f32_view(c.data(), {B, Lq, width}), opts, &ctx);
            r.additive(use_values, want_c, want_w);
            // Scores sum A tanh values (4e-7 each) weighted by |v| <= 1, behind two products.
            const double atol = 16 * std::numeric_limits<float>::epsilon() * (A + 13 + Lk);
            ASSERT_TRUE(all_close(c.data(), want_c.data(), c.size(), atol, 0))
                << "additive context " << where;
            ASSERT_TRUE(all_close(w.data(), want_w.data(), w.size(), atol, 0))
                << "additive weights " << where;

            for (bool scaled : {true, false}) {
              MultiplicativeAttention mul(f32_view(r.wmul.data(), {9, 13}), scaled);
              mul.forward(f32_view(r.h.data(), {B, Lq, 9}), f32_view(r.s.data(), {B, Lk, 13}),
                          f32_view(c.data(), {B, Lq, width}), opts, &ctx);
              r.multiplicative(scaled, use_values, want_c, want_w);
              ASSERT_TRUE(all_close(c.data(), want_c.data(), c.size(), atol, 0))
                  << "multiplicative context " << where << " scaled " << scaled;
              ASSERT_TRUE(all_close(w.data(), want_w.data(), w.size(), atol, 0))
                  << "multiplicative weights " << where << " scaled " << scaled;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AlignTargets, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

// The seed's loop (encoder_dim 100, decoder_dim 50, 10 encoder states, 13 decoder steps): one
// step at a time equals all steps at once, for both kinds, without the weights output. Additive
// rows are computed independently (bitwise equal); multiplicative runs the fused kernel, whose
// single-row path sums in another order (equal within rounding).
TEST(Align, SeedLoopStepByStepEqualsAllAtOnce) {
  AlignRef r = make_align(1, 13, 10, 50, 100, 50, 100, 900);
  AdditiveAttention add({f32_view(r.w1.data(), {50, 50}), f32_view(r.w2.data(), {100, 50}),
                         f32_view(r.v.data(), {50}), f32_view(r.b1.data(), {50}),
                         f32_view(r.b2.data(), {50})});
  MultiplicativeAttention mul(f32_view(r.wmul.data(), {50, 100}));
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> all(13 * 100), step(100);
    const TensorView s = f32_view(r.s.data(), {1, 10, 100});
    auto run = [&](const TensorView& h, const OutputView& c) {
      if (kind == 0)
        add.forward(h, s, c);
      else
        mul.forward(h, s, c);
    };
    run(f32_view(r.h.data(), {1, 13, 50}), f32_view(all.data(), {1, 13, 100}));
    std::vector<float> want_c, want_w;
    if (kind == 0)
      r.additive(false, want_c, want_w);
    else
      r.multiplicative(true, false, want_c, want_w);
    EXPECT_TRUE(all_close(all.data(), want_c.data(), all.size(), 1e-5, 0)) << "kind " << kind;
    for (int i = 0; i < 13; ++i) {
      run(f32_view(r.h.data() + i * 50, {1, 1, 50}), f32_view(step.data(), {1, 1, 100}));
      if (kind == 0) {
        for (int d = 0; d < 100; ++d) ASSERT_EQ(step[d], all[i * 100 + d]) << "step " << i;
      } else {
        ASSERT_TRUE(all_close(step.data(), all.data() + i * 100, 100, 1e-6, 0)) << "step " << i;
      }
    }
  }
}

TEST(Align, BadArgumentsNameThemAndLeaveOutputsUntouched) {
  AlignRef r = make_align(2, 3, 4, 5, 6, 7, 2, 1);
  AdditiveAttention add(
      {f32_view(r.w1.data(), {5, 7}), f32_view(r.w2.data(), {6, 7}), f32_view(r.v.data(), {7})});
  std::vector<float> c(2 * 3 * 6, 4.0f);
  auto expect_error = [&](auto&& f, const std::string& needle) {
    expect_error_mentioning(f, needle);
    for (float v : c) ASSERT_EQ(v, 4.0f);
  };
  const auto h = f32_view(r.h.data(), {2, 3, 5});
  const auto s = f32_view(r.s.data(), {2, 4, 6});
  expect_error(
      [&] {
        add.forward(f32_view(r.h.data(), {2, 3, 4}), s, f32_view(c.data(), {2, 3, 6}));
      },
      "decoder width 5");
  expect_error(
      [&] {
        add.forward(h, f32_view(r.s.data(), {1, 4, 6}), f32_view(c.data(), {2, 3, 6}));
      },
      "s must be [2,Lk,6]");
  expect_error([&] { add.forward(h, s, f32_view(c.data(), {2, 3, 5})); }, "context [2,3,5]");
  std::vector<std::uint8_t> m(5, 1);
  AlignOptions o;
  o.mask = TensorView::contiguous(m.data(), DType::boolean, {5});
  expect_error([&] { add.forward(h, s, f32_view(c.data(), {2, 3, 6}), o); }, "mask");
  AlignOptions ov;
  ov.values = f32_view(r.values.data(), {2, 3, 2});
  expect_error([&] { add.forward(h, s, f32_view(c.data(), {2, 3, 6}), ov); }, "values [2,3,2]");
  EXPECT_THROW(AdditiveAttention({f32_view(r.w1.data(), {5, 7}), f32_view(r.w2.data(), {6, 6}),
                                  f32_view(r.v.data(), {7})}),
               Error);
  EXPECT_THROW(AdditiveAttention({f32_view(r.w1.data(), {5, 7}), f32_view(r.w2.data(), {6, 7}),
                                  f32_view(r.v.data(), {6})}),
               Error);
}

// ------------------------------------------------------------------ RoPE and QK-norm in the layer

// A decoder layer: MhaSetup's weights plus QK-norm weights and a rotary configuration.
struct DecoderSetup : MhaSetup {
  std::vector<float> qn, kn;  // QK-norm weights (per head or per projection)
  DecoderSetup(MhaCase mc, std::optional<RopeOptions> rope, QkNorm norm, std::uint32_t seed)
      : MhaSetup(mc, seed) {
    cfg.rope = rope;
    cfg.qk_norm = norm;
    cfg.qk_norm_eps = 1e-5;
    const bool per_head = norm == QkNorm::head;
    qn = random_floats(per_head ? cfg.head_dim : cfg.heads * cfg.head_dim, seed + 20, 0.5f, 1.5f);
    kn =
        random_floats(per_head ? cfg.head_dim : cfg.kv_heads * cfg.head_dim, seed + 21, 0.5f, 1.5f);
  }
  MultiHeadAttention layer() const {
    MhaWeights w{f32_view(wq.data(), {cfg.d_model, cfg.heads * cfg.head_dim}),
                 f32_view(wk.data(), {cfg.d_model, cfg.kv_heads * cfg.head_dim}),
                 f32_view(wv.data(), {cfg.d_model, cfg.kv_heads * cfg.value_dim}),
                 f32_view(wo.data(), {cfg.heads * cfg.value_dim, cfg.d_model})};
    if (bias) {
      w.bq = f32_view(bq.data(), {cfg.heads * cfg.head_dim});
      w.bk = f32_view(bk.data(), {cfg.kv_heads * cfg.head_dim});
      w.bv = f32_view(bv.data(), {cfg.kv_heads * cfg.value_dim});
      w.bo = f32_view(bo.data(), {cfg.d_model});
    }
    if (cfg.qk_norm != QkNorm::none) {
      w.q_norm = f32_view(qn.data(), {static_cast<std::int64_t>(qn.size())});
      w.k_norm = f32_view(kn.data(), {static_cast<std::int64_t>(kn.size())});
    }
    return MultiHeadAttention(cfg, w);
  }
  // RMSNorm in double of rows [tokens, heads * head_dim], per head or over the row.
  void norm(Dvec& x, std::int64_t tokens, std::int64_t heads, const std::vector<float>& w) const {
    if (cfg.qk_norm == QkNorm::none) return;
    const std::int64_t D = cfg.head_dim;
    const std::int64_t group = cfg.qk_norm == QkNorm::head ? D : heads * D;
    for (std::int64_t g = 0; g < tokens * heads * D / group; ++g) {
      double ss = 0;
      for (std::int64_t i = 0; i < group; ++i) ss += x[g * group + i] * x[g * group + i];
      const double inv = 1 / std::sqrt(ss / double(group) + cfg.qk_norm_eps);
      for (std::int64_t i = 0; i < group; ++i) x[g * group + i] *= inv * w[i];
    }
  }
  // The rotation by apply_rope (checked against a long double reference in test_positional) of
  // rows [B, L, heads, head_dim] at positions 0 .. L-1, or token t at (*pos)[t] when given.
  void rotate(Dvec& x, std::int64_t B, std::int64_t L, std::int64_t heads,
              const std::vector<std::int64_t>* pos = nullptr) const {
    if (!cfg.rope) return;
    std::vector<float> f = to_float(x);
    const std::int64_t D = cfg.head_dim;
    if (pos == nullptr) {
      apply_rope(OutputView::blhd(f.data(), DType::f32, B, L, heads, D), 0, *cfg.rope);
    } else {
      for (std::int64_t t = 0; t < B * L; ++t)
        apply_rope(OutputView::blhd(f.data() + t * heads * D, DType::f32, 1, 1, heads, D),
                   (*pos)[static_cast<std::size_t>(t)], *cfg.rope);
    }
    x = to_double(f);
  }
  // The layer: projections and norms in double, rotation, reference attention, output in double.
  // pos: explicit positions of the B * Lq tokens (self-attention).
  std::vector<float> reference(const std::vector<float>& xq, std::int64_t B, std::int64_t Lq,
                               const std::vector<float>& xkv, std::int64_t Lk, Causal causal,
                               const std::vector<std::int64_t>* pos = nullptr) const {
    const MhaConfig& c = cfg;
    const auto* nb = static_cast<const std::vector<float>*>(nullptr);
    Dvec q = matmul(to_double(xq), wq, bias ? &bq : nb, B * Lq, c.d_model, c.heads * c.head_dim);
    Dvec k =
        matmul(to_double(xkv), wk, bias ? &bk : nb, B * Lk, c.d_model, c.kv_heads * c.head_dim);
    const Dvec v =
        matmul(to_double(xkv), wv, bias ? &bv : nb, B * Lk, c.d_model, c.kv_heads * c.value_dim);
    norm(q, B * Lq, c.heads, qn);
    norm(k, B * Lk, c.kv_heads, kn);
    rotate(q, B, Lq, c.heads, pos);
    rotate(k, B, Lk, c.kv_heads, pos);
    Dvec a(static_cast<std::size_t>(B * Lq * c.heads * c.value_dim));
    AttentionOptions opts;
    opts.causal = causal;
    reference_attention(TensorView::blhd(q.data(), DType::f64, B, Lq, c.heads, c.head_dim),
                        TensorView::blhd(k.data(), DType::f64, B, Lk, c.kv_heads, c.head_dim),
                        TensorView::blhd(v.data(), DType::f64, B, Lk, c.kv_heads, c.value_dim),
                        OutputView::blhd(a.data(), DType::f64, B, Lq, c.heads, c.value_dim), opts);
    return to_float(matmul(a, wo, bias ? &bo : nb, B * Lq, c.heads * c.value_dim, c.d_model));
  }
};

struct DecoderCase {
  const char* name;
  MhaCase mc;
  std::optional<RopeOptions> rope;
  QkNorm norm;
};

std::vector<DecoderCase> decoder_cases() {
  const RopeOptions llama3{.base = 500000.0,
                           .scaling = {.type = RopeScalingType::llama3,
                                       .factor = 8,
                                       .original_max_position = 64,
                                       .low_freq_factor = 1,
                                       .high_freq_factor = 4}};
  const RopeOptions yarn{
      .style = RopeStyle::interleaved,
      .scaling = {.type = RopeScalingType::yarn, .factor = 4, .original_max_position = 32}};
  return {
      {"rope half", MhaCase{64, 4, 2, 16, 0, true}, RopeOptions{}, QkNorm::none},
      {"rope interleaved partial, linear, qk-norm head", MhaCase{48, 4, 4, 12, 10, false},
       RopeOptions{.style = RopeStyle::interleaved,
                   .rotary_dim = 8,
                   .scaling = {.type = RopeScalingType::linear, .factor = 2}},
       QkNorm::head},
      {"llama3 GQA, qk-norm projection", MhaCase{64, 8, 2, 8, 0, true}, llama3, QkNorm::projection},
      {"yarn odd head_dim partial, qk-norm head", MhaCase{33, 3, 1, 11, 0, true},
       [&] {
         RopeOptions o = yarn;
         o.rotary_dim = 6;
         return o;
       }(),
       QkNorm::head},
      {"qk-norm head, no rope", MhaCase{40, 4, 2, 10, 12, true}, std::nullopt, QkNorm::head},
  };
}

TEST(MhaRope, SelfAttentionMatchesReference) {
  Context ctx(2);
  std::uint32_t seed = 300;
  for (const DecoderCase& dc : decoder_cases()) {
    const DecoderSetup s(dc.mc, dc.rope, dc.norm, ++seed);
    const MultiHeadAttention layer = s.layer();
    const MhaConfig& c = layer.config();
    for (std::int64_t B : {1, 2}) {
      for (std::int64_t L : {1, 13, 70}) {
        const auto x = random_floats(B * L * c.d_model, ++seed);
        for (Causal causal : {Causal::none, Causal::top_left}) {
          std::vector<float> out(B * L * c.d_model, 9.0f);
          AttentionOptions opts;
          opts.causal = causal;
          layer.forward(f32_view(x.data(), {B, L, c.d_model}),
                        f32_view(out.data(), {B, L, c.d_model}), opts, &ctx);
          const auto want = s.reference(x, B, L, x, L, causal);
          ASSERT_TRUE(all_close(out.data(), want.data(), out.size(), mha_atol(c, L), 0))
              << dc.name << " B=" << B << " L=" << L << " causal=" << int(causal);
        }
      }
    }
    if (!c.rope) {  // QK-norm alone serves cross attention too
      const std::int64_t B = 2, Lq = 5, Lk = 9;
      const auto xq = random_floats(B * Lq * c.d_model, ++seed);
      const auto xkv = random_floats(B * Lk * c.d_model, ++seed);
      std::vector<float> out(B * Lq * c.d_model);
      layer.forward_cross(f32_view(xq.data(), {B, Lq, c.d_model}),
                          f32_view(xkv.data(), {B, Lk, c.d_model}),
                          f32_view(out.data(), {B, Lq, c.d_model}), {}, &ctx);
      const auto want = s.reference(xq, B, Lq, xkv, Lk, Causal::none);
      ASSERT_TRUE(all_close(out.data(), want.data(), out.size(), mha_atol(c, Lk), 0))
          << dc.name << " cross";
    }
  }
}

// Explicit positions (position_ids): random, unordered and large, per sequence or one row for
// every sequence, against the reference rotated at those positions; 0 .. L-1 given explicitly is
// the implicit forward bit for bit.
TEST(MhaRope, ExplicitPositionsMatchTheReference) {
  Context ctx(2);
  std::uint32_t seed = 700;
  for (const DecoderCase& dc : decoder_cases()) {
    if (!dc.rope) continue;
    SCOPED_TRACE(dc.name);
    const DecoderSetup s(dc.mc, dc.rope, dc.norm, ++seed);
    const MultiHeadAttention layer = s.layer();
    const std::int64_t B = 2, L = 11, d = layer.config().d_model;
    const auto x = random_floats(B * L * d, ++seed);
    std::vector<std::int64_t> pos(B * L);
    for (std::size_t t = 0; t < pos.size(); ++t)
      pos[t] = static_cast<std::int64_t>((t * 7919) % 97) + 3000 * (t % 3);
    for (Causal causal : {Causal::none, Causal::top_left}) {
      AttentionOptions opts;
      opts.causal = causal;
      std::vector<float> out(x.size(), 9.0f);
      layer.forward(f32_view(x.data(), {B, L, d}),
                    TensorView::contiguous(pos.data(), DType::i64, {B, L}),
                    f32_view(out.data(), {B, L, d}), opts, &ctx);
      const auto want = s.reference(x, B, L, x, L, causal, &pos);
      ASSERT_TRUE(all_close(out.data(), want.data(), out.size(), mha_atol(s.cfg, L), 0))
          << "causal=" << int(causal);
      // The implicit positions differ: the check can tell.
      const auto implicit = s.reference(x, B, L, x, L, causal);
      EXPECT_FALSE(all_close(out.data(), implicit.data(), out.size(), mha_atol(s.cfg, L), 0));
    }
    // One int32 row [L] for every sequence equals it repeated as [B, L].
    std::vector<std::int32_t> row(L);
    std::vector<std::int64_t> rows(B * L);
    for (std::int64_t l = 0; l < L; ++l) row[l] = static_cast<std::int32_t>(40 + 3 * l);
    for (std::int64_t t = 0; t < B * L; ++t) rows[t] = row[t % L];
    std::vector<float> a(x.size()), b(x.size()), c(x.size()), e(x.size());
    layer.forward(f32_view(x.data(), {B, L, d}),
                  TensorView::contiguous(row.data(), DType::i32, {L}),
                  f32_view(a.data(), {B, L, d}), {}, &ctx);
    layer.forward(f32_view(x.data(), {B, L, d}),
                  TensorView::contiguous(rows.data(), DType::i64, {B, L}),
                  f32_view(b.data(), {B, L, d}), {}, &ctx);
    EXPECT_EQ(a, b);
    std::vector<std::int64_t> natural(B * L);
    for (std::int64_t t = 0; t < B * L; ++t) natural[t] = t % L;
    layer.forward(f32_view(x.data(), {B, L, d}),
                  TensorView::contiguous(natural.data(), DType::i64, {B, L}),
                  f32_view(c.data(), {B, L, d}), {}, &ctx);
    layer.forward(f32_view(x.data(), {B, L, d}), f32_view(e.data(), {B, L, d}), {}, &ctx);
    EXPECT_EQ(c, e);
  }
}

// A packed batch (forward_varlen), empty and one-token sequences among them, equals each sequence
// run alone against the reference: its own positions 0 .. n-1, or explicit ones.
TEST(MhaRope, ForwardVarlenEqualsEachSequenceAlone) {
  Context ctx(2);
  std::uint32_t seed = 800;
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const DecoderSetup s(dc.mc, dc.rope, dc.norm, ++seed);
    const MultiHeadAttention layer = s.layer();
    const std::int64_t d = layer.config().d_model;
    const std::vector<std::int64_t> lens = {5, 0, 13, 1, 8};
    std::vector<std::int32_t> cu = {0};
    for (std::int64_t n : lens) cu.push_back(cu.back() + static_cast<std::int32_t>(n));
    const std::int64_t T = cu.back();
    const auto x = random_floats(T * d, ++seed);
    std::vector<std::int64_t> pos(T);
    for (std::int64_t t = 0; t < T; ++t) pos[t] = 50 + 17 * t;
    for (bool explicit_pos : {false, true}) {
      if (explicit_pos && !dc.rope) continue;
      for (Causal causal : {Causal::none, Causal::top_left}) {
        AttentionOptions opts;
        opts.causal = causal;
        std::vector<float> out(T * d, 9.0f);
        const TensorView cuv =
            TensorView::contiguous(cu.data(), DType::i32, {std::int64_t(cu.size())});
        if (explicit_pos) {
          layer.forward_varlen(f32_view(x.data(), {T, d}), cuv,
                               TensorView::contiguous(pos.data(), DType::i64, {T}),
                               f32_view(out.data(), {T, d}), opts, &ctx);
        } else {
          layer.forward_varlen(f32_view(x.data(), {T, d}), cuv, f32_view(out.data(), {T, d}), opts,
                               &ctx);
        }
        for (std::size_t b = 0; b < lens.size(); ++b) {
          const std::int64_t n = lens[b], t0 = cu[b];
          if (n == 0) continue;
          const std::vector<float> xb(x.begin() + t0 * d, x.begin() + (t0 + n) * d);
          const std::vector<std::int64_t> pb(pos.begin() + t0, pos.begin() + t0 + n);
          const auto want = s.reference(xb, 1, n, xb, n, causal, explicit_pos ? &pb : nullptr);
          ASSERT_TRUE(all_close(out.data() + t0 * d, want.data(), n * d, mha_atol(s.cfg, n), 0))
              << "sequence " << b << " causal=" << int(causal) << " explicit=" << explicit_pos;
        }
      }
    }
  }
}

// Bad positions and offsets are Errors naming them and the shapes; out keeps its values.
TEST(MhaRope, BadPositionsAndOffsetsAreNamedErrors) {
  const DecoderSetup s(MhaCase{32, 4, 2, 8, 0, true}, RopeOptions{}, QkNorm::none, 900);
  const DecoderSetup plain(MhaCase{32, 4, 2, 8, 0, true}, std::nullopt, QkNorm::none, 901);
  const MultiHeadAttention layer = s.layer(), no_rope = plain.layer();
  const std::int64_t B = 2, L = 3, d = 32;
  const auto x = random_floats(B * L * d, 902);
  std::vector<float> out(B * L * d, 7.0f);
  const std::vector<float> before = out;
  auto expect = [&](const std::function<void()>& call, const std::vector<std::string>& words) {
    try {
      call();
      ADD_FAILURE() << "expected an Error naming " << words[0];
    } catch (const Error& e) {
      for (const std::string& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
    EXPECT_EQ(out, before);
  };
  std::vector<std::int64_t> good(B * L, 1), neg(B * L, 1);
  neg[4] = -1;
  std::vector<float> fpos(B * L);
  const TensorView xv = f32_view(x.data(), {B, L, d});
  const OutputView ov = f32_view(out.data(), {B, L, d});
  expect(
      [&] {
        no_rope.forward(xv, TensorView::contiguous(good.data(), DType::i64, {B, L}), ov);
      },
      {"positions", "MhaConfig::rope"});
  expect(
      [&] {
        layer.forward(xv, TensorView::contiguous(good.data(), DType::i64, {L, B}), ov);
      },
      {"positions [3,2]", "[2,3] or [3]", "x [2,3,32]"});
  expect(
      [&] {
        layer.forward(xv, TensorView::contiguous(neg.data(), DType::i64, {B, L}), ov);
      },
      {"positions[1,1] = -1"});
  expect(
      [&] {
        layer.forward(xv, TensorView::contiguous(fpos.data(), DType::f32, {B, L}), ov);
      },
      {"positions", "int32 or int64"});
  const std::vector<std::int64_t> cu_bad = {0, 4, 5};
  const TensorView x2 = f32_view(x.data(), {B * L, d});
  const OutputView o2 = f32_view(out.data(), {B * L, d});
  expect(
      [&] { layer.forward_varlen(x2, TensorView::contiguous(cu_bad.data(), DType::i64, {3}), o2); },
      {"cu_seqlens[2] = 5", "total_q = 6"});
  const std::vector<std::int64_t> cu = {0, 4, 6};
  expect(
      [&] {
        layer.forward_varlen(x2, TensorView::contiguous(cu.data(), DType::i64, {3}),
                             TensorView::contiguous(good.data(), DType::i64, {B, L}), o2);
      },
      {"positions [2,3]", "must be [6]"});
  expect([&] { layer.forward_varlen(xv, TensorView::contiguous(cu.data(), DType::i64, {3}), o2); },
         {"x", "rank"});
}

// GPT-J's interleaved pairs are NeoX's half-split pairs of a permuted head: the same layer with
// Wq's and Wk's columns permuted per head must give the same output.
TEST(MhaRope, InterleavedEqualsHalfSplitOnPermutedWeights) {
  const std::int64_t D = 16, R = 12;
  DecoderSetup half(MhaCase{64, 4, 2, D, 0, true}, RopeOptions{.rotary_dim = R}, QkNorm::none, 40);
  DecoderSetup inter = half;
  inter.cfg.rope->style = RopeStyle::interleaved;
  // Half-split dimension j < R/2 pairs with j + R/2; interleaved 2j pairs with 2j + 1.
  auto permute = [&](const std::vector<float>& w, std::vector<float>& to, std::int64_t rows,
                     std::int64_t heads) {
    const std::int64_t cols = heads * D;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t from = d >= R ? d : (d % 2 == 0 ? d / 2 : d / 2 + R / 2);
          to[r * cols + h * D + d] = w[r * cols + h * D + from];
        }
  };
  permute(half.wq, inter.wq, half.cfg.d_model, half.cfg.heads);
  permute(half.wk, inter.wk, half.cfg.d_model, half.cfg.kv_heads);
  permute(half.bq, inter.bq, 1, half.cfg.heads);
  permute(half.bk, inter.bk, 1, half.cfg.kv_heads);
  const std::int64_t B = 2, L = 21;
  const auto x = random_floats(B * L * 64, 41);
  std::vector<float> a(x.size()), b(x.size());
  AttentionOptions opts;
  opts.causal = Causal::top_left;
  half.layer().forward(f32_view(x.data(), {B, L, 64}), f32_view(a.data(), {B, L, 64}), opts);
  inter.layer().forward(f32_view(x.data(), {B, L, 64}), f32_view(b.data(), {B, L, 64}), opts);
  EXPECT_TRUE(all_close(b.data(), a.data(), a.size(), mha_atol(half.cfg, L), 0));
  // And the test can tell: unpermuted weights under the interleaved layout differ.
  DecoderSetup wrong = half;
  wrong.cfg.rope->style = RopeStyle::interleaved;
  wrong.layer().forward(f32_view(x.data(), {B, L, 64}), f32_view(b.data(), {B, L, 64}), opts);
  EXPECT_FALSE(all_close(b.data(), a.data(), a.size(), mha_atol(half.cfg, L), 0));
}

// Decoding token by token (and in chunks) with rotated, normalized keys gives the rows of one
// causal forward pass: positions follow the cache, contiguous or paged (each sequence its own).
TEST(MhaRope, DecodeEqualsCausalForward) {
  std::uint32_t seed = 500;
  for (const DecoderCase& dc : decoder_cases()) {
    SCOPED_TRACE(dc.name);
    const DecoderSetup s(dc.mc, dc.rope, dc.norm, ++seed);
    const MultiHeadAttention layer = s.layer();
    const MhaConfig& c = layer.config();
    const std::int64_t B = 2, T = 12, d = c.d_model;
    const auto x = random_floats(B * T * d, ++seed);
    std::vector<float> want(x.size());
    AttentionOptions causal;
    causal.causal = Causal::top_left;
    layer.forward(f32_view(x.data(), {B, T, d}), f32_view(want.data(), {B, T, d}), causal);
    auto slice = [&](std::int64_t b0, std::int64_t nb, std::int64_t pos, std::int64_t n) {
      TensorView xs = f32_view(x.data() + (b0 * T + pos) * d, {nb, n, d});
      xs.strides = {T * d, d, 1, 0};
      return xs;
    };
    auto expect_rows = [&](const std::vector<float>& out, std::int64_t b, std::int64_t row,
                           std::int64_t pos, std::int64_t n, const char* what) {
      ASSERT_TRUE(all_close(out.data() + row * n * d, want.data() + (b * T + pos) * d, n * d,
                            mha_atol(c, T), 0))
          << what << ": tokens [" << pos << ", " << pos + n << ") of sequence " << b;
    };
    for (bool growable : {false, true}) {
      KvCache cache = layer.make_cache(B, growable ? 2 : T, growable);
      std::int64_t pos = 0;
      for (std::int64_t n : {5, 1, 1, 2, 3}) {
        std::vector<float> out(B * n * d);
        layer.decode(slice(0, B, pos, n), cache, f32_view(out.data(), {B, n, d}));
        for (std::int64_t b = 0; b < B; ++b) expect_rows(out, b, b, pos, n, "contiguous");
        pos += n;
      }
    }
    // Paged: sequence 0 prefilled with 5 tokens, sequence 1 with 2, then steps of both together.
    PagedKvCache paged = layer.make_paged_cache(16, 4);
    const std::vector<std::int64_t> seqs = {paged.add_sequence(), paged.add_sequence()};
    std::int64_t len[2] = {5, 2};
    for (std::int64_t b = 0; b < B; ++b) {
      std::vector<float> out(len[b] * d);
      layer.decode(slice(b, 1, 0, len[b]), paged, {seqs[static_cast<std::size_t>(b)]},
                   f32_view(out.data(), {1, len[b], d}));
      expect_rows(out, b, 0, 0, len[b], "paged prefill");
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<float> out(B * d);
      // Sequence b's next token is row b * T + len[b] of x.
      TensorView xs = f32_view(x.data() + len[0] * d, {B, 1, d});
      xs.strides = {(T + len[1] - len[0]) * d, d, 1, 0};
      layer.decode(xs, paged, seqs, f32_view(out.data(), {B, 1, d}));
      for (std::int64_t b = 0; b < B; ++b) expect_rows(out, b, b, len[b], 1, "paged step");
      ++len[0];
      ++len[1];
    }
  }
}

// Keys are cached rotated whatever the cache stores: every dtype holds the f32 cache's keys,
// rounded (bf16, f16) or quantized (int8: within half a step of its scale).
TEST(MhaRope, CachesHoldRotatedKeysInEveryDtype) {
  const DecoderSetup s(MhaCase{48, 4, 2, 12, 0, true}, decoder_cases()[2].rope, QkNorm::head, 90);
  const MultiHeadAttention layer = s.layer();
  const std::int64_t B = 2, T = 7, d = 48, D = 12, Hkv = 2;
  const auto x = random_floats(B * T * d, 91);
  auto run = [&](DType dt) {
    KvCache cache = layer.make_cache(B, T, false, dt);
    std::vector<float> out(B * T * d);
    for (std::int64_t pos = 0; pos < T; ++pos) {
      TensorView xs = f32_view(x.data() + pos * d, {B, 1, d});
      xs.strides = {T * d, d, 1, 0};
      layer.decode(xs, cache, f32_view(out.data(), {B, 1, d}));
    }
    return cache;
  };
  const KvCache ref = run(DType::f32);
  const auto* want = static_cast<const float*>(ref.keys().data);
  for (DType dt : {DType::bf16, DType::f16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    const KvCache cache = run(dt);
    const TensorView keys = cache.keys();
    for (std::int64_t i = 0; i < B * Hkv * T * D; ++i) {
      const std::int64_t row = i / D;
      if (dt == DType::i8) {
        const float scale = static_cast<const float*>(cache.key_scales()->data)[row];
        const float got = static_cast<const std::int8_t*>(keys.data)[i] * scale;
        ASSERT_LE(std::abs(got - want[i]), 0.5f * scale * (1 + 1e-5f)) << "element " << i;
      } else {
        const std::uint16_t bits = static_cast<const std::uint16_t*>(keys.data)[i];
        ASSERT_EQ(bits, dt == DType::bf16 ? to_bf16(want[i]) : to_f16(want[i])) << "element " << i;
      }
    }
  }
}

TEST(MhaRope, BadConfigurationsAreNamedErrors) {
  const MhaCase mc{32, 4, 2, 8, 0, false};
  auto expect_error = [&](const std::function<void(DecoderSetup&, MhaWeights*)>& mutate,
                          const std::string& needle) {
    DecoderSetup s(mc, RopeOptions{}, QkNorm::head, 7);
    mutate(s, nullptr);
    try {
      (void)s.layer();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](DecoderSetup& s, MhaWeights*) { s.cfg.rope->rotary_dim = 5; },
               "rope.rotary_dim must be even");
  expect_error([](DecoderSetup& s, MhaWeights*) { s.cfg.rope->rotary_dim = 10; }, "head_dim=8");
  expect_error([](DecoderSetup& s, MhaWeights*) { s.cfg.rope->base = 1; }, "rope.base");
  expect_error(
      [](DecoderSetup& s, MhaWeights*) {
        s.cfg.rope->scaling = {.type = RopeScalingType::yarn, .factor = 0.5};
      },
      "rope.scaling.factor");
  expect_error([](DecoderSetup& s, MhaWeights*) { s.cfg.qk_norm_eps = 0; }, "qk_norm_eps");
  expect_error([](DecoderSetup& s, MhaWeights*) { s.kn.pop_back(); }, "k_norm [7] must be [8]");
  expect_error([](DecoderSetup& s, MhaWeights*) { s.cfg.qk_norm = QkNorm::projection; },
               "q_norm [8] must be [32]");
  // Norm weights without a norm, and a norm without weights.
  DecoderSetup s(mc, std::nullopt, QkNorm::head, 8);
  MhaWeights w{f32_view(s.wq.data(), {32, 32}), f32_view(s.wk.data(), {32, 16}),
               f32_view(s.wv.data(), {32, 16}), f32_view(s.wo.data(), {32, 32})};
  MhaConfig c = s.cfg;
  EXPECT_THROW(MultiHeadAttention(c, w), Error);  // qk_norm head, no q_norm
  c.qk_norm = QkNorm::none;
  w.q_norm = f32_view(s.qn.data(), {8});
  EXPECT_THROW(MultiHeadAttention(c, w), Error);  // q_norm without qk_norm
  // Cross attention has no positions for the rotation.
  const DecoderSetup r(mc, RopeOptions{}, QkNorm::none, 9);
  const MultiHeadAttention layer = r.layer();
  auto xq = random_floats(2 * 32, 10), xkv = random_floats(3 * 32, 11);
  std::vector<float> out(2 * 32, 4.0f);
  try {
    layer.forward_cross(f32_view(xq.data(), {1, 2, 32}), f32_view(xkv.data(), {1, 3, 32}),
                        f32_view(out.data(), {1, 2, 32}));
    ADD_FAILURE() << "forward_cross with rope must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MhaConfig::rope"), std::string::npos) << e.what();
  }
  for (float v : out) ASSERT_EQ(v, 4.0f);
}

// 16-bit x and out (a bf16 model's hidden states): the layer on the widened x, out rounded to
// nearest even, bit for bit, on every entry; x of rows with a gap between them (strided).
TEST(Mha16BitIo, EveryEntryIsTheF32LayerOnTheSameValuesRounded) {
  Context ctx(2);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto round16 = [&](float v) { return dt == DType::bf16 ? to_bf16(v) : to_f16(v); };
    const auto widen16 = [&](std::uint16_t b) {
      return dt == DType::bf16 ? from_bf16(b) : from_f16(b);
    };
    const DecoderCase dc = decoder_cases()[2];  // llama3 GQA, qk-norm over the projection
    const DecoderSetup s(dc.mc, dc.rope, dc.norm, 700);
    const MultiHeadAttention layer = s.layer();
    const std::int64_t B = 2, T = 9, d = layer.config().d_model, gap = 3;
    // x16: rows of d + gap values (a strided view); xf: the same values as f32, contiguous.
    std::vector<std::uint16_t> x16(static_cast<std::size_t>(B * T * (d + gap)), 0x7fff);
    std::vector<float> xf(static_cast<std::size_t>(B * T * d));
    const auto r = random_floats(xf.size(), 701);
    for (std::int64_t i = 0; i < B * T; ++i)
      for (std::int64_t j = 0; j < d; ++j) {
        x16[i * (d + gap) + j] = round16(r[i * d + j]);
        xf[i * d + j] = widen16(x16[i * (d + gap) + j]);
      }
    const auto x16_view = [&](std::int64_t row0, std::int64_t b, std::int64_t n) {
      TensorView v = TensorView::contiguous(x16.data() + row0 * (d + gap), dt, {b, n, d});
      v.strides = {T * (d + gap), d + gap, 1, 0};
      return v;
    };
    const auto xf_view = [&](std::int64_t row0, std::int64_t b, std::int64_t n) {
      TensorView v = f32_view(xf.data() + row0 * d, {b, n, d});
      v.strides = {T * d, d, 1, 0};
      return v;
    };
    const auto expect_rounded = [&](const std::vector<std::uint16_t>& got,
                                    const std::vector<float>& want, const char* what) {
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], round16(want[i]))
            << what << ": element " << i << " of " << want.size() << ", f32 layer " << want[i];
    };
    const auto n_out = static_cast<std::size_t>(B * T * d);
    std::vector<float> want(n_out), mixed(n_out);
    std::vector<std::uint16_t> got(n_out, 0xffff);
    AttentionOptions causal;
    causal.causal = Causal::top_left;

    layer.forward(xf_view(0, B, T), f32_view(want.data(), {B, T, d}), causal, &ctx);
    layer.forward(x16_view(0, B, T), OutputView::contiguous(got.data(), dt, {B, T, d}), causal,
                  &ctx);
    expect_rounded(got, want, "forward");
    layer.forward(x16_view(0, B, T), f32_view(mixed.data(), {B, T, d}), causal, &ctx);
    ASSERT_EQ(mixed, want) << "forward, 16-bit x, f32 out";

    // Packed: the B sequences back to back (rows of x16 are already in that order).
    const std::vector<std::int64_t> cu = {0, 4, B * T};
    const TensorView cuv = TensorView::contiguous(cu.data(), DType::i64, {3});
    TensorView x16_packed = TensorView::contiguous(x16.data(), dt, {B * T, d});
    x16_packed.strides = {d + gap, 1, 0, 0};
    layer.forward_varlen(f32_view(xf.data(), {B * T, d}), cuv, f32_view(want.data(), {B * T, d}),
                         causal, &ctx);
    layer.forward_varlen(x16_packed, cuv, OutputView::contiguous(got.data(), dt, {B * T, d}),
                         causal, &ctx);
    expect_rounded(got, want, "forward_varlen");

    // Decoding, 4 tokens then 1 then 1 (all cache dtypes take 16-bit x alike: the K/V rows are the
    // layer's f32 projections either way), contiguous and paged.
    KvCache c32 = layer.make_cache(B, T, false, DType::bf16),
            c16 = layer.make_cache(B, T, false, DType::bf16);
    PagedKvCache p32 = layer.make_paged_cache(8, 4), p16 = layer.make_paged_cache(8, 4);
    const std::vector<std::int64_t> s32 = {p32.add_sequence(), p32.add_sequence()},
                                    s16 = {p16.add_sequence(), p16.add_sequence()};
    std::int64_t pos = 0;
    for (std::int64_t n : {4, 1, 1}) {
      const auto m = static_cast<std::size_t>(B * n * d);
      std::vector<float> w(m);
      std::vector<std::uint16_t> g(m, 0xffff);
      layer.decode(xf_view(pos, B, n), c32, f32_view(w.data(), {B, n, d}), {}, &ctx);
      layer.decode(x16_view(pos, B, n), c16, OutputView::contiguous(g.data(), dt, {B, n, d}), {},
                   &ctx);
      expect_rounded(g, w, "decode");
      std::fill(g.begin(), g.end(), 0xffff);
      layer.decode(xf_view(pos, B, n), p32, s32, f32_view(w.data(), {B, n, d}), {}, &ctx);
      layer.decode(x16_view(pos, B, n), p16, s16, OutputView::contiguous(g.data(), dt, {B, n, d}),
                   {}, &ctx);
      expect_rounded(g, w, "paged decode");
      pos += n;
    }
  }
  // Cross-attention (a layer without rope), xq 16-bit and xkv f32.
  const DecoderCase dc = decoder_cases()[4];
  const DecoderSetup s(dc.mc, dc.rope, dc.norm, 710);
  const MultiHeadAttention layer = s.layer();
  const std::int64_t B = 2, Lq = 3, Lk = 7, d = layer.config().d_model;
  const auto xkv = random_floats(B * Lk * d, 711), r = random_floats(B * Lq * d, 712);
  std::vector<std::uint16_t> xq16(r.size());
  std::vector<float> xqf(r.size()), want(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) xqf[i] = from_bf16(xq16[i] = to_bf16(r[i]));
  std::vector<std::uint16_t> got(r.size());
  layer.forward_cross(f32_view(xqf.data(), {B, Lq, d}), f32_view(xkv.data(), {B, Lk, d}),
                      f32_view(want.data(), {B, Lq, d}), {}, &ctx);
  layer.forward_cross(TensorView::contiguous(xq16.data(), DType::bf16, {B, Lq, d}),
                      f32_view(xkv.data(), {B, Lk, d}),
                      OutputView::contiguous(got.data(), DType::bf16, {B, Lq, d}), {}, &ctx);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i], to_bf16(want[i])) << "forward_cross: element " << i;
  // Other dtypes are named errors that leave out as it was.
  std::vector<std::int8_t> x8(r.size(), 1);
  std::fill(got.begin(), got.end(), 0x1234);
  try {
    layer.forward(TensorView::contiguous(x8.data(), DType::i8, {B, Lq, d}),
                  OutputView::contiguous(got.data(), DType::bf16, {B, Lq, d}), {}, &ctx);
    FAIL() << "int8 x was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x [2,3,40] has dtype int8"), std::string::npos)
        << e.what();
  }
  for (std::uint16_t v : got) ASSERT_EQ(v, 0x1234);
}

}  // namespace
}  // namespace cpuattn::test
