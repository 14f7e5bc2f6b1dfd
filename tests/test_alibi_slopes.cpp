// ALiBi slopes per sequence and head, [B, H] (FlashAttention's convention), wherever [H] is taken:
// dense attention, packed batches (one row per sequence) and paged caches. Each sequence must give
// what a call on that sequence alone with its [H] row of slopes gives, on every backend; and bad
// shapes or values are errors that write nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

// Slopes [B, H] in rows of H + 3 floats, so the view's batch stride is not H.
struct Slopes {
  std::int64_t B, H;
  std::vector<float> t;  // [B, H + 3]
  Slopes(std::int64_t b, std::int64_t h, std::uint32_t seed)
      : B(b), H(h), t(random_floats(b * (h + 3), seed, 0.01f, 0.5f)) {}
  TensorView view() const {
    TensorView v = f32_view(t.data(), {B, H});
    v.strides[0] = H + 3;
    return v;
  }
  std::vector<float> row(std::int64_t b) const {
    return {t.begin() + b * (H + 3), t.begin() + b * (H + 3) + H};
  }
};

double tolerance(std::int64_t Lk, std::int64_t D) {
  // Slopes up to 0.5 move scores by up to 0.5 Lk, and f32 rounds them relative to that.
  const double eps = std::numeric_limits<float>::epsilon();
  return 8 * eps * (std::sqrt(double(Lk)) + std::sqrt(double(D)) * (8 + 0.5 * double(Lk))) + 1e-6;
}

class AlibiPerSequence : public ::testing::TestWithParam<Backend> {};

TEST_P(AlibiPerSequence, DenseBatches) {
  const std::int64_t B = 3, H = 4, Hkv = 2, Lq = 5, Lk = 70, D = 24;
  const auto q = random_floats(B * H * Lq * D, 1), k = random_floats(B * Hkv * Lk * D, 2),
             v = random_floats(B * Hkv * Lk * D, 3);
  const Slopes slopes(B, H, 4);
  AttentionOptions o;
  o.causal = Causal::bottom_right;
  o.alibi_slopes = slopes.view();
  std::vector<float> out(B * H * Lq * D, 7.0f), want(out.size(), 7.0f);
  for (int threads : {1, 2}) {
    Context ctx(threads);
    GetParam().apply(ctx);
    attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, Hkv, Lk, D}),
              f32_view(v.data(), {B, Hkv, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), o, &ctx);
    for (std::int64_t b = 0; b < B; ++b) {
      const auto row = slopes.row(b);
      AttentionOptions ob;
      ob.causal = o.causal;
      ob.alibi_slopes = f32_view(row.data(), {H});
      reference_attention(f32_view(q.data() + b * H * Lq * D, {1, H, Lq, D}),
                          f32_view(k.data() + b * Hkv * Lk * D, {1, Hkv, Lk, D}),
                          f32_view(v.data() + b * Hkv * Lk * D, {1, Hkv, Lk, D}),
                          f32_view(want.data() + b * H * Lq * D, {1, H, Lq, D}), ob);
    }
    EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), tolerance(Lk, D)))
        << threads << " threads";
  }
  // The reference with [B, H] agrees exactly with itself per batch.
  std::vector<float> ref(out.size(), 7.0f);
  reference_attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, Hkv, Lk, D}),
                      f32_view(v.data(), {B, Hkv, Lk, D}), f32_view(ref.data(), {B, H, Lq, D}), o);
  EXPECT_EQ(std::memcmp(ref.data(), want.data(), ref.size() * 4), 0);
}

TEST_P(AlibiPerSequence, PackedBatches) {
  // Sequences of 5, 0 (no queries), 130 and 1 queries over 9, 4, 130 and 300 keys.
  const std::vector<std::int32_t> cq = {0, 5, 5, 135, 136}, ck = {0, 9, 13, 143, 443};
  const std::int64_t H = 4, Hkv = 1, D = 16, nq = cq.back(), nk = ck.back();
  const auto q = random_floats(nq * H * D, 5), k = random_floats(nk * Hkv * D, 6),
             v = random_floats(nk * Hkv * D, 7);
  const Slopes slopes(4, H, 8);
  AttentionOptions o;
  o.causal = Causal::bottom_right;
  o.alibi_slopes = slopes.view();
  const TensorView cuq = TensorView::contiguous(cq.data(), DType::i32, {5}),
                   cuk = TensorView::contiguous(ck.data(), DType::i32, {5});
  Context ctx(2);
  GetParam().apply(ctx);
  std::vector<float> out(nq * H * D, 7.0f), want(out.size(), 7.0f);
  attention_varlen(f32_view(q.data(), {nq, H, D}), f32_view(k.data(), {nk, Hkv, D}),
                   f32_view(v.data(), {nk, Hkv, D}), f32_view(out.data(), {nq, H, D}), cuq, cuk, o,
                   &ctx);
  for (std::size_t s = 0; s + 1 < cq.size(); ++s) {
    const std::int64_t lq = cq[s + 1] - cq[s], lk = ck[s + 1] - ck[s];
    if (lq == 0) continue;
    const auto row = slopes.row(static_cast<std::int64_t>(s));
    AttentionOptions os;
    os.causal = o.causal;
    os.alibi_slopes = f32_view(row.data(), {H});
    // One sequence of the packed [total, heads, d] tensors as [1, heads, L, d].
    const auto seq = [](const float* base, std::int64_t off, std::int64_t L, std::int64_t heads) {
      TensorView t = TensorView::contiguous(base + off * heads * D, DType::f32, {1, heads, L, D});
      t.strides = {0, D, heads * D, 1};
      return t;
    };
    OutputView ov = f32_view(want.data() + cq[s] * H * D, {1, H, lq, D});
    ov.strides = {0, D, H * D, 1};
    reference_attention(seq(q.data(), cq[s], lq, H), seq(k.data(), ck[s], lk, Hkv),
                        seq(v.data(), ck[s], lk, Hkv), ov, os);
  }
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), tolerance(300, D)));
  std::vector<float> ref(out.size(), 7.0f);
  reference_attention_varlen(f32_view(q.data(), {nq, H, D}), f32_view(k.data(), {nk, Hkv, D}),
                             f32_view(v.data(), {nk, Hkv, D}), f32_view(ref.data(), {nq, H, D}),
                             cuq, cuk, o);
  EXPECT_EQ(std::memcmp(ref.data(), want.data(), ref.size() * 4), 0);
}

TEST_P(AlibiPerSequence, PagedCache) {
  const std::int64_t H = 4, Hkv = 2, D = 32, P = 16;
  const std::vector<std::int64_t> lens = {40, 1, 300};
  PagedKvCache cache(64, P, Hkv, D, D);
  std::vector<std::int64_t> seqs;
  for (std::size_t s = 0; s < lens.size(); ++s) {
    seqs.push_back(cache.add_sequence());
    const auto kk = random_floats(Hkv * lens[s] * D, 10 + static_cast<std::uint32_t>(s)),
               vv = random_floats(Hkv * lens[s] * D, 20 + static_cast<std::uint32_t>(s));
    cache.append(seqs.back(), f32_view(kk.data(), {Hkv, lens[s], D}),
                 f32_view(vv.data(), {Hkv, lens[s], D}));
  }
  const std::int64_t B = 3, Lq = 2;
  const auto q = random_floats(B * H * Lq * D, 9);
  const Slopes slopes(B, H, 30);
  AttentionOptions o;
  o.causal = Causal::bottom_right;
  o.alibi_slopes = slopes.view();
  Context ctx(2);
  GetParam().apply(ctx);
  std::vector<float> out(B * H * Lq * D, 7.0f), want(out.size(), 7.0f);
  attention(f32_view(q.data(), {B, H, Lq, D}), cache.batch(seqs),
            f32_view(out.data(), {B, H, Lq, D}), o, &ctx);
  for (std::int64_t b = 0; b < B; ++b) {
    const auto row = slopes.row(b);
    AttentionOptions ob;
    ob.causal = o.causal;
    ob.alibi_slopes = f32_view(row.data(), {H});
    reference_attention(f32_view(q.data() + b * H * Lq * D, {1, H, Lq, D}),
                        cache.batch({seqs[static_cast<std::size_t>(b)]}),
                        f32_view(want.data() + b * H * Lq * D, {1, H, Lq, D}), ob);
  }
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), tolerance(300, D)));
}

INSTANTIATE_TEST_SUITE_P(Backends, AlibiPerSequence, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

TEST(AlibiPerSequence, BadSlopesAreErrorsThatWriteNothing) {
  const std::int64_t B = 2, H = 3, L = 8, D = 8;
  const auto x = random_floats(B * H * L * D, 1);
  std::vector<float> s(3 * 4 * 2, 0.25f), out(x.size(), 7.0f);
  const auto call = [&](const TensorView& slopes) {
    AttentionOptions o;
    o.alibi_slopes = slopes;
    attention(f32_view(x.data(), {B, H, L, D}), f32_view(x.data(), {B, H, L, D}),
              f32_view(x.data(), {B, H, L, D}), f32_view(out.data(), {B, H, L, D}), o);
  };
  expect_error_mentioning(
      [&] {
        call(f32_view(s.data(), {B + 1, H}));
      },
      "alibi_slopes has shape [3,3]");
  expect_error_mentioning([&] { call(f32_view(s.data(), {B, H + 1})); }, "expected [3] or [2, 3]");
  expect_error_mentioning([&] { call(f32_view(s.data(), {B, H, 1})); }, "alibi_slopes");
  s[1 * H + 2] = std::numeric_limits<float>::infinity();
  expect_error_mentioning([&] { call(f32_view(s.data(), {B, H})); }, "alibi_slopes[1, 2] = inf");
  for (float o : out) ASSERT_EQ(o, 7.0f);
  // Packed batches: one row per sequence, not per Q's B = 1.
  const std::vector<std::int32_t> cu = {0, 3, 8};
  s[1 * H + 2] = 0.25f;
  expect_error_mentioning(
      [&] {
        AttentionOptions o;
        o.alibi_slopes = f32_view(s.data(), {3, H});
        attention_varlen(f32_view(x.data(), {8, H, D}), f32_view(x.data(), {8, H, D}),
                         f32_view(x.data(), {8, H, D}), f32_view(out.data(), {8, H, D}),
                         TensorView::contiguous(cu.data(), DType::i32, {3}),
                         TensorView::contiguous(cu.data(), DType::i32, {3}), o);
      },
      "expected [3] or [2, 3]");
  for (float o : out) ASSERT_EQ(o, 7.0f);
}

}  // namespace
}  // namespace cpuattn::test
