// A steady-state decode step allocates nothing: once a layer, its cache and the context have seen
// a step of the same shape, further steps reuse the context's arenas (no operator new). Its own
// executable: it links the counting operator new (alloc_counter.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "alloc_counter.h"
#include "cpuattn/layers.h"

namespace cpuattn {
namespace {

struct Layer {
  static constexpr std::int64_t d = 96, H = 4, Hkv = 2, D = 24;
  std::vector<std::vector<std::uint16_t>> w;
  std::vector<float> qn, kn;
  MultiHeadAttention mha;

  TensorView weight(std::mt19937& rng, std::int64_t rows, std::int64_t cols) {
    std::normal_distribution<float> normal(0.0f, 0.1f);
    w.emplace_back(rows * cols);
    for (auto& x : w.back()) x = to_bf16(normal(rng));
    return TensorView::contiguous(w.back().data(), DType::bf16, {rows, cols});
  }
  static MhaConfig config() {
    MhaConfig c{.d_model = d, .heads = H, .kv_heads = Hkv, .head_dim = D};
    c.rope =
        RopeOptions{.base = 10000.0, .scaling = {.type = RopeScalingType::linear, .factor = 2}};
    c.qk_norm = QkNorm::head;
    return c;
  }
  explicit Layer(std::mt19937 rng = std::mt19937(7)) : qn(D, 1.1f), kn(D, 0.9f), mha(make(rng)) {}
  MultiHeadAttention make(std::mt19937& rng) {
    MhaWeights mw{.wq = weight(rng, d, H * D),
                  .wk = weight(rng, d, Hkv * D),
                  .wv = weight(rng, d, Hkv * D),
                  .wo = weight(rng, H * D, d)};
    mw.q_norm = TensorView::contiguous(qn.data(), DType::f32, {D});
    mw.k_norm = TensorView::contiguous(kn.data(), DType::f32, {D});
    return MultiHeadAttention(config(), mw);
  }
};

std::vector<float> random_rows(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

TEST(DecodeAllocations, ContiguousCacheStepAllocatesNothing) {
  CPUATTN_SKIP_WITHOUT_ALLOC_COUNTER();
  for (int threads : {1, 2}) {
    for (DType kv : {DType::bf16, DType::f32}) {
      const Layer l;
      Context ctx(threads);
      const std::int64_t B = 3, prompt = 20;
      KvCache cache = l.mha.make_cache(B, 128, /*growable=*/false, kv);
      auto x = random_rows(B * prompt * Layer::d, 1);
      std::vector<float> out(B * prompt * Layer::d);
      l.mha.decode(TensorView::contiguous(x.data(), DType::f32, {B, prompt, Layer::d}), cache,
                   OutputView::contiguous(out.data(), DType::f32, {B, prompt, Layer::d}), {}, &ctx);
      auto step = random_rows(B * Layer::d, 2);
      const TensorView xs = TensorView::contiguous(step.data(), DType::f32, {B, 1, Layer::d});
      const OutputView os = OutputView::contiguous(out.data(), DType::f32, {B, 1, Layer::d});
      for (int warm = 0; warm < 3; ++warm) l.mha.decode(xs, cache, os, {}, &ctx);
      const test::Allocations news = test::allocations_during([&] {
        for (int s = 0; s < 10; ++s) l.mha.decode(xs, cache, os, {}, &ctx);
      });
      EXPECT_EQ(news.steady_state(threads), 0)
          << threads << " threads, " << (kv == DType::bf16 ? "bf16" : "f32")
          << " cache: operator new calls in 10 decode steps (" << news.plain << " plain, "
          << news.aligned << " aligned)";
      EXPECT_EQ(cache.length(), prompt + 13);
      for (float v : out) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// The count can fail: a step that grows a growable cache past its capacity allocates.
TEST(DecodeAllocations, TheCounterSeesAGrowingCache) {
  CPUATTN_SKIP_WITHOUT_ALLOC_COUNTER();
  const Layer l;
  Context ctx(1);
  KvCache cache = l.mha.make_cache(1, 4, /*growable=*/true);
  auto step = random_rows(Layer::d, 3);
  std::vector<float> out(Layer::d);
  const TensorView xs = TensorView::contiguous(step.data(), DType::f32, {1, 1, Layer::d});
  const OutputView os = OutputView::contiguous(out.data(), DType::f32, {1, 1, Layer::d});
  for (int s = 0; s < 4; ++s) l.mha.decode(xs, cache, os, {}, &ctx);
  EXPECT_GT(test::allocations_during([&] { l.mha.decode(xs, cache, os, {}, &ctx); }).plain, 0);
}

TEST(DecodeAllocations, PagedCacheStepAllocatesNothing) {
  CPUATTN_SKIP_WITHOUT_ALLOC_COUNTER();
  for (int threads : {1, 2}) {
    const Layer l;
    Context ctx(threads);
    PagedKvCache cache = l.mha.make_paged_cache(64, 16, DType::bf16);
    const std::vector<std::int64_t> seqs = {cache.add_sequence(), cache.add_sequence()};
    const std::int64_t B = 2, prompt = 17;
    auto x = random_rows(B * prompt * Layer::d, 4);
    std::vector<float> out(B * prompt * Layer::d);
    l.mha.decode(TensorView::contiguous(x.data(), DType::f32, {B, prompt, Layer::d}), cache, seqs,
                 OutputView::contiguous(out.data(), DType::f32, {B, prompt, Layer::d}), {}, &ctx);
    auto step = random_rows(B * Layer::d, 5);
    const TensorView xs = TensorView::contiguous(step.data(), DType::f32, {B, 1, Layer::d});
    const OutputView os = OutputView::contiguous(out.data(), DType::f32, {B, 1, Layer::d});
    for (int warm = 0; warm < 3; ++warm) l.mha.decode(xs, cache, seqs, os, {}, &ctx);
    // 10 steps from 20 tokens stay within the second page of 16 (no page is taken).
    const test::Allocations news = test::allocations_during([&] {
      for (int s = 0; s < 10; ++s) l.mha.decode(xs, cache, seqs, os, {}, &ctx);
    });
    EXPECT_EQ(news.steady_state(threads), 0)
        << threads << " threads: operator new calls in 10 paged decode steps (" << news.plain
        << " plain, " << news.aligned << " aligned)";
    EXPECT_EQ(cache.length(seqs[0]), prompt + 13);
  }
}

}  // namespace
}  // namespace cpuattn
