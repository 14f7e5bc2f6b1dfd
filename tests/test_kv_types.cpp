// Every K/V element type of cpuattn.h's list (CPUATTN_DTYPES), read from the list itself: a type
// added to it is tested here without a line of this file changing. For each: the list's facts
// (sizes, names, roles), KvCache and PagedKvCache storing it (a scaled type with per-token,
// per-head and per-tensor scales), and the fast path on those caches against the double-precision
// reference on the same stored values, on every backend this CPU runs, over decoding, several rows
// per K/V head, split keys, odd head dimensions and a causal prefill.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cpuattn/layers.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

std::vector<DType> kv_dtypes() {
  std::vector<DType> ts;
  for (int i = 0; i < kNumDTypes; ++i)
    if (is_kv_dtype(static_cast<DType>(i))) ts.push_back(static_cast<DType>(i));
  return ts;
}

TEST(KvTypes, TheListIsConsistent) {
  std::set<std::string> names;
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    SCOPED_TRACE(dtype_name(d));
    EXPECT_GT(dtype_size(d), 0u);
    EXPECT_TRUE(names.insert(dtype_name(d)).second) << "a long name twice";
    DType back;
    ASSERT_TRUE(parse_dtype(dtype_name(d), back));
    EXPECT_EQ(back, d);
    ASSERT_TRUE(parse_dtype(dtype_short_name(d), back));
    EXPECT_EQ(back, d);
    // Scaled types are K/V types; Q and out take the tensor role only.
    if (needs_scales(d)) {
      EXPECT_TRUE(is_kv_dtype(d));
    }
  }
  DType d;
  EXPECT_FALSE(parse_dtype("float7", d));
  EXPECT_EQ(std::string(dtype_name(static_cast<DType>(kNumDTypes))), "unknown");
  expect_error_mentioning([] { KvCache(1, 1, 4, 4, 4, false, DType::i64); }, "not a cache dtype");
  expect_error_mentioning([] { PagedKvCache(4, 2, 1, 4, 4, DType::boolean); }, "not a cache dtype");
}

// How a case's cache keeps its scales.
enum class Scales { none, per_token, per_head, per_tensor };
const char* name_of(Scales s) {
  return s == Scales::none        ? "none"
         : s == Scales::per_token ? "per_token"
         : s == Scales::per_head  ? "per_head"
                                  : "per_tensor";
}

// The KvScales of a mode: static scales chosen so that the largest |x| of the random data (1)
// lands near the top of the type's range, and differ per head.
KvScales scales_of(Scales s, std::int64_t kv_heads) {
  if (s == Scales::per_head) {
    KvScales k;
    for (std::int64_t h = 0; h < kv_heads; ++h) {
      k.k.push_back(0.01f * static_cast<float>(h + 1));
      k.v.push_back(0.02f / static_cast<float>(h + 1));
    }
    return k;
  }
  if (s == Scales::per_tensor) return {{0.0125f}, {0.02f}};
  return {};
}

struct Param {
  DType dtype;
  Scales scales;
  Backend backend;
};
void PrintTo(const Param& p, std::ostream* os) {
  *os << dtype_short_name(p.dtype) << "_" << name_of(p.scales) << "_" << p.backend.name();
}

std::vector<Param> grid() {
  std::vector<Param> ps;
  for (DType d : kv_dtypes())
    for (Scales s : needs_scales(d) ? std::vector<Scales>{Scales::per_token, Scales::per_head,
                                                          Scales::per_tensor}
                                    : std::vector<Scales>{Scales::none})
      for (const Backend& be : machine_backends()) ps.push_back({d, s, be});
  return ps;
}

class KvTypeGrid : public ::testing::TestWithParam<Param> {};

// The fast path's error against the reference on the same stored values (V within [-vmax, vmax]):
// the rounding of D-long dot products and of the Lk-long weighted sum, both growing like the
// square root of their length (as tests/attention_cases.h's model), plus the native units'
// rounding of P where the call may take them (docs/precision.md).
double tolerance(DType dtype, std::int64_t D, std::int64_t Lk, double vmax, bool native) {
  const double eps = std::numeric_limits<float>::epsilon();
  const double score_mag = std::sqrt(double(D)) * 3.0 + 3.0;
  double p_round = 0;
  if (native && dtype == DType::bf16) p_round = std::ldexp(1.0, -8) + std::ldexp(1.0, -15) * 3.0;
  if (native && dtype == DType::i8) p_round = std::ldexp(1.0, -9);
  return (8 * eps * (std::sqrt(double(Lk)) + std::sqrt(double(D)) * score_mag) + 1e-6 + p_round) *
         vmax;
}

// Attention of random Q to a cache of the case's dtype holding random K/V: fast path against the
// reference on the cache's views; the worst element is named on failure.
void check_cache_case(const Param& prm, std::int64_t B, std::int64_t H, std::int64_t Hkv,
                      std::int64_t Lq, std::int64_t Lk, std::int64_t D, std::int64_t Dv,
                      Causal causal) {
  std::ostringstream shape;
  shape << "B" << B << " H" << H << " Hkv" << Hkv << " Lq" << Lq << " Lk" << Lk << " D" << D
        << " Dv" << Dv;
  SCOPED_TRACE(shape.str());
  Context ctx(2);
  prm.backend.apply(ctx);
  KvCache cache(B, Hkv, D, Dv, Lk, false, prm.dtype, scales_of(prm.scales, Hkv));
  const auto k = random_floats(B * Hkv * Lk * D, 11), v = random_floats(B * Hkv * Lk * Dv, 12);
  cache.append(f32_view(k.data(), {B, Hkv, Lk, D}), f32_view(v.data(), {B, Hkv, Lk, Dv}));
  const auto q = random_floats(B * H * Lq * D, 13);
  AttentionOptions o;
  o.causal = causal;
  o.k_scales = cache.key_scales();
  o.v_scales = cache.value_scales();
  ASSERT_EQ(o.k_scales.has_value(), needs_scales(prm.dtype));
  if (prm.scales == Scales::per_head || prm.scales == Scales::per_tensor) {
    ASSERT_EQ(o.k_scales->rank, 1);
  }
  std::vector<float> got(B * H * Lq * Dv), want(got.size());
  attention(f32_view(q.data(), {B, H, Lq, D}), cache.keys(), cache.values(),
            f32_view(got.data(), {B, H, Lq, Dv}), o, &ctx);
  reference_attention(f32_view(q.data(), {B, H, Lq, D}), cache.keys(), cache.values(),
                      f32_view(want.data(), {B, H, Lq, Dv}), o);
  // The largest |v| the cache holds (static scales saturate; per-token ones keep 1).
  double vmax = 0;
  for (float x : v) vmax = std::max(vmax, double(std::abs(x)));
  const bool native = native_products(&ctx, prm.dtype);
  const double tol = tolerance(prm.dtype, D, Lk, std::max(vmax, 1e-30), native);
  std::size_t worst = 0;
  double worst_err = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(double(got[i]) - want[i]);
    if (!(e <= worst_err)) worst_err = e, worst = i;
  }
  EXPECT_LE(worst_err, tol) << "worst element " << worst << ": got " << got[worst] << ", want "
                            << want[worst];
}

TEST_P(KvTypeGrid, CacheAgainstTheReference) {
  const Param& p = GetParam();
  check_cache_case(p, 2, 8, 2, 1, 700, 64, 64, Causal::bottom_right);     // GQA decode, split keys
  check_cache_case(p, 1, 4, 2, 3, 300, 64, 64, Causal::bottom_right);     // 6 rows per K/V head
  check_cache_case(p, 2, 4, 4, 1, 1300, 128, 128, Causal::bottom_right);  // MHA decode
  check_cache_case(p, 1, 3, 1, 1, 333, 37, 21, Causal::none);             // odd sizes
  check_cache_case(p, 1, 2, 2, 70, 70, 40, 24, Causal::top_left);         // prefill, tiled
}

// The same through PagedKvCache: shuffled pages shared by a forked sequence, read in place.
TEST_P(KvTypeGrid, PagedCacheAgainstTheReference) {
  const Param& p = GetParam();
  const std::int64_t Hkv = 2, H = 8, D = 64, P = 16;
  Context ctx(2);
  p.backend.apply(ctx);
  PagedKvCache cache(96, P, Hkv, D, D, p.dtype, scales_of(p.scales, Hkv));
  const std::int64_t a = cache.add_sequence();
  const auto k = random_floats(Hkv * 300 * D, 21), v = random_floats(Hkv * 300 * D, 22);
  cache.append(a, f32_view(k.data(), {Hkv, 300, D}), f32_view(v.data(), {Hkv, 300, D}));
  const std::int64_t b = cache.fork(a, 200);
  cache.append(b, f32_view(k.data(), {Hkv, 37, D}), f32_view(v.data(), {Hkv, 37, D}));
  for (std::int64_t lq : {1, 3}) {
    const auto q = random_floats(2 * H * lq * D, 23);
    AttentionOptions o;
    o.causal = Causal::bottom_right;
    const PagedKv kv = cache.batch({a, b});
    ASSERT_EQ(kv.k_scales.has_value(), needs_scales(p.dtype));
    std::vector<float> got(2 * H * lq * D), want(got.size());
    attention(f32_view(q.data(), {2, H, lq, D}), kv, f32_view(got.data(), {2, H, lq, D}), o, &ctx);
    reference_attention(f32_view(q.data(), {2, H, lq, D}), kv, f32_view(want.data(), {2, H, lq, D}),
                        o);
    const bool native = native_products(&ctx, p.dtype);
    const double tol = tolerance(p.dtype, D, 300, 1.0, native);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::abs(double(got[i]) - want[i]), tol)
          << "Lq " << lq << " element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

// Static scales: the stored value is x / scale saturated to the type's range, so a cache with
// scales 2x larger holds the same data at half the resolution; both read back within their
// resolution of the data, and scales are validated.
TEST(KvTypes, StaticScalesAreCheckedAndApplied) {
  for (DType d : kv_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    if (!needs_scales(d)) {
      expect_error_mentioning(
          [&] {
            KvCache(1, 2, 4, 4, 4, false, d, {{1.0f}, {1.0f}});
          },
          "scales are for scaled dtypes");
      continue;
    }
    expect_error_mentioning(
        [&] {
          KvCache(1, 2, 4, 4, 4, false, d, {{1.0f, 2.0f, 3.0f}, {1.0f}});
        },
        "expected 1 (per tensor) or kv_heads = 2");
    expect_error_mentioning(
        [&] {
          KvCache(1, 2, 4, 4, 4, false, d, {{0.0f}, {1.0f}});
        },
        "must be finite and > 0");
    expect_error_mentioning(
        [&] {
          KvCache(1, 2, 4, 4, 4, false, d, {{1.0f}, {}});
        },
        "both be given");
    expect_error_mentioning(
        [&] {
          PagedKvCache(4, 2, 2, 4, 4, d, {{1.0f}, {std::nanf("")}});
        },
        "finite and > 0");
    KvCache c(1, 2, 4, 4, 4, false, d, {{0.5f, 0.25f}, {1.0f}});
    const std::vector<float> x = {0.1f, -0.2f, 0.3f, -0.4f, 1.0f, 2.0f, -3.0f, 0.0f};
    c.append(f32_view(x.data(), {1, 2, 1, 4}), f32_view(x.data(), {1, 2, 1, 4}));
    const auto ks = c.key_scales();
    ASSERT_TRUE(ks.has_value());
    ASSERT_EQ(ks->rank, 1);
    EXPECT_EQ(static_cast<const float*>(ks->data)[0], 0.5f);
    EXPECT_EQ(static_cast<const float*>(ks->data)[1], 0.25f);
    const auto vs = c.value_scales();
    EXPECT_EQ(static_cast<const float*>(vs->data)[1], 1.0f);  // one scale for every head
    // A non-finite value cannot be stored with a scale (and nothing is).
    std::vector<float> bad = x;
    bad[5] = std::numeric_limits<float>::infinity();
    expect_error_mentioning(
        [&] {
          c.append(f32_view(bad.data(), {1, 2, 1, 4}), f32_view(x.data(), {1, 2, 1, 4}));
        },
        "cache cannot hold");
    EXPECT_EQ(c.length(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(All, KvTypeGrid, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           std::ostringstream s;
                           PrintTo(i.param, &s);
                           return s.str();
                         });

}  // namespace
}  // namespace cpuattn::test
