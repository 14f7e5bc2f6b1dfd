// Packed variable-length batches (attention_varlen): every sequence against the reference run on
// that sequence alone, on every backend, with zero-length sequences, GQA, causal, windows and the
// other variants; the reference_attention_varlen oracle likewise; and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

struct Packed {
  std::int64_t H, Hkv, D, Dv;
  std::vector<std::int64_t> lq, lk;      // per sequence
  std::vector<std::int32_t> cu_q, cu_k;  // offsets
  std::vector<float> q, k, v;
  std::int64_t total_q = 0, total_k = 0;
  Packed(std::int64_t H_, std::int64_t Hkv_, std::int64_t D_, std::int64_t Dv_,
         std::vector<std::int64_t> lq_, std::vector<std::int64_t> lk_, std::uint32_t seed)
      : H(H_), Hkv(Hkv_), D(D_), Dv(Dv_), lq(std::move(lq_)), lk(std::move(lk_)) {
    cu_q.push_back(0);
    cu_k.push_back(0);
    for (std::size_t b = 0; b < lq.size(); ++b) {
      cu_q.push_back(static_cast<std::int32_t>(cu_q.back() + lq[b]));
      cu_k.push_back(static_cast<std::int32_t>(cu_k.back() + lk[b]));
    }
    total_q = cu_q.back(), total_k = cu_k.back();
    q = random_floats(total_q * H * D, seed);
    k = random_floats(total_k * Hkv * D, seed + 1);
    v = random_floats(total_k * Hkv * Dv, seed + 2);
  }
  std::int64_t B() const { return static_cast<std::int64_t>(lq.size()); }
  TensorView cu(const std::vector<std::int32_t>& c) const {
    return TensorView::contiguous(c.data(), DType::i32, {B() + 1});
  }
  // Sequence b of a packed [total, heads, d] tensor as its own [1, heads, L, d] view.
  static TensorView seq(const float* base, std::int64_t off, std::int64_t L, std::int64_t heads,
                        std::int64_t d) {
    TensorView t = TensorView::contiguous(base + off * heads * d, DType::f32, {1, heads, L, d});
    t.strides = {0, d, heads * d, 1};
    return t;
  }
};

// Expected out [total_q, H, Dv] and lse [H, total_q]: the reference on each sequence alone.
void per_sequence_reference(const Packed& pk, const AttentionOptions& opts, std::vector<float>& out,
                            std::vector<float>& lse) {
  out.assign(pk.total_q * pk.H * pk.Dv, 0.0f);
  lse.assign(pk.total_q * pk.H, 0.0f);
  for (std::int64_t b = 0; b < pk.B(); ++b) {
    const std::int64_t Lq = pk.lq[b], Lk = pk.lk[b];
    if (Lq == 0) continue;
    if (Lk == 0) {  // no keys: out 0, lse = sink or -inf
      for (std::int64_t i = 0; i < Lq; ++i)
        for (std::int64_t h = 0; h < pk.H; ++h)
          lse[h * pk.total_q + pk.cu_q[b] + i] =
              opts.sinks ? static_cast<const float*>(opts.sinks->data)[h]
                         : -std::numeric_limits<float>::infinity();
      continue;
    }
    AttentionOptions o = opts;
    OutputView ov = OutputView::contiguous(out.data() + pk.cu_q[b] * pk.H * pk.Dv, DType::f32,
                                           {1, pk.H, Lq, pk.Dv});
    ov.strides = {0, pk.Dv, pk.H * pk.Dv, 1};
    OutputView lv = OutputView::contiguous(lse.data() + pk.cu_q[b], DType::f32, {1, pk.H, Lq});
    lv.strides = {0, pk.total_q, 1};
    o.lse = lv;
    reference_attention(Packed::seq(pk.q.data(), pk.cu_q[b], Lq, pk.H, pk.D),
                        Packed::seq(pk.k.data(), pk.cu_k[b], Lk, pk.Hkv, pk.D),
                        Packed::seq(pk.v.data(), pk.cu_k[b], Lk, pk.Hkv, pk.Dv), ov, o);
  }
}

void check_packed(const Packed& pk, const AttentionOptions& opts, const Backend& backend) {
  std::vector<float> want, want_lse;
  per_sequence_reference(pk, opts, want, want_lse);
  std::vector<float> out(want.size(), 7.0f), lse(want_lse.size(), 7.0f);
  AttentionOptions o = opts;
  o.lse = f32_view(lse.data(), {pk.H, pk.total_q});
  const TensorView q = TensorView::contiguous(pk.q.data(), DType::f32, {pk.total_q, pk.H, pk.D});
  const TensorView k = TensorView::contiguous(pk.k.data(), DType::f32, {pk.total_k, pk.Hkv, pk.D});
  const TensorView v = TensorView::contiguous(pk.v.data(), DType::f32, {pk.total_k, pk.Hkv, pk.Dv});
  Context ctx;
  backend.apply(ctx);
  attention_varlen(q, k, v, f32_view(out.data(), {pk.total_q, pk.H, pk.Dv}), pk.cu(pk.cu_q),
                   pk.cu(pk.cu_k), o, &ctx);
  std::int64_t max_lk = 1;
  for (std::int64_t n : pk.lk) max_lk = std::max(max_lk, n);
  const double eps = std::numeric_limits<float>::epsilon();
  const double atol = 8 * eps * (std::sqrt(double(max_lk)) + std::sqrt(double(pk.D)) * 8) + 1e-6;
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), atol)) << "fast path out";
  EXPECT_TRUE(all_close(lse.data(), want_lse.data(), lse.size(), 16 * atol, 4 * eps))
      << "fast path lse";
  // The varlen oracle agrees with the per-sequence one exactly (same reference, same rows).
  std::vector<float> ref(want.size(), 7.0f), ref_lse(want_lse.size(), 7.0f);
  o.lse = f32_view(ref_lse.data(), {pk.H, pk.total_q});
  reference_attention_varlen(q, k, v, f32_view(ref.data(), {pk.total_q, pk.H, pk.Dv}),
                             pk.cu(pk.cu_q), pk.cu(pk.cu_k), o);
  EXPECT_EQ(std::memcmp(ref.data(), want.data(), ref.size() * 4), 0) << "varlen reference";
  EXPECT_EQ(std::memcmp(ref_lse.data(), want_lse.data(), ref_lse.size() * 4), 0);
}

class VarlenGrid : public ::testing::TestWithParam<Backend> {};

TEST_P(VarlenGrid, SequencesMatchTheirOwnReference) {
  // Odd lengths, a sequence with no queries, one with queries but no keys, decode-like (Lq 1),
  // Lq > Lk and Lq < Lk, and lengths past the 128-key block.
  const Packed pk(6, 2, 24, 20, {7, 0, 3, 1, 130, 40, 9}, {7, 5, 0, 300, 130, 17, 9}, 11);
  AttentionOptions plain;
  check_packed(pk, plain, GetParam());
  AttentionOptions causal;
  causal.causal = Causal::bottom_right;
  check_packed(pk, causal, GetParam());
  AttentionOptions variants;
  variants.causal = Causal::top_left;
  variants.window_left = 20;
  variants.softcap = 3.0;
  variants.alibi = true;
  std::vector<float> sinks{0.5f, 1.0f, -std::numeric_limits<float>::infinity(), 2.0f, 0.0f, 1.5f};
  variants.sinks = f32_view(sinks.data(), {6});
  check_packed(pk, variants, GetParam());
}

TEST_P(VarlenGrid, ManyShortSequences) {
  std::mt19937 rng(5);
  std::vector<std::int64_t> lens;
  // Thinned: the first 8 of the 32 lengths.
  for (int b = 0; b < (thin_grids() ? 8 : 32); ++b)
    lens.push_back(16 + static_cast<std::int64_t>(rng() % 497));
  const Packed pk(4, 4, 32, 32, lens, lens, 21);
  AttentionOptions causal;
  causal.causal = Causal::top_left;
  check_packed(pk, causal, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenGrid, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

TEST(Varlen, ThreadCountInvariant) {
  const Packed pk(4, 2, 32, 32, {50, 1, 200, 0, 77}, {60, 900, 200, 4, 77}, 31);
  std::vector<float> a(pk.total_q * pk.H * pk.Dv), b(a.size());
  for (int threads : {1, 2}) {
    Context ctx(threads);
    attention_varlen(TensorView::contiguous(pk.q.data(), DType::f32, {pk.total_q, pk.H, pk.D}),
                     TensorView::contiguous(pk.k.data(), DType::f32, {pk.total_k, pk.Hkv, pk.D}),
                     TensorView::contiguous(pk.v.data(), DType::f32, {pk.total_k, pk.Hkv, pk.Dv}),
                     f32_view(threads == 1 ? a.data() : b.data(), {pk.total_q, pk.H, pk.Dv}),
                     pk.cu(pk.cu_q), pk.cu(pk.cu_k), {}, &ctx);
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(Varlen, BadArgumentsAreErrorsAndWriteNothing) {
  const Packed pk(2, 1, 8, 8, {3, 4}, {5, 2}, 41);
  const TensorView q = TensorView::contiguous(pk.q.data(), DType::f32, {7, 2, 8});
  const TensorView k = TensorView::contiguous(pk.k.data(), DType::f32, {7, 1, 8});
  std::vector<float> out(7 * 2 * 8, 42.0f);
  const OutputView ov = f32_view(out.data(), {7, 2, 8});
  const auto cu32 = [](std::vector<std::int32_t>& c) {
    return TensorView::contiguous(c.data(), DType::i32, {static_cast<std::int64_t>(c.size())});
  };
  std::vector<std::int32_t> good{0, 3, 7}, not_zero{1, 3, 7}, decreasing{0, 5, 4},
      short_total{0, 3, 6}, three{0, 1, 2, 7};
  std::vector<std::int64_t> good_k64{0, 5, 7};
  const TensorView cuk = TensorView::contiguous(good_k64.data(), DType::i64, {3});
  std::vector<std::uint8_t> mask(7 * 7, 1);
  std::vector<std::int32_t> lens{1, 1};
  std::vector<float> f{0, 3, 7};
  struct Bad {
    std::string needle;
    TensorView cq;
    AttentionOptions o;
  };
  std::vector<Bad> bad{
      {"cu_seqlens_q[0] = 1", cu32(not_zero), {}},
      {"cu_seqlens_q[2] = 4 < cu_seqlens_q[1] = 5", cu32(decreasing), {}},
      {"cu_seqlens_q[2] = 6 but total_q = 7", cu32(short_total), {}},
      {"cu_seqlens_q has shape [4] but cu_seqlens_k has shape [3]", cu32(three), {}},
      {"cu_seqlens_q [3] has dtype float32",
       TensorView::contiguous(f.data(), DType::f32, {3}),
       {}}};
  Bad m{"mask is not supported", cu32(good), {}};
  m.o.mask = TensorView::contiguous(mask.data(), DType::boolean, {7, 7});
  bad.push_back(m);
  Bad l{"key_lengths is not supported", cu32(good), {}};
  l.o.key_lengths = TensorView::contiguous(lens.data(), DType::i32, {2});
  bad.push_back(l);
  Bad w{"window_left = -4", cu32(good), {}};
  w.o.window_left = -4;
  bad.push_back(w);
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.needle);
    expect_error_mentioning([&] { attention_varlen(q, k, k, ov, b.cq, cuk, b.o); }, b.needle);
    expect_error_mentioning([&] { reference_attention_varlen(q, k, k, ov, b.cq, cuk, b.o); },
                            b.needle);
    for (float x : out) ASSERT_EQ(x, 42.0f);
  }
  // Rank-4 Q is not a packed batch.
  expect_error_mentioning(
      [&] {
        attention_varlen(TensorView::contiguous(pk.q.data(), DType::f32, {1, 7, 2, 8}), k, k, ov,
                         cu32(good), cuk);
      },
      "Q has rank 4");
  attention_varlen(q, k, k, ov, cu32(good), cuk);  // the good call runs
}

}  // namespace
}  // namespace cpuattn::test
