// A hostile caller, from C++ (issue 33; the C and Python sides are in tests/c and tests/python):
// views of a cache passed back into it, window bounds near INT64_MAX, huge soft-caps, mask values
// at float32's ends, huge sinks and slopes, size products that overflow, and failed calls that
// must leave caches, their views and outputs exactly as they were (CacheSnapshot). Each test
// failed on the code before its fix.
#include <gtest/gtest.h>

#include <algorithm>
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

// Keys near float32's largest with a scale above 1/log2(e): the fast path folds scale * log2 e
// into Q or (QUnit::f32_in_place) into K's panels, and K = 3.4e38 times 43 overflowed there, NaN
// where the true scores are small (found by fuzz_attention_diff). Q's column that meets the huge
// key holds sub-normals, so each score stays within a few units.
TEST(Hostile, KeysNearFloatMaxWithALargeScaleStayFinite) {
  const std::int64_t B = 1, H = 2, Lq = 13, Lk = 45, D = 37, col = 33;
  auto q = random_floats(B * H * Lq * D, 12), k = random_floats(B * H * Lk * D, 13),
       v = random_floats(B * H * Lk * D, 14);
  const auto tiny = random_floats(B * H * Lq, 15);
  for (std::int64_t r = 0; r < B * H * Lq; ++r) q[r * D + col] = tiny[r] * 1e-39f;
  for (std::int64_t j : {4, 30, 44}) k[j * D + col] = std::numeric_limits<float>::max();
  for (double scale : {30.0, 0.5}) {
    AttentionOptions o;
    o.scale = scale;
    o.causal = Causal::top_left;
    std::vector<float> out(B * H * Lq * D), want(out.size());
    reference_attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
                        f32_view(v.data(), {B, H, Lk, D}), f32_view(want.data(), {B, H, Lq, D}), o);
    for (const Backend& be : machine_backends()) {
      Context ctx(2);
      be.apply(ctx);
      attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
                f32_view(v.data(), {B, H, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), o, &ctx);
      for (float x : out) ASSERT_TRUE(std::isfinite(x)) << be.name() << " scale " << scale;
      // Scores up to about 30 (log2 e) in magnitude: f32 rounds them by a few 1e-6.
      EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), 1e-5, 1e-4))
          << be.name() << " scale " << scale;
    }
  }
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

// Everything a failed call must leave alone in a paged cache: the free pages, each sequence's
// length and pages, the pools' bytes, and a batch() view taken before the call.
struct PagedSnapshot {
  std::int64_t free;
  std::vector<std::int64_t> lengths;
  std::vector<std::vector<std::int32_t>> pages;
  std::vector<std::uint8_t> k, v;
  std::vector<std::int32_t> table;
  std::vector<std::int64_t> lens;
  PagedSnapshot(const PagedKvCache& c, const std::vector<std::int64_t>& seqs, const PagedKv& held)
      : free(c.free_pages()) {
    for (std::int64_t s : seqs) lengths.push_back(c.length(s)), pages.push_back(c.pages(s));
    k = bytes_of(c.key_pages());
    v = bytes_of(c.value_pages());
    const auto* t = static_cast<const std::int32_t*>(held.block_table.data);
    table.assign(t, t + held.block_table.shape[0] * held.block_table.shape[1]);
    const auto* l = static_cast<const std::int64_t*>(held.seq_lens.data);
    lens.assign(l, l + held.seq_lens.shape[0]);
  }
  // The whole pool, padding between pages included (PagedKvCache's page stride).
  static std::vector<std::uint8_t> bytes_of(const TensorView& t) {
    const std::size_t n = dtype_size(t.dtype) * static_cast<std::size_t>(t.shape[0] * t.strides[0]);
    const auto* p = static_cast<const std::uint8_t*>(t.data);
    return {p, p + n};
  }
  bool operator==(const PagedSnapshot& o) const {
    return free == o.free && lengths == o.lengths && pages == o.pages && k == o.k && v == o.v &&
           table == o.table && lens == o.lens;
  }
};

// The "failure changes nothing" rule, entry point by entry point (docs/guarantees.md lists them):
// each call below fails, and every cache, view and output it was given is as it was.
TEST(Hostile, FailedCallsChangeNothing) {
  const std::int64_t dm = 8, H = 2;
  const std::vector<float> w(dm * dm, 0.05f);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  const MultiHeadAttention m({dm, H}, {wv, wv, wv, wv});
  std::vector<float> x = random_floats(2 * 3 * dm, 12), out(2 * 3 * dm, 7.0f);
  const auto untouched = [&] {
    for (float o : out) ASSERT_EQ(o, 7.0f);
  };
  int calls = 0;
  const auto fails = [&](const char* what, auto&& f) {
    SCOPED_TRACE(what);
    ++calls;
    EXPECT_THROW(f(), Error);
  };

  // Contiguous caches: append, reserve, truncate, decode.
  for (DType dt : {DType::f32, DType::bf16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    KvCache fixed = m.make_cache(2, 3, false, dt), grow = m.make_cache(2, 3, true, dt);
    for (KvCache* c : {&fixed, &grow})
      m.decode(f32_view(x.data(), {2, 3, dm}), *c, f32_view(out.data(), {2, 3, dm}));
    std::fill(out.begin(), out.end(), 7.0f);
    const std::vector<float> tok = random_floats(2 * 1 * 1 * 4, 13);
    std::vector<float> nan_tok = tok;
    nan_tok[1] = std::numeric_limits<float>::quiet_NaN();
    for (KvCache* c : {&fixed, &grow}) {
      const CacheSnapshot before(*c);
      const std::vector<std::int64_t> too_long = {99, 1};
      AttentionOptions bad_lengths;
      bad_lengths.key_lengths = TensorView::contiguous(too_long.data(), DType::i64, {2});
      AttentionOptions bad_window;
      bad_window.window_left = -3;
      fails("append: wrong head_dim", [&] {
        c->append(f32_view(tok.data(), {2, 1, 1, 4}), f32_view(tok.data(), {2, 1, 1, 4}));
      });
      fails("append: past a fixed capacity / a huge reserve", [&] {
        if (c == &fixed)
          c->append(c->keys(), c->values());
        else
          c->reserve(std::int64_t{1} << 50);
      });
      if (dt == DType::i8) {
        const std::vector<float> kk(2 * 1 * 1 * 4, std::numeric_limits<float>::infinity());
        fails("append: inf into an int8 cache", [&] {
          c->append(f32_view(kk.data(), {2, 1, 1, 4}), f32_view(kk.data(), {2, 1, 1, 4}));
        });
      }
      fails("truncate past the length", [&] { c->truncate(4); });
      fails("decode: key_lengths past the cache", [&] {
        m.decode(f32_view(x.data(), {2, 1, dm}), *c, f32_view(out.data(), {2, 1, dm}), bad_lengths);
      });
      fails("decode: a bad window", [&] {
        m.decode(f32_view(x.data(), {2, 1, dm}), *c, f32_view(out.data(), {2, 1, dm}), bad_window);
      });
      fails("decode: a batch of 1 for a cache of 2", [&] {
        m.decode(f32_view(x.data(), {1, 1, dm}), *c, f32_view(out.data(), {1, 1, dm}));
      });
      before.expect_same(*c);
      untouched();
    }
  }

  // A paged cache: append, fork, truncate, free, decode, attention; a held batch() view.
  for (DType dt : {DType::f32, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    PagedKvCache cache = m.make_paged_cache(5, 2, dt);
    const std::vector<std::int64_t> seqs = {cache.add_sequence(), cache.add_sequence()};
    m.decode(f32_view(x.data(), {2, 3, dm}), cache, seqs, f32_view(out.data(), {2, 3, dm}));
    std::fill(out.begin(), out.end(), 7.0f);
    const PagedKv held = cache.batch(seqs);
    const PagedSnapshot before(cache, seqs, held);
    const std::vector<float> big = random_floats(1 * 9 * 4, 14);
    fails("append: more pages than are free", [&] {
      cache.append(seqs[0], f32_view(big.data(), {1, 9, 4}), f32_view(big.data(), {1, 9, 4}));
    });
    fails("append: an unknown sequence", [&] {
      cache.append(77, f32_view(big.data(), {1, 1, 4}), f32_view(big.data(), {1, 1, 4}));
    });
    fails("fork: past the length", [&] { cache.fork(seqs[0], 9); });
    fails("truncate: past the length", [&] { cache.truncate(seqs[1], 4); });
    fails("free: an unknown sequence", [&] { cache.free(12); });
    fails("decode: more pages than are free", [&] {
      m.decode(f32_view(x.data(), {2, 3, dm}), cache, seqs, f32_view(out.data(), {2, 3, dm}));
    });
    fails("decode: a sequence twice", [&] {
      m.decode(f32_view(x.data(), {2, 1, dm}), cache, {seqs[0], seqs[0]},
               f32_view(out.data(), {2, 1, dm}));
    });
    AttentionOptions bad;
    bad.softcap = -1;
    fails("decode: a bad soft-cap", [&] {
      m.decode(f32_view(x.data(), {2, 1, dm}), cache, seqs, f32_view(out.data(), {2, 1, dm}), bad);
    });
    fails("attention: a bad soft-cap", [&] {
      attention(f32_view(x.data(), {2, H, 1, dm / H}), held,
                f32_view(out.data(), {2, H, 1, dm / H}), bad);
    });
    EXPECT_TRUE(PagedSnapshot(cache, seqs, held) == before);
    untouched();
  }

  // Layers and the plain entry points: outputs untouched.
  const std::vector<std::int32_t> bad_cu = {0, 5, 4};
  fails("mha.forward: x of the wrong width", [&] {
    m.forward(f32_view(x.data(), {2, 3, 4}), f32_view(out.data(), {2, 3, 4}));
  });
  fails("mha.forward_cross: a mask of the wrong shape", [&] {
    AttentionOptions o;
    o.mask = TensorView::contiguous(bad_cu.data(), DType::boolean, {3, 5});
    m.forward_cross(f32_view(x.data(), {2, 3, dm}), f32_view(x.data(), {2, 3, dm}),
                    f32_view(out.data(), {2, 3, dm}), o);
  });
  fails("Linear: y of the wrong shape", [&] {
    Linear(wv).forward(f32_view(x.data(), {6, dm}), f32_view(out.data(), {5, dm}));
  });
  fails("attention: lse of the wrong shape", [&] {
    AttentionOptions o;
    std::vector<float> lse(4, 7.0f);
    o.lse = f32_view(lse.data(), {1, 4});
    attention(f32_view(x.data(), {1, H, 3, dm}), f32_view(x.data(), {1, H, 3, dm}),
              f32_view(x.data(), {1, H, 3, dm}), f32_view(out.data(), {1, H, 3, dm}), o);
  });
  fails("attention_varlen: decreasing offsets", [&] {
    attention_varlen(f32_view(x.data(), {6, H, 4}), f32_view(x.data(), {6, H, 4}),
                     f32_view(x.data(), {6, H, 4}), f32_view(out.data(), {6, H, 4}),
                     TensorView::contiguous(bad_cu.data(), DType::i32, {3}),
                     TensorView::contiguous(bad_cu.data(), DType::i32, {3}));
  });
  untouched();
  EXPECT_GE(calls, 40);
}

}  // namespace
}  // namespace cpuattn::test
