// Reduced precision: the conversions against the CPU's own instructions, int8 quantization, and
// the fast path with bf16/f16 Q/K/V/out and int8 K/V against the reference run on the same rounded
// values, on every target this machine has, on the native bf16 kernel where the CPU has
// AVX512-BF16, and on the portable bf16 path forced by a cap.
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_cases.h"
#include "cpuattn/layers.h"
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

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t hw_f16(float x) {
  return static_cast<std::uint16_t>(
      _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT), 0));
}

// The library's f32 -> f16 gives the bits of vcvtps2ph on random and edge values.
TEST(Conversions, F16MatchesF16c) {
  // CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports has no "f16c").
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 29)) == 0)
    GTEST_SKIP() << "this CPU has no F16C";
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
  if (!machine_runs(Target::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16";
  std::mt19937 rng(8);
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f) || std::fpclassify(f) == FP_SUBNORMAL) continue;
    ASSERT_EQ(to_bf16(f), hw_bf16(f)) << "x = " << f;
  }
}

#elif defined(__aarch64__)

// The library's f32 -> f16 gives the bits of FCVT (every ARMv8-A core; round to nearest even).
TEST(Conversions, F16MatchesFcvt) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float f = bits_float(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const __fp16 h = static_cast<__fp16>(f);
    std::uint16_t bits;
    std::memcpy(&bits, &h, sizeof bits);
    ASSERT_EQ(to_f16(f), bits) << "x = " << f;
  }
}

#endif

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
      k.mask = masks[n % std::size(masks)];
      // Thinned: every 3rd, which still takes every mask and every case of the five.
      if (grid_case_runs(n++, 3)) check_case(k, GetParam());
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
      c.Lq = thin_grids() ? std::min<std::int64_t>(Lq, 7) : Lq;  // the long keys stay
      c.Lk = Lk;
      check_case(c, GetParam());
    }
  }
}

// Several clean key blocks per query block: on AVX512-BF16 the native tiles take a block after
// each row's first in one pass against the row's max so far (Bf16Tile::ProbBlock), and fall back
// to the two passes where a score is more than 8 above it (the growing keys with scale 1 do so in
// some blocks and not in others), where a mask or window covers part of the block, in the tail
// block, and for NaN or +inf scores.
TEST_P(DtypeGrid, LazySoftmaxAcrossBlocks) {
  int n = 0;
  for (const Dtypes& dt : {kCombos[0], kCombos[1], kCombos[2]}) {
    Case c;
    c.q_dtype = dt.q;
    c.kv_dtype = dt.kv;
    c.out_dtype = dt.out;
    c.B = 1, c.H = 4, c.Hkv = 2, c.Lq = 70, c.Lk = 320, c.D = c.Dv = 64;
    for (MaskCase mask : {MaskCase::none, MaskCase::causal_br, MaskCase::key_lengths}) {
      c.mask = mask;
      c.misalign = n++ % 2;
      check_case(c, GetParam());
    }
    c.mask = MaskCase::none;
    c.Lk = 1000, c.scale = 1.0, c.key_ramp = 1;
    check_case(c, GetParam());
    c.key_ramp = 0, c.scale = 0, c.Lk = 700, c.D = 48, c.Dv = 80;
    c.window_left = 300, c.window_right = 0;
    check_case(c, GetParam());
    c.window_left = c.window_right = -1;
    c.Lq = 9, c.Lk = 400, c.specials = true;
    check_case(c, GetParam());
  }
}

// Decoding steps over int8 K/V with 2..8 query rows per K/V head: on AVX512-BF16 machines their
// P V runs on VNNI (NativeBf16::PvRunsI8), two keys per lane, so odd key counts pair their last
// key with a zero row; 64- and 32-column groups; every row has its own weight scale; a window
// leaves some rows of a block with no key (scale 0). Short key ranges, where one lost key would
// move the output by far more than the 2^-9 bound.
TEST_P(DtypeGrid, Int8DecodingRowsKeysAndColumns) {
  int n = 0;
  for (std::int64_t group : {2, 3, 4, 8})
    for (std::int64_t Lk : {1, 2, 3, 31, 129, 300})
      for (std::int64_t Dv : {32, 96}) {
        Case c;
        c.kv_dtype = DType::i8;
        c.B = 2, c.Hkv = 2, c.H = 2 * group, c.Lq = 1, c.Lk = Lk, c.D = 40, c.Dv = Dv;
        c.mask = n % 3 == 1 ? MaskCase::key_lengths : MaskCase::none;
        if (n % 3 == 2) c.window_left = 5, c.window_right = 0;
        c.misalign = n % 2;
        ++n;
        check_case(c, GetParam());
      }
  Case c;
  c.kv_dtype = DType::i8;
  c.B = 1, c.H = 4, c.Hkv = 2, c.Lq = 1, c.Lk = 140, c.D = 33, c.Dv = 64;
  c.specials = true;
  check_case(c, GetParam());
}

// Decoding steps over K/V of `kv` with 1..8 query rows per K/V head: the streamed dot takes up to
// 4 rows against 4 keys at a time (Dot4; 5..8 rows in two halves of 2..4; on AVX2 the keys side by
// side, all four at once for 1-2 rows and for 3 rows of every type but fp8, which hold the Q rows
// instead of the keys) with odd D (19) and tails of keys; the P V runs read V in steps of 8 KiB of
// rows and column chunks of kPvCols vectors, 4 for 1-3 rows (Dv 72: a last chunk of one vector on
// AVX2; Dv 56: of three vectors for 1-3 rows, of one beside 2-vector chunks; Dv 20: not whole
// vectors, V packed). Odd key counts, windows that leave rows with no key, both
// layouts, and split keys (Lk 1100 with one sequence).
void check_decoding_rows_keys_and_columns(DType kv, const Backend& backend) {
  int n = 0;
  for (std::int64_t group : {1, 2, 3, 4, 5, 6, 7, 8})
    for (std::int64_t Lk : {1, 3, 31, 129, 1100})
      for (std::int64_t Dv : {16, 48, 56, 72, 96, 20}) {
        Case c;
        c.kv_dtype = kv;
        c.B = Lk == 1100 ? 1 : 2, c.Hkv = 2, c.H = 2 * group, c.Lq = 1, c.Lk = Lk;
        c.D = (n / 3) % 3 == 0 ? 40 : (n / 3) % 3 == 1 ? 128 : 19;
        c.Dv = Dv;
        c.mask = n % 3 == 1 ? MaskCase::key_lengths : MaskCase::none;
        if (n % 3 == 2) c.window_left = 5, c.window_right = 0;
        c.misalign = n % 2;
        c.blhd = n % 4 == 3;
        ++n;
        if (grid_case_runs(n, 2)) check_case(c, backend);
      }
  Case c;
  c.kv_dtype = kv;
  c.B = 1, c.H = 4, c.Hkv = 2, c.Lq = 1, c.Lk = 140, c.D = 33, c.Dv = 64;
  c.specials = true;
  check_case(c, backend);
}

TEST_P(DtypeGrid, Bf16DecodingRowsKeysAndColumns) {
  check_decoding_rows_keys_and_columns(DType::bf16, GetParam());
}

TEST_P(DtypeGrid, F32DecodingRowsKeysAndColumns) {
  check_decoding_rows_keys_and_columns(DType::f32, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, DtypeGrid, ::testing::ValuesIn(native_and_machine_backends()),
                         [](const auto& info) { return info.param.name(); });

// The cap decides the bf16 path; active_bf16_path() says which runs.
TEST(Bf16Path, CapSelectsThePath) {
  Context c;
  for (Target t : machine_targets()) {
    c.set_max_target(t);
    EXPECT_STREQ(active_bf16_path(&c), "f32") << target_name(t);
  }
  c.set_max_target(Target::best);
  const bool native = std::string(active_bf16_path(&c)) == "avx512_bf16";
  if (native) {
    EXPECT_EQ(active_target(&c), Target::avx512_bf16);
  }
  if (machine_runs(Target::avx512_bf16)) {
    c.set_max_target(Target::avx512_bf16);
    EXPECT_STREQ(active_bf16_path(&c), "avx512_bf16");
  }
}

// `best` takes the native unit's bf16 products only where vdpbf16ps outpaces two FMAs: AMD's cores
// with AVX512-BF16, not Intel's (lib/dispatch/dispatch.cpp); there they run when a cap names
// avx512_bf16, and best still runs the target (its int8 decoding on VNNI, and bf16 tiles on AMX
// where the CPU has AMX-BF16: the amx_bf16 flag of /proc/cpuinfo, and a Linux that grants the
// tile state, which every kernel that lists the flag does). The vendor and the flags are read here
// from /proc/cpuinfo, not from the library's CPUID.
TEST(Bf16Path, BestTakesTheNativeUnitOnlyWhereItsProductsAreFaster) {
  if (!machine_runs(Target::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16";
  const std::string vendor = cpuinfo_field("vendor_id");
  ASSERT_FALSE(vendor.empty()) << "no vendor_id in /proc/cpuinfo";
  const bool amx = cpuinfo_has_flag("amx_bf16") && cpuinfo_has_flag("amx_tile");
  Context c;
  c.set_max_target(Target::best);
  EXPECT_EQ(active_target(&c), Target::avx512_bf16);
  EXPECT_STREQ(active_bf16_path(&c), vendor == "AuthenticAMD" ? "avx512_bf16"
                                     : amx                    ? "amx_bf16"
                                                              : "f32")
      << vendor;
}

// The native kernel's decoding steps split the scaled Q into bf16 hi + lo (x86/bf16_stream-inl.h).
// With Q values that are bf16 already and scale ln 2 (the kernel scales by scale * log2(e) = 1),
// every lo is 0 and stands in as 2^-126 with q's sign, so q * inf keys stay infinities: a key whose
// score is -inf is dropped as in f32 (hi * inf + 0 * inf would make the row NaN), and a +inf
// score makes the row NaN as the reference does.
TEST(NativeBf16Decode, ExactQKeepsInfiniteScores) {
  if (!machine_runs(Target::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16";
  Context ctx;
  ctx.set_max_target(Target::avx512_bf16);
  ASSERT_STREQ(active_bf16_path(&ctx), "avx512_bf16");
  const std::int64_t H = 4, Hkv = 1, Lk = 45, D = 64, Dv = 64;
  std::vector<float> q = random_floats(H * D, 61);
  for (float& x : q) x = from_bf16(to_bf16(x));
  q[5] = -0.5f;      // head 0: key 7's +inf at d 5 gives -inf, the key drops out
  q[D + 5] = 0.25f;  // head 1: +inf, the row is NaN
  q[2 * D + 5] = -0.125f, q[3 * D + 5] = -1.0f;
  std::vector<std::uint16_t> k(Hkv * Lk * D), v(Hkv * Lk * Dv);
  const auto kf = random_floats(k.size(), 62), vf = random_floats(v.size(), 63);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = to_bf16(kf[i]);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_bf16(vf[i]);
  k[7 * D + 5] = 0x7f80;  // +inf
  const TensorView qv = f32_view(q.data(), {1, H, 1, D});
  const TensorView kv = TensorView::contiguous(k.data(), DType::bf16, {1, Hkv, Lk, D});
  const TensorView vv = TensorView::contiguous(v.data(), DType::bf16, {1, Hkv, Lk, Dv});
  AttentionOptions o;
  o.scale = std::log(2.0);
  std::vector<float> out(H * Dv), want(H * Dv);
  attention(qv, kv, vv, f32_view(out.data(), {1, H, 1, Dv}), o, &ctx);
  reference_attention(qv, kv, vv, f32_view(want.data(), {1, H, 1, Dv}), o);
  for (std::int64_t d = 0; d < Dv; ++d) {
    ASSERT_TRUE(std::isfinite(want[d]));
    ASSERT_TRUE(std::isnan(want[Dv + d]));
    EXPECT_NEAR(out[d], want[d], 1e-2) << "head 0, d " << d;
    EXPECT_TRUE(std::isnan(out[Dv + d])) << "head 1, d " << d << ": " << out[Dv + d];
  }
  // The other heads drop the key too: finite, within the native bound (2^-8 max|v| for P; the
  // split of an exact Q adds nothing).
  EXPECT_TRUE(all_close(out.data() + 2 * Dv, want.data() + 2 * Dv, 2 * Dv, 4e-3)) << "heads 2, 3";
}

// int8 V on the native decoding loop (VNNI P V) with an infinite and a NaN per-token scale: the
// quantized weights cannot hold them, so those rows take the f32 loop and give the reference's
// infinities and NaNs column by column (a zero V element times an infinite scale is NaN, the
// others +-inf); the other rows stay within 2^-9 max|v|. On both native units.
TEST(NativeInt8Decode, NonFiniteScalesMatchF32) {
  if (vnni_targets().empty()) GTEST_SKIP() << "no AVX512-VNNI";
  const std::int64_t H = 8, Hkv = 2, Lk = 37, D = 48, Dv = 64;
  const std::vector<float> q = random_floats(H * D, 71);
  std::vector<std::int8_t> k(Hkv * Lk * D), v(Hkv * Lk * Dv);
  const auto kf = random_floats(k.size(), 72, -127, 127),
             vf = random_floats(v.size(), 73, -127, 127);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::int8_t>(kf[i]);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int8_t>(vf[i]);
  v[(0 * Lk + 11) * Dv + 3] = 0;  // 0 * inf: NaN in column 3 of K/V head 0's rows
  std::vector<float> ks = random_floats(Hkv * Lk, 74, 0.001f, 0.01f);
  std::vector<float> vs = random_floats(Hkv * Lk, 75, 0.001f, 0.01f);
  vs[0 * Lk + 11] = std::numeric_limits<float>::infinity();
  vs[1 * Lk + 30] = std::numeric_limits<float>::quiet_NaN();
  const TensorView qv = f32_view(q.data(), {1, H, 1, D});
  const TensorView kv = TensorView::contiguous(k.data(), DType::i8, {1, Hkv, Lk, D});
  const TensorView vv = TensorView::contiguous(v.data(), DType::i8, {1, Hkv, Lk, Dv});
  AttentionOptions o;
  o.k_scales = f32_view(ks.data(), {1, Hkv, Lk});
  o.v_scales = f32_view(vs.data(), {1, Hkv, Lk});
  std::vector<float> want(H * Dv);
  reference_attention(qv, kv, vv, f32_view(want.data(), {1, H, 1, Dv}), o);
  ASSERT_TRUE(std::isnan(want[3]) && std::isinf(want[4]) && std::isnan(want[4 * Dv + 4]));
  for (Target t : vnni_targets()) {
    Context ctx;
    ctx.set_max_target(t);
    std::vector<float> out(H * Dv, 7.0f);
    attention(qv, kv, vv, f32_view(out.data(), {1, H, 1, Dv}), o, &ctx);
    // |v| <= 127 * 0.01 = 1.27
    EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), std::ldexp(1.27, -9)))
        << target_name(t);
  }
}

// The avx512_vnni unit runs int8 decoding with the avx512_bf16 unit's code (the same driver and
// VNNI P V, compiled without AVX512-BF16): the same bits, where a CPU runs both. 2..8 rows per
// K/V head, odd and multi-block lengths, per-token scales, one case with a window.
TEST(NativeInt8Decode, VnniUnitMatchesTheBf16UnitBitwise) {
  if (vnni_targets().size() < 2) GTEST_SKIP() << "needs AVX512-VNNI and AVX512-BF16";
  const std::int64_t B = 2, Hkv = 2, D = 64, Dv = 96;
  int n = 0;
  for (std::int64_t group : {2, 5, 8})
    for (std::int64_t Lk : {3, 129, 700}) {
      const std::int64_t H = Hkv * group;
      SCOPED_TRACE("group " + std::to_string(group) + " Lk " + std::to_string(Lk));
      const std::vector<float> q = random_floats(B * H * D, 81 + n);
      std::vector<std::int8_t> k(B * Hkv * Lk * D), v(B * Hkv * Lk * Dv);
      const auto kf = random_floats(k.size(), 82 + n, -127, 127),
                 vf = random_floats(v.size(), 83 + n, -127, 127);
      for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::int8_t>(kf[i]);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int8_t>(vf[i]);
      const std::vector<float> ks = random_floats(B * Hkv * Lk, 84 + n, 0.001f, 0.01f),
                               vs = random_floats(B * Hkv * Lk, 85 + n, 0.001f, 0.01f);
      AttentionOptions o;
      o.k_scales = f32_view(ks.data(), {B, Hkv, Lk});
      o.v_scales = f32_view(vs.data(), {B, Hkv, Lk});
      if (n == 4) o.window_left = 50, o.window_right = 0;
      ++n;
      std::vector<float> out[2], lse[2];
      for (int u = 0; u < 2; ++u) {
        Context ctx;
        ctx.set_simd(Simd::xsimd);
        ctx.set_max_target(u == 0 ? Target::avx512_vnni : Target::avx512_bf16);
        out[u].assign(B * H * Dv, 7.0f);
        lse[u].assign(B * H, 7.0f);
        o.lse = f32_view(lse[u].data(), {B, H, 1});
        attention(f32_view(q.data(), {B, H, 1, D}),
                  TensorView::contiguous(k.data(), DType::i8, {B, Hkv, Lk, D}),
                  TensorView::contiguous(v.data(), DType::i8, {B, Hkv, Lk, Dv}),
                  f32_view(out[u].data(), {B, H, 1, Dv}), o, &ctx);
      }
      EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * 4), 0) << "out";
      EXPECT_EQ(std::memcmp(lse[0].data(), lse[1].data(), lse[0].size() * 4), 0) << "lse";
    }
}

// A cap of avx512_vnni runs that target wherever /proc/cpuinfo lists avx512_vnni on an AVX-512
// CPU (and this build has the native units), and `best` runs it or avx512_bf16 there; the bf16
// calls keep the portable path on it.
TEST(NativeInt8Decode, VnniTargetWhereTheCpuHasIt) {
  if (!machine_runs(Target::avx512)) GTEST_SKIP() << "no AVX-512";
  const bool vnni = cpuinfo_has_flag("avx512_vnni");
  Context c;
  c.set_max_target(Target::avx512_vnni);
  const Target t = active_target(&c);
  EXPECT_TRUE(t == Target::avx512_vnni || (t == Target::avx512 && !vnni)) << target_name(t);
  EXPECT_STREQ(active_bf16_path(&c), "f32");
  c.set_max_target(Target::best);
  if (t == Target::avx512_vnni) {
    EXPECT_TRUE(active_target(&c) == Target::avx512_vnni ||
                active_target(&c) == Target::avx512_bf16)
        << target_name(active_target(&c));
  }
  EXPECT_EQ(parse_target("avx512_vnni"), Target::avx512_vnni);
  EXPECT_STREQ(target_name(Target::avx512_vnni), "avx512_vnni");
}

}  // namespace
}  // namespace cpuattn::test

namespace cpuattn::test {
namespace {

// A cache of each dtype stores what the conversions say, and attention() reads it directly.
TEST(KvCacheDtypes, StoresConvertedTokensAndAttentionReadsThem) {
  const std::int64_t B = 2, Hkv = 2, H = 4, D = 24, Dv = 20, n = 37;
  const auto k = random_floats(B * Hkv * n * D, 31), v = random_floats(B * Hkv * n * Dv, 32);
  const auto q = random_floats(B * H * 3 * D, 33);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i8}) {
    SCOPED_TRACE(dtype_name(dt));
    KvCache cache(B, Hkv, D, Dv, 8, /*growable=*/true, dt);
    EXPECT_EQ(cache.dtype(), dt);
    // Two appends of strided views into k/v, laid out [B, Hkv, n, *]; the second grows the cache.
    TensorView k1 = f32_view(k.data(), {B, Hkv, 30, D}), v1 = f32_view(v.data(), {B, Hkv, 30, Dv});
    k1.strides = {Hkv * n * D, n * D, D, 1};
    v1.strides = {Hkv * n * Dv, n * Dv, Dv, 1};
    TensorView k2 = k1, v2 = v1;
    k2.data = k.data() + 30 * D, k2.shape[2] = n - 30;
    v2.data = v.data() + 30 * Dv, v2.shape[2] = n - 30;
    cache.append(k1, v1);
    cache.append(k2, v2);
    ASSERT_EQ(cache.length(), n);
    const TensorView kv = cache.keys();
    EXPECT_EQ(kv.dtype, dt);
    const auto ks = cache.key_scales();
    EXPECT_EQ(ks.has_value(), dt == DType::i8);
    // Every stored element is the conversion of the input.
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t l = 0; l < n; ++l) {
          const float* src = k.data() + ((b * Hkv + h) * n + l) * D;
          std::vector<std::int8_t> qrow(D);
          const float sc = quantize_int8(src, D, qrow.data());
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t off = b * kv.strides[0] + h * kv.strides[1] + l * kv.strides[2] + d;
            const auto* half = static_cast<const std::uint16_t*>(kv.data);
            switch (dt) {
              case DType::bf16:
                ASSERT_EQ(half[off], to_bf16(src[d]));
                break;
              case DType::f16:
                ASSERT_EQ(half[off], to_f16(src[d]));
                break;
              case DType::i8: {
                ASSERT_EQ(static_cast<const std::int8_t*>(kv.data)[off], qrow[d]);
                const float got_sc = static_cast<const float*>(
                    ks->data)[b * ks->strides[0] + h * ks->strides[1] + l * ks->strides[2]];
                ASSERT_EQ(got_sc, sc);
                break;
              }
              default:
                ASSERT_EQ(static_cast<const float*>(kv.data)[off], src[d]);
            }
          }
        }
    // attention() on the cache views (decode-style: 3 queries, bottom-right) against the
    // reference on the same views.
    std::vector<float> out(B * H * 3 * Dv), want(out.size());
    AttentionOptions o;
    o.causal = Causal::bottom_right;
    o.k_scales = cache.key_scales();
    o.v_scales = cache.value_scales();
    attention(f32_view(q.data(), {B, H, 3, D}), cache.keys(), cache.values(),
              f32_view(out.data(), {B, H, 3, Dv}), o);
    reference_attention(f32_view(q.data(), {B, H, 3, D}), cache.keys(), cache.values(),
                        f32_view(want.data(), {B, H, 3, Dv}), o);
    EXPECT_TRUE(all_close(out.data(), want.data(), out.size(), 1e-5, 0));
  }
}

TEST(KvCacheDtypes, BadInput) {
  expect_error_mentioning([] { KvCache(1, 1, 4, 4, 4, false, DType::i32); }, "dtype int32");
  KvCache c(1, 1, 4, 4, 4, false, DType::i8);
  std::vector<float> k(4, 1.0f), v(4, 1.0f);
  k[2] = std::numeric_limits<float>::quiet_NaN();
  expect_error_mentioning(
      [&] {
        c.append(f32_view(k.data(), {1, 1, 1, 4}), f32_view(v.data(), {1, 1, 1, 4}));
      },
      "int8 cache cannot hold");
  EXPECT_EQ(c.length(), 0);
  // int8 K without scales, scales with f32 K, K and V of different dtypes.
  std::vector<std::int8_t> k8(4, 1);
  std::vector<float> q(4, 1.0f), out(4, 7.0f), sc(1, 0.5f);
  const TensorView k8v = TensorView::contiguous(k8.data(), DType::i8, {1, 1, 1, 4});
  expect_error_mentioning(
      [&] {
        attention(f32_view(q.data(), {1, 1, 1, 4}), k8v, k8v, f32_view(out.data(), {1, 1, 1, 4}));
      },
      "k_scales is missing");
  AttentionOptions o;
  o.k_scales = f32_view(sc.data(), {1, 1, 1});
  expect_error_mentioning(
      [&] {
        attention(f32_view(q.data(), {1, 1, 1, 4}), f32_view(v.data(), {1, 1, 1, 4}),
                  f32_view(v.data(), {1, 1, 1, 4}), f32_view(out.data(), {1, 1, 1, 4}), o);
      },
      "k_scales is given but K has dtype float32");
  expect_error_mentioning(
      [&] {
        attention(f32_view(q.data(), {1, 1, 1, 4}), k8v, f32_view(v.data(), {1, 1, 1, 4}),
                  f32_view(out.data(), {1, 1, 1, 4}), o);
      },
      "K and V must share a dtype");
  std::vector<std::uint16_t> h(5, 0);
  expect_error_mentioning(
      [&] {
        attention(TensorView::contiguous(reinterpret_cast<const char*>(h.data()) + 1, DType::bf16,
                                         {1, 1, 1, 4}),
                  f32_view(v.data(), {1, 1, 1, 4}), f32_view(v.data(), {1, 1, 1, 4}),
                  f32_view(out.data(), {1, 1, 1, 4}));
      },
      "not aligned");
  for (float x : out) EXPECT_EQ(x, 7.0f);  // nothing written
}

// End-to-end error of a reduced cache against an f32 cache, on a multi-head decode step: max
// |error| relative to max |V| and cosine similarity of the outputs, on random data and on data with
// outlier channels (a few dims 20x larger, which stretch int8's per-token scale). Printed, and
// asserted against bounds docs/precision.md states ("Measured accuracy").
TEST(KvCacheDtypes, EndToEndErrorAgainstF32Cache) {
  const std::int64_t B = 2, H = 8, Hkv = 2, D = 64, L = 1024;
  for (bool outliers : {false, true}) {
    auto k = random_floats(B * Hkv * L * D, 41), v = random_floats(B * Hkv * L * D, 42);
    const auto q = random_floats(B * H * D, 43);
    if (outliers)
      for (std::size_t i = 0; i < k.size(); ++i)
        if (i % D == 3 || i % D == 40) k[i] *= 20, v[i] *= 20;
    double vmax = 0;
    for (float x : v) vmax = std::max(vmax, double(std::abs(x)));
    std::vector<float> ref(B * H * D);
    KvCache c32(B, Hkv, D, D, L, false, DType::f32);
    c32.append(f32_view(k.data(), {B, Hkv, L, D}), f32_view(v.data(), {B, Hkv, L, D}));
    attention(f32_view(q.data(), {B, H, 1, D}), c32.keys(), c32.values(),
              f32_view(ref.data(), {B, H, 1, D}));
    for (DType dt : {DType::bf16, DType::f16, DType::i8, DType::fp8_e4m3}) {
      KvCache c(B, Hkv, D, D, L, false, dt);
      c.append(f32_view(k.data(), {B, Hkv, L, D}), f32_view(v.data(), {B, Hkv, L, D}));
      std::vector<float> got(ref.size());
      AttentionOptions o;
      o.k_scales = c.key_scales();
      o.v_scales = c.value_scales();
      attention(f32_view(q.data(), {B, H, 1, D}), c.keys(), c.values(),
                f32_view(got.data(), {B, H, 1, D}), o);
      double err = 0, dot = 0, n1 = 0, n2 = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(double(got[i]) - ref[i]));
        dot += double(got[i]) * ref[i];
        n1 += double(got[i]) * got[i];
        n2 += double(ref[i]) * ref[i];
      }
      const double rel = err / vmax, cos = dot / std::sqrt(n1 * n2);
      std::printf("[ cache %-8s %s ] max |err| / max |V| = %.2e, cosine = %.7f\n", dtype_name(dt),
                  outliers ? "outliers" : "random  ", rel, cos);
      EXPECT_LT(rel, dt == DType::fp8_e4m3 ? 1e-2
                     : dt == DType::i8     ? 2e-2
                     : dt == DType::bf16   ? 1e-2
                                           : 2e-3);
      EXPECT_GT(cos, dt == DType::fp8_e4m3 ? 0.995 : dt == DType::i8 ? 0.999 : 0.9999);
    }
  }
}

}  // namespace
}  // namespace cpuattn::test

namespace cpuattn::test {
namespace {

// bf16 weights are widened exactly and summed in the same order as f32 weights holding the same
// values: the products must be bitwise equal, on every target.
TEST(LinearBf16, BitwiseEqualToF32WeightsOfTheSameValues) {
  for (const Backend& be : machine_backends()) {
    for (auto [M, K, N] : {std::array<std::int64_t, 3>{1, 768, 2304},
                           {13, 300, 33},
                           {100, 17, 70},
                           {3, 1000, 5},
                           {40, 600, 97}}) {
      SCOPED_TRACE(be.name() + " M" + std::to_string(M) + " K" + std::to_string(K) + " N" +
                   std::to_string(N));
      auto w = random_floats(K * N, 51);
      std::vector<std::uint16_t> w16(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        w16[i] = to_bf16(w[i]);
        w[i] = from_bf16(w16[i]);
      }
      const auto bias = random_floats(N, 52), x = random_floats(M * K, 53);
      const Linear l32(f32_view(w.data(), {K, N}), f32_view(bias.data(), {N}));
      const Linear l16(TensorView::contiguous(w16.data(), DType::bf16, {K, N}),
                       f32_view(bias.data(), {N}));
      std::vector<float> y32(M * N), y16(M * N);
      Context ctx;
      be.apply(ctx);
      l32.forward(f32_view(x.data(), {M, K}), f32_view(y32.data(), {M, N}), &ctx);
      l16.forward(f32_view(x.data(), {M, K}), f32_view(y16.data(), {M, N}), &ctx);
      EXPECT_EQ(std::memcmp(y32.data(), y16.data(), y32.size() * 4), 0);
    }
  }
  std::vector<std::uint16_t> h(4);
  expect_error_mentioning(
      [&] {
        Linear(TensorView::contiguous(h.data(), DType::f16, {2, 2}));
      },
      "expected float32 or bfloat16");
}

}  // namespace
}  // namespace cpuattn::test
