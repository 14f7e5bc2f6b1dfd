// Soak tests: many calls of random sizes through one context with threads coming and going, and a
// growable KV cache decoding 100k tokens. Resident memory must stay flat after warm-up (what a
// long-lived service needs), within what the scratch limit allows.
#include <unistd.h>

#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

// AddressSanitizer keeps freed memory in quarantine, so resident memory says nothing about what
// the library gives back; there only the library's own accounting is checked.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRssMeaningful = false;
#else
constexpr bool kRssMeaningful = true;
#endif
#else
constexpr bool kRssMeaningful = true;
#endif

// Resident set size in bytes (/proc/self/statm: pages).
std::size_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// One request of random shape: attention (sometimes causal, sometimes a long decode) or an MHA
// layer, on `ctx`. Shapes up to ~1 MiB of inputs, so scratch needs vary by two orders.
void random_request(std::mt19937& rng, Context& ctx, const MultiHeadAttention& mha) {
  std::uniform_int_distribution<int> pick(0, 2), len(1, 300), heads(1, 4);
  const int kind = pick(rng);
  if (kind == 2) {
    const std::int64_t B = 1 + rng() % 2, L = len(rng), dm = mha.config().d_model;
    const auto x = random_floats(static_cast<std::size_t>(B * L * dm), rng());
    std::vector<float> out(x.size());
    mha.forward(f32_view(x.data(), {B, L, dm}), f32_view(out.data(), {B, L, dm}), {}, &ctx);
    return;
  }
  const std::int64_t B = 1 + rng() % 2, H = heads(rng), D = 8 * (1 + rng() % 8);
  const std::int64_t Lq = kind == 0 ? len(rng) : 1, Lk = kind == 0 ? Lq : 200 * len(rng) / 10;
  const auto q = random_floats(static_cast<std::size_t>(B * H * Lq * D), rng());
  const auto k = random_floats(static_cast<std::size_t>(B * H * Lk * D), rng());
  std::vector<float> out(q.size());
  AttentionOptions opts;
  if (kind == 0 && rng() % 2) opts.causal = Causal::top_left;
  attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
            f32_view(k.data(), {B, H, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), opts, &ctx);
}

MultiHeadAttention small_mha(std::vector<float>& w) {
  const std::int64_t dm = 64;
  w = random_floats(dm * dm, 77);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  return MultiHeadAttention(MhaConfig{dm, 4}, MhaWeights{wv, wv, wv, wv});
}

// Rounds of 2 short-lived threads x 4 requests each; returns the RSS growth from the end of
// round `warmup` to the largest RSS seen afterwards.
std::size_t churn(Context& ctx, int rounds, int warmup, bool trim_between_rounds) {
  std::vector<float> w;
  const MultiHeadAttention mha = small_mha(w);
  std::size_t base = 0, peak = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, seed = round * 2 + t] {
        std::mt19937 rng(static_cast<std::uint32_t>(seed));
        for (int i = 0; i < 4; ++i) random_request(rng, ctx, mha);
      });
    }
    for (std::thread& t : threads) t.join();
    // A quiet point: no call runs, so trim() is allowed.
    if (trim_between_rounds) ctx.trim();
    const std::size_t now = rss_bytes();
    if (round == warmup) base = now;
    if (round > warmup) peak = std::max(peak, now);
  }
  return peak > base ? peak - base : 0;
}

TEST(Soak, ThreadChurnWithScratchLimitZeroStaysFlat) {
  Context ctx(0);
  ctx.set_scratch_limit(0);  // nothing kept between uses
  const std::size_t growth = churn(ctx, 60, 15, false);
  std::printf("RSS growth after warm-up: %.1f MiB\n", static_cast<double>(growth) / (1 << 20));
  if (kRssMeaningful) {
    EXPECT_LT(growth, std::size_t{24} << 20);
  }
  EXPECT_EQ(ctx.retained_scratch_bytes(), 0u);
}

TEST(Soak, ThreadChurnWithTrimAtQuietPointsStaysFlat) {
  Context ctx(2);
  const std::size_t growth = churn(ctx, 60, 15, true);
  std::printf("RSS growth after warm-up: %.1f MiB\n", static_cast<double>(growth) / (1 << 20));
  if (kRssMeaningful) {
    EXPECT_LT(growth, std::size_t{24} << 20);
  }
}

TEST(Soak, ALimitGivesBackAHugeRequestsMemory) {
  // The counterpart of the two tests above, so that they can fail: without a limit, one huge
  // request's scratch stays with the context for good. Multiplicative attention of 4096 decoder
  // steps over one 2^14-wide encoder state keeps h W, 4096 x 2^14 floats = 256 MiB... too much
  // for CI; 4096 x 4096 floats = 64 MiB of layer scratch for 34 MFLOP of work.
  const std::int64_t Lq = 4096, de = 4096;
  const auto w = random_floats(de, 91), h = random_floats(Lq, 92), s = random_floats(de, 93);
  const float one = 1.0f;
  const MultiplicativeAttention mul(f32_view(w.data(), {1, de}));
  std::vector<float> context(Lq);
  AlignOptions opts;
  opts.values = f32_view(&one, {1, 1, 1});
  Context ctx(1);
  const std::size_t before = rss_bytes();
  mul.forward(f32_view(h.data(), {1, Lq, 1}), f32_view(s.data(), {1, 1, de}),
              f32_view(context.data(), {1, Lq, 1}), opts, &ctx);
  const std::size_t kept = rss_bytes();
  EXPECT_GE(ctx.retained_scratch_bytes(), std::size_t{64} << 20);
  if (kRssMeaningful) {
    EXPECT_GT(kept, before + (std::size_t{48} << 20)) << "64 MiB stay resident";
  }
  // The same thread's next use frees what is above the limit.
  ctx.set_scratch_limit(std::size_t{1} << 20);
  mul.forward(f32_view(h.data(), {1, 1, 1}), f32_view(s.data(), {1, 1, de}),
              f32_view(context.data(), {1, 1, 1}), opts, &ctx);
  EXPECT_LE(ctx.retained_scratch_bytes(), std::size_t{3} << 20);
  if (kRssMeaningful) {
    EXPECT_LT(rss_bytes(), kept - (std::size_t{48} << 20)) << "given back";
  }
}

TEST(Soak, GrowableCacheDecodes100kTokens) {
  // One head of 4 dims keeps the 100k-token causal decode (5e9 query-key pairs) to about a
  // second; the point is the cache's growth and bookkeeping, not the arithmetic.
  const std::int64_t dm = 4, total = 100000, step = 125;
  const auto w = random_floats(dm * dm, 88);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  const MultiHeadAttention mha(MhaConfig{dm, 1}, MhaWeights{wv, wv, wv, wv});
  const auto x = random_floats(static_cast<std::size_t>(total * dm), 89);
  KvCache cache = mha.make_cache(1, 16, /*growable=*/true);
  std::vector<float> out(static_cast<std::size_t>(step * dm));
  Context ctx(2);
  std::int64_t growths = 0, last_capacity = cache.capacity();
  const std::size_t rss_before = rss_bytes();
  for (std::int64_t t = 0; t < total; t += step) {
    mha.decode(f32_view(x.data() + t * dm, {1, step, dm}), cache,
               f32_view(out.data(), {1, step, dm}), {}, &ctx);
    ASSERT_EQ(cache.length(), t + step);
    if (cache.capacity() != last_capacity) {
      ++growths;
      // Doubling: never more than twice what is cached.
      EXPECT_LE(cache.capacity(), 2 * cache.length());
      last_capacity = cache.capacity();
    }
  }
  EXPECT_LE(growths, 14);  // 16 -> 131072 is 13 doublings
  // K and V of 100k tokens are 3.2 MB; the doubling copies are freed as they go.
  if (kRssMeaningful) {
    EXPECT_LT(rss_bytes(), rss_before + (std::size_t{32} << 20));
  }

  // The last step equals cross attention of its tokens over all 100k, bottom-right causal.
  std::vector<float> want(out.size());
  AttentionOptions opts;
  opts.causal = Causal::bottom_right;
  mha.forward_cross(f32_view(x.data() + (total - step) * dm, {1, step, dm}),
                    f32_view(x.data(), {1, total, dm}), f32_view(want.data(), {1, step, dm}), opts,
                    &ctx);
  for (std::size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], want[i], 1e-4 * (1.0 + std::abs(want[i]))) << "element " << i;
}

}  // namespace
}  // namespace cpuattn::test
