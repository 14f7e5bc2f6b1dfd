// The native units of the avx512_bf16 unit (lib/kernels/flash/x86/) against double precision on
// the same stored values, with the error each states (docs/precision.md): the bf16 tiles (Q K^T of
// bf16 pairs is exact per product; P V rounds P to bf16, 2^-8 of each term), the hi/lo decoding dot
// (2^-16 of sum |q k|), and the decoding P V runs over bf16 V (P rounded, 2^-8) and int8 V on VNNI
// (each weight within 2^-16 of the row's largest, so nk 2^-16 max|w| max|v|). Run where the CPU
// has AVX512-BF16 and VNNI (skipped elsewhere, with the reason).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtypes.h"
#include "cpuattn/cpuattn.h"
#include "dispatch/dispatch.h"
#include "micro_native.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

const double kEps = std::numeric_limits<float>::epsilon();

bool have_native() { return machine_runs(Target::avx512_bf16); }
// What `best` chooses for bf16 tiles (and, with it, the OS's leave to use the tile state).
bool have_amx() { return have_native() && detail::choose(Target::best, Simd::highway).amx_bf16; }

// n bf16 values (rounded from uniform [-1, 1)) as bits, and their exact values.
struct Bf16Rows {
  std::vector<std::uint16_t> bits;
  std::vector<float> value;
  Bf16Rows(std::size_t n, std::uint32_t seed) {
    for (float x : random_floats(n, seed)) {
      bits.push_back(to_bf16(x));
      value.push_back(from_bf16(bits.back()));
    }
  }
};

// A problem of one batch and one K/V head: Q [rows heads, 1 position, D], K [nk, D], V [nk, Dv],
// contiguous rows.
detail::Problem problem(std::int64_t rows, std::int64_t nk, std::int64_t D, std::int64_t Dv,
                        const void* q, DType qd, const void* k, const void* v, DType kvd) {
  detail::Problem p;
  p.B = 1, p.H = rows, p.Hkv = 1, p.Lq = 1, p.Lk = nk, p.D = D, p.Dv = Dv, p.group = rows;
  p.q.data = q, p.q.dtype = qd, p.q.s[1] = D, p.q.s[2] = D;
  p.k.data = k, p.k.dtype = kvd, p.k.s[2] = D;
  p.v.data = v, p.v.dtype = kvd, p.v.s[2] = Dv;
  return p;
}

// a . b over n values in double, and the sum of the terms' magnitudes (what f32 rounding scales).
std::pair<double, double> dot(const float* a, const float* b, std::int64_t n) {
  double sum = 0, mag = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double t = double(a[i]) * b[i];
    sum += t;
    mag += std::abs(t);
  }
  return {sum, mag};
}

using ScoresFn = decltype(detail::NativeMicroKernels::tile_scores);
using PvFn = decltype(detail::NativeMicroKernels::tile_pv);

// Each score within its f32 sum's rounding ((D + 2) eps of sum |q k|: the products are exact).
void ExpectScoresMatch(ScoresFn scores, std::initializer_list<int> row_counts,
                       std::initializer_list<std::int64_t> dims,
                       std::initializer_list<std::int64_t> key_counts) {
  for (int rows : row_counts)
    for (std::int64_t D : dims)
      for (std::int64_t nk : key_counts) {
        const Bf16Rows q(rows * D, 1), kv(nk * D, 2);
        const detail::Problem p = problem(rows, nk, D, D, q.bits.data(), DType::bf16,
                                          kv.bits.data(), kv.bits.data(), DType::bf16);
        const std::int64_t ncols = (nk + 63) / 64 * 64;
        AlignedFloats s(rows * ncols);
        const float qscale = 0.125f;
        scores(p, rows, nk, qscale, s.data(), ncols);
        for (int r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < nk; ++j) {
            const auto [want, mag] = dot(&q.value[r * D], &kv.value[j * D], D);
            ASSERT_LE(std::abs(s.data()[r * ncols + j] - qscale * want),
                      (D + 2) * kEps * qscale * mag + 1e-30)
                << "rows " << rows << " D " << D << " nk " << nk << ": row " << r << " key " << j;
          }
      }
}

TEST(NativeUnits, TileScoresMatchDouble) {
  if (!have_native()) GTEST_SKIP() << "no AVX512-BF16 + VNNI on this CPU";
  ExpectScoresMatch(detail::native_micro_kernels().tile_scores, {1, 5, 6, 13}, {1, 31, 64, 130},
                    {1, 63, 65, 128});
}

// The AMX tiles: row counts around the 16-row tiles and their pairs, head sizes of 1 to 4 steps of
// 32 dims, keys in part of a panel and across two.
TEST(NativeUnits, AmxScoresMatchDouble) {
  if (!have_amx()) GTEST_SKIP() << "no AMX-BF16 (or no leave from the OS to use it) on this CPU";
  ExpectScoresMatch(detail::native_micro_kernels().amx_scores, {1, 5, 16, 17, 32, 33, 50},
                    {32, 96, 128}, {1, 63, 65, 128});
}

// Scores and softmax in one pass: each probability 2^(s - m) within the bf16 rounding (2^-8),
// Exp2Bf16's 3e-6 and what the f32 score's rounding moves it by; the sums the same without the
// rounding plus nk f32 additions. A score above m + 8 (by a row's m), or NaN, is refused. With
// `first` (rows that have seen no key) the tiles set m to each row's largest score of the first
// 64-key panel, within that score's rounding, and a refusal leaves m at -inf.
TEST(NativeUnits, TileProbsMatchDouble) {
  if (!have_native()) GTEST_SKIP() << "no AVX512-BF16 + VNNI on this CPU";
  const auto& k = detail::native_micro_kernels();
  const float qscale = 0.125f * 1.4426950408889634f;  // log2 units
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (bool first : {false, true})
    for (int rows : {1, 5, 6, 13})
      for (std::int64_t D : {1, 31, 64, 130})
        for (std::int64_t nk : {64, 128, 192}) {
          const Bf16Rows q(rows * D, 5), kv(nk * D, 6);
          const detail::Problem p = problem(rows, nk, D, D, q.bits.data(), DType::bf16,
                                            kv.bits.data(), kv.bits.data(), DType::bf16);
          std::vector<double> want(rows * nk), err(rows * nk);
          std::vector<float> m(rows);
          std::vector<double> row_max(rows), first_max(rows, -1e300), first_err(rows);
          for (int r = 0; r < rows; ++r) {
            double mx = -1e300;
            for (std::int64_t j = 0; j < nk; ++j) {
              const auto [s, mag] = dot(&q.value[r * D], &kv.value[j * D], D);
              want[r * nk + j] = qscale * s;
              err[r * nk + j] = (D + 3) * kEps * qscale * mag;
              mx = std::max(mx, qscale * s);
              if (j < 64 && qscale * s > first_max[r]) {
                first_max[r] = qscale * s;
                first_err[r] = err[r * nk + j];
              }
            }
            row_max[r] = mx;
            // Scores up to 3 - r / 2 above m; with `first`, m is the kernel's to set.
            m[r] = first ? neg_inf : static_cast<float>(mx - 3 + 0.5 * r);
          }
          std::vector<std::uint16_t> pb(rows * nk);
          AlignedFloats lsum(rows * 16);
          const std::string what = std::string(first ? "first, " : "") + "rows " +
                                   std::to_string(rows) + " D " + std::to_string(D) + " nk " +
                                   std::to_string(nk);
          ASSERT_TRUE(
              k.tile_probs(p, rows, nk, qscale, m.data(), first, pb.data(), nk, lsum.data()))
              << what;
          for (int r = 0; r < rows; ++r) {
            if (first) {
              ASSERT_LE(std::abs(m[r] - first_max[r]), first_err[r] + kEps * std::abs(first_max[r]))
                  << what << ": m of row " << r;
            }
            double sum = 0, sum_tol = 0, got_sum = 0;
            for (std::int64_t j = 0; j < nk; ++j) {
              const double x = want[r * nk + j] - m[r], e = std::exp2(x);
              const double rel = 3e-6 + std::log(2.0) * (err[r * nk + j] + kEps * std::abs(x));
              ASSERT_LE(std::abs(from_bf16(pb[r * nk + j]) - e), (std::ldexp(1.0, -8) + rel) * e)
                  << what << ": row " << r << " key " << j;
              sum += e;
              sum_tol += (rel + nk * kEps) * e;
            }
            for (int i = 0; i < 16; ++i) got_sum += lsum.data()[r * 16 + i];
            ASSERT_LE(std::abs(got_sum - sum), sum_tol) << what << ": the sum of row " << r;
          }
          // The first or the last row's largest score 8.5 above its m is refused (the first
          // row's tile comes before the other rows' in each panel, and the refusal is known after
          // the block's last tile); a NaN key as well (in the first panel and in the last).
          const std::vector<float> m_kept = m;
          if (!first) {
            for (int bad : {0, rows - 1}) {
              m = m_kept;
              m[bad] = static_cast<float>(row_max[bad] - 8.5);
              EXPECT_FALSE(
                  k.tile_probs(p, rows, nk, qscale, m.data(), first, pb.data(), nk, lsum.data()))
                  << what << ", row " << bad;
            }
          }
          for (std::int64_t j : {std::int64_t{0}, nk - 1}) {
            m = first ? std::vector<float>(rows, neg_inf) : m_kept;
            std::vector<std::uint16_t> knan = kv.bits;
            knan[j * D] = 0x7fc0;  // a bf16 NaN in key j
            const detail::Problem pn = problem(rows, nk, D, D, q.bits.data(), DType::bf16,
                                               knan.data(), knan.data(), DType::bf16);
            EXPECT_FALSE(
                k.tile_probs(pn, rows, nk, qscale, m.data(), first, pb.data(), nk, lsum.data()))
                << what << ", NaN key " << j;
            if (first) {
              for (int r = 0; r < rows; ++r)
                EXPECT_EQ(m[r], neg_inf) << what << ", NaN key " << j << ": m of row " << r;
            }
          }
        }
}

// P V with P rounded to bf16: each term p v within 2^-8 |p v|, plus f32 sums.
void ExpectPvMatches(PvFn pv_fn, std::initializer_list<int> row_counts,
                     std::initializer_list<std::int64_t> widths,
                     std::initializer_list<std::int64_t> key_counts) {
  for (int rows : row_counts)
    for (std::int64_t Dv : widths)
      for (std::int64_t nk : key_counts) {
        const Bf16Rows v(nk * Dv, 3);
        const detail::Problem p = problem(rows, nk, 1, Dv, v.bits.data(), DType::bf16,
                                          v.bits.data(), v.bits.data(), DType::bf16);
        const std::int64_t ncols = (nk + 63) / 64 * 64, dvp = (Dv + 15) / 16 * 16;
        AlignedFloats pr(rows * ncols), acc(rows * dvp);
        const auto pv = random_floats(rows * nk, 4, 0.0f, 1.0f);
        for (int r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < nk; ++j) pr.data()[r * ncols + j] = pv[r * nk + j];
        // Accumulators that start away from 0, as a block after the first finds them.
        const auto acc0 = random_floats(rows * dvp, 5);
        for (std::int64_t i = 0; i < rows * dvp; ++i) acc.data()[i] = acc0[i];
        pv_fn(p, rows, nk, pr.data(), ncols, acc.data(), dvp);
        for (int r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < Dv; ++c) {
            double want = acc0[r * dvp + c], mag = std::abs(want);
            for (std::int64_t j = 0; j < nk; ++j) {
              const double t = double(pv[r * nk + j]) * v.value[j * Dv + c];
              want += t;
              mag += std::abs(t);
            }
            ASSERT_LE(std::abs(acc.data()[r * dvp + c] - want),
                      (std::ldexp(1.0, -8) + (nk + 2) * kEps) * mag + 1e-30)
                << "rows " << rows << " Dv " << Dv << " nk " << nk << ": row " << r << " col " << c;
          }
      }
}

TEST(NativeUnits, TilePvMatchesDouble) {
  if (!have_native()) GTEST_SKIP() << "no AVX512-BF16 + VNNI on this CPU";
  ExpectPvMatches(detail::native_micro_kernels().tile_pv, {1, 6, 7}, {1, 40, 64, 100},
                  {1, 2, 63, 128});
}

// The AMX tiles: rows around 16 and 32, widths of part of a tile, an odd number of 16-column
// tiles and several chunks, keys below one step of 32, whole steps and steps with a tail.
TEST(NativeUnits, AmxPvMatchesDouble) {
  if (!have_amx()) GTEST_SKIP() << "no AMX-BF16 (or no leave from the OS to use it) on this CPU";
  ExpectPvMatches(detail::native_micro_kernels().amx_pv, {1, 15, 16, 17, 33}, {1, 40, 64, 100, 144},
                  {1, 31, 32, 33, 64, 100, 128});
}

// The decoding dot with Q split into bf16 hi + lo: within 2^-16 sum |q k| of the f32 product.
TEST(NativeUnits, HiLoScoresMatchDouble) {
  if (!have_native()) GTEST_SKIP() << "no AVX512-BF16 + VNNI on this CPU";
  const auto& k = detail::native_micro_kernels();
  for (int rows : {2, 3, 6, 8})
    for (std::int64_t D : {1, 30, 64, 128, 131})
      for (std::int64_t nk : {1, 4, 7, 33}) {
        const Bf16Rows kv(nk * D, 5);
        const detail::Problem p = problem(rows, nk, D, D, nullptr, DType::f32, kv.bits.data(),
                                          kv.bits.data(), DType::bf16);
        const std::int64_t qs = (D + 15) / 16 * 16 + (D + 31) / 32 * 32;  // TaskScratch's
        AlignedFloats qp(rows * qs), s(rows * nk);
        const auto q = random_floats(rows * D, 6);
        for (int r = 0; r < rows; ++r)
          for (std::int64_t d = 0; d < D; ++d) qp.data()[r * qs + d] = q[r * D + d];
        k.hilo_scores(rows, qp.data(), qs, p, nk, s.data(), nk);
        for (int r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < nk; ++j) {
            double want = 0, mag = 0;
            for (std::int64_t d = 0; d < D; ++d) {
              const double t = double(q[r * D + d]) * kv.value[j * D + d];
              want += t;
              mag += std::abs(t);
            }
            ASSERT_LE(std::abs(s.data()[r * nk + j] - want),
                      (std::ldexp(1.0, -16) + (D + 2) * kEps) * mag + 1e-30)
                << "rows " << rows << " D " << D << " nk " << nk << ": row " << r << " key " << j;
          }
      }
}

// The decoding P V runs: bf16 V (P rounded to bf16) and int8 V with per-key scales on VNNI
// (weights p_j vscale_j quantized against the row's largest: nk 2^-16 max|w| max|v|), in natural
// column order afterwards.
TEST(NativeUnits, PvRunsMatchDouble) {
  if (!have_native()) GTEST_SKIP() << "no AVX512-BF16 + VNNI on this CPU";
  const auto& k = detail::native_micro_kernels();
  for (DType vd : {DType::bf16, DType::i8})
    for (int rows : {2, 5, 8})
      for (std::int64_t Dv : {32, 64, 96, 128})
        for (std::int64_t nk : {1, 2, 17, 128}) {
          std::vector<std::uint16_t> v16;
          std::vector<std::int8_t> v8;
          std::vector<float> value(nk * Dv), vscale(nk);
          const auto x = random_floats(nk * Dv, 7);
          if (vd == DType::bf16) {
            for (float f : x) v16.push_back(to_bf16(f));
            for (std::int64_t i = 0; i < nk * Dv; ++i) value[i] = from_bf16(v16[i]);
          } else {
            v8.resize(nk * Dv);
            for (std::int64_t j = 0; j < nk; ++j) {
              vscale[j] = quantize_int8(x.data() + j * Dv, Dv, v8.data() + j * Dv);
              for (std::int64_t c = 0; c < Dv; ++c)
                value[j * Dv + c] = float(v8[j * Dv + c]) * vscale[j];
            }
          }
          const void* vdata = vd == DType::bf16 ? static_cast<const void*>(v16.data()) : v8.data();
          detail::Problem p = problem(rows, nk, 1, Dv, nullptr, DType::f32, vdata, vdata, vd);
          if (vd == DType::i8) p.v_scale = vscale.data(), p.v_scale_s[2] = 1;
          const std::int64_t ncols = (nk + 63) / 64 * 64;
          AlignedFloats pr(rows * ncols), acc(rows * Dv);
          const auto pv = random_floats(rows * nk, 8, 0.0f, 1.0f);
          for (int r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < nk; ++j) pr.data()[r * ncols + j] = pv[r * nk + j];
          k.pv_runs(p, rows, nk, pr.data(), ncols, acc.data(), Dv);
          for (int r = 0; r < rows; ++r) {
            // int8: the weights w_j = p_j vscale_j, each within 2^-16 max|w| after quantization,
            // times |q_j| <= 127.
            double wmax = 0;
            for (std::int64_t j = 0; j < nk; ++j)
              wmax = std::max(wmax, pv[r * nk + j] * double(vd == DType::i8 ? vscale[j] : 1.0f));
            for (std::int64_t c = 0; c < Dv; ++c) {
              double want = 0, mag = 0;
              for (std::int64_t j = 0; j < nk; ++j) {
                const double t = double(pv[r * nk + j]) * value[j * Dv + c];
                want += t;
                mag += std::abs(t);
              }
              const double tol = vd == DType::bf16 ? (std::ldexp(1.0, -8) + (nk + 2) * kEps) * mag
                                                   : nk * std::ldexp(1.0, -16) * wmax * 127.0 +
                                                         (nk + 2) * kEps * mag;
              ASSERT_LE(std::abs(acc.data()[r * Dv + c] - want), tol + 1e-30)
                  << dtype_name(vd) << " rows " << rows << " Dv " << Dv << " nk " << nk << ": row "
                  << r << " col " << c;
            }
          }
        }
}

}  // namespace
}  // namespace cpuattn::test
