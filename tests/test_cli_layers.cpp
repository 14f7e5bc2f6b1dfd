// End-to-end tests of `cpuattn run --kind additive|multiplicative` and `cpuattn mha`: the built
// binary (CPUATTN_CLI_PATH) on random .npy inputs, compared with double-precision computations
// done here (alignment models from their formulas; multi-head attention from double matmuls
// around the library's reference_attention).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "cpuattn/cpuattn.h"
#include "npy.h"
#include "test_util.h"

namespace {

namespace npy = cpuattn::npy;
using cpuattn::DType;
using cpuattn::cli_test::exists;
using cpuattn::cli_test::expect_values;
using cpuattn::cli_test::Result;
using cpuattn::cli_test::Shape;
using Vec = std::vector<double>;

const double kInf = std::numeric_limits<double>::infinity();

// Sizes: odd on purpose.
constexpr std::int64_t B = 2, Lq = 3, Lk = 5, Ddec = 7, Denc = 6, A = 4, Dv = 3;

Vec random_values(std::size_t n, std::uint32_t seed) {
  const std::vector<float> f = cpuattn::test::random_floats(n, seed);
  return Vec(f.begin(), f.end());  // exactly the float32 values written to the files
}

std::int64_t numel(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

// x [rows, K] W [K, N] (+ b [N]) in double.
Vec matmul(const Vec& x, const Vec& w, const Vec* b, std::int64_t rows, std::int64_t K,
           std::int64_t N) {
  Vec y(static_cast<std::size_t>(rows * N));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = b != nullptr ? (*b)[n] : 0.0;
      for (std::int64_t k = 0; k < K; ++k) acc += x[r * K + k] * w[k * N + n];
      y[r * N + n] = acc;
    }
  }
  return y;
}

// Attention of one head in double: weights_ij = softmax_j(score(b, i, j) + bias(b, i, j)) (a row
// that is -inf everywhere gives zeros), context_i = sum_j weights_ij values_j.
struct AlignResult {
  Vec context, weights;
};
AlignResult align_reference(
    std::int64_t nb, std::int64_t lq, std::int64_t lk, std::int64_t dv, const Vec& values,
    const std::function<double(std::int64_t, std::int64_t, std::int64_t)>& score,
    const std::function<double(std::int64_t, std::int64_t, std::int64_t)>& bias) {
  AlignResult r{Vec(static_cast<std::size_t>(nb * lq * dv)),
                Vec(static_cast<std::size_t>(nb * lq * lk))};
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t i = 0; i < lq; ++i) {
      Vec e(static_cast<std::size_t>(lk));
      double m = -kInf;
      for (std::int64_t j = 0; j < lk; ++j) {
        e[j] = score(b, i, j) + bias(b, i, j);
        m = std::max(m, e[j]);
      }
      if (m == -kInf) continue;  // fully masked: zeros
      double sum = 0;
      for (double& x : e) sum += (x = std::exp(x - m));
      for (std::int64_t j = 0; j < lk; ++j) {
        const double a = e[j] / sum;
        r.weights[(b * lq + i) * lk + j] = a;
        for (std::int64_t d = 0; d < dv; ++d) {
          r.context[(b * lq + i) * dv + d] += a * values[(b * lk + j) * dv + d];
        }
      }
    }
  }
  return r;
}

double no_bias(std::int64_t, std::int64_t, std::int64_t) { return 0.0; }

// Every row of a [.., L] float32 array sums to 1 (or is all zero when `allow_zero`).
void expect_rows_sum_to_one(const npy::Array& w, bool allow_zero = false) {
  const std::vector<float> v = npy::values<float>(w);
  const std::int64_t n = w.shape.back();
  for (std::size_t r = 0; r < v.size() / n; ++r) {
    double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += v[r * n + j];
    if (allow_zero && sum == 0) continue;
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
  }
}

class CliLayers : public cpuattn::cli_test::CliTest {
 protected:
  // Random float32 values of `shape` written to <name>; returns them as doubles.
  Vec put_random(const std::string& name, const Shape& shape, std::uint32_t seed) {
    const Vec v = random_values(static_cast<std::size_t>(numel(shape)), seed);
    put(name, npy::from_values(shape, std::vector<float>(v.begin(), v.end())));
    return v;
  }
  // Expects a failing run (see run_bad) whose message contains `needle`, and no weights file.
  void expect_bad(const std::string& args, const std::string& needle) {
    std::remove(path("w.npy").c_str());
    const std::string err = run_bad(args);
    EXPECT_NE(err.find(needle), std::string::npos)
        << "cpuattn " << subcommand_ << args << "\nstderr lacks '" << needle << "': " << err;
    EXPECT_FALSE(exists(path("w.npy"))) << args;
  }
};

// ---- Additive and multiplicative attention -------------------------------------------------

class CliAlign : public CliLayers {
 protected:
  void SetUp() override {
    CliLayers::SetUp();
    h = put_random("h.npy", {B, Lq, Ddec}, 1);
    s = put_random("s.npy", {B, Lk, Denc}, 2);
    w1 = put_random("w1.npy", {Ddec, A}, 3);
    w2 = put_random("w2.npy", {Denc, A}, 4);
    va = put_random("va.npy", {A}, 5);
    b1 = put_random("b1.npy", {A}, 6);
    b2 = put_random("b2.npy", {A}, 7);
    w = put_random("wm.npy", {Ddec, Denc}, 8);
    vals = put_random("vals.npy", {B, Lk, Dv}, 9);
  }

  // v^T tanh(W1 h_i + b1 + W2 s_j + b2) for batches of `nb`.
  std::function<double(std::int64_t, std::int64_t, std::int64_t)> additive_score(
      bool biases, std::int64_t nb = B) const {
    auto e1 = std::make_shared<Vec>(matmul(h, w1, biases ? &b1 : nullptr, nb * Lq, Ddec, A));
    auto e2 = std::make_shared<Vec>(matmul(s, w2, biases ? &b2 : nullptr, nb * Lk, Denc, A));
    return [this, e1, e2](std::int64_t b, std::int64_t i, std::int64_t j) {
      double acc = 0;
      for (std::int64_t a = 0; a < A; ++a) {
        acc += va[a] * std::tanh((*e1)[(b * Lq + i) * A + a] + (*e2)[(b * Lk + j) * A + a]);
      }
      return acc;
    };
  }
  // h_i^T W s_j * scale.
  std::function<double(std::int64_t, std::int64_t, std::int64_t)> multiplicative_score(
      double scale) const {
    auto g = std::make_shared<Vec>(matmul(h, w, nullptr, B * Lq, Ddec, Denc));
    return [this, g, scale](std::int64_t b, std::int64_t i, std::int64_t j) {
      double acc = 0;
      for (std::int64_t d = 0; d < Denc; ++d) {
        acc += (*g)[(b * Lq + i) * Denc + d] * s[(b * Lk + j) * Denc + d];
      }
      return acc * scale;
    };
  }

  Vec h, s, w1, w2, va, b1, b2, w, vals;
  const std::string additive =
      "--kind additive --h h.npy --s s.npy --w1 w1.npy --w2 w2.npy --va va.npy --out out.npy";
  const std::string multiplicative =
      "--kind multiplicative --h h.npy --s s.npy --w wm.npy "
      "--out out.npy";
};

TEST_F(CliAlign, AdditiveMatchesDouble) {
  const AlignResult ref = align_reference(B, Lq, Lk, Denc, s, additive_score(true), no_bias);
  expect_values(run_ok(additive + " --b1 b1.npy --b2 b2.npy --weights w.npy"), {B, Lq, Denc},
                ref.context, 1e-4, 1e-5);
  const npy::Array weights = get("w.npy");
  expect_values(weights, {B, Lq, Lk}, ref.weights, 1e-4, 1e-5);
  expect_rows_sum_to_one(weights);
  // Without biases; the thread count does not change the result.
  const AlignResult nob = align_reference(B, Lq, Lk, Denc, s, additive_score(false), no_bias);
  const npy::Array one = run_ok(additive + " --threads 1");
  expect_values(one, {B, Lq, Denc}, nob.context, 1e-4, 1e-5);
  EXPECT_EQ(run_ok(additive + " --threads 2").data, one.data);
}

TEST_F(CliAlign, AdditiveValuesMaskAndKeyLengths) {
  // Bool mask [B, Lq, Lk] with one fully masked row (batch 1, row 2), key lengths {5, 3}.
  std::vector<bool> m(static_cast<std::size_t>(B * Lq * Lk));
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = (i % 3) != 1;
  for (std::int64_t j = 0; j < Lk; ++j) m[(1 * Lq + 2) * Lk + j] = false;
  put("mask.npy", npy::from_values<bool>({B, Lq, Lk}, m));
  put("len.npy", npy::from_values<std::int32_t>({B}, {5, 3}));
  const std::vector<std::int64_t> lens = {5, 3};
  const AlignResult ref =
      align_reference(B, Lq, Lk, Dv, vals, additive_score(false),
                      [&](std::int64_t b, std::int64_t i, std::int64_t j) {
                        return m[(b * Lq + i) * Lk + j] && j < lens[b] ? 0.0 : -kInf;
                      });
  expect_values(
      run_ok(additive + " --values vals.npy --mask mask.npy --key-lengths len.npy --weights w.npy"),
      {B, Lq, Dv}, ref.context, 1e-4, 1e-5);
  expect_values(get("w.npy"), {B, Lq, Lk}, ref.weights, 1e-4, 1e-5);
  expect_rows_sum_to_one(get("w.npy"), /*allow_zero=*/true);
}

TEST_F(CliAlign, RankTwoInputsHaveNoBatchAxis) {
  // Batch 0 of h and s as [L, F], float64 on disk (converted to float32).
  const Vec h0(h.begin(), h.begin() + Lq * Ddec), s0(s.begin(), s.begin() + Lk * Denc);
  put("h2.npy", npy::from_values<double>({Lq, Ddec}, h0));
  put("s2.npy", npy::from_values<double>({Lk, Denc}, s0));
  const AlignResult ref = align_reference(1, Lq, Lk, Denc, s, additive_score(false, 1), no_bias);
  expect_values(run_ok("--kind additive --h h2.npy --s s2.npy --w1 w1.npy --w2 w2.npy --va va.npy "
                       "--out out.npy --weights w.npy"),
                {Lq, Denc}, ref.context, 1e-4, 1e-5);
  expect_values(get("w.npy"), {Lq, Lk}, ref.weights, 1e-4, 1e-5);
  const AlignResult mref = align_reference(1, Lq, Lk, Denc, s, multiplicative_score(1.0), no_bias);
  expect_values(run_ok("--kind multiplicative --h h2.npy --s s2.npy --w wm.npy --unscaled "
                       "--out out.npy"),
                {Lq, Denc}, mref.context, 1e-5, 1e-6);
}

TEST_F(CliAlign, MultiplicativeMatchesDouble) {
  const AlignResult ref = align_reference(
      B, Lq, Lk, Denc, s, multiplicative_score(1.0 / std::sqrt(double(Ddec))), no_bias);
  expect_values(run_ok(multiplicative + " --weights w.npy"), {B, Lq, Denc}, ref.context, 1e-5,
                1e-6);
  expect_values(get("w.npy"), {B, Lq, Lk}, ref.weights, 1e-5, 1e-6);
  expect_rows_sum_to_one(get("w.npy"));
  const AlignResult unscaled =
      align_reference(B, Lq, Lk, Denc, s, multiplicative_score(1.0), no_bias);
  expect_values(run_ok(multiplicative + " --unscaled"), {B, Lq, Denc}, unscaled.context, 1e-5,
                1e-6);
}

TEST_F(CliAlign, MultiplicativeFloatMaskBroadcastAndValues) {
  // An additive float32 mask [Lq, Lk] broadcast over the batch, with -inf entries.
  Vec m = random_values(static_cast<std::size_t>(Lq * Lk), 10);
  m[1] = m[Lk + 3] = -kInf;
  put("mask.npy", npy::from_values<float>({Lq, Lk}, std::vector<float>(m.begin(), m.end())));
  const AlignResult ref =
      align_reference(B, Lq, Lk, Dv, vals, multiplicative_score(1.0 / std::sqrt(double(Ddec))),
                      [&](std::int64_t, std::int64_t i, std::int64_t j) { return m[i * Lk + j]; });
  expect_values(run_ok(multiplicative + " --values vals.npy --mask mask.npy --weights w.npy"),
                {B, Lq, Dv}, ref.context, 1e-5, 1e-6);
  expect_values(get("w.npy"), {B, Lq, Lk}, ref.weights, 1e-5, 1e-6);
}

TEST_F(CliAlign, BadInputs) {
  const std::string add_w = additive + " --weights w.npy";
  // Options of another kind, missing required options.
  expect_bad(add_w + " --q h.npy", "--q");
  expect_bad(add_w + " --scale 2", "--scale");
  expect_bad(add_w + " --w wm.npy", "--w ");
  expect_bad(multiplicative + " --va va.npy", "--va");
  expect_bad(multiplicative + " --b1 b1.npy", "--b1");
  expect_bad("--q h.npy --k s.npy --v s.npy --out out.npy --w1 w1.npy", "--w1");
  expect_bad("--q h.npy --k s.npy --v s.npy --out out.npy --unscaled", "--unscaled");
  expect_bad("--kind additive --h h.npy --s s.npy --w1 w1.npy --va va.npy --out out.npy", "--w2");
  expect_bad("--kind multiplicative --h h.npy --w wm.npy --out out.npy", "--s");
  expect_bad("--kind luong " + multiplicative.substr(22), "luong");
  // Wrong shapes.
  put_random("w1_8.npy", {Ddec + 1, A}, 20);
  expect_bad(
      "--kind additive --h h.npy --s s.npy --w1 w1_8.npy --w2 w2.npy --va va.npy "
      "--out out.npy",
      "decoder width");
  put_random("w2_5.npy", {Denc, A + 1}, 21);
  expect_bad(
      "--kind additive --h h.npy --s s.npy --w1 w1.npy --w2 w2_5.npy --va va.npy "
      "--out out.npy",
      "w2");
  put_random("va3.npy", {A - 1}, 22);
  expect_bad(
      "--kind additive --h h.npy --s s.npy --w1 w1.npy --w2 w2.npy --va va3.npy "
      "--out out.npy",
      "v");
  expect_bad(
      "--kind additive --h h.npy --s s.npy --w1 va.npy --w2 w2.npy --va va.npy "
      "--out out.npy",
      "W1");
  put_random("s1.npy", {1, Lk, Denc}, 23);
  expect_bad("--kind multiplicative --h h.npy --s s1.npy --w wm.npy --out out.npy", "s ");
  put_random("s2.npy", {Lk, Denc}, 24);
  expect_bad("--kind multiplicative --h h.npy --s s2.npy --w wm.npy --out out.npy", "same rank");
  put_random("h4.npy", {1, B, Lq, Ddec}, 25);
  expect_bad("--kind multiplicative --h h4.npy --s s.npy --w wm.npy --out out.npy", "H (h4.npy)");
  put_random("vals4.npy", {B, Lk + 1, Dv}, 26);
  expect_bad(multiplicative + " --values vals4.npy", "values");
  // Masks and key lengths.
  put("mask_bad.npy", npy::from_values<bool>({Lq, Lq}, std::vector<bool>(Lq * Lq, true)));
  expect_bad(multiplicative + " --mask mask_bad.npy", "mask");
  expect_bad(add_w + " --mask causal", "causal");
  put("len_bad.npy", npy::from_values<std::int32_t>({3}, {1, 2, 3}));
  expect_bad(add_w + " --key-lengths len_bad.npy", "key lengths");
  put("len_big.npy", npy::from_values<std::int32_t>({B}, {1, Lk + 1}));
  expect_bad(add_w + " --key-lengths len_big.npy", "key_lengths");
  // Same file twice.
  expect_bad(additive + " --weights out.npy", "same file");
}

// ---- Multi-head attention ------------------------------------------------------------------

// d_model 7, 2 query heads of head_dim 3 sharing 1 key/value head of value_dim 2.
constexpr std::int64_t L = 5, Lx = 4, Dm = 7, H = 2, Hkv = 1, Dh = 3, Dvh = 2;

class CliMha : public CliLayers {
 protected:
  void SetUp() override {
    CliLayers::SetUp();
    subcommand_ = "mha ";
    x = put_random("x.npy", {B, L, Dm}, 31);
    xkv = put_random("xkv.npy", {B, Lx, Dm}, 32);
    wq = put_random("wq.npy", {Dm, H * Dh}, 33);
    wk = put_random("wk.npy", {Dm, Hkv * Dh}, 34);
    wv = put_random("wv.npy", {Dm, Hkv * Dvh}, 35);
    wo = put_random("wo.npy", {H * Dvh, Dm}, 36);
    bq = put_random("bq.npy", {H * Dh}, 37);
    bk = put_random("bk.npy", {Hkv * Dh}, 38);
    bv = put_random("bv.npy", {Hkv * Dvh}, 39);
    bo = put_random("bo.npy", {Dm}, 40);
  }

  struct MhaResult {
    Vec out, weights;
  };
  // The layer in double: projections by matmul, attention by cpuattn::reference_attention.
  MhaResult reference(const Vec& xq, std::int64_t nb, std::int64_t lq, const Vec& xk,
                      std::int64_t lk, bool biases, const cpuattn::AttentionOptions& base) const {
    const Vec q = matmul(xq, wq, biases ? &bq : nullptr, nb * lq, Dm, H * Dh);
    const Vec k = matmul(xk, wk, biases ? &bk : nullptr, nb * lk, Dm, Hkv * Dh);
    const Vec v = matmul(xk, wv, biases ? &bv : nullptr, nb * lk, Dm, Hkv * Dvh);
    Vec a(static_cast<std::size_t>(nb * lq * H * Dvh));
    MhaResult r;
    r.weights.resize(static_cast<std::size_t>(nb * H * lq * lk));
    using cpuattn::OutputView;
    using cpuattn::TensorView;
    cpuattn::AttentionOptions opts = base;
    opts.weights = OutputView::contiguous(r.weights.data(), DType::f64, {nb, H, lq, lk});
    cpuattn::reference_attention(TensorView::blhd(q.data(), DType::f64, nb, lq, H, Dh),
                                 TensorView::blhd(k.data(), DType::f64, nb, lk, Hkv, Dh),
                                 TensorView::blhd(v.data(), DType::f64, nb, lk, Hkv, Dvh),
                                 OutputView::blhd(a.data(), DType::f64, nb, lq, H, Dvh), opts);
    r.out = matmul(a, wo, biases ? &bo : nullptr, nb * lq, H * Dvh, Dm);
    return r;
  }

  Vec x, xkv, wq, wk, wv, wo, bq, bk, bv, bo;
  const std::string layer =
      "--x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 2 --kv-heads 1";
  const std::string biases = " --bq bq.npy --bk bk.npy --bv bv.npy --bo bo.npy";
};

TEST_F(CliMha, SelfAttentionMatchesReference) {
  const MhaResult ref = reference(x, B, L, x, L, true, {});
  expect_values(run_ok(layer + biases + " --out out.npy --weights w.npy"), {B, L, Dm}, ref.out,
                1e-4, 1e-5);
  const npy::Array weights = get("w.npy");
  expect_values(weights, {B, H, L, L}, ref.weights, 1e-4, 1e-6);
  expect_rows_sum_to_one(weights);
  // No biases, 1 vs 2 threads.
  const MhaResult nob = reference(x, B, L, x, L, false, {});
  const npy::Array one = run_ok(layer + " --out out.npy --threads 1");
  expect_values(one, {B, L, Dm}, nob.out, 1e-4, 1e-5);
  EXPECT_EQ(run_ok(layer + " --out out.npy --threads 2").data, one.data);
}

TEST_F(CliMha, CausalEqualsIncrementalDecoding) {
  cpuattn::AttentionOptions causal;
  causal.causal = cpuattn::Causal::top_left;
  const MhaResult ref = reference(x, B, L, x, L, true, causal);
  const npy::Array full = run_ok(layer + biases + " --causal --out out.npy --weights w.npy");
  expect_values(full, {B, L, Dm}, ref.out, 1e-4, 1e-5);
  const npy::Array full_w = get("w.npy");
  expect_values(full_w, {B, H, L, L}, ref.weights, 1e-4, 1e-6);
  const std::vector<float> fo = npy::values<float>(full), fw = npy::values<float>(full_w);
  for (const char* steps : {"1", "2", "5", "9"}) {
    SCOPED_TRACE(std::string("--decode-steps ") + steps);
    expect_values(run_ok(layer + biases + " --out out.npy --weights w.npy --decode-steps " + steps),
                  {B, L, Dm}, Vec(fo.begin(), fo.end()), 1e-5, 1e-6);
    expect_values(get("w.npy"), {B, H, L, L}, Vec(fw.begin(), fw.end()), 1e-5, 1e-6);
  }
  // With key lengths, on rank-2 input (no batch axis).
  put("x2.npy",
      npy::from_values<float>({L, Dm}, std::vector<float>(x.begin(), x.begin() + L * Dm)));
  put("len.npy", npy::from_values<std::int64_t>({1}, {3}));
  cpuattn::AttentionOptions causal_len = causal;
  const std::int64_t len3[] = {3};
  causal_len.key_lengths = cpuattn::TensorView::contiguous(len3, DType::i64, {1});
  const MhaResult ref2 = reference(x, 1, L, x, L, false, causal_len);
  const std::string layer2 =
      "--x x2.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads "
      "2 --kv-heads 1 --key-lengths len.npy --out out.npy";
  expect_values(run_ok(layer2 + " --causal --weights w.npy"), {L, Dm}, ref2.out, 1e-4, 1e-5);
  expect_values(get("w.npy"), {H, L, L}, ref2.weights, 1e-4, 1e-6);
  expect_values(run_ok(layer2 + " --decode-steps 1"), {L, Dm}, ref2.out, 1e-4, 1e-5);
  expect_values(run_ok(layer2 + " --decode-steps 2"), {L, Dm}, ref2.out, 1e-4, 1e-5);
  // Reduced-precision caches: the cached K/V are rounded (bf16: 2^-8 relative, int8: 1/254 of a
  // token's largest value), so the output moves by about that much.
  expect_values(run_ok(layer2 + " --decode-steps 2 --cache-dtype f16"), {L, Dm}, ref2.out, 2e-3,
                2e-3);
  expect_values(run_ok(layer2 + " --decode-steps 1 --cache-dtype bf16"), {L, Dm}, ref2.out, 2e-2,
                2e-2);
  expect_values(run_ok(layer2 + " --decode-steps 3 --cache-dtype int8"), {L, Dm}, ref2.out, 3e-2,
                3e-2);
  run_bad(layer2 + " --cache-dtype bf16");
}

TEST_F(CliMha, CrossAttention) {
  put("len.npy", npy::from_values<std::int32_t>({B}, {4, 2}));
  const std::int32_t lens[] = {4, 2};
  cpuattn::AttentionOptions opts;
  opts.key_lengths = cpuattn::TensorView::contiguous(lens, DType::i32, {B});
  const MhaResult ref = reference(x, B, L, xkv, Lx, true, opts);
  expect_values(
      run_ok(layer + biases + " --xkv xkv.npy --key-lengths len.npy --out out.npy --weights w.npy"),
      {B, L, Dm}, ref.out, 1e-4, 1e-5);
  expect_values(get("w.npy"), {B, H, L, Lx}, ref.weights, 1e-4, 1e-6);
  expect_rows_sum_to_one(get("w.npy"));
  // Equal heads (kv-heads defaults to heads) needs Wk, Wv of H heads.
  put_random("wk2.npy", {Dm, H * Dh}, 41);
  put_random("wv2.npy", {Dm, H * Dvh}, 42);
  const npy::Array out = run_ok(
      "--x x.npy --xkv xkv.npy --wq wq.npy --wk wk2.npy --wv wv2.npy --wo wo.npy --heads 2 "
      "--out out.npy");
  EXPECT_EQ(out.shape, (Shape{B, L, Dm}));
}

TEST_F(CliMha, BadInputs) {
  const std::string ok = layer + " --out out.npy --weights w.npy";
  expect_bad("--x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --out out.npy", "--heads");
  expect_bad("--x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --heads 2 --out out.npy", "--wo");
  expect_bad(layer, "--out");
  expect_bad(ok + " --kind additive", "--kind");
  expect_bad(ok + " --decode-steps 1 --xkv xkv.npy", "--xkv");
  expect_bad(ok + " --decode-steps 0", "--decode-steps");
  // Shapes.
  expect_bad(
      "--x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 4 --kv-heads 1 "
      "--out out.npy",
      "WQ");
  expect_bad("--x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 2 --out out.npy",
             "wk");
  expect_bad(
      "--x x.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 2 --kv-heads 3 "
      "--out out.npy",
      "--kv-heads 3");
  put_random("x8.npy", {B, L, Dm + 1}, 50);
  expect_bad(
      "--x x8.npy --wq wq.npy --wk wk.npy --wv wv.npy --wo wo.npy --heads 2 --kv-heads 1 "
      "--out out.npy",
      "wq");
  put_random("xkv1.npy", {1, Lx, Dm}, 51);
  expect_bad(ok + " --xkv xkv1.npy", "xkv");
  put_random("xkv2.npy", {Lx, Dm}, 52);
  expect_bad(ok + " --xkv xkv2.npy", "same rank");
  expect_bad(ok + " --bq bo.npy", "bq");
  expect_bad(ok + " --bo wo.npy", "bo");
  put("len.npy", npy::from_values<std::int32_t>({1}, {2}));
  expect_bad(ok + " --key-lengths len.npy", "key lengths");
  put("len9.npy", npy::from_values<std::int32_t>({B}, {2, 9}));
  expect_bad(ok + " --key-lengths len9.npy --decode-steps 2", "key lengths");
  expect_bad(ok + " --key-lengths len9.npy", "key_lengths");
  expect_bad(layer + " --out out.npy --weights out.npy", "same file");
}

TEST_F(CliMha, Help) {
  const Result r = run("mha --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* option :
       {"--x", "--xkv", "--wq", "--wk", "--wv", "--wo", "--bq", "--bo", "--heads", "--kv-heads",
        "--causal", "--decode-steps", "--key-lengths", "--out", "--weights", "--threads"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << "mha --help lacks " << option;
  }
  const Result run_help = run("run --help");
  for (const char* option :
       {"--kind", "--h", "--s", "--w1", "--w2", "--va", "--b1", "--b2", "--values", "--unscaled"}) {
    EXPECT_NE(run_help.out.find(option), std::string::npos) << "run --help lacks " << option;
  }
}

}  // namespace
