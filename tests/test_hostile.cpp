// A hostile caller, from C++ (issue 33; the C and Python sides are in tests/c and tests/python):
// views of a cache passed back into it, window bounds near INT64_MAX, huge soft-caps, mask values
// at float32's ends, huge sinks and slopes, size products that overflow, and failed calls that
// must leave caches, their views and outputs exactly as they were (CacheSnapshot). Each test
// failed on the code before its fix.
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

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr float kLowest = std::numeric_limits<float>::lowest();

// Everything a failed call must leave alone: a cache's length, capacity and bytes, the views a
// caller took of it (their data pointers and contents), and an output buffer.
struct CacheSnapshot {
  std::int64_t length, capacity;
  const void *kdata, *vdata;
  std::vector<std::uint8_t> k, v;
  explicit CacheSnapshot(const KvCache& c)
      : length(c.length()),
        capacity(c.capacity()),
        kdata(c.keys().data),
        vdata(c.values().data),
        k(bytes(c.keys())),
        v(bytes(c.values())) {}
  static std::vector<std::uint8_t> bytes(const TensorView& t) {
    // [B, Hkv, L, d] with rows `strides[2]` apart: the rows in order.
    std::vector<std::uint8_t> out;
    const std::size_t e = dtype_size(t.dtype);
    for (std::int64_t b = 0; b < t.shape[0]; ++b)
      for (std::int64_t h = 0; h < t.shape[1]; ++h)
        for (std::int64_t l = 0; l < t.shape[2]; ++l) {
          const auto* row = static_cast<const std::uint8_t*>(t.data) +
                            (b * t.strides[0] + h * t.strides[1] + l * t.strides[2]) * e;
          out.insert(out.end(), row, row + t.shape[3] * e);
        }
    return out;
  }
  void expect_same(const KvCache& c) const {
    EXPECT_EQ(c.length(), length);
    EXPECT_EQ(c.capacity(), capacity);
    EXPECT_EQ(c.keys().data, kdata) << "the keys moved: a view taken before the call dangles";
    EXPECT_EQ(c.values().data, vdata);
    EXPECT_EQ(bytes(c.keys()), k);
    EXPECT_EQ(bytes(c.values()), v);
  }
};

// Item 1: appending a cache's own keys() / values() to it, also when the append grows it.
TEST(Hostile, AppendingACachesOwnViewsToItself) {
  for (DType dt : {DType::f32, DType::bf16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    KvCache c(1, 2, 4, 3, 2, /*growable=*/true, dt);
    const auto k = random_floats(2 * 2 * 4, 1), v = random_floats(2 * 2 * 3, 2);
    c.append(f32_view(k.data(), {1, 2, 2, 4}), f32_view(v.data(), {1, 2, 2, 3}));
    ASSERT_EQ(c.capacity(), 2);
    const CacheSnapshot before(c);
    if (dt == DType::i8) {
      // An int8 cache takes f32/bf16/f16 tokens, not its own int8 views.
      EXPECT_THROW(c.append(c.keys(), c.values()), Error);
      before.expect_same(c);
      continue;
    }
    c.append(c.keys(), c.values());  // full: grows while it reads its own old buffers
    ASSERT_EQ(c.length(), 4);
    const auto after = CacheSnapshot::bytes(c.keys());
    // Per head: tokens 0, 1 then copies of them.
    const std::size_t row = 4 * dtype_size(dt), head = 4 * row;
    for (std::size_t h = 0; h < 2; ++h)
      EXPECT_EQ(std::memcmp(&after[h * head + 2 * row], &after[h * head], 2 * row), 0)
          << "head " << h;
  }
}

// Item 3: a window side of any size up to INT64_MAX means no bound, on every path.
TEST(Hostile, WindowSidesUpToInt64Max) {
  const std::int64_t B = 1, H = 2, Lq = 5, Lk = 300, D = 16;
  const auto q = random_floats(B * H * Lq * D, 3), k = random_floats(B * H * Lk * D, 4),
             v = random_floats(B * H * Lk * D, 5);
  const auto run = [&](const AttentionOptions& o, bool reference) {
    std::vector<float> out(B * H * Lq * D, 7.0f);
    const auto qv = f32_view(q.data(), {B, H, Lq, D}), kv = f32_view(k.data(), {B, H, Lk, D}),
               vv = f32_view(v.data(), {B, H, Lk, D});
    if (reference) {
      reference_attention(qv, kv, vv, f32_view(out.data(), {B, H, Lq, D}), o);
    } else {
      attention(qv, kv, vv, f32_view(out.data(), {B, H, Lq, D}), o);
    }
    return out;
  };
  for (bool reference : {false, true}) {
    for (const auto& [left, right] : {std::pair{kMax, kMax},
                                      {-1, kMax},
                                      {kMax, -1},
                                      {kMax, std::int64_t{0}},
                                      {kMax - 1, std::int64_t{1} << 62}}) {
      SCOPED_TRACE(std::to_string(left) + ", " + std::to_string(right));
      AttentionOptions o, unbounded;
      o.window_left = left;
      o.window_right = right;
      unbounded.window_left = left == kMax || left == kMax - 1 ? -1 : left;
      unbounded.window_right = right >= (std::int64_t{1} << 62) ? -1 : right;
      EXPECT_EQ(run(o, reference), run(unbounded, reference)) << (reference ? "reference" : "fast");
    }
  }
}

// Item 4: the capped score tends to the uncapped one as the cap grows, on every target.
TEST(Hostile, HugeSoftCapLeavesScoresAsTheyAre) {
  const std::int64_t B = 1, H = 2, Lq = 7, Lk = 130, D = 32;
  const auto q = random_floats(B * H * Lq * D, 6, -3, 3),
             k = random_floats(B * H * Lk * D, 7, -3, 3), v = random_floats(B * H * Lk * D, 8);
  for (const Backend& be : machine_backends()) {
    SCOPED_TRACE(be.name());
    Context ctx(1);
    be.apply(ctx);
    std::vector<float> plain(B * H * Lq * D), capped(plain.size());
    const auto call = [&](double cap, std::vector<float>& out) {
      AttentionOptions o;
      o.softcap = cap;
      attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
                f32_view(v.data(), {B, H, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), o, &ctx);
    };
    call(0, plain);
    for (double cap : {1e6, 1e12, 1e20, 1e30}) {
      call(cap, capped);
      EXPECT_TRUE(all_close(capped.data(), plain.data(), plain.size(), 1e-6)) << "softcap " << cap;
    }
  }
}

// Item 5: finite mask values at float32's ends, and huge sinks and slopes, never give NaN: masks
// saturate (as in the reference), sinks and slopes beyond the kernels' range are errors.
TEST(Hostile, FiniteExtremesGiveFiniteResultsOrErrors) {
  const std::int64_t B = 2, H = 2, Lq = 3, Lk = 40, D = 8;
  const auto q = random_floats(B * H * Lq * D, 9), k = random_floats(B * H * Lk * D, 10),
             v = random_floats(B * H * Lk * D, 11);
  // Batch 0: Hugging Face padding (float32's lowest) on keys 30.., batch 1 on every key; one
  // key of +3e38 in row 0.
  std::vector<float> mask(B * Lk, 0.0f);
  for (std::int64_t j = 30; j < Lk; ++j) mask[j] = kLowest;
  for (std::int64_t j = 0; j < Lk; ++j) mask[Lk + j] = kLowest;
  std::vector<float> mask2 = mask;
  mask2[5] = 3e38f;
  for (const std::vector<float>* m : {&mask, &mask2}) {
    AttentionOptions o;
    o.mask = f32_view(m->data(), {B, 1, 1, Lk});
    std::vector<float> out(B * H * Lq * D), want(out.size());
    for (const Backend& be : machine_backends()) {
      Context ctx(2);
      be.apply(ctx);
      attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
                f32_view(v.data(), {B, H, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), o, &ctx);
      reference_attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
                          f32_view(v.data(), {B, H, Lk, D}), f32_view(want.data(), {B, H, Lq, D}),
                          o);
      for (float x : out) ASSERT_TRUE(std::isfinite(x)) << be.name();
      EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), 1e-5)) << be.name();
    }
    if (m == &mask) {
      // Batch 1 is all padding: the mean of V over every key, as PyTorch's SDPA gives.
      for (std::int64_t d = 0; d < D; ++d) {
        double mean = 0;
        for (std::int64_t j = 0; j < Lk; ++j) mean += v[((1 * H + 0) * Lk + j) * D + d];
        EXPECT_NEAR(out[((1 * H + 0) * Lq + 0) * D + d], mean / Lk, 1e-5);
      }
    }
  }
  std::vector<float> out(B * H * Lq * D, 7.0f);
  const std::vector<float> huge = {3e38f, 0.0f};
  for (const char* which : {"sinks", "alibi_slopes"}) {
    AttentionOptions o;
    (std::string(which) == "sinks" ? o.sinks : o.alibi_slopes) = f32_view(huge.data(), {H});
    expect_error_mentioning(
        [&] {
          attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
                    f32_view(v.data(), {B, H, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), o);
        },
        std::string(which) + "[0] = 3.00000001e+38 is outside [");
  }
  for (float x : out) ASSERT_EQ(x, 7.0f);
}

// Item 8: a decode step that fails validation (a bad key_lengths, a NaN x for an int8 cache) on a
// full growable cache leaves it, and a view taken before, as they were.
TEST(Hostile, FailedDecodeOnAFullGrowableCacheChangesNothing) {
  const std::int64_t dm = 8;
  const std::vector<float> w(dm * dm, 0.05f);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  const MultiHeadAttention m({dm, 2}, {wv, wv, wv, wv});
  for (DType dt : {DType::f32, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    KvCache cache = m.make_cache(1, 2, /*growable=*/true, dt);
    std::vector<float> x(2 * dm, 1.0f), out(2 * dm, 7.0f);
    m.decode(f32_view(x.data(), {1, 2, dm}), cache, f32_view(out.data(), {1, 2, dm}));
    const CacheSnapshot before(cache);
    const std::vector<std::int64_t> lengths = {99};
    AttentionOptions o;
    o.key_lengths = TensorView::contiguous(lengths.data(), DType::i64, {1});
    EXPECT_THROW(
        m.decode(f32_view(x.data(), {1, 1, dm}), cache, f32_view(out.data(), {1, 1, dm}), o),
        Error);
    before.expect_same(cache);
    if (dt == DType::i8) {
      x[3] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_THROW(
          m.decode(f32_view(x.data(), {1, 1, dm}), cache, f32_view(out.data(), {1, 1, dm})), Error);
      before.expect_same(cache);
    }
  }
}

// Item 10: heads x head_dim that overflows is an error at construction.
TEST(Hostile, MhaSizeProductsAreChecked) {
  const std::vector<float> w(64, 0.1f);
  const TensorView wv = f32_view(w.data(), {8, 8});
  expect_error_mentioning(
      [&] {
        MultiHeadAttention({8, (std::int64_t{1} << 61) + 1, 0, 8, 8}, {wv, wv, wv, wv});
      },
      "MhaConfig: heads x head_dim = 2305843009213693953 x 8 overflows");
}

// Item 13: a paged decode that fails validation leaves the cache's batch() table and lengths, which
// the caller holds as a PagedKv, as they were.
TEST(Hostile, FailedPagedDecodeLeavesAHeldBatchAlone) {
  const std::int64_t dm = 8;
  const std::vector<float> w(dm * dm, 0.05f);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  const MultiHeadAttention m({dm, 2}, {wv, wv, wv, wv});
  PagedKvCache cache = m.make_paged_cache(8, 4);
  const std::vector<std::int64_t> seqs = {cache.add_sequence(), cache.add_sequence()};
  std::vector<float> x(2 * 3 * dm, 0.5f), out(2 * 3 * dm, 7.0f);
  m.decode(f32_view(x.data(), {2, 3, dm}), cache, seqs, f32_view(out.data(), {2, 3, dm}));
  const PagedKv held = cache.batch(seqs);
  const auto* lens = static_cast<const std::int64_t*>(held.seq_lens.data);
  const auto* table = static_cast<const std::int32_t*>(held.block_table.data);
  const std::vector<std::int32_t> table_before(
      table, table + held.block_table.shape[0] * held.block_table.shape[1]);
  AttentionOptions bad;
  bad.window_left = -5;
  EXPECT_THROW(
      m.decode(f32_view(x.data(), {2, 1, dm}), cache, seqs, f32_view(out.data(), {2, 1, dm}), bad),
      Error);
  EXPECT_EQ(lens[0], 3);
  EXPECT_EQ(lens[1], 3);
  EXPECT_EQ(std::vector<std::int32_t>(table, table + table_before.size()), table_before);
  EXPECT_EQ(cache.length(seqs[0]), 3);
}

}  // namespace
}  // namespace cpuattn::test
