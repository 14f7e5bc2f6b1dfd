// Every argument check of the public entry points: the error names the argument and the shapes,
// and the output is left untouched.
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "test_util.h"

namespace cpuattn::test {
namespace {

constexpr float kSentinel = 12345.0f;

struct Args {
  std::vector<float> q, k, v, out, lse, w;
  TensorView qv, kv, vv;
  OutputView ov;
  AttentionOptions opts;
  Args()
      : q(2 * 4 * 3 * 8, 0.5f),
        k(2 * 2 * 5 * 8, 0.25f),
        v(2 * 2 * 5 * 6, 1.0f),
        out(2 * 4 * 3 * 6, kSentinel),
        lse(2 * 4 * 3, kSentinel),
        w(2 * 4 * 3 * 5, kSentinel) {
    qv = f32_view(q.data(), {2, 4, 3, 8});
    kv = f32_view(k.data(), {2, 2, 5, 8});
    vv = f32_view(v.data(), {2, 2, 5, 6});
    ov = f32_view(out.data(), {2, 4, 3, 6});
  }
};

// Runs both entry points on `a` after `mutate`, expects an Error whose message contains every
// string in `needles`, and checks that no output was written.
void expect_error(const std::function<void(Args&)>& mutate, std::vector<std::string> needles) {
  for (bool reference : {false, true}) {
    Args a;
    a.opts.lse = f32_view(a.lse.data(), {2, 4, 3});
    mutate(a);
    try {
      if (reference) {
        reference_attention(a.qv, a.kv, a.vv, a.ov, a.opts);
      } else {
        attention(a.qv, a.kv, a.vv, a.ov, a.opts);
      }
      ADD_FAILURE() << "no error; expected one mentioning " << needles[0];
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("cpuattn: ", 0), 0u) << msg;
      for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    }
    for (float x : a.out) ASSERT_EQ(x, kSentinel) << "out was written";
    for (float x : a.lse) ASSERT_EQ(x, kSentinel) << "lse was written";
  }
}

TEST(Validate, ValidArgumentsPass) {
  Args a;
  EXPECT_NO_THROW(attention(a.qv, a.kv, a.vv, a.ov));
  EXPECT_NE(a.out[0], kSentinel);
}

TEST(Validate, NullPointers) {
  expect_error([](Args& a) { a.qv.data = nullptr; }, {"Q [2,4,3,8]", "null"});
  expect_error([](Args& a) { a.ov.data = nullptr; }, {"out", "null"});
}

TEST(Validate, DTypeAndRank) {
  expect_error([](Args& a) { a.kv.dtype = DType::i32; }, {"K [2,2,5,8]", "int32", "float32"});
  expect_error([](Args& a) { a.qv.dtype = DType::i8; }, {"Q [2,4,3,8]", "int8", "bfloat16"});
  expect_error([](Args& a) { a.qv.rank = 3; }, {"Q must have rank 4", "rank 3"});
}

TEST(Validate, ShapeAgreement) {
  expect_error(
      [](Args& a) {
        a.kv = f32_view(a.k.data(), {2, 2, 5, 4});
      },
      {"K has D=4 but Q has D=8", "Q [2,4,3,8], K [2,2,5,4]"});
  expect_error(
      [](Args& a) {
        a.vv = f32_view(a.v.data(), {2, 2, 4, 6});
      },
      {"V has Lk=4 but K has Lk=5"});
  expect_error([](Args& a) { a.kv = f32_view(a.k.data(), {2, 3, 5, 4}); }, {"K"});
  expect_error(
      [](Args& a) {
        a.kv = f32_view(a.k.data(), {2, 3, 5, 8});
        a.vv = f32_view(a.v.data(), {2, 3, 5, 4});
      },
      {"H=4", "not a multiple of the 3 K/V heads"});
  expect_error(
      [](Args& a) {
        a.ov = f32_view(a.out.data(), {2, 4, 3, 5});
      },
      {"out must have shape [B,H,Lq,Dv] = [2,4,3,6]"});
  expect_error(
      [](Args& a) {
        a.kv = f32_view(a.k.data(), {1, 2, 5, 8});
      },
      {"K has B=1 but Q has B=2"});
  expect_error([](Args& a) { a.qv.shape[2] = 0; }, {"Q", "size 0"});
}

TEST(Validate, Strides) {
  expect_error([](Args& a) { a.qv.strides[3] = 2; },
               {"Q [2,4,3,8]", "last dimension must be contiguous"});
  expect_error([](Args& a) { a.kv.strides[2] = -8; }, {"K", "negative"});
  expect_error([](Args& a) { a.ov.strides[2] = 0; }, {"out", "overlap"});
  expect_error([](Args& a) { a.ov.data = a.q.data(); }, {"out overlaps Q"});
  expect_error(
      [](Args& a) {
        a.opts.lse = OutputView::contiguous(a.out.data(), DType::f32, {2, 4, 3});
      },
      {"lse overlaps out"});
}

TEST(Validate, SizeOverflow) {
  expect_error([](Args& a) { a.kv.strides[0] = std::numeric_limits<std::int64_t>::max() / 2; },
               {"K", "overflow"});
}

TEST(Validate, Scale) {
  expect_error([](Args& a) { a.opts.scale = 0.0; }, {"scale must be in", "got 0"});
  expect_error([](Args& a) { a.opts.scale = -1.0; }, {"scale"});
  expect_error([](Args& a) { a.opts.scale = std::numeric_limits<double>::infinity(); }, {"scale"});
  expect_error([](Args& a) { a.opts.scale = std::numeric_limits<double>::quiet_NaN(); }, {"scale"});
  // Finite doubles that float32 cannot carry: 1e39 became inf in the fast path (an all-NaN
  // output, exit 0 from the CLI) while the reference gave finite numbers; 1e-39 is a denormal.
  expect_error([](Args& a) { a.opts.scale = 1e39; }, {"scale must be in", "got 1e+39"});
  expect_error([](Args& a) { a.opts.scale = kMaxScale * 1.0001; }, {"scale must be in"});
  expect_error([](Args& a) { a.opts.scale = 1e-39; }, {"scale must be in"});
}

// The edges of the accepted range give finite results that agree with the reference.
TEST(Validate, ScaleRangeEdgesAreFinite) {
  for (double scale : {kMinScale, kMaxScale}) {
    Args a;
    // Scores of order 1e-38 .. 1e38 stay finite: q.k is small for the largest scale.
    std::fill(a.k.begin(), a.k.end(), 1e-3f);
    std::fill(a.q.begin(), a.q.end(), 1e-3f);
    std::vector<float> want(a.out.size());
    a.opts.scale = scale;
    attention(a.qv, a.kv, a.vv, a.ov, a.opts);
    reference_attention(a.qv, a.kv, a.vv, f32_view(want.data(), {2, 4, 3, 6}), a.opts);
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(a.out[i])) << "scale " << scale << " element " << i;
      EXPECT_NEAR(a.out[i], want[i], 1e-5) << "scale " << scale << " element " << i;
    }
  }
}

TEST(Validate, Masks) {
  static std::vector<float> m(64, 0.0f);
  static std::vector<std::int32_t> lens = {5, 6};
  static std::vector<float> flens = {5, 5};
  expect_error(
      [](Args& a) {
        a.opts.mask = f32_view(m.data(), {3, 4});
      },
      {"mask [3,4] does not broadcast", "[2,4,3,5]"});
  expect_error(
      [](Args& a) {
        a.opts.mask = TensorView::contiguous(m.data(), DType::i32, {3, 5});
      },
      {"mask", "int32"});
  expect_error(
      [](Args& a) { a.opts.key_lengths = TensorView::contiguous(lens.data(), DType::i32, {2}); },
      {"key_lengths[1] = 6", "Lk=5"});
  expect_error(
      [](Args& a) { a.opts.key_lengths = TensorView::contiguous(lens.data(), DType::i32, {1}); },
      {"key_lengths has shape [1]", "B=2"});
  expect_error([](Args& a) { a.opts.key_lengths = f32_view(flens.data(), {2}); },
               {"key_lengths", "float32"});
}

TEST(Validate, OptionalOutputs) {
  expect_error(
      [](Args& a) {
        a.opts.lse = f32_view(a.lse.data(), {2, 4, 2});
      },
      {"lse has shape [2,4,2]", "[2,4,3]"});
  expect_error(
      [](Args& a) {
        a.opts.weights = f32_view(a.w.data(), {2, 4, 3, 4});
      },
      {"weights has shape", "[2,4,3,5]"});
}

TEST(Validate, EnumValuesOutsideTheEnum) {
  // Found by fuzz_validate: an out-of-range Causal was taken as none, and an out-of-range Target
  // indexed the dispatch table out of bounds.
  expect_error([](Args& a) { a.opts.causal = static_cast<Causal>(7); }, {"causal must be"});
  Context c(1);
  EXPECT_THROW(c.set_max_target(static_cast<Target>(9)), Error);
  EXPECT_EQ(c.max_target(), Target::best);
}

TEST(Validate, LargestOffsetExactlyInt64Max) {
  // Found by fuzz_validate: extent_of computed last + 1 without a check (signed overflow).
  expect_error(
      [](Args& a) {
        // K [2,2,5,8] with strides {s0, 40, 8, 1}: the largest offset is s0 + 40 + 32 + 7.
        a.kv.strides[0] = std::numeric_limits<std::int64_t>::max() - 79;
      },
      {"K", "overflow"});
}

TEST(Validate, ContextAndTargets) {
  EXPECT_THROW(Context(-1), Error);
  EXPECT_THROW(parse_target("avx1024"), Error);
  EXPECT_EQ(parse_target("avx2"), Target::avx2);
  EXPECT_EQ(parse_target("neon"), Target::neon);
  EXPECT_EQ(parse_target("sve"), Target::sve);
  EXPECT_STREQ(target_name(Target::sve), "sve");
  // A cap names a target of the library's architecture; a refused cap changes nothing.
  Context c;
  c.set_max_target(Target::scalar);
#if defined(__x86_64__)
  expect_error_mentioning([&] { c.set_max_target(Target::neon); }, "'neon'");
  expect_error_mentioning([&] { c.set_max_target(Target::sve); }, "'sve'");
#elif defined(__aarch64__)
  expect_error_mentioning([&] { c.set_max_target(Target::avx2); }, "'avx2'");
#endif
  EXPECT_EQ(c.max_target(), Target::scalar);
}

// The target dispatch picks on this CPU is the one CPUATTN_EXPECT_TARGET names (set by
// tools/check aarch64 per emulated CPU model); the best one supported_targets() lists.
TEST(Dispatch, PicksTheExpectedTarget) {
  const char* expected = std::getenv("CPUATTN_EXPECT_TARGET");
  if (expected == nullptr) GTEST_SKIP() << "CPUATTN_EXPECT_TARGET is not set";
  EXPECT_STREQ(target_name(active_target()), expected);
  const std::string all = supported_targets();
  EXPECT_EQ(all.substr(0, all.find(',')), expected) << all;
}

}  // namespace
}  // namespace cpuattn::test

namespace cpuattn::test {
namespace {

TEST(Simd, ProviderSelectionAndFallback) {
  EXPECT_EQ(parse_simd("xsimd"), Simd::xsimd);
  EXPECT_EQ(parse_simd("highway"), Simd::highway);
  try {
    parse_simd("neon");
    ADD_FAILURE() << "parse_simd accepted 'neon'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'neon'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("highway or xsimd"), std::string::npos) << e.what();
  }
  Context c(1);
  EXPECT_EQ(c.simd(), Simd::highway);
  EXPECT_THROW(c.set_simd(static_cast<Simd>(7)), Error);
  EXPECT_EQ(c.simd(), Simd::highway) << "a refused provider must not change the context";
  c.set_simd(Simd::xsimd);
  EXPECT_EQ(c.simd(), Simd::xsimd);
  // xsimd has no portable unit: a scalar cap runs Highway's, and says so. On aarch64 NEON is the
  // baseline, so that cap runs neon, and xsimd has no units there at all: every call runs
  // Highway's (docs/architecture.md#arm).
#if defined(__aarch64__)
  constexpr Target kScalarCapRuns = Target::neon;
  constexpr Simd kSimdRuns = Simd::highway;
#else
  constexpr Target kScalarCapRuns = Target::scalar;
  constexpr Simd kSimdRuns = Simd::xsimd;
#endif
  c.set_max_target(Target::scalar);
  EXPECT_EQ(active_simd(&c), Simd::highway);
  EXPECT_EQ(active_target(&c), kScalarCapRuns);
  for (Target t : machine_targets()) {
    if (t == Target::scalar) continue;
    c.set_max_target(t);
    EXPECT_EQ(active_simd(&c), kSimdRuns) << target_name(t);
    EXPECT_EQ(active_target(&c), t);
  }
}

}  // namespace
}  // namespace cpuattn::test
