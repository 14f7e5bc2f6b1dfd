// The reference implementation: the seed documents' worked examples (golden values) and the
// mathematical properties attention must have. The golden cases also run through the fast path.
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "test_util.h"

namespace cpuattn::test {
namespace {

using Mat = std::vector<std::vector<double>>;

struct Golden {
  std::vector<double> out;  // [Lq, Dv]
  std::vector<double> weights;
};

// Runs one [L, D] problem (B = H = 1) through the reference in f64 or through the fast path.
Golden run2d(const Mat& q, const Mat& k, const Mat& v, AttentionOptions opts, bool fast,
             const std::vector<std::uint8_t>* bool_mask = nullptr) {
  const std::int64_t Lq = q.size(), Lk = k.size(), D = q[0].size(), Dv = v[0].size();
  std::vector<double> qd, kd, vd;
  for (auto& r : q) qd.insert(qd.end(), r.begin(), r.end());
  for (auto& r : k) kd.insert(kd.end(), r.begin(), r.end());
  for (auto& r : v) vd.insert(vd.end(), r.begin(), r.end());
  if (bool_mask) opts.mask = TensorView::contiguous(bool_mask->data(), DType::boolean, {Lq, Lk});
  Golden g;
  if (!fast) {
    std::vector<double> out(Lq * Dv), w(Lq * Lk);
    opts.weights = OutputView::contiguous(w.data(), DType::f64, {1, 1, Lq, Lk});
    reference_attention(TensorView::contiguous(qd.data(), DType::f64, {1, 1, Lq, D}),
                        TensorView::contiguous(kd.data(), DType::f64, {1, 1, Lk, D}),
                        TensorView::contiguous(vd.data(), DType::f64, {1, 1, Lk, Dv}),
                        OutputView::contiguous(out.data(), DType::f64, {1, 1, Lq, Dv}), opts);
    g.out = out;
    g.weights = w;
  } else {
    std::vector<float> qf(qd.begin(), qd.end()), kf(kd.begin(), kd.end()), vf(vd.begin(), vd.end());
    std::vector<float> out(Lq * Dv);
    attention(f32_view(qf.data(), {1, 1, Lq, D}), f32_view(kf.data(), {1, 1, Lk, D}),
              f32_view(vf.data(), {1, 1, Lk, Dv}), f32_view(out.data(), {1, 1, Lq, Dv}), opts);
    g.out.assign(out.begin(), out.end());
  }
  return g;
}

void expect_near_vec(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "element " << i;
  }
}

class GoldenTest : public ::testing::TestWithParam<bool> {};  // param: fast path?

// Seed 000: causal self-attention with the article's tensors, scale 1/sqrt(3).
TEST_P(GoldenTest, Seed000CausalSelfAttention) {
  const bool fast = GetParam();
  const double tol = fast ? 1e-6 : 1e-9;
  const Mat q = {{1, 0, 0}, {0, 1, 0}}, k = {{1, 2, 3}, {4, 5, 6}}, v = {{0, 1, 0}, {1, 0, 1}};
  AttentionOptions causal;
  causal.causal = Causal::top_left;
  expect_near_vec(run2d(q, k, v, causal, fast).out,
                  {0, 1, 0, 0.8496745531, 0.1503254469, 0.8496745531}, tol);
  // The article's own mask: np.where(mask, dots, -1e9) with a lower-triangular boolean mask.
  const std::vector<std::uint8_t> tril = {1, 0, 1, 1};
  expect_near_vec(run2d(q, k, v, {}, fast, &tril).out,
                  {0, 1, 0, 0.8496745531, 0.1503254469, 0.8496745531}, tol);
  expect_near_vec(
      run2d(q, k, v, {}, fast).out,
      {0.8496745531, 0.1503254469, 0.8496745531, 0.8496745531, 0.1503254469, 0.8496745531}, tol);
}

// Seed 001: self-attention of four 3-d words, scale 1/sqrt(3).
TEST_P(GoldenTest, Seed001SelfAttention) {
  const bool fast = GetParam();
  const Mat Q = {{2, 0, 2}, {2, 0, 0}, {4, 0, 2}, {2, 1, 2}};
  const Mat K = {{2, 2, 2}, {0, 2, 1}, {2, 4, 3}, {0, 1, 1}};
  const Mat V = {{1, 1, 0}, {0, 1, 1}, {1, 2, 1}, {0, 0, 0}};
  expect_near_vec(
      run2d(Q, K, V, {}, fast).out,
      {0.9852202489, 1.74174051, 0.7565202611, 0.909652645, 1.409652645, 0.5, 0.99851226,
       1.7584933413, 0.7599810813, 0.9956038602, 1.9040730856, 0.9084692254},
      fast ? 1e-6 : 1e-9);
}

// Seed 002: the quiz (no scaling; temperature 0.01 picks the best-matching value).
TEST_P(GoldenTest, Seed002Quiz) {
  const bool fast = GetParam();
  const Mat s = {{0.4685, 0.9785}};
  const Mat kv = {{0.5539, 0.7239}, {0.4111, 0.3878}, {0.2376, 0.1264}};
  AttentionOptions no_scale;
  no_scale.scale = 1.0;
  const Golden g = run2d(s, kv, kv, no_scale, fast);
  expect_near_vec(g.out, {0.4386924863, 0.4855324097}, fast ? 1e-6 : 1e-9);
  if (!fast) expect_near_vec(g.weights, {0.46431725, 0.31255873, 0.22312402}, 1e-7);
  AttentionOptions cold;
  cold.scale = 1.0 / 0.01;
  expect_near_vec(run2d(s, kv, kv, cold, fast).out, {0.5539, 0.7239}, 1e-4);
}

// Seed 002: attention as a soft dictionary lookup.
TEST_P(GoldenTest, Seed002DictionaryLookup) {
  const bool fast = GetParam();
  const Mat keys = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}, values = {{2, 3}, {5, 7}, {3, 2}};
  AttentionOptions no_scale;
  no_scale.scale = 1.0;
  expect_near_vec(run2d({{0, 1, 0}}, keys, values, no_scale, fast).out,
                  {3.9402922119, 5.0925259814}, fast ? 1e-6 : 1e-9);
  AttentionOptions cold;
  cold.scale = 100.0;
  expect_near_vec(run2d({{0, 1, 0}}, keys, values, cold, fast).out, {5, 7}, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(ReferenceAndFast, GoldenTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "fast" : "reference"; });

// ---- Properties of the reference on random inputs ----

struct Problem4 {
  std::int64_t B = 2, H = 4, Hkv = 2, Lq = 5, Lk = 7, D = 6, Dv = 3;
  std::vector<double> q, k, v;
  explicit Problem4(std::uint32_t seed) {
    auto r = [&](std::size_t n, std::uint32_t s) {
      auto f = random_floats(n, s);
      return std::vector<double>(f.begin(), f.end());
    };
    q = r(B * H * Lq * D, seed);
    k = r(B * Hkv * Lk * D, seed + 1);
    v = r(B * Hkv * Lk * Dv, seed + 2);
  }
  std::vector<double> run(AttentionOptions opts = {}, std::vector<double>* weights = nullptr,
                          std::vector<double>* lse = nullptr) const {
    std::vector<double> out(B * H * Lq * Dv);
    if (weights) {
      weights->assign(B * H * Lq * Lk, 0);
      opts.weights = OutputView::contiguous(weights->data(), DType::f64, {B, H, Lq, Lk});
    }
    if (lse) {
      lse->assign(B * H * Lq, 0);
      opts.lse = OutputView::contiguous(lse->data(), DType::f64, {B, H, Lq});
    }
    reference_attention(TensorView::contiguous(q.data(), DType::f64, {B, H, Lq, D}),
                        TensorView::contiguous(k.data(), DType::f64, {B, Hkv, Lk, D}),
                        TensorView::contiguous(v.data(), DType::f64, {B, Hkv, Lk, Dv}),
                        OutputView::contiguous(out.data(), DType::f64, {B, H, Lq, Dv}), opts);
    return out;
  }
};

TEST(Reference, WeightRowsSumToOneAndMatchLse) {
  const Problem4 p(11);
  std::vector<double> w, lse;
  p.run({}, &w, &lse);
  for (std::int64_t row = 0; row < p.B * p.H * p.Lq; ++row) {
    double sum = 0;
    for (std::int64_t j = 0; j < p.Lk; ++j) sum += w[row * p.Lk + j];
    EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << row;
    EXPECT_TRUE(std::isfinite(lse[row]));
  }
  // lse is log sum exp of the scaled scores: check one row by hand.
  double s = 0;
  for (std::int64_t j = 0; j < p.Lk; ++j) {
    double dot = 0;
    for (std::int64_t d = 0; d < p.D; ++d) dot += p.q[d] * p.k[j * p.D + d];
    s += std::exp(dot / std::sqrt(double(p.D)));
  }
  EXPECT_NEAR(lse[0], std::log(s), 1e-12);
}

TEST(Reference, InvariantUnderKeyValuePermutation) {
  Problem4 p(21);
  const auto base = p.run();
  std::vector<std::int64_t> perm(p.Lk);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(perm.begin(), perm.end(), rng);
  Problem4 q = p;
  for (std::int64_t b = 0; b < p.B * p.Hkv; ++b) {
    for (std::int64_t j = 0; j < p.Lk; ++j) {
      for (std::int64_t d = 0; d < p.D; ++d)
        q.k[(b * p.Lk + j) * p.D + d] = p.k[(b * p.Lk + perm[j]) * p.D + d];
      for (std::int64_t d = 0; d < p.Dv; ++d)
        q.v[(b * p.Lk + j) * p.Dv + d] = p.v[(b * p.Lk + perm[j]) * p.Dv + d];
    }
  }
  const auto permuted = q.run();
  for (std::size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(base[i], permuted[i], 1e-12);
}

TEST(Reference, BoolMaskEqualsMinusInfMaskEqualsKeyLengths) {
  const Problem4 p(31);
  const std::vector<std::int64_t> lengths = {3, 6};
  std::vector<std::uint8_t> bmask(p.B * p.Lk);
  std::vector<double> amask(p.B * p.Lk);
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t j = 0; j < p.Lk; ++j) {
      bmask[b * p.Lk + j] = j < lengths[b];
      amask[b * p.Lk + j] = j < lengths[b] ? 0.0 : -std::numeric_limits<double>::infinity();
    }
  }
  AttentionOptions by_len, by_bool, by_add;
  by_len.key_lengths = TensorView::contiguous(lengths.data(), DType::i64, {p.B});
  // [B, 1, 1, Lk] broadcasts over heads and queries.
  by_bool.mask = TensorView::contiguous(bmask.data(), DType::boolean, {p.B, 1, 1, p.Lk});
  by_add.mask = TensorView::contiguous(amask.data(), DType::f64, {p.B, 1, 1, p.Lk});
  const auto a = p.run(by_len), b = p.run(by_bool), c = p.run(by_add);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_DOUBLE_EQ(a[i], b[i]);
    EXPECT_DOUBLE_EQ(a[i], c[i]);
  }
}

TEST(Reference, LowTemperatureSelectsBestMatchingValue) {
  const Problem4 p(41);
  AttentionOptions cold;
  cold.scale = 1e4;
  const auto out = p.run(cold);
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / (p.H / p.Hkv);
      for (std::int64_t i = 0; i < p.Lq; ++i) {
        std::int64_t best = 0;
        double best_dot = -1e300;
        for (std::int64_t j = 0; j < p.Lk; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < p.D; ++d) {
            dot += p.q[((b * p.H + h) * p.Lq + i) * p.D + d] *
                   p.k[((b * p.Hkv + hk) * p.Lk + j) * p.D + d];
          }
          if (dot > best_dot) best_dot = dot, best = j;
        }
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          EXPECT_NEAR(out[((b * p.H + h) * p.Lq + i) * p.Dv + d],
                      p.v[((b * p.Hkv + hk) * p.Lk + best) * p.Dv + d], 1e-6);
        }
      }
    }
  }
}

TEST(Reference, GroupedQueryEqualsRepeatedKvHeads) {
  const Problem4 p(51);  // H = 4, Hkv = 2
  Problem4 rep = p;
  rep.Hkv = p.H;
  rep.k.clear();
  rep.v.clear();
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / (p.H / p.Hkv);
      auto kb = p.k.begin() + ((b * p.Hkv + hk) * p.Lk) * p.D;
      auto vb = p.v.begin() + ((b * p.Hkv + hk) * p.Lk) * p.Dv;
      rep.k.insert(rep.k.end(), kb, kb + p.Lk * p.D);
      rep.v.insert(rep.v.end(), vb, vb + p.Lk * p.Dv);
    }
  }
  const auto a = p.run(), b = rep.run();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(a[i], b[i]);
}

TEST(Reference, CausalAlignmentsOnRectangularScores) {
  for (const auto& sizes : {std::pair<std::int64_t, std::int64_t>{3, 7}, {7, 3}}) {
    // Plain variables, not a structured binding: clang 14 cannot capture those in a lambda.
    const std::int64_t Lq = sizes.first, Lk = sizes.second;
    Problem4 p(61);
    p.Lq = Lq;
    p.Lk = Lk;
    p = [&] {
      Problem4 r(61);
      r.Lq = Lq;
      r.Lk = Lk;
      auto f = [](std::size_t n, std::uint32_t s) {
        auto x = random_floats(n, s);
        return std::vector<double>(x.begin(), x.end());
      };
      r.q = f(r.B * r.H * Lq * r.D, 1);
      r.k = f(r.B * r.Hkv * Lk * r.D, 2);
      r.v = f(r.B * r.Hkv * Lk * r.Dv, 3);
      return r;
    }();
    for (Causal c : {Causal::top_left, Causal::bottom_right}) {
      // The same mask spelled out as a boolean [Lq, Lk] tensor.
      std::vector<std::uint8_t> m(Lq * Lk);
      for (std::int64_t i = 0; i < Lq; ++i) {
        for (std::int64_t j = 0; j < Lk; ++j) {
          m[i * Lk + j] = c == Causal::top_left ? j <= i : j <= i + Lk - Lq;
        }
      }
      AttentionOptions by_flag, by_mask;
      by_flag.causal = c;
      by_mask.mask = TensorView::contiguous(m.data(), DType::boolean, {Lq, Lk});
      std::vector<double> lse;
      const auto a = p.run(by_flag, nullptr, &lse), b = p.run(by_mask);
      for (std::size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(a[i], b[i]);
      // Bottom-right with Lq > Lk leaves the first Lq - Lk queries with no key: 0 and -inf.
      if (c == Causal::bottom_right && Lq > Lk) {
        EXPECT_EQ(a[0], 0.0);
        EXPECT_EQ(lse[0], -std::numeric_limits<double>::infinity());
      }
    }
  }
}

TEST(Reference, FullyMaskedRowGivesZeroAndMinusInf) {
  const Problem4 p(71);
  const std::vector<std::int32_t> lengths = {0, 7};
  AttentionOptions opts;
  opts.key_lengths = TensorView::contiguous(lengths.data(), DType::i32, {p.B});
  std::vector<double> w, lse;
  const auto out = p.run(opts, &w, &lse);
  for (std::int64_t i = 0; i < p.H * p.Lq * p.Dv; ++i) EXPECT_EQ(out[i], 0.0);
  for (std::int64_t i = 0; i < p.H * p.Lq; ++i)
    EXPECT_EQ(lse[i], -std::numeric_limits<double>::infinity());
  for (std::int64_t i = 0; i < p.H * p.Lq * p.Lk; ++i) EXPECT_EQ(w[i], 0.0);
  // A finite -1e9 everywhere is arithmetic, not masking: the row averages V.
  std::vector<double> big(p.Lk, -1e9);
  AttentionOptions finite;
  finite.mask = TensorView::contiguous(big.data(), DType::f64, {p.Lk});
  std::vector<double> w2;
  p.run(finite, &w2);
  // Same as without the mask, since a constant shift cancels in the softmax.
  std::vector<double> w3;
  p.run({}, &w3);
  for (std::size_t i = 0; i < w2.size(); ++i) EXPECT_NEAR(w2[i], w3[i], 1e-6);
}

TEST(Reference, NanOnlyAffectsItsRow) {
  Problem4 p(81);
  p.q[0] = std::numeric_limits<double>::quiet_NaN();  // row (0, 0, 0)
  const auto out = p.run();
  for (std::int64_t d = 0; d < p.Dv; ++d) EXPECT_TRUE(std::isnan(out[d]));
  for (std::size_t i = p.Dv; i < out.size(); ++i) EXPECT_TRUE(std::isfinite(out[i])) << i;
}

}  // namespace
}  // namespace cpuattn::test
