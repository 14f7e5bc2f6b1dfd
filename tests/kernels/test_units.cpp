// Micro-kernel testers for the flash kernel's units (XNNPACK's style: a tester object with the
// unit's sizes and strides, its output checked against a scalar loop in double precision with a
// tolerance that grows with the reduction length), on every provider and target this CPU runs:
// the widening of every K/V type of the dtype list, Q packing, the streamed score units (one
// stream and runs), the P V runs over every K/V type, the output epilogue and the split-key
// merge. The tiles, K/V packing and the online softmax are in test_kernels.cpp; the native units
// in test_native_units.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "core/softmax.h"
#include "dispatch/dispatch.h"
#include "micro.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

const double kEps = std::numeric_limits<float>::epsilon();

std::vector<DType> kv_dtypes() {
  std::vector<DType> ts;
  for (int i = 0; i < kNumDTypes; ++i)
    if (is_kv_dtype(static_cast<DType>(i))) ts.push_back(static_cast<DType>(i));
  return ts;
}

// n random elements of a K/V dtype, as stored: a tensor type rounded from uniform [-1, 1), a
// scaled type quantized from uniform values over its whole range; value(i) is the exact value of
// element i (the scalar definition, without scale).
struct Stored {
  DType dtype;
  std::vector<std::uint8_t> bytes;
  Stored(DType d, std::size_t n, std::uint32_t seed) : dtype(d), bytes(n * dtype_size(d) + 64) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      if (!needs_scales(d)) {
        detail::store_float(bytes.data(), d, static_cast<std::int64_t>(i), u(rng));
        continue;
      }
      detail::with_elem(d, [&](auto e) {
        using T = decltype(e);
        if constexpr (detail::ElemTraits<T>::kScaled)
          reinterpret_cast<T*>(bytes.data())[i] =
              detail::ElemTraits<T>::Quantize(u(rng) * detail::ElemTraits<T>::kMaxStored);
      });
    }
  }
  const void* data(std::size_t offset = 0) const {
    return bytes.data() + offset * dtype_size(dtype);
  }
  double value(std::size_t i) const {
    return detail::load_as_float(bytes.data(), dtype, static_cast<std::int64_t>(i));
  }
};

class Units : public ::testing::TestWithParam<Backend> {
 protected:
  const detail::MicroKernels& mk() const {
    return detail::micro_kernels(detail::choose(GetParam().target, GetParam().simd));
  }
};

// Every bit pattern of every 1- and 2-byte K/V type, and f32 specials, widen to exactly the
// scalar definition's value (NaN to NaN); odd counts exercise the partial tail.
TEST_P(Units, WideningMatchesTheScalarDefinition) {
  const auto& k = mk();
  for (DType d : kv_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    const std::size_t size = dtype_size(d);
    std::vector<std::uint8_t> in;
    if (size <= 2) {
      const std::size_t patterns = std::size_t{1} << (8 * size);
      in.resize(patterns * size);
      for (std::size_t i = 0; i < patterns; ++i)
        for (std::size_t b = 0; b < size; ++b)
          in[i * size + b] = static_cast<std::uint8_t>(i >> (8 * b));
    } else {
      std::vector<float> x = random_floats(1000, 3, -1e6f, 1e6f);
      for (float s : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::denorm_min(), std::nanf("")})
        x.push_back(s);
      in.resize(x.size() * 4);
      std::memcpy(in.data(), x.data(), in.size());
    }
    for (std::size_t n : {in.size() / size, in.size() / size - 3, std::size_t{5}}) {
      std::vector<float> out(n, 7.0f);
      k.widen(d, in.data(), out.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        const float want = detail::load_as_float(in.data(), d, static_cast<std::int64_t>(i));
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(out[i])) << "element " << i;
        } else {
          ASSERT_EQ(out[i], want) << "element " << i << " of " << n;
          ASSERT_EQ(std::signbit(out[i]), std::signbit(want)) << "element " << i;
        }
      }
    }
  }
}

// bf16 read by parity (the GEMV's reading of bf16 weights on AVX2 and AVX-512): every bit pattern
// at an even and at an odd position widens to exactly the scalar definition's value.
TEST_P(Units, Bf16ParityWideningMatchesTheScalarDefinition) {
  const auto& k = mk();
  std::vector<std::uint16_t> in(2 * 65536);
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<std::uint16_t>(i < 65536 ? i : (i * 40503u + 17) % 65536);
  std::vector<float> out(in.size(), 7.0f);
  if (!k.widen_bf16_parity(in.data(), out.data(), in.size()))
    GTEST_SKIP() << "no parity loads on this target";
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float want = detail::load_as_float(in.data(), DType::bf16, static_cast<std::int64_t>(i));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(out[i])) << "element " << i;
    } else {
      ASSERT_EQ(out[i], want) << "element " << i << " (bits " << in[i] << ")";
      ASSERT_EQ(std::signbit(out[i]), std::signbit(want)) << "element " << i;
    }
  }
}

// Fp8E4M3Lo, the decode reading: every byte, at every position of a vector and of a pair, is
// 2^-120 times its exact value (times 2^120 gives that value, sign of zero included), and a NaN
// code reads as +-480 * 2^-120 or NaN (the units that read it find NaN codes themselves).
TEST_P(Units, Fp8LoReadingIsTheValueTimesTwoToTheMinus120) {
  const auto& k = mk();
  const std::size_t N = static_cast<std::size_t>(k.lanes);
  std::vector<std::uint8_t> in(2 * 256 + 3 * N);
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<std::uint8_t>(i < 256 ? i : (i * 37 + 11) % 256);
  for (std::size_t n : {in.size() / N * N, 256 - N}) {
    std::vector<float> out(n, 7.0f);
    k.widen_fp8_lo(in.data(), out.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t b = in[i];
      const float got = out[i] * 0x1p120f;
      if ((b & 0x7f) == 0x7f) {
        if (!std::isnan(got)) {
          ASSERT_EQ(got, (b & 0x80) ? -480.0f : 480.0f) << "byte " << int(b) << ", element " << i;
        }
        continue;
      }
      const float want = detail::load_as_float(&in[i], DType::fp8_e4m3, 0);
      ASSERT_EQ(got, want) << "byte " << int(b) << ", element " << i << " of " << n;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << "byte " << int(b);
    }
  }
}

// QUnit::f32: Qp[r][d] = round(q[r][d] * qscale) for the block's rows (position-major over the
// block's heads), zero from D to the row stride, for every Q dtype and ragged D.
TEST_P(Units, PackQScalesRowsAndZeroPads) {
  const auto& k = mk();
  for (DType qd : {DType::f32, DType::bf16, DType::f16}) {
    for (std::int64_t D : {1, 7, 16, 37, 64}) {
      const std::int64_t H = 3, L = 5, nh = 2, h0 = 1, pos0 = 2, rows = 6;  // 3 positions x 2 heads
      const std::int64_t qs = (D + 15) / 16 * 16 + 16;
      const Stored q(qd, H * L * D, 41);
      detail::Problem p;
      p.B = 1, p.H = H, p.Lq = L, p.D = D;
      p.q.data = q.data();
      p.q.dtype = qd;
      p.q.s[1] = L * D, p.q.s[2] = D;
      // Qp is 64-byte aligned with a row stride of whole 16 floats (TaskScratch).
      std::vector<float> qp_buf(rows * qs + 64, 9.0f);
      float* qp =
          qp_buf.data() + (64 - reinterpret_cast<std::uintptr_t>(qp_buf.data()) % 64) % 64 / 4;
      const float qscale = 0.3f;
      k.pack_q(p, 0, h0, nh, pos0, static_cast<int>(rows), qscale, qs, qp);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t d = 0; d < qs; ++d) {
          const std::int64_t h = h0 + r % nh, i = pos0 + r / nh;
          const float want =
              d < D ? static_cast<float>(q.value((h * L + i) * D + d)) * qscale : 0.0f;
          ASSERT_EQ(qp[r * qs + d], want)
              << dtype_name(qd) << " D " << D << " row " << r << " d " << d;
        }
    }
  }
}

// The streamed score units against a double dot product: s[r][j] = qp[r] . K[j] * scale[j], for
// every K/V type, every row count up to 8, ragged D and key counts, strided K rows; the error
// bound grows with D (f32 sums of D products, each a product of exact values).
class StreamScoreTester {
 public:
  StreamScoreTester& dtype(DType d) {
    dtype_ = d;
    return *this;
  }
  StreamScoreTester& rows(int r) {
    rows_ = r;
    return *this;
  }
  StreamScoreTester& dims(std::int64_t d) {
    D_ = d;
    return *this;
  }
  StreamScoreTester& keys(std::int64_t n) {
    nk_ = n;
    return *this;
  }
  // Keys in runs of these lengths (ScoreUnit::dot_runs); empty: one stream (ScoreUnit::dot).
  StreamScoreTester& runs(std::vector<std::int64_t> lens) {
    runs_ = std::move(lens);
    return *this;
  }

  void Test(const detail::MicroKernels& k) const {
    const std::int64_t ks = D_ + 3, qs = (D_ + 15) / 16 * 16 + 32, s_stride = nk_ + 5;
    const Stored K(dtype_, nk_ * ks, 51);
    const bool scaled = needs_scales(dtype_);
    AlignedFloats q_buf(
        random_floats(rows_ * qs, 52));  // Qp rows (vector-aligned, as TaskScratch lays them)
    const float* q = q_buf.data();
    const std::vector<float> scale = random_floats(nk_, 53, 0.001f, 0.01f);
    std::vector<float> s(rows_ * s_stride, 7.0f);
    if (runs_.empty()) {
      k.stream_dot(dtype_, rows_, q, qs, D_, K.data(), ks, nk_, scaled ? scale.data() : nullptr, 1,
                   s.data(), s_stride);
    } else {
      std::vector<const void*> kr;
      std::vector<const float*> sr;
      std::vector<std::int64_t> off;
      for (std::int64_t j = 0, i = 0; i < static_cast<std::int64_t>(runs_.size());
           j += runs_[i++]) {
        kr.push_back(K.data(j * ks));
        sr.push_back(scaled ? scale.data() + j : nullptr);
        off.push_back(j);
      }
      k.stream_runs(dtype_, rows_, q, qs, D_, static_cast<int>(runs_.size()), kr.data(), sr.data(),
                    off.data(), runs_.data(), ks, 1, s.data(), s_stride);
    }
    for (int r = 0; r < rows_; ++r)
      for (std::int64_t j = 0; j < nk_; ++j) {
        double want = 0, mag = 0;
        for (std::int64_t d = 0; d < D_; ++d) {
          const double t = double(q[r * qs + d]) * K.value(j * ks + d);
          want += t;
          mag += std::abs(t);
        }
        const double sc = scaled ? scale[j] : 1.0;
        ASSERT_LE(std::abs(s[r * s_stride + j] - want * sc), (2 * D_ + 2) * kEps * mag * sc + 1e-30)
            << dtype_name(dtype_) << " R " << rows_ << " D " << D_ << " keys " << nk_
            << (runs_.empty() ? " one stream" : " runs") << ": row " << r << " key " << j;
      }
  }

 private:
  DType dtype_ = DType::f32;
  int rows_ = 1;
  std::int64_t D_ = 16, nk_ = 4;
  std::vector<std::int64_t> runs_;
};

TEST_P(Units, StreamDotMatchesDouble) {
  const auto& k = mk();
  for (DType d : kv_dtypes())
    for (int R = 1; R <= 8; ++R)
      for (std::int64_t D : {1, 5, 16, 37, 128})
        for (std::int64_t nk : {1, 3, 4, 9})
          StreamScoreTester().dtype(d).rows(R).dims(D).keys(nk).Test(k);
}

TEST_P(Units, StreamRunsMatchDouble) {
  const auto& k = mk();
  for (DType d : kv_dtypes())
    for (int R = 1; R <= 8; ++R)
      for (std::int64_t D : {3, 64})
        for (const std::vector<std::int64_t>& lens :
             {std::vector<std::int64_t>{4, 4, 4, 4}, {3, 5, 1, 7, 2}, {9}, {2, 6, 6, 6, 6, 1}}) {
          std::int64_t nk = 0;
          for (std::int64_t n : lens) nk += n;
          StreamScoreTester().dtype(d).rows(R).dims(D).keys(nk).runs(lens).Test(k);
        }
}

// PvUnit::runs: acc[r][c] += sum over the runs' keys of p[r][key] * V[key][c0 + c], V of every
// K/V type read in place (rows v_stride apart), the accumulators kept across runs.
TEST_P(Units, PvRunsMatchDouble) {
  const auto& k = mk();
  for (DType d : kv_dtypes())
    for (int R = 1; R <= k.pv_rows; ++R)
      for (int C = 1; C <= k.pv_cols; ++C) {
        const std::vector<std::int64_t> j0 = {0, 5, 6}, n = {5, 1, 10};
        const std::int64_t nk = 16, c0 = k.lanes, v_stride = c0 + C * k.lanes + 3;
        const std::int64_t p_stride = nk + 3, acc_stride = C * k.lanes + 16;
        const Stored V(d, nk * v_stride, 61);
        const std::vector<float> p = random_floats(R * p_stride, 62, 0.0f, 1.0f);
        std::vector<float> acc = random_floats(R * acc_stride + 64, 63);
        float* a = acc.data() + (64 - reinterpret_cast<std::uintptr_t>(acc.data()) % 64) % 64 / 4;
        const std::vector<float> before(a, a + R * acc_stride);
        std::vector<const void*> v;
        for (std::int64_t start : j0) v.push_back(V.data(start * v_stride));
        k.pv_runs(d, R, C, p.data(), p_stride, 3, v.data(), j0.data(), n.data(), c0, v_stride, a,
                  acc_stride);
        for (int r = 0; r < R; ++r)
          for (std::int64_t c = 0; c < C * k.lanes; ++c) {
            double want = before[r * acc_stride + c], mag = std::abs(want);
            for (std::int64_t j = 0; j < nk; ++j) {
              const double t = double(p[r * p_stride + j]) * V.value(j * v_stride + c0 + c);
              want += t;
              mag += std::abs(t);
            }
            ASSERT_LE(std::abs(a[r * acc_stride + c] - want), 2 * (nk + 1) * kEps * mag + 1e-30)
                << dtype_name(d) << " R " << R << " C " << C << " row " << r << " col " << c;
          }
      }
}

// The output epilogue: out = arow * RowState::out_scale() rounded to out's dtype (the scalar
// conversion's bits), lse = RowState::lse(), for f32 (plain and non-temporal, aligned and not),
// bf16 and f16 outputs, with and without a sink, and an empty row.
TEST_P(Units, OutputEpilogueWritesTheNormalisedRow) {
  const auto& k = mk();
  for (DType od : {DType::f32, DType::bf16, DType::f16})
    for (std::int64_t Dv : {1, 16, 21, 64})
      for (detail::OutUnit unit :
           {detail::OutUnit::f32, detail::OutUnit::f32_stream, detail::OutUnit::narrow}) {
        if ((od == DType::f32) == (unit == detail::OutUnit::narrow)) continue;
        for (float m : {1.5f, -std::numeric_limits<float>::infinity()})
          for (float sink : {-std::numeric_limits<float>::infinity(), 0.7f}) {
            const std::int64_t H = 2, L = 3, h = 1, i = 2;
            std::vector<float> arow_buf = random_floats(Dv + 32, 71);
            float* arow = arow_buf.data() +
                          (64 - reinterpret_cast<std::uintptr_t>(arow_buf.data()) % 64) % 64 / 4;
            std::vector<std::uint8_t> out((H * L * Dv + 16) * 4 + 64, 0xEE);
            std::vector<float> lse(H * L, 5.0f);
            detail::Problem p;
            p.B = 1, p.H = H, p.Lq = L, p.Dv = Dv;
            p.out = out.data() + 64 - reinterpret_cast<std::uintptr_t>(out.data()) % 64;
            p.out_dtype = od;
            p.out_s[1] = L * Dv, p.out_s[2] = Dv;
            p.lse = lse.data();
            p.lse_s[1] = L, p.lse_s[2] = 1;
            const float l = 2.25f;
            k.write_row(p, unit, m, l, sink, arow, 0, h, i);
            const detail::RowState st{m, l, sink};
            const float scale = st.out_scale();
            for (std::int64_t d = 0; d < Dv; ++d) {
              alignas(8) std::uint8_t want[8];
              detail::store_float(want, od, 0, arow[d] * scale);
              const auto* got =
                  static_cast<const std::uint8_t*>(p.out) + ((h * L + i) * Dv + d) * dtype_size(od);
              ASSERT_EQ(std::memcmp(got, want, dtype_size(od)), 0)
                  << dtype_name(od) << " Dv " << Dv << " unit " << int(unit) << " m " << m << " d "
                  << d;
            }
            const float want_lse = st.lse();
            if (std::isinf(want_lse)) {
              ASSERT_EQ(lse[h * L + i], want_lse);
            } else {
              ASSERT_EQ(lse[h * L + i], want_lse);
            }
            ASSERT_EQ(lse[0], 5.0f) << "another row's lse was written";
          }
      }
}

// The split-key merge: k_splits partial (m, l, acc) rows combined in double precision as the
// softmax defines them, with the head's sink; a split of no keys (m = -inf) adds nothing, a row
// of only such splits is 0, a NaN m poisons its row; for f32 and bf16 outputs.
TEST_P(Units, SplitMergeMatchesDouble) {
  const auto& k = mk();
  const float inf = std::numeric_limits<float>::infinity();
  for (DType od : {DType::f32, DType::bf16})
    for (std::int64_t Dv : {1, 16, 21})
      for (std::int64_t splits : {2, 3, 5}) {
        const std::int64_t H = 2, L = 3, rows = H * L;
        detail::Problem p;
        p.B = 1, p.H = H, p.Hkv = 1, p.Lq = L, p.Dv = Dv;
        std::vector<float> sinks = {-inf, 0.5f};
        p.sinks = sinks.data(), p.sinks_s = 1;
        std::vector<float> out_f(rows * Dv, 9.0f), lse(rows, 9.0f);
        std::vector<std::uint16_t> out_h(rows * Dv, 0x7777);
        p.out = od == DType::f32 ? static_cast<void*>(out_f.data()) : out_h.data();
        p.out_dtype = od;
        p.out_s[1] = L * Dv, p.out_s[2] = Dv;
        p.lse = lse.data(), p.lse_s[1] = L, p.lse_s[2] = 1;
        detail::Plan pl;
        pl.k_splits = splits;
        pl.partial_row_floats = Dv + 2;
        std::vector<float> partials = random_floats(rows * splits * (Dv + 2), 81);
        pl.partials = partials.data();
        for (std::int64_t row = 0; row < rows; ++row)
          for (std::int64_t s = 0; s < splits; ++s) {
            float* pr = partials.data() + (row * splits + s) * (Dv + 2);
            pr[0] = 4.0f * pr[0];                           // m in [-4, 4)
            pr[1] = 1.5f + std::abs(pr[1]);                 // l in [1.5, 2.5)
            if (row == 1 && s == 1) pr[0] = -inf;           // a split that saw no key
            if (row == 2) pr[0] = -inf;                     // a row with no key at all
            if (row == 3 && s == 0) pr[0] = std::nanf("");  // a NaN score
          }
        std::vector<float> buf(Dv + 64);
        k.merge_rows(
            p, pl, 0, rows,
            buf.data() + (64 - reinterpret_cast<std::uintptr_t>(buf.data()) % 64) % 64 / 4);
        for (std::int64_t row = 0; row < rows; ++row) {
          const std::int64_t h = row / L, i = row % L;
          const double sink = h == 1 ? 0.5 * detail::kLog2e : -INFINITY;
          double M = -INFINITY;
          bool nan = false;
          for (std::int64_t s = 0; s < splits; ++s) {
            const float m = partials[(row * splits + s) * (Dv + 2)];
            nan |= std::isnan(m);
            M = std::max(M, double(m));
          }
          double l = 0;
          std::vector<double> acc(Dv, 0.0), mag(Dv, 0.0);
          for (std::int64_t s = 0; s < splits && !nan && M > -INFINITY; ++s) {
            const float* pr = partials.data() + (row * splits + s) * (Dv + 2);
            if (pr[0] == -inf) continue;
            const double w = std::exp2(double(pr[0]) - M);
            l += pr[1] * w;
            for (std::int64_t d = 0; d < Dv; ++d)
              acc[d] += pr[2 + d] * w, mag[d] += std::abs(pr[2 + d] * w);
          }
          const double denom = l + std::exp2(sink - M);
          for (std::int64_t d = 0; d < Dv; ++d) {
            const float got =
                od == DType::f32 ? out_f[row * Dv + d] : detail::bf16_to_f32(out_h[row * Dv + d]);
            if (nan) {
              ASSERT_TRUE(std::isnan(got)) << "row " << row;
              continue;
            }
            if (M == -INFINITY) {  // no key at all: 0 by definition
              ASSERT_EQ(got, 0.0f) << "row " << row;
              continue;
            }
            const double want = acc[d] / denom;
            const double tol = (4 * splits + 8) * kEps * (mag[d] / denom) +
                               (od == DType::bf16 ? std::ldexp(std::abs(want), -8) : 0.0) + 1e-30;
            ASSERT_LE(std::abs(got - want), tol) << dtype_name(od) << " Dv " << Dv << " splits "
                                                 << splits << " row " << row << " d " << d;
          }
          ASSERT_EQ(lse[h * L + i] == -inf, M == -INFINITY && h == 0) << "row " << row;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Backends, Units, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace cpuattn::test
