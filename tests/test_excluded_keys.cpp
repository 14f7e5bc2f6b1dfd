// Keys that a mask, causality, a window, key lengths, a packed batch's boundary or a paged cache's
// block table excludes never reach the output or the lse, whatever their K and V rows hold
// (docs/guarantees.md, "Excluded keys"): services pad batches with uninitialised memory, recycle
// cache pages and pre-allocate cache slots. Each case poisons the excluded keys' K and V rows with
// inf, -inf or NaN (and int8 rows through their scale) and compares the fast path with the
// reference on the same inputs, on every backend, for f32/bf16/f16 tensors and bf16/f16/int8
// caches, on the tiled, streamed, split-key, paged and packed paths, at 1 and 2 threads. Rows that
// attend a poisoned key propagate it, as the reference does (NaN for NaN, inf for inf).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

enum class Poison { pos_inf, neg_inf, nan };
constexpr Poison kPoisons[] = {Poison::pos_inf, Poison::neg_inf, Poison::nan};

float value_of(Poison x) {
  return x == Poison::pos_inf   ? std::numeric_limits<float>::infinity()
         : x == Poison::neg_inf ? -std::numeric_limits<float>::infinity()
                                : std::numeric_limits<float>::quiet_NaN();
}

const char* name_of(Poison x) {
  return x == Poison::pos_inf ? "inf" : x == Poison::neg_inf ? "-inf" : "NaN";
}

// Writes the poison into row (b, h, j) of a stored tensor and of its f32 copy `t`. An int8 row gets
// it as its scale, over values `i8`: 0 for K, so that its scores are NaN (0 * inf) both in the
// reference, which dequantizes each element, and in the fast path, which scales the dot product.
void poison_row(Tensor4& t, Stored& st, DType dtype, std::int64_t b, std::int64_t h, std::int64_t j,
                Poison x, std::int8_t i8) {
  const float f = value_of(x);
  for (std::int64_t d = 0; d < t.D; ++d) {
    t.at(b, h, j, d) = f;
    const auto i = static_cast<std::size_t>(t.offset(b, h, j, d) + t.misalign);
    if (dtype == DType::bf16) st.half[i] = to_bf16(f);
    if (dtype == DType::f16) st.half[i] = to_f16(f);
    if (dtype == DType::i8) st.i8[i] = i8;
  }
  if (dtype == DType::i8) st.scales[static_cast<std::size_t>((b * t.H + h) * t.L + j)] = f;
}

// Sets a case's exclusions on its inputs (masks, causality, windows, key lengths).
using Exclude = std::function<void(Inputs&)>;

// Runs case c with the K and V rows of `keys` (in every batch and K/V head) poisoned, on the fast
// path and on the reference; out and lse must match within the case's tolerance, NaN for NaN and
// inf for inf. At least `finite_rows` rows of the reference's out must be finite: the poison sits
// in keys that those rows exclude, so the case tests exclusion and not propagation.
void check_poisoned(const Case& c, const Exclude& exclude, const std::vector<std::int64_t>& keys,
                    Poison x, const Backend& backend, int threads, std::int64_t finite_rows,
                    bool poison_k) {
  SCOPED_TRACE(c.str() + ", " + name_of(x) + " in " + std::to_string(keys.size()) +
               " excluded keys, " + std::to_string(threads) + " threads, on " + backend.name());
  Inputs in(c);
  exclude(in);
  Stored sq(in.q, c.q_dtype), sk(in.k, c.kv_dtype), sv(in.v, c.kv_dtype);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.Hkv; ++h)
      for (std::int64_t j : keys) {
        if (poison_k) poison_row(in.k, sk, c.kv_dtype, b, h, j, x, 0);
        poison_row(in.v, sv, c.kv_dtype, b, h, j, x, 77);
      }
  AttentionOptions o = in.opts;
  o.k_scales = sk.scales_view;
  o.v_scales = sv.scales_view;
  const std::int64_t rows = c.B * c.H * c.Lq;
  std::vector<float> out(rows * c.Dv, 7.0f), want(out.size(), 7.0f), lse(rows, 7.0f),
      want_lse(rows, 7.0f);
  const OutputView out_view = f32_view(out.data(), {c.B, c.H, c.Lq, c.Dv});
  Context ctx(threads);
  backend.apply(ctx);
  o.lse = f32_view(lse.data(), {c.B, c.H, c.Lq});
  attention(sq.view, sk.view, sv.view, out_view, o, &ctx);
  o.lse = f32_view(want_lse.data(), {c.B, c.H, c.Lq});
  reference_attention(sq.view, sk.view, sv.view, f32_view(want.data(), {c.B, c.H, c.Lq, c.Dv}), o);

  std::int64_t finite = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    bool all = true;
    for (std::int64_t d = 0; d < c.Dv; ++d) all = all && std::isfinite(want[r * c.Dv + d]);
    finite += all ? 1 : 0;
  }
  ASSERT_GE(finite, finite_rows) << "the case poisons keys that its rows attend";
  const Tolerance tol = tolerance_of(c, native_products(&ctx, c.kv_dtype));
  EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), tol.out_atol, tol.out_rtol)) << "out";
  EXPECT_TRUE(all_close(lse.data(), want_lse.data(), lse.size(), tol.lse_atol, tol.lse_rtol))
      << "lse";
}

// The dtypes of the grid: f32, bf16 and f16 tensors, bf16/f16/int8 caches with f32 queries.
struct Dtypes {
  DType q, kv;
};
const Dtypes kDtypes[] = {{DType::f32, DType::f32},
                          {DType::bf16, DType::bf16},
                          {DType::f16, DType::f16},
                          {DType::f32, DType::bf16},
                          {DType::f32, DType::i8}};

// Runs case c over the dtypes, both thread counts and the three poisons (one poison per dtype
// and thread count, cycling, so that every poison meets every path).
void check_grid(Case c, const Exclude& exclude, const std::vector<std::int64_t>& keys,
                const Backend& backend, std::int64_t finite_rows, bool poison_k = true) {
  int n = 0;
  for (const Dtypes& dt : kDtypes)
    for (int threads : {1, 2}) {
      if (!grid_case_runs(n++, 3)) continue;
      c.q_dtype = dt.q;
      c.kv_dtype = dt.kv;
      check_poisoned(c, exclude, keys, kPoisons[n % 3], backend, threads, finite_rows, poison_k);
    }
}

std::vector<std::int64_t> key_range(std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> keys;
  for (std::int64_t j = lo; j < hi; ++j) keys.push_back(j);
  return keys;
}

Case make_case(std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t Lq, std::int64_t Lk,
               std::int64_t D) {
  Case c;
  c.B = B, c.H = H, c.Hkv = Hkv, c.Lq = Lq, c.Lk = Lk, c.D = D, c.Dv = D;
  return c;
}

// The shapes of the mask cases: the tiled prefill, a GQA decoding step (4 query rows per
// K/V head: the native bf16/VNNI P V where the CPU has it), one row per head with split keys, and
// odd sizes whose V rows are not whole vectors (packed, not read in place).
std::vector<Case> mask_shapes() {
  return {make_case(2, 3, 3, 17, 70, 64), make_case(2, 8, 2, 1, 300, 64),
          make_case(1, 2, 2, 1, 3000, 48), make_case(1, 3, 1, 5, 133, 17)};
}

// Keys every row excludes in the mask cases: 3..8, 35..39 (of the first 128-key block) and the
// last four, which end the last block.
std::vector<std::int64_t> dead_keys(std::int64_t Lk) {
  std::vector<std::int64_t> keys = key_range(3, 9);
  for (std::int64_t j : key_range(35, 40)) keys.push_back(j);
  for (std::int64_t j : key_range(Lk - 4, Lk)) keys.push_back(j);
  return keys;
}

class ExcludedKeys : public ::testing::TestWithParam<Backend> {};

TEST_P(ExcludedKeys, BoolMask) {
  for (const Case& c : mask_shapes()) {
    const auto dead = dead_keys(c.Lk);
    const Exclude mask = [&](Inputs& in) {
      // [Lq, Lk]: the dead keys, and a fifth of the other entries at random.
      in.bmask.assign(c.Lq * c.Lk, 1);
      for (std::size_t e = 0; e < in.bmask.size(); ++e) in.bmask[e] = e * 2654435761u % 5 != 0;
      for (std::int64_t i = 0; i < c.Lq; ++i)
        for (std::int64_t j : dead) in.bmask[i * c.Lk + j] = 0;
      in.opts.mask = TensorView::contiguous(in.bmask.data(), DType::boolean, {c.Lq, c.Lk});
    };
    check_grid(c, mask, dead, GetParam(), c.B * c.H * c.Lq);
  }
}

TEST_P(ExcludedKeys, AdditiveMaskOfMinusInfinity) {
  // -inf excludes a key even where its score is NaN (a NaN K row); a finite additive value does
  // not (that is the caller's NaN, as in every peer).
  for (const Case& c : mask_shapes()) {
    const auto dead = dead_keys(c.Lk);
    const Exclude mask = [&](Inputs& in) {
      in.amask = random_floats(c.Lq * c.Lk, 11, -2.0f, 2.0f);
      for (std::int64_t i = 0; i < c.Lq; ++i)
        for (std::int64_t j : dead)
          in.amask[i * c.Lk + j] = -std::numeric_limits<float>::infinity();
      in.opts.mask = f32_view(in.amask.data(), {c.Lq, c.Lk});
    };
    check_grid(c, mask, dead, GetParam(), c.B * c.H * c.Lq);
  }
}

TEST_P(ExcludedKeys, Causal) {
  // Top-left, Lq = Lk: the last key is seen by the last row only, so every other row must stay
  // finite (the diagonal block multiplies the masked zeros by it). Two query blocks of 200: the
  // packed K/V are kept across query blocks.
  for (std::int64_t L : {70, 200}) {
    const Case c = make_case(1, 2, 1, L, L, 32);
    const Exclude causal = [](Inputs& in) { in.opts.causal = Causal::top_left; };
    check_grid(c, causal, {L - 1}, GetParam(), c.B * c.H * (L - 1));
  }
  // Bottom-right decoding of 4 positions over 300 keys: the last key is the last row's.
  const Case c = make_case(2, 4, 2, 4, 300, 64);
  const Exclude causal = [](Inputs& in) { in.opts.causal = Causal::bottom_right; };
  check_grid(c, causal, {299}, GetParam(), c.B * c.H * 3);
}

TEST_P(ExcludedKeys, SlidingWindow) {
  // window (32, 0) bottom-right: keys left of the first row's window are excluded for all rows.
  const Case c = make_case(2, 3, 3, 17, 70, 64);
  const Exclude window = [](Inputs& in) {
    in.opts.causal = Causal::bottom_right;
    in.opts.window_left = 32;
    in.opts.window_right = 0;
  };
  check_grid(c, window, key_range(0, 70 - 17 - 32), GetParam(), c.B * c.H * c.Lq);
  // A decoding step over 3000 keys (split keys) whose window starts inside a key block.
  const Case d = make_case(1, 4, 2, 1, 3000, 64);
  const Exclude decode_window = [](Inputs& in) { in.opts.window_left = 300; };
  check_grid(d, decode_window, key_range(2000, 3000 - 1 - 300), GetParam(), d.B * d.H);
}

TEST_P(ExcludedKeys, SplitKeysWhoseWeightIsZero) {
  // Decoding over 3000 keys runs in key splits. A +1e30 mask term on the last key leaves every
  // other key a weight of 0 against the row's max, but within its own split a key keeps a weight:
  // the split holding a NaN V row must add nothing when the splits merge (found by
  // fuzz_attention_diff).
  const Case c = make_case(1, 2, 2, 1, 3000, 16);
  const Exclude mask = [&](Inputs& in) {
    in.amask.assign(3000, 0.0f);
    in.amask[2999] = 1e30f;
    in.opts.mask = f32_view(in.amask.data(), {1, 3000});
  };
  // V only: these keys are attended (with a weight of 0), so inf in their K would be the row's.
  check_grid(c, mask, {10, 1500}, GetParam(), c.B * c.H, /*poison_k=*/false);
  // Within one split too: the NaN row's block comes first, and the block with the +1e30 key
  // rescales the accumulator by exactly 0.
  const Case d = make_case(1, 2, 2, 1, 300, 16);
  const Exclude mask2 = [&](Inputs& in) {
    in.amask.assign(300, 0.0f);
    in.amask[200] = 1e30f;
    in.opts.mask = f32_view(in.amask.data(), {1, 300});
  };
  check_grid(d, mask2, {10, 130}, GetParam(), d.B * d.H, /*poison_k=*/false);
}

TEST_P(ExcludedKeys, KeyLengths) {
  const Case c = make_case(2, 4, 2, 3, 200, 40);
  const Exclude lengths = [](Inputs& in) {
    in.lengths = {150, 150};
    in.opts.key_lengths = TensorView::contiguous(in.lengths.data(), DType::i32, {2});
  };
  check_grid(c, lengths, key_range(150, 200), GetParam(), c.B * c.H * c.Lq);
}

// Packed batches: causal top-left per sequence with Lq = Lk, the last key of each sequence
// poisoned; every row but each sequence's last stays finite, and no sequence sees another's keys.
TEST_P(ExcludedKeys, PackedBatches) {
  const std::vector<std::int32_t> cu = {0, 9, 140, 141, 200};
  const std::int64_t total = cu.back(), H = 2, D = 24;
  std::vector<float> q = random_floats(total * H * D, 31), k = random_floats(total * H * D, 32),
                     v = random_floats(total * H * D, 33);
  for (std::size_t s = 1; s < cu.size(); ++s)
    for (std::int64_t e = 0; e < H * D; ++e) {
      k[(cu[s] - 1) * H * D + e] = std::numeric_limits<float>::quiet_NaN();
      v[(cu[s] - 1) * H * D + e] = std::numeric_limits<float>::infinity();
    }
  const auto view = [&](const std::vector<float>& t) { return f32_view(t.data(), {total, H, D}); };
  AttentionOptions o;
  o.causal = Causal::top_left;
  const TensorView cuv = TensorView::contiguous(cu.data(), DType::i32, {5});
  std::vector<float> want(total * H * D, 7.0f);
  reference_attention_varlen(view(q), view(k), view(v), f32_view(want.data(), {total, H, D}), cuv,
                             cuv, o);
  for (int threads : {1, 2}) {
    Context ctx(threads);
    GetParam().apply(ctx);
    std::vector<float> out(want.size(), 7.0f);
    attention_varlen(view(q), view(k), view(v), f32_view(out.data(), {total, H, D}), cuv, cuv, o,
                     &ctx);
    const double atol = 8 * std::numeric_limits<float>::epsilon() * 64;
    EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), atol)) << threads << " threads";
    std::int64_t finite = 0;
    for (float x : out) finite += std::isfinite(x) ? 1 : 0;
    EXPECT_EQ(finite, (total - 4) * H * D) << "rows that see only their own, clean keys";
  }
}

// A paged cache: keys left of a window, and the unused rows of each sequence's last page and the
// unused pages, hold inf and NaN; decoding and a 20-query prefill must not see them.
TEST_P(ExcludedKeys, PagedCache) {
  const std::int64_t P = 16, Hkv = 2, H = 8, D = 64, pages = 40;
  const std::vector<std::int64_t> lens = {300, 37};
  for (DType dt : {DType::f32, DType::bf16, DType::i8}) {
    for (std::int64_t Lq : {1, 20}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " Lq " + std::to_string(Lq));
      PagedKvCache cache(pages, P, Hkv, D, D, dt);
      const std::vector<std::int64_t> seqs = {cache.add_sequence(), cache.add_sequence()};
      for (std::size_t s = 0; s < seqs.size(); ++s) {
        const std::int64_t n = lens[s];
        const std::vector<float> kk = random_floats(Hkv * n * D, 40 + s),
                                 vv = random_floats(Hkv * n * D, 50 + s);
        cache.append(seqs[s], f32_view(kk.data(), {Hkv, n, D}), f32_view(vv.data(), {Hkv, n, D}));
      }
      const PagedKv kv = cache.batch(seqs);
      // Every pool row the window excludes or no sequence holds, in both pools (int8: the scales).
      const auto* table = static_cast<const std::int32_t*>(kv.block_table.data);
      const std::int64_t max_pages = kv.block_table.shape[1];
      const std::int64_t window = 100;
      std::vector<bool> live(pages * P, false);
      for (std::size_t s = 0; s < seqs.size(); ++s)
        for (std::int64_t j = std::max<std::int64_t>(0, lens[s] - Lq - window); j < lens[s]; ++j)
          live[table[s * max_pages + j / P] * P + j % P] = true;
      for (const TensorView* pool : {&kv.k_pages, &kv.v_pages}) {
        const std::size_t e = dtype_size(dt);
        for (std::int64_t row = 0; row < pages * P; ++row) {
          if (live[row]) continue;
          const std::int64_t page = row / P, slot = row % P;
          for (std::int64_t h = 0; h < Hkv; ++h) {
            auto* dst = static_cast<char*>(const_cast<void*>(pool->data)) +
                        (page * pool->strides[0] + h * pool->strides[1] + slot * pool->strides[2]) *
                            static_cast<std::int64_t>(e);
            for (std::int64_t d = 0; d < D; ++d) {
              const float f = d % 2 ? std::numeric_limits<float>::infinity()
                                    : std::numeric_limits<float>::quiet_NaN();
              if (dt == DType::f32) std::memcpy(dst + d * 4, &f, 4);
              if (dt == DType::bf16) {
                const std::uint16_t b16 = to_bf16(f);
                std::memcpy(dst + d * 2, &b16, 2);
              }
              if (dt == DType::i8) dst[d] = 5;
            }
          }
        }
      }
      if (dt == DType::i8) {
        for (const TensorView* sc : {&*kv.k_scales, &*kv.v_scales})
          for (std::int64_t row = 0; row < pages * P; ++row)
            if (!live[row])
              for (std::int64_t h = 0; h < Hkv; ++h)
                static_cast<float*>(
                    const_cast<void*>(sc->data))[(row / P * Hkv + h) * P + row % P] =
                    std::numeric_limits<float>::infinity();
      }
      const std::vector<float> q = random_floats(2 * H * Lq * D, 60);
      AttentionOptions o;
      o.causal = Causal::bottom_right;
      o.window_left = window;
      std::vector<float> want(2 * H * Lq * D, 7.0f);
      reference_attention(f32_view(q.data(), {2, H, Lq, D}), kv,
                          f32_view(want.data(), {2, H, Lq, D}), o);
      for (float x : want) ASSERT_TRUE(std::isfinite(x));
      for (int threads : {1, 2}) {
        Context ctx(threads);
        GetParam().apply(ctx);
        std::vector<float> out(want.size(), 7.0f);
        attention(f32_view(q.data(), {2, H, Lq, D}), kv, f32_view(out.data(), {2, H, Lq, D}), o,
                  &ctx);
        const double atol =
            8 * std::numeric_limits<float>::epsilon() * 64 +
            (dt == DType::f32 ? 0.0 : std::ldexp(1.0, -8) + std::ldexp(1.0, -15) * 8);
        EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), atol)) << threads << " threads";
      }
    }
  }
}

// Multi-head attention over an encoder output padded with garbage (np.empty): the padded tokens'
// projected K and V rows are inf or NaN, and a key-padding mask excludes them, so every output
// matches the same layer over zero padding.
TEST_P(ExcludedKeys, MultiHeadAttentionOverPaddedTokens) {
  const std::int64_t B = 2, Lq = 5, Lk = 40, dm = 32, heads = 4;
  const std::vector<float> wq = random_floats(dm * dm, 71, -0.3f, 0.3f),
                           wk = random_floats(dm * dm, 72, -0.3f, 0.3f),
                           wv = random_floats(dm * dm, 73, -0.3f, 0.3f),
                           wo = random_floats(dm * dm, 74, -0.3f, 0.3f);
  const auto w = [&](const std::vector<float>& x) { return f32_view(x.data(), {dm, dm}); };
  const MultiHeadAttention mha({dm, heads}, {w(wq), w(wk), w(wv), w(wo)});
  const std::vector<float> xq = random_floats(B * Lq * dm, 75);
  std::vector<float> clean = random_floats(B * Lk * dm, 76), poisoned = clean;
  const std::int64_t valid[B] = {30, 25};
  std::vector<std::uint8_t> mask(B * Lk);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < Lk; ++j) {
      mask[b * Lk + j] = j < valid[b];
      for (std::int64_t d = 0; j >= valid[b] && d < dm; ++d) {
        clean[(b * Lk + j) * dm + d] = 0.0f;
        poisoned[(b * Lk + j) * dm + d] = d % 3 == 0   ? std::numeric_limits<float>::infinity()
                                          : d % 3 == 1 ? std::numeric_limits<float>::quiet_NaN()
                                                       : -1e30f;
      }
    }
  AttentionOptions o;
  o.mask = TensorView::contiguous(mask.data(), DType::boolean, {B, 1, 1, Lk});
  for (int threads : {1, 2}) {
    Context ctx(threads);
    GetParam().apply(ctx);
    std::vector<float> want(B * Lq * dm, 7.0f), got(want.size(), 7.0f);
    mha.forward_cross(f32_view(xq.data(), {B, Lq, dm}), f32_view(clean.data(), {B, Lk, dm}),
                      f32_view(want.data(), {B, Lq, dm}), o, &ctx);
    mha.forward_cross(f32_view(xq.data(), {B, Lq, dm}), f32_view(poisoned.data(), {B, Lk, dm}),
                      f32_view(got.data(), {B, Lq, dm}), o, &ctx);
    const double atol = 8 * std::numeric_limits<float>::epsilon() * std::sqrt(double(Lk * dm));
    EXPECT_TRUE(all_close(got.data(), want.data(), got.size(), atol)) << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ExcludedKeys, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace cpuattn::test
