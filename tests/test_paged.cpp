// Paged KV caches: attention(q, PagedKv) against the reference run on each sequence's pages
// gathered into a contiguous copy, on every backend, for page sizes from 1 to 256 with ragged last
// pages, shuffled and shared pages, empty sequences, decode and prefill against the cache, the
// variants, and f32/bf16/f16/int8 pools; PagedKvCache (append, fork with copy-on-write, truncate,
// free, page accounting); MultiHeadAttention::decode on a paged cache against the contiguous
// cache; and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "cpuattn/profile.h"
#include "test_util.h"
#include "tweaks.h"

namespace cpuattn::test {
namespace {

// A pool of pages with B sequences laid over shuffled pages; sequence 1 shares sequence 0's first
// `shared` pages when asked. Unused pages hold random values too, so a wrong page shows.
struct Pool {
  std::int64_t B, H, Hkv, D, Dv, P, num_pages, max_pages;
  DType dtype;
  std::vector<std::int64_t> lens;
  std::vector<std::int32_t> table;
  std::vector<std::uint8_t> k, v;  // pool bytes in `dtype`
  std::vector<float> ks, vs;       // int8 scales [num_pages, Hkv, P]
  std::vector<float> q;            // [B, H, Lq, D]
  std::int64_t Lq;

  Pool(std::int64_t H_, std::int64_t Hkv_, std::int64_t D_, std::int64_t Dv_, std::int64_t P_,
       std::vector<std::int64_t> lens_, std::int64_t Lq_, DType dt, std::int64_t shared,
       std::uint32_t seed)
      : B(static_cast<std::int64_t>(lens_.size())),
        H(H_),
        Hkv(Hkv_),
        D(D_),
        Dv(Dv_),
        P(P_),
        dtype(dt),
        lens(std::move(lens_)),
        Lq(Lq_) {
    max_pages = 1;
    std::int64_t used = 0;
    for (std::int64_t n : lens) {
      max_pages = std::max(max_pages, (n + P - 1) / P);
      used += (n + P - 1) / P;
    }
    num_pages = used + 3;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    table.assign(static_cast<std::size_t>(B * max_pages), -1);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < (lens[b] + P - 1) / P; ++i)
        table[b * max_pages + i] = (b == 1 && i < shared) ? table[i] : ids[next++];
    const auto e = static_cast<std::int64_t>(dtype_size(dtype));
    k.resize(num_pages * Hkv * P * D * e);
    v.resize(num_pages * Hkv * P * Dv * e);
    fill(k, D, ks, seed + 1);
    fill(v, Dv, vs, seed + 2);
    q = random_floats(B * H * Lq * D, seed + 3);
  }
  void fill(std::vector<std::uint8_t>& buf, std::int64_t width, std::vector<float>& scales,
            std::uint32_t seed) {
    const std::int64_t rows = num_pages * Hkv * P;
    const std::vector<float> x = random_floats(rows * width, seed);
    if (dtype == DType::i8) scales.resize(rows);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* src = x.data() + r * width;
      if (dtype == DType::i8) {
        scales[r] =
            quantize_int8(src, width, reinterpret_cast<std::int8_t*>(buf.data()) + r * width);
        continue;
      }
      for (std::int64_t d = 0; d < width; ++d) {
        if (dtype == DType::f32) std::memcpy(buf.data() + (r * width + d) * 4, src + d, 4);
        const std::uint16_t h = dtype == DType::bf16 ? to_bf16(src[d]) : to_f16(src[d]);
        if (dtype != DType::f32) std::memcpy(buf.data() + (r * width + d) * 2, &h, 2);
      }
    }
  }
  PagedKv kv() const {
    PagedKv p;
    p.k_pages = TensorView::contiguous(k.data(), dtype, {num_pages, Hkv, P, D});
    p.v_pages = TensorView::contiguous(v.data(), dtype, {num_pages, Hkv, P, Dv});
    p.block_table = TensorView::contiguous(table.data(), DType::i32, {B, max_pages});
    p.seq_lens = TensorView::contiguous(lens.data(), DType::i64, {B});
    if (dtype == DType::i8) {
      p.k_scales = f32_view(ks.data(), {num_pages, Hkv, P});
      p.v_scales = f32_view(vs.data(), {num_pages, Hkv, P});
    }
    return p;
  }
  TensorView qv() const { return f32_view(q.data(), {B, H, Lq, D}); }

  // Sequence b's tokens of one pool gathered into a contiguous [1, Hkv, len, width] copy (same
  // dtype), and its scales [1, Hkv, len].
  void gather(std::int64_t b, const std::vector<std::uint8_t>& pool, const std::vector<float>& sc,
              std::int64_t width, std::vector<std::uint8_t>& out,
              std::vector<float>& out_sc) const {
    const auto e = static_cast<std::int64_t>(dtype_size(dtype));
    const std::int64_t n = lens[b];
    out.resize(std::max<std::int64_t>(1, Hkv * n * width * e));
    out_sc.resize(std::max<std::int64_t>(1, Hkv * n));
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t page = table[b * max_pages + j / P];
        const std::int64_t row = (page * Hkv + h) * P + j % P;
        std::memcpy(out.data() + (h * n + j) * width * e, pool.data() + row * width * e, width * e);
        if (dtype == DType::i8) out_sc[h * n + j] = sc[row];
      }
  }

  // The expected out [B, H, Lq, Dv] and lse [B, H, Lq]: the reference on each gathered sequence.
  void expected(const AttentionOptions& opts, std::vector<float>& out,
                std::vector<float>& lse) const {
    out.assign(B * H * Lq * Dv, 0.0f);
    lse.assign(B * H * Lq, 0.0f);
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = lens[b];
      if (n == 0) {
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < Lq; ++i)
            lse[(b * H + h) * Lq + i] = opts.sinks ? static_cast<const float*>(opts.sinks->data)[h]
                                                   : -std::numeric_limits<float>::infinity();
        continue;
      }
      std::vector<std::uint8_t> kc, vc;
      std::vector<float> ksc, vsc;
      gather(b, k, ks, D, kc, ksc);
      gather(b, v, vs, Dv, vc, vsc);
      AttentionOptions o = opts;
      if (dtype == DType::i8) {
        o.k_scales = f32_view(ksc.data(), {1, Hkv, n});
        o.v_scales = f32_view(vsc.data(), {1, Hkv, n});
      }
      o.lse = f32_view(lse.data() + b * H * Lq, {1, H, Lq});
      reference_attention(f32_view(q.data() + b * H * Lq * D, {1, H, Lq, D}),
                          TensorView::contiguous(kc.data(), dtype, {1, Hkv, n, D}),
                          TensorView::contiguous(vc.data(), dtype, {1, Hkv, n, Dv}),
                          f32_view(out.data() + b * H * Lq * Dv, {1, H, Lq, Dv}), o);
    }
  }
};

void check_pool(const Pool& pl, const AttentionOptions& opts, const Backend& backend) {
  std::vector<float> want, want_lse;
  pl.expected(opts, want, want_lse);
  std::vector<float> out(want.size(), 7.0f), lse(want_lse.size(), 7.0f);
  AttentionOptions o = opts;
  o.lse = f32_view(lse.data(), {pl.B, pl.H, pl.Lq});
  Context ctx;
  backend.apply(ctx);
  attention(pl.qv(), pl.kv(), f32_view(out.data(), {pl.B, pl.H, pl.Lq, pl.Dv}), o, &ctx);
  std::int64_t max_len = 1;
  for (std::int64_t n : pl.lens) max_len = std::max(max_len, n);
  const double eps = std::numeric_limits<float>::epsilon();
  // The native decoding units round P for P V (bf16 V: to bf16, and Q splits into bf16 hi + lo;
  // int8 V: to int16 against the block's largest weight): the bound of tolerance_of
  // (attention_cases.h) for V in [-1, 1].
  const bool native = native_products(&ctx, pl.dtype);
  const double scale = opts.scale.value_or(1.0 / std::sqrt(double(pl.D)));
  const double p_round = !native ? 0.0
                         : pl.dtype == DType::bf16
                             ? std::ldexp(1.0, -8) + std::ldexp(1.0, -15) * double(pl.D) * scale
                         : pl.dtype == DType::i8 ? std::ldexp(1.0, -9)
                                                 : 0.0;
  const double atol = 8 * eps * (std::sqrt(double(max_len)) + std::sqrt(double(pl.D)) * 8) + 1e-6;
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), atol + p_round)) << "fast path out";
  EXPECT_TRUE(all_close(lse.data(), want_lse.data(), lse.size(), 16 * atol, 4 * eps))
      << "fast path lse";
  // The paged oracle reads the pages exactly as the gathered copies.
  std::vector<float> ref(want.size(), 7.0f), ref_lse(want_lse.size(), 7.0f);
  o.lse = f32_view(ref_lse.data(), {pl.B, pl.H, pl.Lq});
  reference_attention(pl.qv(), pl.kv(), f32_view(ref.data(), {pl.B, pl.H, pl.Lq, pl.Dv}), o);
  EXPECT_EQ(std::memcmp(ref.data(), want.data(), ref.size() * 4), 0) << "paged reference";
  EXPECT_EQ(std::memcmp(ref_lse.data(), want_lse.data(), ref_lse.size() * 4), 0);
}

class PagedGrid : public ::testing::TestWithParam<Backend> {};

TEST_P(PagedGrid, DecodeOverPageSizesAndRaggedLastPages) {
  // Lengths around page and block (128-key) boundaries, an empty sequence, GQA 3:1, odd D.
  for (std::int64_t P : {1, 2, 16, 128, 256}) {
    SCOPED_TRACE("P = " + std::to_string(P));
    const Pool pl(6, 2, 24, 20, P, {17, 0, 1, 300, 129, 16}, 1, DType::f32, 0, 5);
    check_pool(pl, {}, GetParam());
  }
}

TEST_P(PagedGrid, DecodeWithSharedPagesAndVariants) {
  // Sequence 1 shares sequence 0's first two pages (a common prefix, the last one partly used by
  // sequence 0); per-sequence alignment of the window, ALiBi and causal; sinks with a sequence
  // whose window misses no key and an empty one.
  const Pool pl(4, 4, 64, 64, 16, {40, 70, 0, 5}, 1, DType::f32, 2, 7);
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity()};
  AttentionOptions o;
  o.window_left = 7;
  o.alibi = true;
  o.softcap = 8;
  o.sinks = f32_view(sinks.data(), {4});
  check_pool(pl, o, GetParam());
  AttentionOptions causal;
  causal.causal = Causal::bottom_right;
  check_pool(pl, causal, GetParam());
}

TEST_P(PagedGrid, PrefillAgainstTheCache) {
  // Lq = 40 queries per sequence (packed tiles, several query blocks), causal bottom-right to each
  // sequence's own length, one sequence shorter than Lq, pages of 16 and 128.
  for (std::int64_t P : {16, 128}) {
    SCOPED_TRACE("P = " + std::to_string(P));
    const Pool pl(4, 2, 32, 32, P, {300, 25, 140}, 40, DType::f32, 0, 9);
    AttentionOptions o;
    o.causal = Causal::bottom_right;
    check_pool(pl, o, GetParam());
    AttentionOptions w;
    w.causal = Causal::bottom_right;
    w.window_left = 129;
    check_pool(pl, w, GetParam());
  }
}

TEST_P(PagedGrid, ReducedPrecisionPools) {
  for (DType dt : {DType::bf16, DType::f16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Pool decode(8, 2, 64, 64, 16, {33, 200, 1}, 1, dt, 1, 13);
    check_pool(decode, {}, GetParam());
    const Pool prefill(4, 2, 48, 40, 32, {100, 70}, 20, dt, 0, 17);
    AttentionOptions o;
    o.causal = Causal::bottom_right;
    check_pool(prefill, o, GetParam());
  }
}

TEST_P(PagedGrid, DecodeTasksOfSeveralKvHeads) {
  // Paged decoding gives a task several K/V heads (Plan::kv_heads_per_task, at most 64 rows):
  // 12 heads of 6 query heads each make tasks of 10 heads and of 2; Dv = 24 is not whole vectors
  // (V packed head by head); 8 query heads per K/V head is past the four-key micro-kernel's 6.
  for (DType dt : {DType::f32, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Pool wide(72, 12, 40, 24, 16, {33, 260, 0, 129}, 1, dt, 0, 23);
    check_pool(wide, {}, GetParam());
    const Pool deep(24, 3, 64, 48, 16, {200, 17}, 1, dt, 1, 29);
    AttentionOptions o;
    o.window_left = 100;
    o.softcap = 20;
    check_pool(deep, o, GetParam());
  }
}

TEST_P(PagedGrid, DecodeBlocksWithinOnePage) {
  // Pages of a multiple of the 128-key block: each block lies in one page and is read as
  // contiguous K/V (one stream, the next K rows asked for during P V: the next K/V head's in the
  // same block, or the next block's); pages of 64 cross blocks and keep the runs. Dv whole
  // vectors (V read in place), several K/V heads per task, lengths around 128 and 256, one long
  // enough to split its keys, f32/bf16/int8 pools (int8 scales per page).
  for (DType dt : {DType::f32, DType::bf16, DType::i8})
    for (std::int64_t P : {64, 128, 256}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " P = " + std::to_string(P));
      const Pool pl(12, 3, 64, 64, P, {129, 255, 1, 2100, 256}, 1, dt, 1, 31);
      check_pool(pl, {}, GetParam());
    }
}

TEST_P(PagedGrid, LongDecodeSplitsKeys) {
  // One long sequence decoded alone: the plan splits its keys across tasks and merges them.
  const Pool pl(8, 1, 64, 64, 16, {5000}, 1, DType::f32, 0, 19);
  check_pool(pl, {}, GetParam());
}

// Whether every prefetch hint fills L1 on this CPU by /proc/cpuinfo: AMD before Zen 4 (family
// 23, or family 25 outside Zen 4's models 0x10-0x1f, 0x60-0x7f, 0xa0-0xaf), where the plan trims
// the runs prefetched ahead (BlockPath::runs_ahead).
bool hints_fill_l1() {
#if defined(__x86_64__) || defined(__i386__)
  if (cpuinfo_field("vendor_id") != "AuthenticAMD") return false;
  const int family = std::atoi(cpuinfo_field("cpu family").c_str());
  const int model = std::atoi(cpuinfo_field("model").c_str());
  const bool zen4 = (model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) ||
                    (model >= 0xa0 && model <= 0xaf);
  return family == 23 || (family == 25 && !zen4);
#else
  return false;
#endif
}

TEST_P(PagedGrid, RunsAheadChangesOnlyPrefetches) {
  // Pages of 16 read in runs, four at a time, with the K rows of the runs read next prefetched
  // beside them: however many of those (the plan's, all 8, none), out and lse are bitwise the
  // same; the call's path names a trimmed count. Where every hint fills L1 the plan prefetches
  // none for f32 at D 128 (its V rows alone fill the lock-step's lines), all for bf16 and int8.
  for (DType dt : {DType::f32, DType::bf16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    const Pool pl(8, 2, 128, 128, 16, {300, 45, 700}, 1, dt, 0, 37);
    std::vector<float> want(pl.B * pl.H * pl.Dv), want_lse(pl.B * pl.H);
    Context ctx(2);
    GetParam().apply(ctx);
    for (const char* name : {"none", "runs_ahead_max", "no_runs_ahead"}) {
      std::vector<float> out(want.size(), 7.0f), lse(want_lse.size(), 7.0f);
      AttentionOptions o;
      o.lse = f32_view(lse.data(), {pl.B, pl.H, 1});
      set_plan_tweak(ctx, name);
      std::vector<CallProfile> calls;
      {
        ProfileSession session;
        attention(pl.qv(), pl.kv(), f32_view(out.data(), {pl.B, pl.H, 1, pl.Dv}), o, &ctx);
        calls = session.take();
      }
      ASSERT_EQ(calls.size(), 1u);
      const std::string line = verbose_line(calls[0], 1);
      ASSERT_NE(line.find("=dot_runs"), std::string::npos) << line;
      const bool trimmed = std::string(name) == "none" ? dt == DType::f32 && hints_fill_l1()
                                                       : std::string(name) == "no_runs_ahead";
      EXPECT_EQ(line.find("+ahead0") != std::string::npos, trimmed) << name << ": " << line;
      if (std::string(name) == "none") {
        want = out;
        want_lse = lse;
        continue;
      }
      EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * 4), 0) << name;
      EXPECT_EQ(std::memcmp(lse.data(), want_lse.data(), lse.size() * 4), 0) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PagedGrid, ::testing::ValuesIn(native_and_machine_backends()),
                         [](const auto& info) { return info.param.name(); });

TEST(Paged, NativeBf16PathReadsPages) {
  // bf16 Q and pages on the native bf16 kernel (when the CPU has it) against the reference.
  const Pool pl(4, 2, 64, 64, 16, {150, 37}, 24, DType::bf16, 0, 23);
  std::vector<std::uint16_t> qb(pl.q.size());
  std::vector<float> qr(pl.q.size());
  for (std::size_t i = 0; i < qb.size(); ++i) {
    qb[i] = to_bf16(pl.q[i]);
    qr[i] = from_bf16(qb[i]);
  }
  Pool rounded = pl;
  rounded.q = qr;
  std::vector<float> want, want_lse;
  rounded.expected({}, want, want_lse);
  std::vector<float> out(want.size(), 7.0f);
  Context ctx;
  // The native kernel where this CPU runs it; elsewhere (another architecture refuses the name)
  // the best target's path.
  if (machine_runs(Target::avx512_bf16)) ctx.set_max_target(Target::avx512_bf16);
  attention(TensorView::contiguous(qb.data(), DType::bf16, {pl.B, pl.H, pl.Lq, pl.D}), pl.kv(),
            f32_view(out.data(), {pl.B, pl.H, pl.Lq, pl.Dv}), {}, &ctx);
  // Probabilities rounded to bf16 before P V (docs/precision.md): 2^-8 relative per term.
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), 4e-3 * std::sqrt(150.0 / 64), 8e-3))
      << active_bf16_path(&ctx);
}

TEST(Paged, NativeDecodeWithF32Q) {
  // A decoding step of f32 Q over bf16 pages on the native kernel: scores on vdpbf16ps with Q
  // split into hi + lo, P V over the pages' V rows in place; over int8 pages, P V on VNNI. Pages
  // of 1 make every run one key (each paired with a zero row), D 72 ends in a partial 32, Dv 96
  // is a 64 and a 32 group.
  if (!machine_runs(Target::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16";
  Context ctx;
  ctx.set_max_target(Target::avx512_bf16);
  ASSERT_STREQ(active_bf16_path(&ctx), "avx512_bf16");
  for (DType dt : {DType::bf16, DType::i8})
    for (std::int64_t P : {1, 2, 16, 128}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " P " + std::to_string(P));
      const Pool pl(8, 2, 72, 96, P, {301, 37, 0, 1}, 1, dt, 0, 29);
      std::vector<float> want, want_lse;
      pl.expected({}, want, want_lse);
      std::vector<float> out(want.size(), 7.0f);
      attention(pl.qv(), pl.kv(), f32_view(out.data(), {pl.B, pl.H, pl.Lq, pl.Dv}), {}, &ctx);
      // docs/precision.md ("Accuracy"), V in [-1, 1]: bf16 |out - ref| <= (2^-8 + 2^-15 D scale)
      // max|v|; int8 (against the dequantized values) 2^-9 max|v|, plus f32's rounding.
      const double tol = dt == DType::bf16
                             ? std::ldexp(1.0, -8) + std::ldexp(1.0, -15) * 72 / std::sqrt(72.0)
                             : std::ldexp(1.0, -9) + 1e-5;
      EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), tol));
    }
}

TEST(Paged, ReadmeWorkedExample) {
  // docs/api.md, "Paged KV cache": 4 pages of 2 tokens, one head, D = 1; row 1 of page 1 (99)
  // lies past sequence 0's length and must not be read; sequence 1 shares page 3.
  const std::vector<float> k = {4, 5, 3, 99, -7, -7, 1, 2}, v = {40, 50, 30, 99, -7, -7, 10, 20};
  const std::vector<std::int32_t> table = {3, 1, 3, 0};
  const std::vector<std::int64_t> lens = {3, 4};
  const std::vector<float> q = {1, 1};
  PagedKv kv;
  kv.k_pages = f32_view(k.data(), {4, 1, 2, 1});
  kv.v_pages = f32_view(v.data(), {4, 1, 2, 1});
  kv.block_table = TensorView::contiguous(table.data(), DType::i32, {2, 2});
  kv.seq_lens = TensorView::contiguous(lens.data(), DType::i64, {2});
  AttentionOptions o;
  o.scale = 1.0;
  const auto expected = [](std::vector<double> ks, std::vector<double> vs) {
    double num = 0, den = 0;
    for (std::size_t j = 0; j < ks.size(); ++j) {
      num += std::exp(ks[j]) * vs[j];
      den += std::exp(ks[j]);
    }
    return num / den;
  };
  const double want0 = expected({1, 2, 3}, {10, 20, 30}),
               want1 = expected({1, 2, 4, 5}, {10, 20, 40, 50});
  EXPECT_NEAR(want0, 25.75, 0.005);
  EXPECT_NEAR(want1, 45.89, 0.005);
  for (const Backend& backend : machine_backends()) {
    Context ctx;
    backend.apply(ctx);
    std::vector<float> out(2, 0.0f);
    attention(f32_view(q.data(), {2, 1, 1, 1}), kv, f32_view(out.data(), {2, 1, 1, 1}), o, &ctx);
    EXPECT_NEAR(out[0], want0, 1e-4 * want0) << backend.name();
    EXPECT_NEAR(out[1], want1, 1e-4 * want1) << backend.name();
  }
}

TEST(Paged, ThreadCountInvariant) {
  const Pool pl(8, 2, 64, 64, 16, {900, 3, 2000}, 1, DType::f32, 0, 29);
  std::vector<float> a(pl.B * pl.H * pl.Dv), b(a.size());
  for (int threads : {1, 2}) {
    Context ctx(threads);
    attention(pl.qv(), pl.kv(), f32_view((threads == 1 ? a : b).data(), {pl.B, pl.H, 1, pl.Dv}), {},
              &ctx);
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// A paged call runs one problem per sequence, all as one set of tasks; the sequences share the
// tasks the machine wants (kernels/flash/config.cpp, plan_tasks: 4 per hardware thread, at least
// 16), each split by its share of the work, so the set adds at most one task per sequence to
// them. Planned alone, each of the 8 sequences here took the whole target in key splits.
TEST(Paged, SequencesShareTheTasksOfTheMachine) {
  const std::int64_t want = std::max<std::int64_t>(
      16, 4 * static_cast<std::int64_t>(std::thread::hardware_concurrency()));
  const Pool pl(8, 2, 32, 32, 64, std::vector<std::int64_t>(8, 4096), 1, DType::f32, 0, 37);
  std::vector<float> out(pl.B * pl.H * pl.Dv);
  Context ctx(1);
  ProfileSession session;
  attention(pl.qv(), pl.kv(), f32_view(out.data(), {pl.B, pl.H, 1, pl.Dv}), {}, &ctx);
  const std::vector<CallProfile> calls = session.take();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_LE(calls[0].tasks, want + pl.B) << "k_splits " << calls[0].k_splits;
  EXPECT_GE(calls[0].tasks, pl.B);
}

TEST(Paged, BadArgumentsAreErrorsAndWriteNothing) {
  Pool pl(4, 2, 16, 16, 4, {9, 3}, 1, DType::f32, 0, 31);
  std::vector<float> out(pl.B * pl.H * pl.Dv, 7.0f);
  const OutputView ov = f32_view(out.data(), {pl.B, pl.H, 1, pl.Dv});
  const auto expect = [&](const PagedKv& kv, const AttentionOptions& o, const std::string& what) {
    expect_error_mentioning([&] { attention(pl.qv(), kv, ov, o); }, what);
    expect_error_mentioning([&] { reference_attention(pl.qv(), kv, ov, o); }, what);
    for (float x : out) ASSERT_EQ(x, 7.0f) << what;
  };
  {  // a page size that is not a power of two
    PagedKv kv = pl.kv();
    kv.k_pages.shape[2] = kv.v_pages.shape[2] = 3;
    expect(kv, {}, "power of two");
  }
  {  // a table entry out of range, negative, and an unused entry that may be anything
    const std::int32_t saved = pl.table[1];
    pl.table[1] = static_cast<std::int32_t>(pl.num_pages);
    expect(pl.kv(), {}, "block_table[0, 1]");
    pl.table[1] = -1;
    expect(pl.kv(), {}, "block_table[0, 1] = -1");
    pl.table[1] = saved;
    pl.table[pl.max_pages + 1] = -5;  // sequence 1 (3 tokens) uses one page only
    attention(pl.qv(), pl.kv(), ov);
    std::fill(out.begin(), out.end(), 7.0f);
  }
  {
    pl.lens[1] = pl.max_pages * pl.P + 1;
    expect(pl.kv(), {}, "seq_lens[1]");
    pl.lens[1] = -1;
    expect(pl.kv(), {}, "seq_lens[1]");
    pl.lens[1] = 3;
  }
  {
    PagedKv kv = pl.kv();
    kv.block_table.dtype = DType::i64;
    expect(kv, {}, "block_table");
    kv = pl.kv();
    kv.block_table.shape[0] = 1;
    expect(kv, {}, "block_table");
    kv = pl.kv();
    kv.v_pages.shape[0] -= 1;
    expect(kv, {}, "v_pages");
    kv = pl.kv();
    kv.k_scales = f32_view(pl.q.data(), {pl.num_pages, pl.Hkv, pl.P});
    expect(kv, {}, "k_scales");
  }
  std::vector<std::uint8_t> m(64, 1);
  std::vector<std::int64_t> kl = {1, 1};
  AttentionOptions o;
  o.mask = TensorView::contiguous(m.data(), DType::boolean, {1});
  expect(pl.kv(), o, "mask");
  o = {};
  o.key_lengths = TensorView::contiguous(kl.data(), DType::i64, {2});
  expect(pl.kv(), o, "key_lengths");
  o = {};
  o.window_left = -2;
  expect(pl.kv(), o, "window_left");
  {  // out overlapping the pool
    PagedKv kv = pl.kv();
    auto* pool = reinterpret_cast<float*>(pl.k.data());
    expect_error_mentioning(
        [&] {
          attention(pl.qv(), kv, f32_view(pool, {pl.B, pl.H, 1, pl.Dv}));
        },
        "overlaps");
  }
}

// ---------------------------------------------------------------------------------------------
// PagedKvCache

// The tokens appended to one sequence, kept contiguous to check the cache against.
struct Tokens {
  std::int64_t Hkv, D, Dv;
  std::vector<std::vector<float>> k, v;  // per head, [len * d]
  Tokens(std::int64_t h, std::int64_t d, std::int64_t dv)
      : Hkv(h), D(d), Dv(dv), k(static_cast<std::size_t>(h)), v(static_cast<std::size_t>(h)) {}
  std::int64_t len() const { return static_cast<std::int64_t>(k[0].size()) / D; }
  // Appends n random tokens to the record and to `cache` (sequence `seq`).
  void append(PagedKvCache& cache, std::int64_t seq, std::int64_t n, std::uint32_t seed) {
    const std::vector<float> nk = random_floats(Hkv * n * D, seed);
    const std::vector<float> nv = random_floats(Hkv * n * Dv, seed + 1);
    cache.append(seq, f32_view(nk.data(), {Hkv, n, D}), f32_view(nv.data(), {Hkv, n, Dv}));
    for (std::int64_t h = 0; h < Hkv; ++h) {
      k[h].insert(k[h].end(), nk.begin() + h * n * D, nk.begin() + (h + 1) * n * D);
      v[h].insert(v[h].end(), nv.begin() + h * n * Dv, nv.begin() + (h + 1) * n * Dv);
    }
  }
  void truncate(std::int64_t n) {
    for (auto& x : k) x.resize(n * D);
    for (auto& x : v) x.resize(n * Dv);
  }
  std::vector<float> flat(const std::vector<std::vector<float>>& t) const {
    std::vector<float> f;
    for (const auto& x : t) f.insert(f.end(), x.begin(), x.end());
    return f;
  }
};

// attention over cache.batch(seqs) against the reference over each sequence's record.
void check_cache(PagedKvCache& cache, const std::vector<std::int64_t>& seqs,
                 const std::vector<Tokens*>& rec, std::int64_t H, std::uint32_t seed) {
  const auto B = static_cast<std::int64_t>(seqs.size());
  const std::int64_t Hkv = cache.kv_heads(), D = cache.head_dim(), Dv = cache.value_dim();
  const std::vector<float> q = random_floats(B * H * D, seed);
  std::vector<float> out(B * H * Dv, 7.0f), want(out.size(), 0.0f);
  attention(f32_view(q.data(), {B, H, 1, D}), cache.batch(seqs),
            f32_view(out.data(), {B, H, 1, Dv}));
  for (std::int64_t b = 0; b < B; ++b) {
    const Tokens& t = *rec[b];
    ASSERT_EQ(cache.length(seqs[b]), t.len());
    if (t.len() == 0) continue;
    const std::vector<float> k = t.flat(t.k), v = t.flat(t.v);
    reference_attention(f32_view(q.data() + b * H * D, {1, H, 1, D}),
                        f32_view(k.data(), {1, Hkv, t.len(), D}),
                        f32_view(v.data(), {1, Hkv, t.len(), Dv}),
                        f32_view(want.data() + b * H * Dv, {1, H, 1, Dv}));
  }
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), 1e-5));
}

TEST(PagedKvCache, AppendForkTruncateFree) {
  PagedKvCache cache(20, 8, 2, 16, 12);
  EXPECT_EQ(cache.free_pages(), 20);
  const std::int64_t a = cache.add_sequence();
  Tokens ta(2, 16, 12);
  ta.append(cache, a, 13, 1);  // 2 pages, the second partly filled
  ta.append(cache, a, 1, 2);
  EXPECT_EQ(cache.free_pages(), 18);
  // b shares a's 14 tokens (two pages, the second partly filled): no page taken.
  const std::int64_t b = cache.fork(a);
  Tokens tb = ta;
  EXPECT_EQ(cache.free_pages(), 18);
  EXPECT_EQ(cache.pages(a), cache.pages(b));
  // Writing into the shared partial page copies it for the writer only.
  tb.append(cache, b, 5, 3);
  EXPECT_EQ(cache.free_pages(), 16);  // the copy and one new page
  EXPECT_EQ(cache.pages(a)[0], cache.pages(b)[0]);
  EXPECT_NE(cache.pages(a)[1], cache.pages(b)[1]);
  // a fork of a prefix that ends mid-page, then a's own append: a copies (the page is shared).
  const std::int64_t c = cache.fork(a, 10);
  Tokens tc = ta;
  tc.truncate(10);
  ta.append(cache, a, 4, 4);
  tc.append(cache, c, 9, 5);
  check_cache(cache, {a, b, c}, {&ta, &tb, &tc}, 4, 6);
  check_cache(cache, {c, a}, {&tc, &ta}, 2, 7);
  // Truncate across a page boundary (rolls back rejected speculative tokens), then append again.
  cache.truncate(b, 7);
  tb.truncate(7);
  tb.append(cache, b, 3, 8);
  check_cache(cache, {a, b, c}, {&ta, &tb, &tc}, 4, 9);
  // Freeing every sequence returns every page; ids are reused.
  cache.free(a);
  cache.free(b);
  cache.free(c);
  EXPECT_EQ(cache.free_pages(), 20);
  EXPECT_EQ(cache.add_sequence(), a);
  expect_error_mentioning([&] { cache.length(b); }, "no sequence");
}

TEST(PagedKvCache, FullPoolIsAnErrorThatChangesNothing) {
  PagedKvCache cache(3, 4, 1, 8, 8);
  const std::int64_t a = cache.add_sequence();
  Tokens ta(1, 8, 8);
  ta.append(cache, a, 10, 1);  // 3 pages
  const std::int64_t b = cache.fork(a);
  Tokens tb = ta;
  // b's last page is shared and partly filled: its copy needs a free page, and there is none.
  expect_error_mentioning([&] { tb.append(cache, b, 1, 2); }, "0 of 3 are free");
  tb.truncate(10);
  EXPECT_EQ(cache.length(b), 10);
  check_cache(cache, {a, b}, {&ta, &tb}, 2, 3);
  std::vector<float> bad(8, std::numeric_limits<float>::quiet_NaN());
  PagedKvCache q8(4, 4, 1, 8, 8, DType::i8);
  const std::int64_t s = q8.add_sequence();
  expect_error_mentioning(
      [&] {
        q8.append(s, f32_view(bad.data(), {1, 1, 8}), f32_view(bad.data(), {1, 1, 8}));
      },
      "int8");
  EXPECT_EQ(q8.length(s), 0);
  EXPECT_EQ(q8.free_pages(), 4);
  expect_error_mentioning([] { PagedKvCache(4, 12, 1, 8, 8); }, "power of two");
  expect_error_mentioning([&] { cache.truncate(a, 11); }, "outside");
  expect_error_mentioning([&] { cache.fork(a, 11); }, "outside");
}

TEST(PagedKvCache, ReducedPrecisionStorage) {
  for (DType dt : {DType::bf16, DType::f16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    PagedKvCache cache(16, 16, 2, 32, 32, dt);
    const std::int64_t a = cache.add_sequence();
    const std::vector<float> k = random_floats(2 * 40 * 32, 3), v = random_floats(2 * 40 * 32, 4);
    cache.append(a, f32_view(k.data(), {2, 40, 32}), f32_view(v.data(), {2, 40, 32}));
    const std::vector<float> q = random_floats(4 * 32, 5);
    std::vector<float> out(4 * 32), want(4 * 32);
    attention(f32_view(q.data(), {1, 4, 1, 32}), cache.batch({a}),
              f32_view(out.data(), {1, 4, 1, 32}));
    reference_attention(f32_view(q.data(), {1, 4, 1, 32}), f32_view(k.data(), {1, 2, 40, 32}),
                        f32_view(v.data(), {1, 2, 40, 32}), f32_view(want.data(), {1, 4, 1, 32}));
    // End to end against the f32 values: the storage rounding (bf16 2^-9, f16 2^-12, int8
    // max|x| / 254 per element) dominates.
    EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), dt == DType::f16 ? 2e-3 : 2e-2));
  }
}

// Pages of an even number of 64-byte lines (1 KiB or more) are a line apart from contiguous, so
// that pages start at every line offset of 4 KiB (docs/performance.md#dm-page-stride); the views
// say so in their strides, and the rows appended lie where the views put them.
TEST(PagedKvCache, PagesStartAtEveryLineOffset) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto e = static_cast<std::int64_t>(dtype_size(dt));
    PagedKvCache cache(96, 16, 8, 128, 64, dt);
    const TensorView k = cache.key_pages(), v = cache.value_pages();
    EXPECT_EQ(k.strides[0] * e, 16 * 8 * 128 * e + 64);
    EXPECT_EQ(v.strides[0] * e, 16 * 8 * 64 * e + 64);
    EXPECT_EQ(k.strides[1], 16 * 128);
    std::set<std::int64_t> offsets;
    for (std::int64_t p = 0; p < 96; ++p) offsets.insert(p * k.strides[0] * e % 4096);
    EXPECT_EQ(offsets.size(), 64u);
    // A token in the pool's last page (pages are taken from page 0 up), read back through the
    // view's strides.
    const std::int64_t a = cache.add_sequence();
    const std::vector<float> kx = random_floats(8 * (95 * 16 + 3) * 128, 1),
                             vx = random_floats(8 * (95 * 16 + 3) * 64, 2);
    cache.append(a, f32_view(kx.data(), {8, 95 * 16 + 3, 128}),
                 f32_view(vx.data(), {8, 95 * 16 + 3, 64}));
    ASSERT_EQ(cache.pages(a).back(), 95);
    const std::int64_t tok = 95 * 16 + 2, h = 5, d = 77;
    const float want = kx[static_cast<std::size_t>((h * (95 * 16 + 3) + tok) * 128 + d)];
    const std::int64_t at = 95 * k.strides[0] + h * k.strides[1] + (tok % 16) * k.strides[2] + d;
    const auto* base = static_cast<const unsigned char*>(k.data) + at * e;
    float got = 0.0f;
    if (dt == DType::f32) std::memcpy(&got, base, 4);
    if (dt == DType::i8)
      got = static_cast<float>(static_cast<std::int8_t>(*base)) *
            static_cast<const float*>(cache.key_page_scales()->data)[(95 * 8 + h) * 16 + 2];
    std::uint16_t bits = 0;
    if (e == 2) std::memcpy(&bits, base, 2);
    if (dt == DType::bf16) {
      const std::uint32_t wide = std::uint32_t{bits} << 16;
      std::memcpy(&got, &wide, 4);
    }
    if (dt == DType::f16) {  // a normal f16 value (|x| < 1 here)
      const int exp = (bits >> 10) & 31, man = bits & 1023;
      got = std::ldexp(1.0f + man / 1024.0f, exp - 15) * (bits >> 15 ? -1 : 1);
    }
    EXPECT_NEAR(got, want, dt == DType::f32 ? 0.0 : std::abs(want) / 64 + 1.0 / 128);
  }
  // Smaller pages, and pages of an odd number of lines, stay contiguous.
  EXPECT_EQ(PagedKvCache(4, 4, 1, 8, 8).key_pages().strides[0], 32);
  EXPECT_EQ(PagedKvCache(4, 16, 1, 17, 8).key_pages().strides[0], 16 * 17);
}

TEST(PagedKvCache, MhaDecodeMatchesContiguousCaches) {
  const MhaConfig cfg{64, 8, 2, 0, 0};
  const std::vector<float> wq = random_floats(64 * 64, 1, -0.2f, 0.2f),
                           wk = random_floats(64 * 16, 2, -0.2f, 0.2f),
                           wv = random_floats(64 * 16, 3, -0.2f, 0.2f),
                           wo = random_floats(64 * 64, 4, -0.2f, 0.2f);
  const MultiHeadAttention mha(cfg, {f32_view(wq.data(), {64, 64}), f32_view(wk.data(), {64, 16}),
                                     f32_view(wv.data(), {64, 16}), f32_view(wo.data(), {64, 64})});
  PagedKvCache paged = mha.make_paged_cache(64, 16);
  // Two sequences of different lengths: prompts of 21 and 5 tokens, then decode steps.
  std::vector<KvCache> ref;
  std::vector<std::int64_t> seqs;
  const std::int64_t prompt[2] = {21, 5};
  for (int b = 0; b < 2; ++b) {
    seqs.push_back(paged.add_sequence());
    ref.push_back(mha.make_cache(1, 64));
    const std::vector<float> x = random_floats(prompt[b] * 64, 10 + b);
    std::vector<float> o1(x.size()), o2(x.size());
    AttentionOptions causal;
    causal.causal = Causal::bottom_right;
    mha.decode(f32_view(x.data(), {1, prompt[b], 64}), paged, {seqs[b]},
               f32_view(o1.data(), {1, prompt[b], 64}), causal);
    mha.decode(f32_view(x.data(), {1, prompt[b], 64}), ref[b],
               f32_view(o2.data(), {1, prompt[b], 64}), causal);
    EXPECT_TRUE(all_close(o1.data(), o2.data(), o1.size(), 1e-5)) << "prompt " << b;
  }
  for (int step = 0; step < 20; ++step) {
    const std::vector<float> x = random_floats(2 * 64, 100 + step);
    std::vector<float> o1(x.size(), 7.0f), o2(x.size());
    mha.decode(f32_view(x.data(), {2, 1, 64}), paged, seqs, f32_view(o1.data(), {2, 1, 64}));
    for (int b = 0; b < 2; ++b)
      mha.decode(f32_view(x.data() + b * 64, {1, 1, 64}), ref[b],
                 f32_view(o2.data() + b * 64, {1, 1, 64}));
    ASSERT_TRUE(all_close(o1.data(), o2.data(), o1.size(), 1e-5)) << "step " << step;
  }
  EXPECT_EQ(paged.length(seqs[0]), 41);
  EXPECT_EQ(paged.length(seqs[1]), 25);
  // A step the pool cannot hold changes neither out nor the cache.
  PagedKvCache small = mha.make_paged_cache(2, 16);
  const std::int64_t s = small.add_sequence();
  const std::vector<float> x = random_floats(33 * 64, 7);
  std::vector<float> o(33 * 64, 7.0f);
  expect_error_mentioning(
      [&] {
        mha.decode(f32_view(x.data(), {1, 33, 64}), small, {s}, f32_view(o.data(), {1, 33, 64}));
      },
      "free pages");
  EXPECT_EQ(small.length(s), 0);
  for (float y : o) ASSERT_EQ(y, 7.0f);
  expect_error_mentioning(
      [&] {
        mha.decode(f32_view(x.data(), {2, 1, 64}), paged, {seqs[0], seqs[0]},
                   f32_view(o.data(), {2, 1, 64}));
      },
      "twice");
}

}  // namespace
}  // namespace cpuattn::test
