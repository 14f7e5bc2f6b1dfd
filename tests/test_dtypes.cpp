// Reduced precision: the conversions against the CPU's own instructions, int8 quantization, and
// the fast path with bf16/f16 Q/K/V/out and int8 K/V against the reference run on the same rounded
// values, on every target this machine has, on the native bf16 kernel where the CPU has
// AVX512-BF16, and on the portable bf16 path forced by a cap.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every f16 bit pattern widens exactly and narrows back to itself (NaNs stay NaN).
TEST(Conversions, F16RoundTripsEveryPattern) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = from_f16(static_cast<std::uint16_t>(h));
    const std::uint16_t back = to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(from_f16(back))) << h;
      EXPECT_EQ((h & 0x7c00u), 0x7c00u) << h;
    } else {
      EXPECT_EQ(back, h) << "pattern " << h << " value " << f;
    }
  }
}

TEST(Conversions, Bf16RoundTripsEveryPattern) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = from_bf16(static_cast<std::uint16_t>(h));
    EXPECT_EQ(std::memcmp(&f, &(const std::uint32_t&)(h << 16), 4), 0);
    if (!std::isnan(f)) {
      EXPECT_EQ(to_bf16(f), h) << h;
    } else {
      EXPECT_TRUE(std::isnan(from_bf16(to_bf16(f)))) << h;
    }
  }
}

// Ties round to even; overflow goes to inf (f16) or stays finite below the bf16 rounding
// boundary.
TEST(Conversions, TiesAndOverflow) {
  EXPECT_EQ(to_bf16(bits_float(0x3f808000u)), 0x3f80u);  // tie, even below
  EXPECT_EQ(to_bf16(bits_float(0x3f818000u)), 0x3f82u);  // tie, even above
  EXPECT_EQ(to_bf16(bits_float(0x3f808001u)), 0x3f81u);  // past the tie
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(to_f16(65504.0f), 0x7bffu);
  EXPECT_EQ(to_f16(65519.0f), 0x7bffu);
  EXPECT_EQ(to_f16(65520.0f), 0x7c00u);
  EXPECT_EQ(to_f16(-1e9f), 0xfc00u);
  EXPECT_EQ(to_f16(5.9604645e-08f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(to_f16(2.9802322e-08f), 0x0000u);  // half of it: tie to even (0)
  EXPECT_EQ(to_f16(4.4703484e-08f), 0x0001u);  // 0.75 of it
}

__attribute__((target("f16c"))) std::uint16_t hw_f16(float x) {
  return static_cast<std::uint16_t>(
      _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT), 0));
}

// The library's f32 -> f16 gives the bits of vcvtps2ph on random and edge values.
TEST(Conversions, F16MatchesF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C";
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(to_f16(f), hw_f16(f)) << "x = " << f;
  }
}

__attribute__((target("avx512f,avx512bf16,avx512vl"))) std::uint16_t hw_bf16(float x) {
  const __m128bh h = _mm_cvtneps_pbh(_mm_set1_ps(x));
  std::uint16_t out[8];
  std::memcpy(out, &h, sizeof out);
  return out[0];
}

// And f32 -> bf16 the bits of vcvtneps2bf16 (which flushes subnormal inputs to zero: those are
// skipped, the library keeps them).
TEST(Conversions, Bf16MatchesAvx512Bf16) {
  if (std::string(active_bf16_path()) != "avx512_bf16") GTEST_SKIP() << "no AVX512-BF16";
  std::mt19937 rng(8);
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f) || std::fpclassify(f) == FP_SUBNORMAL) continue;
    ASSERT_EQ(to_bf16(f), hw_bf16(f)) << "x = " << f;
  }
}

TEST(Quantize, SymmetricPerRow) {
  const std::vector<float> x = {0.5f, -1.27f, 0.0f, 1.0f, -0.005f};
  std::vector<std::int8_t> q(x.size());
  const float s = quantize_int8(x.data(), 5, q.data());
  EXPECT_FLOAT_EQ(s, 1.27f / 127.0f);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[0], 50);
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[4], 0);  // -0.5 rounds to even
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_LE(std::abs(q[i] * s - x[i]), s / 2 * (1 + 1e-6)) << i;
  const std::vector<float> zeros(4, 0.0f);
  EXPECT_EQ(quantize_int8(zeros.data(), 4, q.data()), 0.0f);
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::infinity()};
  q.assign(2, 9);
  expect_error_mentioning([&] { quantize_int8(bad.data(), 2, q.data()); }, "element 1");
  EXPECT_EQ(q[0], 9);  // nothing written
}

// Backends for the dtype grid: every (provider, target) of the machine, plus the native bf16
// kernel where the CPU has it (the avx512 entries then run the portable bf16 path: the cap).
std::vector<Backend> dtype_backends() {
  std::vector<Backend> bs = machine_backends();
  Context c;
  c.set_max_target(Target::avx512_bf16);
  if (active_target(&c) == Target::avx512_bf16) {
    bs.insert(bs.begin(), Backend{Simd::highway, Target::avx512_bf16});
    bs.insert(bs.begin() + 1, Backend{Simd::xsimd, Target::avx512_bf16});
  }
  return bs;
}

struct Dtypes {
  DType q, kv, out;
};

class DtypeGrid : public ::testing::TestWithParam<Backend> {};

const Dtypes kCombos[] = {
    {DType::bf16, DType::bf16, DType::f32}, {DType::bf16, DType::bf16, DType::bf16},
    {DType::f16, DType::f16, DType::f32},   {DType::f16, DType::f16, DType::f16},
    {DType::f32, DType::bf16, DType::f32},  {DType::f32, DType::f16, DType::f32},
    {DType::f32, DType::i8, DType::f32},    {DType::bf16, DType::i8, DType::bf16},
    {DType::bf16, DType::f32, DType::f32},
};

// Odd and tail sizes, both layouts, misaligned bases, every mask kind, GQA ratios, decode.
TEST_P(DtypeGrid, SizesMasksLayouts) {
  const MaskCase masks[] = {MaskCase::none,          MaskCase::causal_tl,    MaskCase::causal_br,
                            MaskCase::bool_full,     MaskCase::bool_2d,      MaskCase::bool_keys,
                            MaskCase::additive_full, MaskCase::additive_inf, MaskCase::key_lengths,
                            MaskCase::combo};
  int n = 0;
  for (const Dtypes& dt : kCombos) {
    std::vector<Case> cases;
    Case c;
    c.q_dtype = dt.q;
    c.kv_dtype = dt.kv;
    c.out_dtype = dt.out;
    c.B = 1, c.H = 2, c.Hkv = 1, c.Lq = 7, c.Lk = 65, c.D = c.Dv = 17;
    cases.push_back(c);
    c.B = 2, c.H = 6, c.Hkv = 2, c.Lq = 70, c.Lk = 130, c.D = 64, c.Dv = 64, c.blhd = true;
    c.misalign = 1;
    cases.push_back(c);
    c.B = 1, c.H = 4, c.Hkv = 4, c.Lq = 33, c.Lk = 257, c.D = 128, c.Dv = 72, c.blhd = false;
    c.misalign = 3;
    cases.push_back(c);
    c.B = 3, c.H = 8, c.Hkv = 2, c.Lq = 1, c.Lk = 1100, c.D = 64, c.Dv = 64;  // decode + splits
    c.misalign = 0;
    cases.push_back(c);
    c.B = 1, c.H = 3, c.Hkv = 1, c.Lq = 2, c.Lk = 9, c.D = 2, c.Dv = 3;
    cases.push_back(c);
    for (Case& k : cases) {
      k.mask = masks[n++ % std::size(masks)];
      check_case(k, GetParam());
    }
  }
}

TEST_P(DtypeGrid, SpecialValues) {
  for (const Dtypes& dt : kCombos) {
    Case c;
    c.q_dtype = dt.q;
    c.kv_dtype = dt.kv;
    c.out_dtype = dt.out;
    c.B = 1, c.H = 4, c.Hkv = 2, c.Lq = 9, c.Lk = 140, c.D = 33, c.Dv = 20;
    c.specials = true;
    check_case(c, GetParam());
    c.Lq = 1;  // the streaming decode path
    check_case(c, GetParam());
  }
}

// Long key ranges: the tolerance grows with Lk; scores that grow along the keys make the running
// max move in every block.
TEST_P(DtypeGrid, LongKeysAndMovingMax) {
  for (const Dtypes& dt : {kCombos[0], kCombos[2], kCombos[6]}) {
    Case c;
    c.q_dtype = dt.q;
    c.kv_dtype = dt.kv;
    c.out_dtype = dt.out;
    c.B = 1, c.H = 4, c.Hkv = 2, c.D = c.Dv = 64;
    c.scale = 2.0;
    c.key_ramp = 1;
    for (auto [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{70, 3000}, {1, 5000}}) {
      c.Lq = Lq;
      c.Lk = Lk;
      check_case(c, GetParam());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DtypeGrid, ::testing::ValuesIn(dtype_backends()),
                         [](const auto& info) { return info.param.name(); });

// The cap decides the bf16 path; active_bf16_path() says which runs.
TEST(Bf16Path, CapSelectsThePath) {
  Context c;
  c.set_max_target(Target::avx512);
  EXPECT_STREQ(active_bf16_path(&c), "f32");
  c.set_max_target(Target::avx2);
  EXPECT_STREQ(active_bf16_path(&c), "f32");
  c.set_max_target(Target::best);
  const bool native = std::string(active_bf16_path(&c)) == "avx512_bf16";
  EXPECT_EQ(native, active_target(&c) == Target::avx512_bf16);
}

}  // namespace
}  // namespace cpuattn::test
