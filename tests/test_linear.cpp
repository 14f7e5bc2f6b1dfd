// Linear (the layers' dense product) and the vector tanh, on every target this machine runs,
// against double-precision products.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

// y[m, n] = sum_k x[m, k] w[k, n] + b[n] in double; x rows `xs` floats apart, y rows `ys`.
std::vector<float> matmul_ref(const float* x, std::int64_t xs, const float* w, const float* b,
                              std::int64_t M, std::int64_t K, std::int64_t N) {
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = b ? b[n] : 0.0;
      for (std::int64_t k = 0; k < K; ++k) acc += double(x[m * xs + k]) * w[k * N + n];
      y[m * N + n] = static_cast<float>(acc);
    }
  }
  return y;
}

// |error| of an f32 dot product of length K with entries in [-1, 1]: rounding grows like
// sqrt(K) * eps per unit of magnitude (which is itself ~ sqrt(K / 3) * 1/sqrt(3)).
double dot_atol(std::int64_t K) { return 4 * std::numeric_limits<float>::epsilon() * (K + 1); }

class LinearTargets : public ::testing::TestWithParam<Backend> {};

TEST_P(LinearTargets, MatchesDoubleOverOddShapes) {
  Context ctx(2);
  GetParam().apply(ctx);
  std::uint32_t seed = 100;
  int n = 0;
  for (std::int64_t M : {1, 2, 5, 12, 13, 97, 200}) {
    for (std::int64_t K : {1, 3, 17, 64, 255, 256, 257, 600}) {
      for (std::int64_t N : {1, 7, 32, 33, 95, 130}) {
        for (bool bias : {false, true}) {
          for (int misalign : {0, 3}) {
            // Thinned: every 5th (coprime to the periods 2, 2 and 6 of the inner loops).
            if (!grid_case_runs(n++, 5)) continue;
            // x rows padded by 5 floats (a strided slice); y rows too.
            const std::int64_t xs = K + 5, ys = N + 5;
            auto xbuf = random_floats(static_cast<std::size_t>(M * xs + misalign), ++seed);
            auto w = random_floats(static_cast<std::size_t>(K * N), ++seed);
            auto b = random_floats(static_cast<std::size_t>(N), ++seed);
            const float* x = xbuf.data() + misalign;
            std::vector<float> ybuf(static_cast<std::size_t>(M * ys + misalign), 7.0f);
            float* y = ybuf.data() + misalign;
            Linear lin(f32_view(w.data(), {K, N}),
                       bias ? std::optional<TensorView>(f32_view(b.data(), {N})) : std::nullopt);
            TensorView xv = f32_view(x, {M, K});
            xv.strides[0] = xs;
            OutputView yv = f32_view(y, {M, N});
            yv.strides[0] = ys;
            lin.forward(xv, yv, &ctx);
            const auto want = matmul_ref(x, xs, w.data(), bias ? b.data() : nullptr, M, K, N);
            std::vector<float> got(static_cast<std::size_t>(M * N));
            for (std::int64_t m = 0; m < M; ++m) {
              std::memcpy(&got[m * N], y + m * ys, sizeof(float) * N);
              for (std::int64_t p = N; p < ys && m * ys + p < M * ys; ++p) {
                ASSERT_EQ(y[m * ys + p], 7.0f) << "wrote past column N at row " << m;
              }
            }
            ASSERT_TRUE(all_close(got.data(), want.data(), got.size(), dot_atol(K), 0))
                << "M=" << M << " K=" << K << " N=" << N << " bias=" << bias
                << " misalign=" << misalign;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LinearTargets, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

// The first m rows alone take the matrix-vector path (m up to the GEMM micro-kernel's rows),
// inside a batch of 40 the GEMM's; both sum each element over k in increasing order, so a
// decoded row equals the same row of a prefill bit for bit. N = 200 is 7 panels: a group of
// four, three single panels, the last one ragged.
TEST(Linear, FewRowsBitwiseEqualToTheSameRowsInABatch) {
  const std::int64_t M = 40;
  std::uint32_t seed = 300;
  for (const Backend& be : machine_backends()) {
    for (bool bf16 : {false, true}) {
      for (auto [K, N] : {std::array<std::int64_t, 2>{1, 5}, {257, 33}, {1000, 200}, {64, 130}}) {
        SCOPED_TRACE(be.name() + (bf16 ? " bf16" : " f32") + " K" + std::to_string(K) + " N" +
                     std::to_string(N));
        auto w = random_floats(K * N, ++seed);
        std::vector<std::uint16_t> w16(w.size());
        for (std::size_t i = 0; i < w.size(); ++i) w16[i] = to_bf16(w[i]);
        const auto bias = random_floats(N, ++seed), x = random_floats(M * K, ++seed);
        const Linear lin(bf16 ? TensorView::contiguous(w16.data(), DType::bf16, {K, N})
                              : f32_view(w.data(), {K, N}),
                         f32_view(bias.data(), {N}));
        for (int threads : {1, 2}) {
          Context ctx(threads);
          be.apply(ctx);
          std::vector<float> all(M * N);
          lin.forward(f32_view(x.data(), {M, K}), f32_view(all.data(), {M, N}), &ctx);
          for (std::int64_t m : {1, 2, 3, 4, 5, 7, 8, 11, 12}) {
            std::vector<float> few(m * N + 1, 7.0f);
            lin.forward(f32_view(x.data(), {m, K}), f32_view(few.data(), {m, N}), &ctx);
            ASSERT_EQ(std::memcmp(few.data(), all.data(), m * N * 4), 0)
                << m << " rows, " << threads << " threads";
            ASSERT_EQ(few[m * N], 7.0f) << "wrote past the output";
          }
        }
      }
    }
  }
}

TEST(Linear, ConcatEqualsSeparateProducts) {
  const std::int64_t M = 37, K = 70, N0 = 40, N1 = 9, N2 = 33;
  auto x = random_floats(M * K, 1);
  auto w0 = random_floats(K * N0, 2), w1 = random_floats(K * N1, 3), w2 = random_floats(K * N2, 4);
  auto b0 = random_floats(N0, 5), b2 = random_floats(N2, 6);
  Linear cat = Linear::concat(
      {f32_view(w0.data(), {K, N0}), f32_view(w1.data(), {K, N1}), f32_view(w2.data(), {K, N2})},
      {f32_view(b0.data(), {N0}), std::nullopt, f32_view(b2.data(), {N2})});
  ASSERT_EQ(cat.out_features(), N0 + N1 + N2);
  std::vector<float> y(M * (N0 + N1 + N2));
  cat.forward(f32_view(x.data(), {M, K}), f32_view(y.data(), {M, N0 + N1 + N2}));
  const auto r0 = matmul_ref(x.data(), K, w0.data(), b0.data(), M, K, N0);
  const auto r1 = matmul_ref(x.data(), K, w1.data(), nullptr, M, K, N1);
  const auto r2 = matmul_ref(x.data(), K, w2.data(), b2.data(), M, K, N2);
  std::vector<float> want;
  for (std::int64_t m = 0; m < M; ++m) {
    want.insert(want.end(), r0.begin() + m * N0, r0.begin() + (m + 1) * N0);
    want.insert(want.end(), r1.begin() + m * N1, r1.begin() + (m + 1) * N1);
    want.insert(want.end(), r2.begin() + m * N2, r2.begin() + (m + 1) * N2);
  }
  EXPECT_TRUE(all_close(y.data(), want.data(), y.size(), dot_atol(K), 0));
}

TEST(Linear, Rank3StridedSliceAndThreadsBitwise) {
  // x is the [B, L, 48] slice at column 16 of a [B, L, 80] buffer; y a [B, L, 50] slice of a
  // [B, L, 64] one. 1, 2 and 3 threads must agree bit for bit.
  const std::int64_t B = 3, L = 41, K = 48, N = 50;
  auto xbuf = random_floats(B * L * 80, 11);
  auto w = random_floats(K * N, 12);
  Linear lin(f32_view(w.data(), {K, N}));
  TensorView xv = TensorView::contiguous(xbuf.data() + 16, DType::f32, {B, L, K});
  xv.strides = {L * 80, 80, 1, 0};
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    Context ctx(threads);
    std::vector<float> ybuf(B * L * 64, 0.0f);
    OutputView yv = OutputView::contiguous(ybuf.data(), DType::f32, {B, L, N});
    yv.strides = {L * 64, 64, 1, 0};
    lin.forward(xv, yv, &ctx);
    outs.push_back(ybuf);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
  for (std::int64_t r = 0; r < B * L; ++r) {
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (std::int64_t k = 0; k < K; ++k) acc += double(xbuf[r * 80 + 16 + k]) * w[k * N + n];
      ASSERT_NEAR(outs[0][r * 64 + n], acc, dot_atol(K)) << "row " << r << " col " << n;
    }
  }
}

TEST(Linear, BadArgumentsNameThemAndLeaveYUntouched) {
  auto w = random_floats(6 * 4, 1);
  auto x = random_floats(5 * 6, 2);
  std::vector<float> y(5 * 4, 3.0f);
  Linear lin(f32_view(w.data(), {6, 4}));
  auto expect_error = [&](auto&& f, const std::string& needle) {
    expect_error_mentioning(f, needle);
    for (float v : y) ASSERT_EQ(v, 3.0f);
  };
  expect_error(
      [&] {
        lin.forward(f32_view(x.data(), {5, 5}), f32_view(y.data(), {5, 4}));
      },
      "in_features=6");
  expect_error(
      [&] {
        lin.forward(f32_view(x.data(), {5, 6}), f32_view(y.data(), {5, 3}));
      },
      "out_features=4");
  expect_error(
      [&] {
        lin.forward(f32_view(x.data(), {4, 6}), f32_view(y.data(), {5, 4}));
      },
      "same leading dimensions");
  expect_error(
      [&] {
        lin.forward(f32_view(y.data(), {5, 4}), f32_view(y.data(), {5, 4}));
      },
      "in_features");
  expect_error(
      [&] {
        Linear l2(f32_view(w.data(), {6, 4}));
        l2.forward(f32_view(y.data(), {3, 6}), f32_view(y.data() + 2, {3, 4}));
      },
      "overlaps x");
  expect_error(
      [&] {
        Linear bad(f32_view(w.data(), {6, 4}), f32_view(w.data(), {3}));
      },
      "bias 0 [3]");
  expect_error(
      [&] {
        Linear::concat({f32_view(w.data(), {6, 4}), f32_view(w.data(), {4, 6})});
      },
      "share K");
  expect_error(
      [&] {
        Linear bad(f32_view(static_cast<const float*>(nullptr), {6, 4}));
      },
      "data is null");
}

}  // namespace
}  // namespace cpuattn::test
