// The library's side of issue 11: KvCache size arithmetic and moved-from objects, overlapping
// optional outputs of MultiHeadAttention, bounded scratch memory, and a thread count above the
// machine's. Each test failed (or crashed) on the code before its fix.
#include <tbb/task_arena.h>

#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

// Fills a [1, Hkv, n, D] token block with values that identify (token, head, dim).
std::vector<float> tokens(std::int64_t first, std::int64_t Hkv, std::int64_t n, std::int64_t D) {
  std::vector<float> t(static_cast<std::size_t>(Hkv * n * D));
  for (std::int64_t h = 0; h < Hkv; ++h)
    for (std::int64_t l = 0; l < n; ++l)
      for (std::int64_t d = 0; d < D; ++d)
        t[(h * n + l) * D + d] = static_cast<float>((first + l) * 1000 + h * 100 + d);
  return t;
}

// Every cached token still holds what append() stored.
void expect_contents(const KvCache& c, std::int64_t n) {
  ASSERT_EQ(c.length(), n);
  const TensorView k = c.keys();
  for (std::int64_t h = 0; h < c.kv_heads(); ++h)
    for (std::int64_t l = 0; l < n; ++l)
      for (std::int64_t d = 0; d < c.head_dim(); ++d) {
        const float got =
            static_cast<const float*>(k.data)[h * k.strides[1] + l * k.strides[2] + d];
        ASSERT_EQ(got, static_cast<float>(l * 1000 + h * 100 + d)) << "h " << h << " l " << l;
      }
}

void append_tokens(KvCache& c, std::int64_t n) {
  const auto k = tokens(c.length(), c.kv_heads(), n, c.head_dim());
  const auto v = tokens(c.length(), c.kv_heads(), n, c.value_dim());
  c.append(f32_view(k.data(), {1, c.kv_heads(), n, c.head_dim()}),
           f32_view(v.data(), {1, c.kv_heads(), n, c.value_dim()}));
}

TEST(KvCacheLimits, HugeReserveIsAnErrorAndChangesNothing) {
  KvCache c(1, 2, 4, 4, 8, /*growable=*/true);
  append_tokens(c, 3);
  // reserve(2^62) overflowed B * Hkv * capacity * D to a small allocation before, and the next
  // append wrote past it.
  for (std::int64_t huge : {kMax, kMax / 2, std::int64_t{1} << 62, std::int64_t{1} << 40}) {
    try {
      c.reserve(huge);
      ADD_FAILURE() << "reserve(" << huge << ") did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
    }
    EXPECT_EQ(c.capacity(), 8);
    expect_contents(c, 3);
  }
  append_tokens(c, 10);  // grows normally afterwards
  expect_contents(c, 13);
}

TEST(KvCacheLimits, HugeAppendIsAnErrorAndChangesNothing) {
  KvCache c(1, 2, 4, 4, 8, /*growable=*/true);
  append_tokens(c, 5);
  // A broadcast view (stride 0 along the tokens) can claim 2^58 tokens from 8 floats. Before,
  // growing to them asked std::vector for 2^61 floats (std::length_error, not an Error); a few
  // more dimensions and the size wrapped around instead.
  std::vector<float> row(2 * 4, 1.0f);
  TensorView k = f32_view(row.data(), {1, 2, std::int64_t{1} << 58, 4});
  k.strides = {8, 4, 0, 1};
  try {
    c.append(k, k);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the largest capacity"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.capacity(), 8);
  expect_contents(c, 5);
}

TEST(KvCacheLimits, ConstructorSizesAreChecked) {
  // batch * kv_heads overflowed int64 (undefined behaviour) before it was checked.
  EXPECT_THROW(KvCache(std::int64_t{1} << 40, std::int64_t{1} << 40, 4, 4, 1), Error);
  EXPECT_THROW(KvCache(1, 1, kMax, 1, 2), Error);
  EXPECT_THROW(KvCache(1, 1, 1, 1, kMax), Error);
}

TEST(KvCacheLimits, MovedFromCacheThrowsInsteadOfCrashing) {
  KvCache a(1, 2, 4, 4, 8);
  append_tokens(a, 2);
  KvCache b(std::move(a));
  expect_contents(b, 2);
  // Every call on the moved-from cache dereferenced null before.
  EXPECT_THROW(a.length(), Error);
  EXPECT_THROW(a.capacity(), Error);
  EXPECT_THROW(a.keys(), Error);
  EXPECT_THROW(a.values(), Error);
  EXPECT_THROW(a.reserve(100), Error);
  EXPECT_THROW(a.truncate(0), Error);
  EXPECT_THROW(a.clear(), Error);
  EXPECT_THROW(append_tokens(a, 1), Error);
  try {
    a.length();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moved from"), std::string::npos) << e.what();
  }
  // A layer's decode with a moved-from cache, and a moved-from layer.
  const std::int64_t dm = 8;
  const auto w = random_floats(dm * dm, 1);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  MultiHeadAttention mha(MhaConfig{dm, 2, 2, 4, 4}, MhaWeights{wv, wv, wv, wv});
  const auto x = random_floats(dm, 2);
  std::vector<float> out(dm, 7.0f);
  EXPECT_THROW(mha.decode(f32_view(x.data(), {1, 1, dm}), a, f32_view(out.data(), {1, 1, dm})),
               Error);
  MultiHeadAttention moved(std::move(mha));
  EXPECT_THROW(mha.forward(f32_view(x.data(), {1, 1, dm}), f32_view(out.data(), {1, 1, dm})),
               Error);
  EXPECT_THROW(mha.config(), Error);
  for (float o : out) EXPECT_EQ(o, 7.0f);
  // Assigning to a moved-from object revives it; destroying one is fine.
  a = std::move(b);
  expect_contents(a, 2);
}

// ---- MultiHeadAttention: optional outputs that overlap out or an input ------------------------

struct SmallMha {
  static constexpr std::int64_t B = 1, L = 4, dm = 8, H = 2;
  std::vector<float> w = random_floats(dm * dm, 3), x = random_floats(B * L * dm, 4);
  // One buffer holds out [B, L, dm] = 32 floats, then room for weights [B, H, L, L] = 32.
  std::vector<float> buf = std::vector<float>(64, 7.0f);
  MultiHeadAttention mha{MhaConfig{dm, H, H, 4, 4},
                         MhaWeights{f32_view(w.data(), {dm, dm}), f32_view(w.data(), {dm, dm}),
                                    f32_view(w.data(), {dm, dm}), f32_view(w.data(), {dm, dm})}};
  OutputView out() { return f32_view(buf.data(), {B, L, dm}); }
};

TEST(MhaOverlap, WeightsOrLseOverlappingOutOrInputIsAnError) {
  SmallMha m;
  const TensorView x = f32_view(m.x.data(), {SmallMha::B, SmallMha::L, SmallMha::dm});
  auto expect_overlap = [&](AttentionOptions opts, const char* needle) {
    std::fill(m.buf.begin(), m.buf.end(), 7.0f);
    const std::vector<float> x_before = m.x;
    try {
      m.mha.forward(x, m.out(), opts);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    for (float b : m.buf) ASSERT_EQ(b, 7.0f) << needle << ": an output was written";
    EXPECT_EQ(m.x, x_before);
  };
  AttentionOptions opts;
  // weights starting 8 floats into out: the output projection would overwrite them (before: no
  // error, and the weights the caller got back were garbage).
  opts.weights = f32_view(m.buf.data() + 8, {1, 2, 4, 4});
  expect_overlap(opts, "opts.weights overlaps out");
  opts.weights.reset();
  opts.lse = f32_view(m.buf.data() + 4, {1, 2, 4});
  expect_overlap(opts, "opts.lse overlaps out");
  opts.lse = f32_view(m.x.data(), {1, 2, 4});
  expect_overlap(opts, "opts.lse overlaps xq");

  // The same through decode: weights over out.
  KvCache cache = m.mha.make_cache(1, 16);
  AttentionOptions dopts;
  dopts.weights = f32_view(m.buf.data() + 4, {1, 2, 1, 1});
  std::fill(m.buf.begin(), m.buf.end(), 7.0f);
  EXPECT_THROW(m.mha.decode(f32_view(m.x.data(), {1, 1, SmallMha::dm}), cache,
                            f32_view(m.buf.data(), {1, 1, SmallMha::dm}), dopts),
               Error);
  for (float b : m.buf) ASSERT_EQ(b, 7.0f);
  EXPECT_EQ(cache.length(), 0);

  // Disjoint buffers still work.
  std::vector<float> weights(2 * 4 * 4);
  AttentionOptions ok;
  ok.weights = f32_view(weights.data(), {1, 2, 4, 4});
  EXPECT_NO_THROW(m.mha.forward(x, m.out(), ok));
}

TEST(Strides, HugeStrideOnASizeOneKeyAxis) {
  // Found by fuzz_validate: a stride is never used on an axis of size 1, so any value is legal,
  // but packing formed K + key * stride for the padding keys too (a pointer overflow UBSan
  // reports). Lk = 1 on every target against the reference.
  const auto q = random_floats(2 * 3 * 5 * 7, 31), k = random_floats(2 * 7, 32),
             v = random_floats(2 * 6, 33);
  TensorView kv = f32_view(k.data(), {2, 1, 1, 7}), vv = f32_view(v.data(), {2, 1, 1, 6});
  kv.strides[2] = vv.strides[2] = std::int64_t{1} << 60;
  std::vector<float> want(2 * 3 * 5 * 6);
  const TensorView qv = f32_view(q.data(), {2, 3, 5, 7});
  reference_attention(qv, kv, vv, f32_view(want.data(), {2, 3, 5, 6}));
  for (Target t : machine_targets()) {
    Context ctx(1);
    ctx.set_max_target(t);
    std::vector<float> out(want.size());
    attention(qv, kv, vv, f32_view(out.data(), {2, 3, 5, 6}), {}, &ctx);
    for (std::size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], want[i], 1e-6) << target_name(t) << " element " << i;
  }
}

// ---- Scratch memory: bounded and releasable ---------------------------------------------------

// A call that needs megabytes of scratch: an MHA layer's projections and head outputs.
struct BigCall {
  static constexpr std::int64_t B = 2, L = 256, dm = 256, H = 4;
  std::vector<float> w = random_floats(dm * dm, 5), x = random_floats(B * L * dm, 6),
                     out = std::vector<float>(B * L * dm);
  MultiHeadAttention mha{MhaConfig{dm, H},
                         MhaWeights{f32_view(w.data(), {dm, dm}), f32_view(w.data(), {dm, dm}),
                                    f32_view(w.data(), {dm, dm}), f32_view(w.data(), {dm, dm})}};
  void run(Context& ctx) {
    AttentionOptions opts;
    opts.causal = Causal::top_left;
    mha.forward(f32_view(x.data(), {B, L, dm}), f32_view(out.data(), {B, L, dm}), opts, &ctx);
  }
};

TEST(Scratch, LimitBoundsWhatThreadsKeepAndTrimFreesIt) {
  BigCall call;
  Context unbounded(2);
  call.run(unbounded);
  const std::vector<float> want = call.out;
  // The layer alone keeps 4 x 512 x 256 floats = 2 MiB per calling thread.
  EXPECT_GT(unbounded.retained_scratch_bytes(), std::size_t{2} << 20);
  unbounded.trim();
  EXPECT_EQ(unbounded.retained_scratch_bytes(), 0u);

  constexpr std::size_t kLimit = 256 << 10;
  Context bounded(2);
  bounded.set_scratch_limit(kLimit);
  EXPECT_EQ(bounded.scratch_limit(), kLimit);
  for (int rep = 0; rep < 3; ++rep) {
    call.run(bounded);
    EXPECT_EQ(call.out, want) << "a scratch limit must not change results";
    // At most one buffer of each kind per thread that ran (caller + up to 2 arena threads), each
    // at most the limit.
    EXPECT_LE(bounded.retained_scratch_bytes(), 3 * 3 * kLimit);
  }
  // Limit 0: the threads that ran a call keep nothing. An arena thread that took no task of the
  // call keeps its buffers until its next use (documented), and under load the caller may run
  // every task itself, so the call runs on a one-thread arena: the only thread that can hold
  // scratch is the one that ran.
  Context single(0);
  single.set_scratch_limit(0);
  tbb::task_arena one(1);
  one.execute([&] { call.run(single); });
  EXPECT_EQ(call.out, want);
  EXPECT_EQ(single.retained_scratch_bytes(), 0u);
}

TEST(Scratch, ThreadsThatExitedAreReleasedByTrim) {
  BigCall call;
  Context ctx(0);  // the callers' own arenas: every calling thread gets its own buffers
  // Four threads alive at once (an exited thread's id may be reused by the next one).
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { call.run(ctx); });
  for (std::thread& t : threads) t.join();
  EXPECT_GT(ctx.retained_scratch_bytes(), std::size_t{4} * (2 << 20))
      << "each exited thread's buffers were kept";
  ctx.trim();
  EXPECT_EQ(ctx.retained_scratch_bytes(), 0u);
  call.run(ctx);  // usable after trim
}

TEST(Scratch, DefaultContextIsReachable) {
  Context& d = default_context();
  EXPECT_EQ(&d, &default_context());
  EXPECT_EQ(d.num_threads(), 0);
}

}  // namespace
}  // namespace cpuattn::test
