// Micro-kernel tests, per provider and per target this CPU runs (in the style of Highway's
// HWY_EXPORT_AND_TEST_P and XNNPACK's micro-kernel testers): exp2 and tanh against their stated
// bounds, the register transpose, the score and P V tiles over every row count, ragged sizes and
// misaligned operands, K/V packing with ragged edges, and the online-softmax step. Each compares
// with double precision, with tolerances that grow with the reduction length, and names the
// worst element on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/scratch.h"
#include "core/softmax.h"
#include "dispatch/dispatch.h"
#include "micro.h"
#include "simd/contract.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const double kEps = std::numeric_limits<float>::epsilon();

// 64-byte aligned floats, with `offset` floats of deliberate misalignment before data().
struct Buf {
  std::vector<float> v;
  std::size_t off;
  Buf(std::size_t n, std::size_t offset = 0) : v(n + 32), off(offset) {
    const auto addr = reinterpret_cast<std::uintptr_t>(v.data());
    off += (64 - addr % 64) % 64 / sizeof(float);
  }
  float* data() { return v.data() + off; }
};

void fill(float* p, std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::size_t i = 0; i < n; ++i) p[i] = u(rng);
}

class Micro : public ::testing::TestWithParam<Backend> {
 protected:
  const detail::MicroKernels& mk() const {
    const detail::MicroKernels& k =
        detail::micro_kernels(detail::choose(GetParam().target, GetParam().simd));
    EXPECT_EQ(k.target, GetParam().target);
    EXPECT_EQ(k.provider, GetParam().simd);
    return k;
  }
};

// What Exp2 and Exp2Bf16 state: relative error <= `bound` on (-126, 127], and never a denormal
// there; x <= -126 gives exactly 0 (the threshold the online softmax tests, kExp2ZeroAtOrBelow);
// NaN stays NaN.
void ExpectExp2Stated(void (*exp2)(const float*, float*, std::size_t), double bound) {
  static_assert(simd::kExp2ZeroAtOrBelow == -126.0f, "the range below is Exp2's stated one");
  std::vector<float> x;
  for (double v = -126.0 + 1.0 / 1024; v <= 127.0; v += 1.0 / 1024)
    x.push_back(static_cast<float>(v));
  // Every fraction a target's polynomial sees, finely: [0, 1) for a floor step, [-0.5, 0.5] for
  // a nearest one; the worst f32 rounding sits between the grid above's points.
  for (double v = -1.0; v < 1.0; v += 1.0 / (1 << 18)) x.push_back(static_cast<float>(v));
  for (float v :
       {0.0f, -0.5f, 0.5f, -1e-8f, 1e-8f, -125.999f, 126.9f, -125.0f, std::nextafter(-126.0f, 0.0f),
        std::nextafter(-125.0f, -126.0f), std::nextafter(1.0f, 0.0f), std::nextafter(-3.0f, 0.0f)})
    x.push_back(v);
  x.push_back(0.25f);  // an odd count: the tail goes through the padded vector
  std::vector<float> y(x.size());
  exp2(x.data(), y.data(), x.size());
  double worst = 0;
  float worst_x = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(double(x[i]));
    const double rel = std::abs(y[i] - want) / want;
    if (rel > worst) worst = rel, worst_x = x[i];
    EXPECT_EQ(std::fpclassify(y[i]), FP_NORMAL) << "x = " << x[i] << ", 2^x = " << y[i];
  }
  EXPECT_LE(worst, bound) << "worst at x = " << worst_x;
  const float special[] = {-kInf,
                           -1000.0f,
                           -127.0f,
                           -126.6f,
                           std::nextafter(simd::kExp2ZeroAtOrBelow, -127.0f),
                           simd::kExp2ZeroAtOrBelow,
                           std::numeric_limits<float>::quiet_NaN()};
  constexpr int kSpecial = sizeof(special) / sizeof(special[0]);
  float out[kSpecial];
  exp2(special, out, kSpecial);
  for (int i = 0; i + 1 < kSpecial; ++i) EXPECT_EQ(out[i], 0.0f) << "x = " << special[i];
  EXPECT_TRUE(std::isnan(out[kSpecial - 1]));
  // NaNs whose payload fills the low mantissa bits (a caller's NaN in Q reaches exp2 with its
  // payload), of either sign: still NaN.
  std::vector<float> nans;
  for (std::uint32_t payload : {1u, 0x7fu, 0x1ffu, 0x155u, 0x3fffffu})
    for (std::uint32_t sign : {0u, 0x80000000u})
      nans.push_back(std::bit_cast<float>(sign | 0x7fc00000u | payload));
  std::vector<float> nan_out(nans.size());
  exp2(nans.data(), nan_out.data(), nans.size());
  for (std::size_t i = 0; i < nans.size(); ++i)
    EXPECT_TRUE(std::isnan(nan_out[i]))
        << "bits " << std::hex << std::bit_cast<std::uint32_t>(nans[i]) << " gave " << nan_out[i];
}

TEST_P(Micro, Exp2StatedError) { ExpectExp2Stated(mk().exp2, 3e-7); }

// SoftCap's cap (1 - e) / (1 + e) takes its sign from 1 - e: Exp2 must not pass 1 below 0.
TEST_P(Micro, Exp2AtMostOneBelowZero) {
  std::vector<float> x;
  for (float v = -1e-30f; v > -2.0f; v *= 1.01f) x.push_back(v);
  for (float v = -1.0f; v <= 0.0f; v = std::nextafter(v, 1.0f) + 1.0f / (1 << 20)) x.push_back(v);
  x.push_back(-0.0f);
  x.push_back(0.0f);
  std::vector<float> y(x.size());
  mk().exp2(x.data(), y.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_LE(y[i], 1.0f) << "x = " << x[i];
}

// The exp2 of the native bf16 tiles' probabilities, tested on every target as written.
TEST_P(Micro, Exp2Bf16StatedError) { ExpectExp2Stated(mk().exp2_bf16, 3e-6); }

// tanh states: relative error <= 4e-7 for every finite input, exactly +-1 from |x| >= 9, odd,
// NaN stays NaN.
TEST_P(Micro, TanhStatedError) {
  const auto& k = mk();
  std::vector<float> x;
  for (double v = -12.0; v <= 12.0; v += 1.0 / 4096) x.push_back(static_cast<float>(v));
  for (float v = 1e-30f; v < 1.0f; v *= 1.01f) x.push_back(v), x.push_back(-v);
  for (float v : {0.0f, -0.0f, 0.625f, std::nextafter(0.625f, 0.0f), 9.0f, 3e38f, -3e38f})
    x.push_back(v);
  std::vector<float> y(x.size());
  k.tanh(x.data(), y.data(), x.size());
  double worst = 0;
  float worst_x = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::tanh(double(x[i]));
    const double rel = want == 0 ? std::abs(y[i]) : std::abs(y[i] - want) / std::abs(want);
    if (rel > worst) worst = rel, worst_x = x[i];
    ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "x = " << x[i];
  }
  EXPECT_LE(worst, 4e-7) << "worst at x = " << worst_x;
  const float special[] = {kInf, -kInf, 9.0f, -20.0f, std::numeric_limits<float>::quiet_NaN()};
  float out[5];
  k.tanh(special, out, 5);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], -1.0f);
  EXPECT_TRUE(std::isnan(out[4]));
}

// SoftCap states: |cap * tanh(x / cap) - result| <= 4e-7 cap for every finite x, and for caps
// above kSoftCapExactAbove (64) <= 4e-7 |result| where |x| < 0.625 cap (so a huge cap leaves
// scores as they are); +-inf give +-cap, odd,
// NaN stays NaN; over caps from 1e-3 to 1.44e30 (in the kernel's log2 units: softcap 1e30).
TEST_P(Micro, SoftCapStatedError) {
  const auto& k = mk();
  for (float cap :
       {1e-3f, 0.7213475f, 5.0f, 43.28085f, 1e4f, 1.4426950e6f, 1.4426950e12f, 1.4426950e30f}) {
    SCOPED_TRACE(cap);
    std::vector<float> x;
    for (double v = -20.0; v <= 20.0; v += 1.0 / 2048) x.push_back(static_cast<float>(v * cap));
    for (float v = 1e-30f; v < 1e30f; v *= 1.07f) x.push_back(v), x.push_back(-v);
    for (float v : {0.0f, -0.0f, 3e38f, -3e38f}) x.push_back(v);
    std::vector<float> y(x.size());
    k.softcap(x.data(), y.data(), x.size(), cap);
    double worst = 0;
    float worst_x = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = double(cap) * std::tanh(double(x[i]) / double(cap));
      const double err = std::abs(y[i] - want) / cap;
      if (err > worst) worst = err, worst_x = x[i];
      if (cap > 64 && std::abs(double(x[i])) < 0.625 * cap) {
        ASSERT_LE(std::abs(y[i] - want), 4e-7 * std::abs(want) + 1e-45)
            << "x = " << x[i] << ", cap = " << cap << ": relative error below 0.625 cap";
      }
      if (x[i] != 0) {
        ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "x = " << x[i];
      }
    }
    EXPECT_LE(worst, 4e-7) << "worst at x = " << worst_x;
    const float special[] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()};
    float out[3];
    k.softcap(special, out, 3, cap);
    EXPECT_EQ(out[0], cap);
    EXPECT_EQ(out[1], -cap);
    EXPECT_TRUE(std::isnan(out[2]));
  }
}

TEST_P(Micro, TransposeIsExact) {
  const auto& k = mk();
  const int n = k.lanes;
  std::vector<float> m(n * n), t(n * n);
  fill(m.data(), m.size(), 7);
  t = m;
  k.transpose(t.data());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) ASSERT_EQ(t[i * n + j], m[j * n + i]) << i << "," << j;
}

// The check that sends a query block through the exact P V rerun: every position of a 1..13
// vector buffer (every chain of the loop and the tail) holding +inf, -inf or NaN among random
// finite values is found, and large finite values (their product with 0 is 0) are not.
TEST_P(Micro, AccFiniteFindsEveryNonFinite) {
  const auto& k = mk();
  for (int nv = 1; nv <= 13; ++nv) {
    const std::int64_t n = static_cast<std::int64_t>(nv) * k.lanes;
    Buf acc(static_cast<std::size_t>(n));
    fill(acc.data(), static_cast<std::size_t>(n), 40 + nv, -1e30f, 1e30f);
    acc.data()[n / 2] = std::numeric_limits<float>::max();
    ASSERT_TRUE(k.acc_finite(acc.data(), n)) << nv << " vectors";
    for (std::int64_t i = 0; i < n; ++i) {
      for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
        const float keep = acc.data()[i];
        acc.data()[i] = bad;
        EXPECT_FALSE(k.acc_finite(acc.data(), n)) << nv << " vectors, " << bad << " at " << i;
        acc.data()[i] = keep;
      }
    }
  }
}

enum class MaskCase { none, ends, boolean, boolean_broadcast, additive };

// Scores and softmax in one pass (lazy max), for every row count, ragged D and misaligned
// operands: each probability within Exp2's 3e-7 and what the f32 score's rounding moves it by, the
// sums within that plus f32 additions; a row whose largest score is 8.5 above its m refuses the
// block. With `first` (rows that have seen no key) the tiles set m to each row's largest score of
// the first panel, within that score's rounding, and refuse a later panel 8 above it or a first
// panel whose largest score is not finite, leaving m at -inf.
TEST_P(Micro, ProbBlockMatchesDouble) {
  const auto& k = mk();
  const int W = k.score_cols * k.lanes;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (bool first : {false, true})
    for (int rows : {1, k.score_rows, k.score_rows + 1, 13})
      for (std::int64_t D : {1, 17, 64})
        for (std::int64_t ncols : {W, 2 * W}) {
          const std::int64_t qs = D + 3, s_stride = ncols + 16;
          Buf q(rows * qs, 1), kp(D * ncols), s(rows * s_stride), lsum(rows * k.lanes);
          fill(q.data(), rows * qs, 21 + rows);
          // With `first`, keys of a quarter the size keep every later score below the first
          // panel's largest + 8 (their spread is about 5 at D 64 otherwise).
          const float kmax = first ? 0.5f : 2.0f;
          fill(kp.data(), D * ncols, 23 + static_cast<std::uint32_t>(D), -kmax, kmax);
          std::vector<double> want(rows * ncols), err(rows * ncols), row_max(rows, -1e300);
          std::vector<double> first_max(rows, -1e300), first_err(rows);
          std::vector<float> m(rows);
          for (int r = 0; r < rows; ++r) {
            for (std::int64_t j = 0; j < ncols; ++j) {
              const float* panel = kp.data() + j / W * D * W;
              double dot = 0, mag = 0;
              for (std::int64_t d = 0; d < D; ++d) {
                const double t = double(q.data()[r * qs + d]) * panel[d * W + j % W];
                dot += t;
                mag += std::abs(t);
              }
              want[r * ncols + j] = dot;
              err[r * ncols + j] = (D + 2) * kEps * mag;
              row_max[r] = std::max(row_max[r], dot);
              if (j < W && dot > first_max[r]) {
                first_max[r] = dot;
                first_err[r] = err[r * ncols + j];
              }
            }
            m[r] = first ? neg_inf : static_cast<float>(row_max[r] - 3 + 0.25 * r);
          }
          const std::string what = std::string(first ? "first, " : "") + "rows " +
                                   std::to_string(rows) + " D " + std::to_string(D) + " ncols " +
                                   std::to_string(ncols);
          // A later panel's scores may exceed the first's largest, by less than 8 here.
          if (first && ncols > W) {
            for (int r = 0; r < rows; ++r) ASSERT_LT(row_max[r], first_max[r] + 7.5) << what;
          }
          ASSERT_TRUE(k.prob_block(rows, q.data(), qs, D, kp.data(), ncols, m.data(), first,
                                   s.data(), s_stride, lsum.data()))
              << what;
          for (int r = 0; r < rows; ++r) {
            if (first) {
              // The largest of the scores in f32 is within its own rounding of the true largest.
              ASSERT_LE(std::abs(m[r] - first_max[r]), first_err[r]) << what << ": m of row " << r;
            }
            double sum = 0, tol = 0, got_sum = 0;
            for (std::int64_t j = 0; j < ncols; ++j) {
              const double x = want[r * ncols + j] - m[r], e = std::exp2(x);
              const double rel = 3e-7 + std::log(2.0) * (err[r * ncols + j] + kEps * std::abs(x));
              ASSERT_LE(std::abs(s.data()[r * s_stride + j] - e), rel * e)
                  << what << ": row " << r << " key " << j;
              sum += e;
              tol += (rel + ncols * kEps) * e;
            }
            for (int i = 0; i < k.lanes; ++i) got_sum += lsum.data()[r * k.lanes + i];
            ASSERT_LE(std::abs(got_sum - sum), tol) << what << ": the sum of row " << r;
          }
          if (!first) {
            // Row 0's tile comes before the other rows' in each panel, and the block learns of
            // the refusal after its last tile: a later tile must not undo it.
            const std::vector<float> m_kept = m;
            m[0] = static_cast<float>(row_max[0] - 8.5);
            EXPECT_FALSE(k.prob_block(rows, q.data(), qs, D, kp.data(), ncols, m.data(), first,
                                      s.data(), s_stride, lsum.data()))
                << what << ", row 0";
            m = m_kept;
            m[rows - 1] = static_cast<float>(row_max[rows - 1] - 8.5);
          } else if (ncols > W) {
            // The second panel's first key, for the last row: a score 9 above the first panel's.
            const float* qr = q.data() + (rows - 1) * qs;
            double qq = 0;
            for (std::int64_t d = 0; d < D; ++d) qq += double(qr[d]) * qr[d];
            for (std::int64_t d = 0; d < D; ++d)
              kp.data()[D * W + d * W] = static_cast<float>(qr[d] * (first_max[rows - 1] + 9) / qq);
            std::fill(m.begin(), m.end(), neg_inf);
          } else {
            q.data()[(rows - 1) * qs] = std::numeric_limits<float>::infinity();
            std::fill(m.begin(), m.end(), neg_inf);
          }
          EXPECT_FALSE(k.prob_block(rows, q.data(), qs, D, kp.data(), ncols, m.data(), first,
                                    s.data(), s_stride, lsum.data()))
              << what;
          if (first) {
            for (int r = 0; r < rows; ++r) EXPECT_EQ(m[r], neg_inf) << what << ": m of row " << r;
          }
        }
}

// The keys-as-rows units (KeysAsRows: keys in the tiles' rows, query rows in the lanes) on one
// key block, for key counts around the tile's rows and the block's keys, ragged D and Dv, K and V
// rows not a whole vector apart, one and two chunks of lanes: the scores and each lane's new max
// (exactly the largest f32 score or the old max), the one-pass weights against a max 3 below each
// lane's largest score (within Exp2's 3e-7 and the score's rounding; their sums within that plus
// f32 additions), a lane 8.5 above its max refusing the block, and P V into Accᵀ, each against
// double precision.
TEST_P(Micro, KeysAsRowsBlockMatchesDouble) {
  const auto& k = mk();
  for (int chunks : {1, 2})
    for (std::int64_t nk : {std::int64_t{1}, std::int64_t{k.score_rows},
                            std::int64_t{k.score_rows + 1}, std::int64_t{37}, k.block_keys})
      for (std::int64_t D : {1, 17, 64}) {
        const int qp = chunks * k.kr_chunk;
        const std::int64_t ks = D + 3, Dv = D + 5;
        Buf qt(D * qp), kr(nk * ks, 1), vr(nk * ks + Dv, 3), st(nk * qp), acct(Dv * qp);
        Buf m(qp), mnew(qp), sums(qp);
        fill(qt.data(), D * qp, 31 + static_cast<std::uint32_t>(D));
        fill(kr.data(), nk * ks, 37 + static_cast<std::uint32_t>(nk), -2.0f, 2.0f);
        fill(vr.data(), nk * ks + Dv, 41);
        const std::string what = "chunks " + std::to_string(chunks) + " nk " + std::to_string(nk) +
                                 " D " + std::to_string(D);
        std::vector<double> want(nk * qp), err(nk * qp), lane_max(qp, -1e300);
        for (std::int64_t j = 0; j < nk; ++j)
          for (int i = 0; i < qp; ++i) {
            double dot = 0, mag = 0;
            for (std::int64_t d = 0; d < D; ++d) {
              const double t = double(kr.data()[j * ks + d]) * qt.data()[d * qp + i];
              dot += t;
              mag += std::abs(t);
            }
            want[j * qp + i] = dot;
            err[j * qp + i] = (D + 2) * kEps * mag;
            lane_max[i] = std::max(lane_max[i], dot);
          }
        // Scores, and the new max: lanes of even index start above every score, odd below.
        for (int i = 0; i < qp; ++i)
          m.data()[i] = static_cast<float>(lane_max[i] + (i % 2 == 0 ? 1.0 : -1.0));
        k.kr_score_block(kr.data(), ks, D, nk, qt.data(), qp, m.data(), st.data(), mnew.data());
        for (int i = 0; i < qp; ++i) {
          float got_max = m.data()[i];
          for (std::int64_t j = 0; j < nk; ++j) {
            const float s = st.data()[j * qp + i];
            ASSERT_LE(std::abs(s - want[j * qp + i]), err[j * qp + i])
                << what << ": score of key " << j << " lane " << i;
            got_max = std::max(got_max, s);
          }
          ASSERT_EQ(mnew.data()[i], got_max) << what << ": the max of lane " << i;
        }
        // One pass against m = the largest score - 3.
        for (int i = 0; i < qp; ++i) m.data()[i] = static_cast<float>(lane_max[i] - 3.0);
        ASSERT_TRUE(
            k.kr_prob_block(kr.data(), ks, D, nk, qt.data(), qp, m.data(), st.data(), sums.data()))
            << what;
        for (int i = 0; i < qp; ++i) {
          double sum = 0, tol = 0;
          for (std::int64_t j = 0; j < nk; ++j) {
            const double x = want[j * qp + i] - m.data()[i], e = std::exp2(x);
            const double rel = 3e-7 + std::log(2.0) * (err[j * qp + i] + kEps * std::abs(x));
            ASSERT_LE(std::abs(st.data()[j * qp + i] - e), rel * e)
                << what << ": weight of key " << j << " lane " << i;
            sum += e;
            tol += (rel + nk * kEps) * e;
          }
          ASSERT_LE(std::abs(sums.data()[i] - sum), tol) << what << ": the sum of lane " << i;
        }
        // P V on those weights, into an Accᵀ that holds something already.
        fill(acct.data(), Dv * qp, 43);
        std::vector<float> acc0(acct.data(), acct.data() + Dv * qp);
        k.kr_pv_block(vr.data(), ks, Dv, nk, st.data(), qp, acct.data());
        for (std::int64_t c = 0; c < Dv; ++c)
          for (int i = 0; i < qp; ++i) {
            double want_acc = acc0[c * qp + i], mag = std::abs(want_acc);
            for (std::int64_t j = 0; j < nk; ++j) {
              const double t = double(vr.data()[j * ks + c]) * st.data()[j * qp + i];
              want_acc += t;
              mag += std::abs(t);
            }
            ASSERT_LE(std::abs(acct.data()[c * qp + i] - want_acc), (nk + 2) * kEps * mag)
                << what << ": Acc of column " << c << " lane " << i;
          }
        // A lane whose largest score is 8.5 above its max refuses the block, whichever lane.
        for (int lane : {0, qp - 1}) {
          m.data()[lane] = static_cast<float>(lane_max[lane] - 8.5);
          EXPECT_FALSE(k.kr_prob_block(kr.data(), ks, D, nk, qt.data(), qp, m.data(), st.data(),
                                       sums.data()))
              << what << ": lane " << lane;
          m.data()[lane] = static_cast<float>(lane_max[lane] - 3.0);
        }
      }
}

TEST_P(Micro, ScoreTileMatchesDouble) {
  const auto& k = mk();
  const int W = k.score_cols * k.lanes;
  for (int R = 1; R <= k.score_rows; ++R) {
    for (std::int64_t D : {1, 2, 3, 7, 16, 17, 64, 65, 128}) {
      for (MaskCase mc : {MaskCase::none, MaskCase::ends, MaskCase::boolean,
                          MaskCase::boolean_broadcast, MaskCase::additive}) {
        for (std::size_t misalign : {0, 3}) {
          const std::int64_t qs = D + 5;
          Buf q(R * qs, misalign), kp(D * W, misalign), s(R * (W + 16));
          const std::int64_t s_stride = W + 16;
          fill(q.data(), R * qs, 11 + R);
          fill(kp.data(), D * W, 13 + static_cast<std::uint32_t>(D));
          const std::int32_t col0 = 5;  // masks are indexed from the tile's first key
          std::vector<std::int32_t> ends(R);
          std::vector<std::uint8_t> bmask(R * (col0 + W));
          std::vector<float> amask(R * (col0 + W));
          std::vector<const void*> masks(R, nullptr);
          std::mt19937 rng(R * 131 + static_cast<unsigned>(D));
          detail::MaskKind kind = detail::MaskKind::none;
          std::int64_t mstride = 1;
          for (int r = 0; r < R; ++r) {
            ends[r] = mc == MaskCase::none ? W + col0 : static_cast<std::int32_t>(rng() % (W + 1));
            for (int j = 0; j < col0 + W; ++j) {
              bmask[r * (col0 + W) + j] = rng() % 3 != 0;
              amask[r * (col0 + W) + j] = static_cast<float>(rng() % 200) / 10.0f - 10.0f;
            }
            if (mc == MaskCase::boolean || mc == MaskCase::boolean_broadcast) {
              kind = detail::MaskKind::boolean;
              masks[r] = bmask.data() + r * (col0 + W);
              if (mc == MaskCase::boolean_broadcast) mstride = 0;
            } else if (mc == MaskCase::additive) {
              kind = detail::MaskKind::additive;
              masks[r] = amask.data() + r * (col0 + W);
            }
          }
          // The kernel reads each row's mask relative to its tile start (col0 keys in).
          std::vector<const void*> at(R, nullptr);
          for (int r = 0; r < R; ++r) at[r] = masks[r];
          const bool masked = mc != MaskCase::none;
          k.score_tile(R, q.data(), qs, D, kp.data(), s.data(), s_stride, col0, masked, ends.data(),
                       at.data(), kind, mstride);
          double worst = 0;
          std::string where;
          for (int r = 0; r < R; ++r) {
            for (int w = 0; w < W; ++w) {
              const float got = s.data()[r * s_stride + w];
              const std::int64_t key = col0 + w;  // index into the row's mask
              const std::int64_t mk_at = mstride == 0 ? 0 : key;
              bool visible = !masked || key < ends[r];
              if (visible && kind == detail::MaskKind::boolean)
                visible = bmask[r * (col0 + W) + mk_at] != 0;
              if (!visible) {
                ASSERT_EQ(got, -kInf) << "R " << R << " D " << D << " row " << r << " key " << w;
                continue;
              }
              double want = 0, mag = 0;
              for (std::int64_t d = 0; d < D; ++d) {
                const double t = double(q.data()[r * qs + d]) * kp.data()[d * W + w];
                want += t;
                mag += std::abs(t);
              }
              double tol = 2 * D * kEps * mag + 1e-30;
              if (kind == detail::MaskKind::additive) {
                const double a = amask[r * (col0 + W) + key] * double(detail::kLog2e);
                want += a;
                tol += 2 * kEps * (std::abs(a) + std::abs(want));
              }
              const double err = std::abs(got - want) / tol;
              if (err > worst) {
                worst = err;
                std::ostringstream os;
                os << "R " << R << " D " << D << " mask " << int(mc) << " row " << r << " key " << w
                   << ": got " << got << " want " << want;
                where = os.str();
              }
            }
          }
          ASSERT_LE(worst, 1.0) << where;
        }
      }
    }
  }
}

// The output a P V tile writes beside its accumulators (PvOut): row r's columns [0, cw) are
// acc * scale[r] exactly, in rows at offsets that leave some aligned and some not, and nothing
// around them is touched.
namespace {
void ExpectTileOut(int R, std::int64_t cw, const float* acc, std::int64_t acc_stride,
                   const std::vector<float>& out, const std::vector<std::int64_t>& at,
                   const std::vector<float>& scale, const std::string& what) {
  std::vector<bool> written(out.size(), false);
  for (int r = 0; r < R; ++r) {
    for (std::int64_t c = 0; c < cw; ++c) {
      const float want = acc[r * acc_stride + c] * scale[r];
      ASSERT_EQ(std::memcmp(&out[at[r] + c], &want, sizeof(float)), 0)
          << what << " row " << r << " col " << c << ": got " << out[at[r] + c] << " want " << want;
      written[at[r] + c] = true;
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!written[i]) {
      ASSERT_EQ(out[i], -7.0f) << what << ": wrote outside the rows, at " << i;
    }
}
}  // namespace

// acc[R][C vectors] += P V over every row count, chunk width and ragged key counts; the same
// tile with its rows' outputs (PvOut), plain and streamed, to aligned and misaligned rows.
TEST_P(Micro, PvTileMatchesDouble) {
  const auto& k = mk();
  for (int R = 1; R <= k.pv_rows; ++R) {
    for (int C = 1; C <= k.pv_cols; ++C) {
      for (std::int64_t nk : {1, 5, 64, 129}) {
        const std::int64_t cw = C * k.lanes, p_stride = nk + 3, acc_stride = cw + 16;
        Buf p(R * p_stride, 1), vp(nk * cw, 2), acc(R * acc_stride);
        fill(p.data(), R * p_stride, 17, 0.0f, 1.0f);
        fill(vp.data(), nk * cw, 19);
        fill(acc.data(), R * acc_stride, 23);
        const std::vector<float> before(acc.data(), acc.data() + R * acc_stride);
        for (const bool stream : {false, true}) {
          // Rows 2 cw + 16 floats apart from a 64-byte boundary, every third one 1 float off.
          Buf out_buf(R * (2 * cw + 16) + 16);
          std::vector<float> out(out_buf.v.size() - out_buf.off, -7.0f), scale(R);
          std::vector<std::int64_t> at(R);
          std::vector<float*> rows(R);
          for (int r = 0; r < R; ++r) {
            at[r] = r * (2 * cw + 16) + (r % 3 == 2 ? 1 : 0);
            scale[r] = 0.25f + 0.125f * r;
          }
          std::copy(before.begin(), before.end(), acc.data());
          std::copy(out.begin(), out.end(), out_buf.data());
          for (int r = 0; r < R; ++r) rows[r] = out_buf.data() + at[r];
          k.pv_tile(R, C, p.data(), p_stride, vp.data(), cw, nk, acc.data(), acc_stride,
                    rows.data(), scale.data(), stream);
          std::copy(out_buf.data(), out_buf.data() + out.size(), out.begin());
          ExpectTileOut(R, cw, acc.data(), acc_stride, out, at, scale,
                        std::string(stream ? "streamed" : "plain") + " R " + std::to_string(R) +
                            " C " + std::to_string(C) + " nk " + std::to_string(nk));
        }
        std::copy(before.begin(), before.end(), acc.data());
        k.pv_tile(R, C, p.data(), p_stride, vp.data(), cw, nk, acc.data(), acc_stride, nullptr,
                  nullptr, false);
        for (int r = 0; r < R; ++r) {
          for (std::int64_t c = 0; c < cw; ++c) {
            double want = before[r * acc_stride + c], mag = std::abs(want);
            for (std::int64_t j = 0; j < nk; ++j) {
              const double t = double(p.data()[r * p_stride + j]) * vp.data()[j * cw + c];
              want += t;
              mag += std::abs(t);
            }
            const float got = acc.data()[r * acc_stride + c];
            ASSERT_LE(std::abs(got - want), 2 * (nk + 1) * kEps * mag + 1e-30)
                << "R " << R << " C " << C << " nk " << nk << " row " << r << " col " << c
                << ": got " << got << " want " << want;
          }
        }
      }
    }
  }
}

// Kp[panel][d][w] = K[j0 + panel W + w][d] x kscale (one f32 rounding; kscale 1, and the
// scale x log2 e of QUnit::f32_in_place) and Vp[chunk][key][c] = V[j0 + key][c0 + c], zero past
// the keys and past Dv, for ragged key counts, odd D/Dv and strided, misaligned K/V.
TEST_P(Micro, PackKVIsExactWithRaggedEdges) {
  const auto& k = mk();
  const std::int64_t W = k.score_cols * k.lanes, CW = k.pv_cols * k.lanes;
  for (const float kscale : {1.0f, 0.18033688f})
    for (std::int64_t D : {1, 5, 17, 67}) {
      for (std::int64_t Dv : {1, 3, 16, 33}) {
        for (std::int64_t nk : {std::int64_t{1}, W - 1, W + 3, k.block_keys}) {
          const std::int64_t Lk = nk + 9, j0 = 4;
          const std::int64_t ks = D + 3, vs = Dv + 5;  // row strides (a padded [Lk, D] layout)
          Buf K(Lk * ks, 1), V(Lk * vs, 3);
          fill(K.data(), Lk * ks, 29);
          fill(V.data(), Lk * vs, 31);
          detail::Problem p;
          p.B = 1, p.H = 1, p.Hkv = 1, p.Lq = 1, p.Lk = Lk, p.D = D, p.Dv = Dv;
          p.k.data = K.data();
          p.k.s[2] = ks;
          p.v.data = V.data();
          p.v.s[2] = vs;
          const std::int64_t panels = (nk + W - 1) / W,
                             dvp = (Dv + k.lanes - 1) / k.lanes * k.lanes;
          Buf kp(panels * W * D + 64), vp(nk * dvp + 64);
          std::fill(kp.v.begin(), kp.v.end(), 7.0f);
          std::fill(vp.v.begin(), vp.v.end(), 7.0f);
          k.pack_kv(p, 0, 0, j0, nk, kscale, kp.data(), vp.data());
          for (std::int64_t pi = 0; pi < panels; ++pi)
            for (std::int64_t d = 0; d < D; ++d)
              for (std::int64_t w = 0; w < W; ++w) {
                const std::int64_t key = pi * W + w;
                const float want = key < nk ? K.data()[(j0 + key) * ks + d] * kscale : 0.0f;
                ASSERT_EQ(kp.data()[(pi * D + d) * W + w], want)
                    << "kscale " << kscale << " D " << D << " nk " << nk << " panel " << pi << " d "
                    << d << " w " << w;
              }
          for (std::int64_t c0 = 0; c0 < dvp; c0 += CW) {
            const std::int64_t cw = std::min(CW, dvp - c0);
            for (std::int64_t key = 0; key < nk; ++key)
              for (std::int64_t c = 0; c < cw; ++c) {
                const float want = c0 + c < Dv ? V.data()[(j0 + key) * vs + c0 + c] : 0.0f;
                ASSERT_EQ(vp.data()[c0 * nk + key * cw + c], want)
                    << "Dv " << Dv << " nk " << nk << " chunk " << c0 << " key " << key;
              }
          }
        }
      }
    }
}

// Three blocks through the online softmax: the final state must be m = max, l = sum 2^(s - m),
// acc rescaled to the final max; a block of masked keys changes nothing.
TEST_P(Micro, OnlineSoftmaxRowMatchesDouble) {
  const auto& k = mk();
  const std::int64_t ncols = 2 * k.score_cols * k.lanes, dvp = 2 * k.lanes;
  Buf srow(ncols), lrow(k.lanes), arow(dvp);
  float m = -kInf;
  std::fill(lrow.data(), lrow.data() + k.lanes, 0.0f);
  std::fill(arow.data(), arow.data() + dvp, 1.0f);  // stands for P V of earlier blocks
  std::vector<double> all;
  double acc_scale = 0;  // what arow's 1.0 must have become, relative to the final max
  const float shifts[] = {0.0f, 6.0f, -3.0f};
  float prev_m = -kInf;
  for (int blk = 0; blk < 4; ++blk) {
    if (blk == 2) {
      std::fill(srow.data(), srow.data() + ncols, -kInf);  // a fully masked block
    } else {
      fill(srow.data(), ncols, 37 + blk, -4.0f, 4.0f);
      for (std::int64_t c = 0; c < ncols; ++c) srow.data()[c] += shifts[blk % 3];
      srow.data()[ncols - 1] = -kInf;  // a masked key inside a live block
    }
    const std::vector<float> in(srow.data(), srow.data() + ncols);
    k.softmax_row(srow.data(), ncols, &m, lrow.data(), arow.data(), dvp);
    for (std::int64_t c = 0; c < ncols; ++c) {
      if (in[c] != -kInf) all.push_back(in[c]);
      if (in[c] == -kInf) {
        ASSERT_EQ(srow.data()[c], 0.0f) << "block " << blk << " col " << c;
        continue;
      }
      const double x = double(in[c]) - m;
      const double want = std::exp2(x);
      // exp2's 3e-7, plus the rounding of s - m in float: eps/2 |s - m| absolute in the
      // exponent, ln 2 times that relative in the result.
      const double tol = (3e-7 + 0.5 * kEps * std::log(2.0) * std::abs(x)) * want + 1e-30;
      ASSERT_NEAR(srow.data()[c], want, tol) << "block " << blk << " col " << c;
    }
    // Nothing is rescaled while m is -inf: after block 0, arow is 1 relative to its max.
    if (blk == 0) acc_scale = 1.0;
    if (blk > 0 && prev_m != -kInf) acc_scale *= std::exp2(double(prev_m) - m);
    prev_m = m;
  }
  double mx = -INFINITY, l = 0;
  for (double s : all) mx = std::max(mx, s);
  for (double s : all) l += std::exp2(s - mx);
  EXPECT_EQ(m, static_cast<float>(mx));
  double lsum = 0;
  for (int i = 0; i < k.lanes; ++i) lsum += lrow.data()[i];
  EXPECT_NEAR(lsum, l, 8 * kEps * l * std::sqrt(double(all.size())));
  for (std::int64_t c = 0; c < dvp; ++c)
    EXPECT_NEAR(arow.data()[c], acc_scale, 4e-6 * acc_scale) << "col " << c;
}

// A size whose bytes overflow is refused, and the buffer (and its capacity) stay as they were.
TEST(Scratch, OverflowingSizeIsRefusedAndKeepsTheBuffer) {
  detail::Scratch s;
  float* p = s.get(100);
  ASSERT_NE(p, nullptr);
  const std::size_t cap = s.capacity();
  EXPECT_THROW(s.get(SIZE_MAX / 2), std::bad_alloc);
  EXPECT_EQ(s.capacity(), cap);
  EXPECT_EQ(s.get(100), p);
}

INSTANTIATE_TEST_SUITE_P(Backends, Micro, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace cpuattn::test
