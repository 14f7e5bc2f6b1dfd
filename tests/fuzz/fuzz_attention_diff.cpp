// Differential: the fused fast path (attention, f32) against the double-precision reference
// (reference_attention, f64 outputs) on small random problems: GQA, causal alignments, boolean
// and additive masks with broadcasting, key lengths, strided views into larger buffers, values
// scaled from tiny to huge with NaN, +-Inf, denormals and 1e30 planted where the fuzzer says,
// on every SIMD target this CPU has and one or two threads.
//
// Agreement, row by row (out [Dv] and lse of one query row):
//  * every key masked: out exactly 0 and lse -inf (docs/api.md, "Semantics"), whatever the masked
//    keys hold;
//  * otherwise NaN where the reference has NaN and nowhere else, the same infinities, and finite
//    values within the test suite's tolerance (tests/test_fast.cpp, check_case):
//      out: |got - want| <= 8 eps (sqrt(Lk) + sqrt(D) score_mag) + 1e-6
//      lse: |got - want| <= 8 eps (sqrt(D) score_mag + log(Lk) + 8) + 4 eps |want|
//    where the suite's inputs lie in [-1, 1]. Here they do not, so the bound is stated for the
//    row's actual data: out scales with the largest |V| the row can see (the output is linear in
//    V), and score_mag is the larger of the suite's magnitude (3 sqrt(D) scale |q|max |k|max,
//    three sigmas of a random dot product) and the exact bound scale * sum_d |q_d k_d| (fuzzed
//    vectors can align), plus the largest |additive mask|, as the suite adds its mask bound 3.
//    Sub-normal outputs get one f32 sub-normal step per key on top: f32 cannot round finer.
// Rows whose finite data would overflow f32 somewhere along the way (|terms| > 2^100), or whose
// scores f32 rounds by more than 16 log2 units, are only run, not compared: the fast path is f32
// by contract and the reference is not.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attention_problem.h"
#include "cpuattn/cpuattn.h"
#include "fuzz_contexts.h"
#include "fuzz_util.h"

namespace cpuattn::fuzz {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();
constexpr double kHuge = 0x1p100;  // beyond this, a row's f32 arithmetic may overflow
constexpr double kLog2e = 1.4426950408889634;

// A tensor's elements as dense doubles [n0][n1][n2][n3], for the oracle's loops.
struct Dense {
  std::int64_t n[4];
  std::vector<double> x;
  explicit Dense(Tensor& t) : n{t.n[0], t.n[1], t.n[2], t.n[3]} {
    x.reserve(static_cast<std::size_t>(n[0] * n[1] * n[2] * n[3]));
    for (std::int64_t a = 0; a < n[0]; ++a)
      for (std::int64_t b = 0; b < n[1]; ++b)
        for (std::int64_t c = 0; c < n[2]; ++c)
          for (std::int64_t d = 0; d < n[3]; ++d) x.push_back(t.at(a, b, c, d));
  }
  const double* row(std::int64_t a, std::int64_t b, std::int64_t c) const {
    return &x[static_cast<std::size_t>(((a * n[1] + b) * n[2] + c) * n[3])];
  }
};

// What the comparison of one query row needs to know.
struct RowInfo {
  bool any_visible = false;              // some key is attended
  bool nonfinite = false;                // a NaN or Inf in Q, K, V or the mask reaches the row
  bool in_range = true;                  // its finite data stays far inside f32's range
  bool f32_blind = false;                // beyond f32: see analyze
  std::vector<std::int64_t> blind_cols;  // output columns f32 weights cannot resolve
  double score_mag = 0, vmax = 0;        // for the tolerance
};

// Analyzes row (b, h, i) against the reference's weights `w` (Lk of them).
RowInfo analyze(const Problem& p, const Dense& q, const Dense& k, const Dense& v, const double* w,
                std::int64_t b, std::int64_t h, std::int64_t i, double scale) {
  RowInfo r;
  const std::int64_t hk = h / (p.H / p.Hkv);
  const double* qr = q.row(b, h, i);
  double qmax = 0, kmax = 0, exact = 0, mask_mag = 0;
  for (std::int64_t d = 0; d < p.D; ++d) {
    if (std::isfinite(qr[d])) qmax = std::max(qmax, std::fabs(qr[d]));
  }
  for (std::int64_t j = 0; j < p.Lk; ++j) {
    // Every key, attended or not: the fast path computes scores for whole key blocks.
    const double *kr = k.row(b, hk, j), *vr = v.row(b, hk, j);
    double sum = 0;
    bool qk_nonfinite = false;
    for (std::int64_t d = 0; d < p.D; ++d) {
      const bool finite = std::isfinite(qr[d]) && std::isfinite(kr[d]);
      if (finite) sum += std::fabs(qr[d] * kr[d]);
      qk_nonfinite = qk_nonfinite || !finite;
      // The fast path scales Q or K (QUnit::f32_in_place, scale * log2(e) <= 1) by
      // scale * log2(e) in f32 first: a q_d or k_d that this takes below f32's smallest
      // sub-normal becomes 0, and 0 * Inf is NaN where the reference has +-Inf.
      const double c = scale * kLog2e;
      r.f32_blind |= !std::isfinite(kr[d]) && qr[d] != 0 && std::fabs(qr[d] * c) < 0x1p-148;
      r.f32_blind |= !std::isfinite(qr[d]) && kr[d] != 0 && std::fabs(kr[d] * c) < 0x1p-148;
    }
    const float m = p.mask_kind == 2 ? p.mask_at(b, h, i, j) : 0.0f;
    for (std::int64_t d = 0; d < p.Dv; ++d) {
      if (std::isfinite(vr[d])) continue;
      // Below 2^-126 the fast path's exp2 gives 0 (its stated range) where the reference still
      // has a weight: a NaN or Inf in V there gives the reference NaN or Inf, beyond f32.
      if (w[j] > 0 && w[j] < 0x1p-125) r.blind_cols.push_back(d);
    }
    if (!p.visible(b, h, i, j)) continue;
    r.any_visible = true;
    r.nonfinite = r.nonfinite || qk_nonfinite || !std::isfinite(m);
    exact = std::max(exact, sum);
    for (std::int64_t d = 0; d < p.D; ++d) {
      if (std::isfinite(kr[d])) kmax = std::max(kmax, std::fabs(kr[d]));
    }
    for (std::int64_t d = 0; d < p.Dv; ++d) {
      if (std::isfinite(vr[d])) r.vmax = std::max(r.vmax, std::fabs(vr[d]));
      r.nonfinite = r.nonfinite || !std::isfinite(vr[d]);
    }
    if (std::isfinite(m)) mask_mag = std::max(mask_mag, std::fabs(double(m)));
  }
  const double suite = 3 * std::sqrt(static_cast<double>(p.D)) * scale * qmax * kmax;
  r.score_mag = std::max(suite, scale * exact) + mask_mag;
  r.in_range = exact * std::max(scale, 1.0) <= kHuge && qmax * std::max(scale, 1.0) <= kHuge &&
               mask_mag <= kHuge && r.vmax * p.Lk <= kHuge;
  // Scores so large that f32 rounds them by more than 16 (log2 units) can make a weight that is 0
  // in double 1 in f32 (or the reverse), so a NaN or inf in V reaches one side only: such rows
  // are run, not compared (their tolerance was vacuous anyway).
  r.in_range = r.in_range && r.score_mag * kEps * kLog2e <= 16.0;
  return r;
}

// Same NaN-ness, the same infinities, or finite values within `atol + rtol |want|`.
bool agree(double got, double want, double atol, double rtol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

}  // namespace
}  // namespace cpuattn::fuzz

using namespace cpuattn;
using namespace cpuattn::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size);
  Problem p = make_problem(in);
  const bool ask_lse = in.chance(60), ask_weights = in.chance(10);
  const Target target = static_cast<Target>(in.range(0, 3));  // scalar, sse4, avx2, avx512
  const int threads = static_cast<int>(in.range(1, 2));
  // The provider from the input's length, not from its bytes, so that the seed corpus keeps
  // decoding to the same problems and still covers both providers.
  const Simd simd = size % 2 == 1 ? Simd::xsimd : Simd::highway;
  fill_values(p, in, 0x2545F4914F6CDD1DULL * (size + 1));
  poison_excluded(p, in);
  const bool verbose = std::getenv("CPUATTN_FUZZ_VERBOSE") != nullptr;
  if (verbose) describe(p);

  AttentionOptions opts;
  if (p.scale > 0) opts.scale = p.scale;
  opts.causal = p.causal;
  if (p.mask_kind == 1)
    opts.mask = TensorView::contiguous(p.bmask.data(), DType::boolean, p.mask_n, p.mask_rank);
  if (p.mask_kind == 2)
    opts.mask = TensorView::contiguous(p.amask.data(), DType::f32, p.mask_n, p.mask_rank);
  if (!p.len32.empty())
    opts.key_lengths = TensorView::contiguous(p.len32.data(), DType::i32, {p.B});
  if (!p.len64.empty())
    opts.key_lengths = TensorView::contiguous(p.len64.data(), DType::i64, {p.B});

  // The reference, in double, with its weights (the analysis needs them).
  const std::int64_t rows = p.B * p.H * p.Lq;
  std::vector<double> want(static_cast<std::size_t>(rows * p.Dv)), want_lse(rows),
      want_w(static_cast<std::size_t>(rows * p.Lk));
  AttentionOptions ref_opts = opts;
  ref_opts.lse = OutputView::contiguous(want_lse.data(), DType::f64, {p.B, p.H, p.Lq});
  ref_opts.weights = OutputView::contiguous(want_w.data(), DType::f64, {p.B, p.H, p.Lq, p.Lk});
  reference_attention(p.q.in(), p.k.in(), p.v.in(),
                      OutputView::contiguous(want.data(), DType::f64, {p.B, p.H, p.Lq, p.Dv}),
                      ref_opts);

  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  const Dense q(p.q), k(p.k), v(p.v);
  std::vector<RowInfo> info;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t i = row % p.Lq, h = (row / p.Lq) % p.H, b = row / (p.Lq * p.H);
    info.push_back(
        analyze(p, q, k, v, &want_w[static_cast<std::size_t>(row * p.Lk)], b, h, i, scale));
  }

  // The fast path, its output a strided view too.
  Tensor out(in, {p.B, p.H, p.Lq, p.Dv}, false);
  std::vector<float> lse(static_cast<std::size_t>(rows)), w(static_cast<std::size_t>(rows * p.Lk));
  AttentionOptions fast_opts = opts;
  if (ask_lse) fast_opts.lse = f32_view(lse.data(), {p.B, p.H, p.Lq});
  if (ask_weights) fast_opts.weights = f32_view(w.data(), {p.B, p.H, p.Lq, p.Lk});
  Context* ctx = fuzz_context(simd, target, threads);
  attention(p.q.in(), p.k.in(), p.v.in(), out.out(), fast_opts, ctx);

  for (std::int64_t row = 0; row < rows; ++row) {
    const RowInfo& r = info[static_cast<std::size_t>(row)];
    const std::int64_t i = row % p.Lq, h = (row / p.Lq) % p.H, b = row / (p.Lq * p.H);
    auto where = [&] {  // built only for a failure message
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "row b%lld h%lld i%lld of B%lld H%lld Hkv%lld Lq%lld Lk%lld "
                    "D%lld Dv%lld, target %s, %d threads%s",
                    static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(i),
                    static_cast<long long>(p.B), static_cast<long long>(p.H),
                    static_cast<long long>(p.Hkv), static_cast<long long>(p.Lq),
                    static_cast<long long>(p.Lk), static_cast<long long>(p.D),
                    static_cast<long long>(p.Dv), target_name(active_target(ctx)), threads,
                    r.nonfinite ? ", reached by NaN/Inf" : "");
      return std::string(buf);
    };
    // Keys of weight 0 (excluded, or exp() underflowed) never reach a row, whatever their K and
    // V hold, in both paths: such rows are compared like any other (poison_excluded plants them).
    if (r.f32_blind) continue;
    const double got_lse = lse[static_cast<std::size_t>(row)];
    if (!r.any_visible) {
      for (std::int64_t d = 0; d < p.Dv; ++d) {
        FUZZ_CHECK(out.at(b, h, i, d) == 0.0f, "%s: every key masked, out[%lld] = %g, not 0",
                   where().c_str(), static_cast<long long>(d), out.at(b, h, i, d));
      }
      FUZZ_CHECK(!ask_lse || got_lse == -kInf, "%s: every key masked, lse = %g, not -inf",
                 where().c_str(), got_lse);
      continue;
    }
    if (!r.in_range) continue;
    const double atol =
        r.vmax *
            (8 * kEps * (std::sqrt(double(p.Lk)) + std::sqrt(double(p.D)) * r.score_mag) + 1e-6) +
        p.Lk * 0x1p-149;
    for (std::int64_t d = 0; d < p.Dv; ++d) {
      if (std::find(r.blind_cols.begin(), r.blind_cols.end(), d) != r.blind_cols.end()) continue;
      const double g = out.at(b, h, i, d), wv = want[static_cast<std::size_t>(row * p.Dv + d)];
      FUZZ_CHECK(agree(g, wv, atol, 0), "%s: out[%lld] = %.9g, reference %.9g, |diff| %.3g > %.3g",
                 where().c_str(), static_cast<long long>(d), g, wv, std::fabs(g - wv), atol);
    }
    if (ask_lse) {
      const double ref_lse = want_lse[static_cast<std::size_t>(row)];
      const double tol =
          8 * kEps * (std::sqrt(double(p.D)) * r.score_mag + std::log(double(p.Lk)) + 8);
      FUZZ_CHECK(agree(got_lse, ref_lse, tol, 4 * kEps), "%s: lse = %.9g, reference %.9g, tol %.3g",
                 where().c_str(), got_lse, ref_lse, tol);
    }
    if (ask_weights) {
      // With weights the call runs the reference itself and stores its doubles as f32.
      for (std::int64_t j = 0; j < p.Lk; ++j) {
        const double g = w[static_cast<std::size_t>(row * p.Lk + j)];
        const double wv = want_w[static_cast<std::size_t>(row * p.Lk + j)];
        FUZZ_CHECK(agree(g, wv, 0x1p-149, kEps), "%s: weight[%lld] = %.9g, reference %.9g",
                   where().c_str(), static_cast<long long>(j), g, wv);
      }
    }
  }
  return 0;
}
