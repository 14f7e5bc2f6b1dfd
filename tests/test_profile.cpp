// Call records (include/cpuattn/profile.h): the verbose line, the phase split against the wall
// time, layers recorded as one call, the Chrome trace, and CPUATTN_VERBOSE from many threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "cpuattn/profile.h"
#include "test_util.h"

namespace cpuattn {
namespace {

using test::random_floats;

struct Attn {
  std::int64_t B, H, Lq, Lk, D;
  std::vector<float> q, k, v, out;
  Attn(std::int64_t b, std::int64_t h, std::int64_t lq, std::int64_t lk, std::int64_t d)
      : B(b),
        H(h),
        Lq(lq),
        Lk(lk),
        D(d),
        q(random_floats(b * h * lq * d, 1)),
        k(random_floats(b * h * lk * d, 2)),
        v(random_floats(b * h * lk * d, 3)),
        out(b * h * lq * d) {}
  void run(Context& ctx, const AttentionOptions& opts = {}) {
    attention(f32_view(q.data(), {B, H, Lq, D}), f32_view(k.data(), {B, H, Lk, D}),
              f32_view(v.data(), {B, H, Lk, D}), f32_view(out.data(), {B, H, Lq, D}), opts, &ctx);
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

// Parses a verbose line into (key, value) pairs in order; the first two fields are the prefix
// and the op.
std::vector<std::pair<std::string, std::string>> parse_line(const std::string& line) {
  std::vector<std::pair<std::string, std::string>> kv;
  const auto fields = split(line, ',');
  EXPECT_GE(fields.size(), 15u) << line;
  if (fields.size() < 2) return kv;
  EXPECT_EQ(fields[0], "cpuattn_verbose") << line;
  kv.emplace_back("op", fields[1]);
  for (std::size_t i = 2; i < fields.size(); ++i) {
    const auto eq = fields[i].find('=');
    EXPECT_NE(eq, std::string::npos) << fields[i] << " in " << line;
    if (eq == std::string::npos) continue;
    kv.emplace_back(fields[i].substr(0, eq), fields[i].substr(eq + 1));
  }
  return kv;
}

const char* const kFieldOrder[] = {"op",       "dtype",  "kv",      "out",     "shapes",
                                   "mask",     "target", "simd",    "threads", "tasks",
                                   "k_splits", "path",   "time_ms", "gflops",  "gbps"};

std::set<std::string> phase_names() {
  std::set<std::string> s;
  for (int p = 0; p < kNumPhases; ++p) s.insert(phase_name(static_cast<Phase>(p)));
  return s;
}

// Checks a line's fields and order; returns them by key.
std::map<std::string, std::string> check_line(const std::string& line, bool phases) {
  const auto kv = parse_line(line);
  const std::size_t n = std::size(kFieldOrder);
  EXPECT_EQ(kv.size(), n + (phases ? 1 : 0)) << line;
  for (std::size_t i = 0; i < std::min(n, kv.size()); ++i) {
    EXPECT_EQ(kv[i].first, kFieldOrder[i]) << "field " << i << " of " << line;
  }
  std::map<std::string, std::string> m(kv.begin(), kv.end());
  if (phases) {
    EXPECT_EQ(kv.back().first, "phases") << line;
    double sum = 0;
    for (const auto& item : split(m["phases"], ';')) {
      const auto colon = item.find(':');
      EXPECT_NE(colon, std::string::npos) << item;
      if (colon == std::string::npos) continue;
      EXPECT_TRUE(phase_names().count(item.substr(0, colon))) << item;
      const double ms = std::stod(item.substr(colon + 1));
      EXPECT_GT(ms, 0) << item;
      sum += ms;
    }
    EXPECT_GT(sum, 0) << line;
  }
  for (const char* num : {"time_ms", "gflops", "gbps"}) EXPECT_GE(std::stod(m[num]), 0) << line;
  return m;
}

// The line names the call, its shapes and mask, and the target and provider that ran it, on
// every (provider, target) of this machine.
TEST(Profile, VerboseLineNamesTheCallAndTheTargetThatRanIt) {
  Attn a(2, 3, 37, 45, 24);
  for (const auto& be : test::machine_backends()) {
    SCOPED_TRACE(be.name());
    Context ctx(2);
    be.apply(ctx);
    AttentionOptions opts;
    opts.causal = Causal::top_left;
    std::vector<CallProfile> calls;
    {
      ProfileSession session;
      a.run(ctx, opts);
      calls = session.take();
    }
    ASSERT_EQ(calls.size(), 1u);
    const auto m = check_line(verbose_line(calls[0], 1), false);
    EXPECT_EQ(m.at("op"), "attention");
    EXPECT_EQ(m.at("dtype"), "f32");
    EXPECT_EQ(m.at("shapes"), "q:2x3x37x24;k:2x3x45x24;v:2x3x45x24;out:2x3x37x24");
    EXPECT_EQ(m.at("mask"), "causal_top_left");
    EXPECT_EQ(m.at("target"), target_name(active_target(&ctx)));
    EXPECT_EQ(m.at("simd"), simd_name(active_simd(&ctx)));
    EXPECT_EQ(m.at("threads"), std::to_string(std::min(2u, std::thread::hardware_concurrency())));
    EXPECT_GE(std::stoll(m.at("tasks")), 1);
    check_line(verbose_line(calls[0], 2), true);
    // Work: 2 (D + Dv) flops per visible pair (top-left causal: i + 1 keys of 45) per head.
    double pairs = 0;
    for (int i = 0; i < 37; ++i) pairs += i + 1;
    EXPECT_DOUBLE_EQ(calls[0].flops, 2.0 * 48 * 2 * 3 * pairs);
  }
  // After the session, nothing is recorded.
  ProfileSession later;
  EXPECT_TRUE(later.take().empty());
}

// The tiled kind of the one call `call` makes, as its verbose line names it ("tiled=...").
template <class Call>
std::string TiledPathOf(Call&& call) {
  ProfileSession session;
  call();
  const std::vector<CallProfile> calls = session.take();
  EXPECT_EQ(calls.size(), 1u);
  if (calls.empty()) return std::string();
  const std::string path = check_line(verbose_line(calls[0], 1), false).at("path");
  const auto at = path.find("tiled=");
  EXPECT_NE(at, std::string::npos) << path;
  return at == std::string::npos ? path : path.substr(at, path.find_first_of(";/", at) - at);
}

// The tiled blocks' K/V unit, as the call record names it: f32 V of whole-vector rows, one row
// after another, whose blocks lie in one page is read in place by the P V tile (`vin_`); bf16 V,
// rows of a [B, L, H, D] tensor (H * D apart) and blocks across pages of 16 tokens are packed
// (kernels/flash/config.cpp, choose_block). Their f32 outputs of whole-vector rows are written by
// the last key block's P V tiles (`+out`, BlockPath::out_in_pv), and their f32 Q rows, one
// head per block, are read in place (`_qin`, QUnit::f32_in_place).
TEST(Profile, TiledBlocksReadF32VInPlaceWhereItLiesWhole) {
  const std::int64_t H = 2, Lq = 24, Lk = 40, D = 64;
  const std::vector<float> q = random_floats(H * Lq * D, 4), k = random_floats(H * Lk * D, 5);
  std::vector<std::uint16_t> kb(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) kb[i] = to_bf16(k[i]);
  std::vector<float> out(H * Lq * D);
  for (const auto& be : test::machine_backends()) {
    SCOPED_TRACE(be.name());
    Context ctx(1);
    be.apply(ctx);
    const TensorView qv = f32_view(q.data(), {1, H, Lq, D});
    const OutputView ov = f32_view(out.data(), {1, H, Lq, D});
    EXPECT_EQ(TiledPathOf([&] {
                attention(qv, f32_view(k.data(), {1, H, Lk, D}), f32_view(k.data(), {1, H, Lk, D}),
                          ov, {}, &ctx);
              }),
              "tiled=tile_f32_qin+vin_tile_f32+out");
    const TensorView kl = TensorView::blhd(k.data(), DType::f32, 1, Lk, H, D);
    EXPECT_EQ(TiledPathOf([&] { attention(qv, kl, kl, ov, {}, &ctx); }),
              "tiled=tile_f32_qin+tile_f32+out");
    const TensorView kbv = TensorView::contiguous(kb.data(), DType::bf16, {1, H, Lk, D});
    EXPECT_EQ(TiledPathOf([&] { attention(qv, kbv, kbv, ov, {}, &ctx); }),
              "tiled=tile_f32_qin+tile_f32+out");
    for (const std::int64_t P : {16, 128}) {
      SCOPED_TRACE("pages of " + std::to_string(P));
      PagedKvCache pages(4, P, H, D, D, DType::f32);
      const std::vector<std::int64_t> seqs = {pages.add_sequence()};
      pages.append(seqs[0], f32_view(k.data(), {H, Lk, D}), f32_view(k.data(), {H, Lk, D}));
      EXPECT_EQ(
          TiledPathOf([&] { attention(qv, pages.batch(seqs), ov, {}, &ctx); }),
          P == 16 ? "tiled=tile_f32_qin+tile_f32+out" : "tiled=tile_f32_qin+vin_tile_f32+out");
    }
  }
}

// f32 V of rows of 128 floats (512 B, 8 lines) is packed where a P V column chunk of it would not
// fit L1d's sets: with S sets, a block's 128 rows start in only S / 8 of them, so a chunk narrower
// than the row (every target's: 64 floats on AVX-512) puts 128 * 8 / S of its lines in each set
// it touches, 16 in the 64 sets of every x86 L1d cpuattn targets, above their 8-12 ways
// (config.cpp, v_chunk_fits_l1). The arithmetic here is the closed form for such rows, from the
// L1d the OS reports (as the library reads it, or 32 KiB of 8 ways where it reports none).
TEST(Profile, TiledBlocksPackF32VWhoseChunksOverflowL1Sets) {
  long size = sysconf(_SC_LEVEL1_DCACHE_SIZE), ways = sysconf(_SC_LEVEL1_DCACHE_ASSOC),
       line = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
  if (size <= 0 || ways <= 0 || line <= 0 || size % (ways * line) != 0) {
    size = 32 << 10;
    ways = 8;
    line = 64;
  }
  const long sets = size / (ways * line);
  if (line != 64 || sets % 8 != 0)
    GTEST_SKIP() << "the closed form needs 64-byte lines and a multiple of 8 sets: " << sets
                 << " sets of " << line << " B";
  const bool packed = 128 * 8 / sets > ways;
  const std::int64_t H = 2, Lq = 24, Lk = 40, D = 48, Dv = 128;
  const std::vector<float> q = random_floats(H * Lq * D, 8), k = random_floats(H * Lk * D, 9),
                           v = random_floats(H * Lk * Dv, 10);
  std::vector<float> out(H * Lq * Dv);
  for (const auto& be : test::machine_backends()) {
    SCOPED_TRACE(be.name() + ", L1d " + std::to_string(sets) + " sets of " + std::to_string(ways) +
                 " ways");
    Context ctx(1);
    be.apply(ctx);
    EXPECT_EQ(TiledPathOf([&] {
                attention(f32_view(q.data(), {1, H, Lq, D}), f32_view(k.data(), {1, H, Lk, D}),
                          f32_view(v.data(), {1, H, Lk, Dv}), f32_view(out.data(), {1, H, Lq, Dv}),
                          {}, &ctx);
              }),
              packed ? "tiled=tile_f32_qin+tile_f32+out" : "tiled=tile_f32_qin+vin_tile_f32+out");
  }
}

// Streamed decoding follows three vendor rules (kernels/flash/config.cpp, choose_block;
// dispatch.cpp, keys_in_runs, v_ahead_into_l2 and narrow_keys_asked_once). K read in place goes in
// four runs on Intel
// (`=dot_runs`), except 1-byte K outside the native unit's VNNI blocks, and as one stream with
// P V asking for the next block's K elsewhere (`=dot` ... `+k_ahead`); V packed per block keeps
// one stream for one-row blocks. Where K is one stream, the scores prefetch V of 2- and 4-byte
// elements into L2 on Intel (`+v_l2`), into L1 on other CPUs and for 1-byte V; on AMD's family 25
// (Zen 3 and Zen 4) the scores of 2-byte K that P V asked for do not ask again (`+k_once`). The
// vendor is read here from /proc/cpuinfo, not CPUID as the library reads it. Off x86 no CPU is
// Intel's or AMD's.
TEST(Profile, DecodeStreamsFollowTheVendorRules) {
#if defined(__x86_64__) || defined(__i386__)
  const bool intel = test::cpuinfo_field("vendor_id") == "GenuineIntel";
  const bool amd_25 = test::cpuinfo_field("vendor_id") == "AuthenticAMD" &&
                      std::atoi(test::cpuinfo_field("cpu family").c_str()) == 25;
#else
  const bool intel = false, amd_25 = false;
#endif
  // GQA (4 rows per K/V head, V rows whole vectors on every target) and MHA of 20-float rows
  // (V packed on targets of 8 or 16 lanes).
  struct Shape {
    std::int64_t H, Hkv, D;
  };
  const std::int64_t Lk = 300;
  for (const Shape sh : {Shape{4, 1, 32}, Shape{2, 2, 20}}) {
    const std::vector<float> q = random_floats(sh.H * sh.D, 11),
                             k = random_floats(sh.Hkv * Lk * sh.D, 12);
    std::vector<std::uint16_t> kb(k.size());
    std::vector<std::int8_t> k8(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
      kb[i] = to_bf16(k[i]);
      k8[i] = static_cast<std::int8_t>(k[i] * 100);
    }
    const std::vector<float> scales(sh.Hkv * Lk, 0.01f);
    std::vector<float> out(sh.H * sh.D);
    for (const auto& be : test::machine_backends()) {
      Context ctx(1);
      be.apply(ctx);
      for (const DType kv : {DType::f32, DType::bf16, DType::i8}) {
        const void* data = kv == DType::f32    ? static_cast<const void*>(k.data())
                           : kv == DType::bf16 ? static_cast<const void*>(kb.data())
                                               : static_cast<const void*>(k8.data());
        SCOPED_TRACE(be.name() + ", H " + std::to_string(sh.H) + ", kv " +
                     std::to_string(static_cast<int>(kv)) + (intel ? ", Intel" : ", not Intel"));
        AttentionOptions opts;
        if (kv == DType::i8)
          opts.k_scales = opts.v_scales = f32_view(scales.data(), {1, sh.Hkv, Lk});
        const TensorView kvv = TensorView::contiguous(data, kv, {1, sh.Hkv, Lk, sh.D});
        ProfileSession session;
        attention(f32_view(q.data(), {1, sh.H, 1, sh.D}), kvv, kvv,
                  f32_view(out.data(), {1, sh.H, 1, sh.D}), opts, &ctx);
        const std::vector<CallProfile> calls = session.take();
        ASSERT_EQ(calls.size(), 1u);
        const std::string path = check_line(verbose_line(calls[0], 1), false).at("path");
        const auto has = [&](const char* part) { return path.find(part) != std::string::npos; };
        const bool runs = has("=dot_runs+"), one_stream = has("=dot+");
        EXPECT_NE(runs, one_stream) << path;
        if (!has("vpacked_")) {
          EXPECT_EQ(runs, intel && (kv != DType::i8 || has("runs_vnni"))) << path;
          EXPECT_EQ(has("+k_ahead"), one_stream) << path;
        } else if (sh.H == sh.Hkv) {
          EXPECT_TRUE(one_stream) << path;
        }
        EXPECT_EQ(has("+v_l2"), one_stream && intel && kv != DType::i8) << path;
        EXPECT_EQ(has("+k_once"), has("+k_ahead") && amd_25 && kv == DType::bf16) << path;
      }
    }
  }
}

// Q is read in place only where a block's rows are rows of Q: one query head per block over an
// f32 Q, and where K's panels can carry scale * log2 e without overflowing (at most 1: scale
// 0.69 reads in place, 0.7 and 1 do not). Blocks that fold a group's heads (GQA) copy their
// rows into Qp, scaled.
TEST(Profile, TiledBlocksReadQInPlaceOnlyForOneHeadPerBlock) {
  const std::int64_t Lq = 40, Lk = 40, D = 32;
  const std::vector<float> q = random_floats(4 * Lq * D, 6), k = random_floats(4 * Lk * D, 7);
  std::vector<float> out(q.size());
  for (const auto& be : test::machine_backends()) {
    SCOPED_TRACE(be.name());
    Context ctx(1);
    be.apply(ctx);
    for (const std::int64_t Hkv : {4, 2, 1}) {
      SCOPED_TRACE("Hkv " + std::to_string(Hkv));
      const std::string path = TiledPathOf([&] {
        attention(f32_view(q.data(), {1, 4, Lq, D}), f32_view(k.data(), {1, Hkv, Lk, D}),
                  f32_view(k.data(), {1, Hkv, Lk, D}), f32_view(out.data(), {1, 4, Lq, D}), {},
                  &ctx);
      });
      EXPECT_EQ(path.rfind(Hkv == 4 ? "tiled=tile_f32_qin+" : "tiled=tile_f32+", 0), 0u) << path;
    }
    for (const double scale : {0.69, 0.7, 1.0}) {
      SCOPED_TRACE("scale " + std::to_string(scale));
      AttentionOptions o;
      o.scale = scale;
      const std::string path = TiledPathOf([&] {
        attention(f32_view(q.data(), {1, 4, Lq, D}), f32_view(k.data(), {1, 4, Lk, D}),
                  f32_view(k.data(), {1, 4, Lk, D}), f32_view(out.data(), {1, 4, Lq, D}), o, &ctx);
      });
      EXPECT_EQ(path.rfind(scale < 0.693 ? "tiled=tile_f32_qin+" : "tiled=tile_f32+", 0), 0u)
          << path;
    }
  }
}

// The phases partition the tasks' time, and with one thread the tasks are nearly all of the
// call: stated slack, the phases cover >= 80% of the wall time (the rest is validation, the plan,
// scratch and the scheduler) and never more than the wall time (+1% for the clock conversion).
TEST(Profile, PhaseTimesSumToTheWallTime) {
  struct Case {
    Attn a;
    std::vector<Phase> expected;
  };
  std::vector<Case> cases;
  cases.push_back({Attn(1, 4, 512, 512, 64),
                   {Phase::pack_kv, Phase::scores, Phase::softmax, Phase::pv, Phase::output}});
  // Decode against a long cache: split keys, merged afterwards.
  cases.push_back({Attn(1, 2, 1, 8192, 64), {Phase::scores, Phase::pv, Phase::merge}});
  for (auto& c : cases) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE("Lq " + std::to_string(c.a.Lq) + ", threads " + std::to_string(threads));
      Context ctx(threads);
      c.a.run(ctx);  // warm-up
      ProfileSession session;
      for (int r = 0; r < 5; ++r) c.a.run(ctx);
      const auto calls = session.take();
      ASSERT_EQ(calls.size(), 5u);
      double best_cover = 0, best_of_busy = 0;
      for (const CallProfile& call : calls) {
        ASSERT_TRUE(call.has_phases);
        const double total = call.phase_total_ms();
        double busy = 0;
        for (double b : call.thread_busy_ms) busy += b;
        // Phases lie inside tasks: their sum is the tasks' time, less the two clock reads.
        EXPECT_LE(total, busy * 1.001 + 1e-3);
        best_of_busy = std::max(best_of_busy, busy > 0 ? total / busy : 1.0);
        EXPECT_LE(total, call.wall_ms * call.threads * 1.01 + 1e-3);
        for (Phase p : c.expected)
          EXPECT_GT(call.phase_ms[static_cast<int>(p)], 0) << phase_name(p);
        if (c.a.Lq == 1) {
          EXPECT_GT(call.k_splits, 1);
        }
        best_cover = std::max(best_cover, total / call.wall_ms);
      }
      // And nearly all of it, in the best of the calls: a thread's first task in a session may
      // first grow its scratch outside the phases (seen under ASan on 2 threads: 70% once).
      EXPECT_GE(best_of_busy, 0.97);
      if (threads == 1) {
        EXPECT_GE(best_cover, 0.8);
      }
    }
  }
}

// A layer is one call: MultiHeadAttention's projections and attention are phases of its record,
// and its work is theirs added up.
TEST(Profile, LayersRecordOneCallWithTheWorkOfTheirParts) {
  const std::int64_t B = 2, L = 33, dm = 64, heads = 4;
  const auto w = [&](std::uint32_t seed) { return random_floats(dm * dm, seed, -0.1f, 0.1f); };
  const auto wq = w(1), wk = w(2), wv = w(3), wo = w(4);
  const auto m = [&](const std::vector<float>& x) { return f32_view(x.data(), {dm, dm}); };
  MultiHeadAttention mha(MhaConfig{dm, heads, 0, 0, 0}, MhaWeights{m(wq), m(wk), m(wv), m(wo)});
  const auto x = random_floats(B * L * dm, 5);
  std::vector<float> out(B * L * dm);
  Context ctx(2);
  ProfileSession session;
  AttentionOptions causal;
  causal.causal = Causal::top_left;
  mha.forward(f32_view(x.data(), {B, L, dm}), f32_view(out.data(), {B, L, dm}), causal, &ctx);
  Linear lin(m(wq));
  lin.forward(f32_view(x.data(), {B * L, dm}), f32_view(out.data(), {B * L, dm}), &ctx);
  const auto calls = session.take();
  ASSERT_EQ(calls.size(), 2u);
  const CallProfile& f = calls[0];
  EXPECT_EQ(f.op, "mha.forward");
  EXPECT_EQ(f.mask, "causal_top_left");
  EXPECT_NE(f.shapes.find("x:2x33x64"), std::string::npos) << f.shapes;
  EXPECT_GT(f.phase_ms[static_cast<int>(Phase::gemm)], 0);
  EXPECT_GT(f.phase_ms[static_cast<int>(Phase::scores)], 0);
  const double proj = 4 * 2.0 * B * L * dm * dm;
  const double attn = 2.0 * 2 * (dm / heads) * heads * B * (L * (L + 1) / 2.0);
  EXPECT_DOUBLE_EQ(f.flops, proj + attn);
  check_line(verbose_line(f, 2), true);
  EXPECT_EQ(calls[1].op, "linear");
  EXPECT_DOUBLE_EQ(calls[1].flops, 2.0 * B * L * dm * dm);
  EXPECT_EQ(calls[1].shapes, "x:66x64;weight:64x64;y:66x64");
}

// Every pair of Q and K/V dtypes (and each out dtype) is recorded as it ran: dtype, kv and out
// in the record, the verbose line and the trace; a paged int8 cache, a bf16 KV cache behind
// MultiHeadAttention::decode and a Linear with bf16 weights likewise.
TEST(Profile, RecordsTheDtypesOfEveryCall) {
  const std::int64_t B = 1, H = 2, Lq = 3, Lk = 20, D = 16;
  const std::vector<float> x = random_floats(B * H * Lk * D, 9);
  std::vector<std::uint16_t> bf16(x.size()), f16(x.size());
  std::vector<std::int8_t> i8(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    bf16[i] = to_bf16(x[i]);
    f16[i] = to_f16(x[i]);
    i8[i] = static_cast<std::int8_t>(x[i] * 100);
  }
  const std::vector<float> scales(B * H * Lk, 0.01f);
  const auto data = [&](DType t) -> const void* {
    return t == DType::bf16  ? static_cast<const void*>(bf16.data())
           : t == DType::f16 ? static_cast<const void*>(f16.data())
           : t == DType::i8  ? static_cast<const void*>(i8.data())
                             : static_cast<const void*>(x.data());
  };
  const auto name = [](DType t) {
    return std::string(t == DType::bf16  ? "bf16"
                       : t == DType::f16 ? "f16"
                       : t == DType::i8  ? "int8"
                                         : "f32");
  };
  std::vector<float> out(B * H * Lq * D * 2);
  Context ctx(1);
  const std::string trace = ::testing::TempDir() + "cpuattn_dtypes_" + std::to_string(::getpid());
  for (DType q : {DType::f32, DType::bf16, DType::f16})
    for (DType kv : {DType::f32, DType::bf16, DType::f16, DType::i8})
      for (DType o : {DType::f32, DType::bf16, DType::f16}) {
        SCOPED_TRACE(name(q) + " " + name(kv) + " " + name(o));
        AttentionOptions opts;
        if (kv == DType::i8) opts.k_scales = opts.v_scales = f32_view(scales.data(), {B, H, Lk});
        OutputView ov = f32_view(out.data(), {B, H, Lq, D});
        ov.dtype = o;
        std::vector<CallProfile> calls;
        {
          ProfileSession session;
          attention(TensorView::contiguous(data(q), q, {B, H, Lq, D}),
                    TensorView::contiguous(data(kv), kv, {B, H, Lk, D}),
                    TensorView::contiguous(data(kv), kv, {B, H, Lk, D}), ov, opts, &ctx);
          calls = session.take();
        }
        ASSERT_EQ(calls.size(), 1u);
        EXPECT_EQ(calls[0].dtype, name(q));
        EXPECT_EQ(calls[0].kv, name(kv));
        EXPECT_EQ(calls[0].out, name(o));
        const auto m = check_line(verbose_line(calls[0], 1), false);
        EXPECT_EQ(m.at("dtype"), name(q));
        EXPECT_EQ(m.at("kv"), name(kv));
        EXPECT_EQ(m.at("out"), name(o));
        write_chrome_trace(calls, trace);
        std::ifstream f(trace);
        const std::string text((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
        EXPECT_NE(text.find("dtype=" + name(q) + ",kv=" + name(kv) + ",out=" + name(o)),
                  std::string::npos);
      }
  std::remove(trace.c_str());

  ProfileSession session;
  PagedKvCache pages(4, 16, H, D, D, DType::i8);
  const std::vector<std::int64_t> seqs = {pages.add_sequence()};
  pages.append(seqs[0], f32_view(x.data(), {H, Lk, D}), f32_view(x.data(), {H, Lk, D}));
  attention(f32_view(x.data(), {1, H, 1, D}), pages.batch(seqs), f32_view(out.data(), {1, H, 1, D}),
            {}, &ctx);
  const std::int64_t dm = H * D;
  const auto w = random_floats(dm * dm, 10, -0.1f, 0.1f);
  std::vector<std::uint16_t> wb(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) wb[i] = to_bf16(w[i]);
  const TensorView wv = f32_view(w.data(), {dm, dm});
  MultiHeadAttention mha(MhaConfig{dm, H, 0, 0, 0}, MhaWeights{wv, wv, wv, wv});
  KvCache cache = mha.make_cache(1, 4, false, DType::bf16);
  mha.decode(f32_view(x.data(), {1, 1, dm}), cache, f32_view(out.data(), {1, 1, dm}), {}, &ctx);
  Linear lin(TensorView::contiguous(wb.data(), DType::bf16, {dm, dm}));
  lin.forward(f32_view(x.data(), {2, dm}), f32_view(out.data(), {2, dm}), &ctx);
  const auto calls = session.take();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].op + " " + calls[0].dtype + " " + calls[0].kv + " " + calls[0].out,
            "attention_paged f32 int8 f32");
  EXPECT_EQ(calls[1].op + " " + calls[1].dtype + " " + calls[1].kv + " " + calls[1].out,
            "mha.decode f32 bf16 f32");
  EXPECT_EQ(calls[2].op + " " + calls[2].dtype + " " + calls[2].kv + " " + calls[2].out,
            "linear f32 bf16 f32");
}

// A call that fails validation records nothing.
TEST(Profile, RejectedCallsAreNotRecorded) {
  Attn a(1, 2, 8, 8, 16);
  Context ctx(1);
  ProfileSession session;
  EXPECT_THROW(attention(f32_view(a.q.data(), {1, 2, 8, 16}), f32_view(a.k.data(), {1, 2, 8, 15}),
                         f32_view(a.v.data(), {1, 2, 8, 16}), f32_view(a.out.data(), {1, 2, 8, 16}),
                         {}, &ctx),
               Error);
  EXPECT_TRUE(session.take().empty());
}

// The trace is valid JSON: a named track per thread that ran tasks plus the calls' track, task
// spans on the threads' tracks, and phase spans inside their tasks.
TEST(Profile, ChromeTraceHasOneTrackPerThreadAndPhaseSpansInsideTasks) {
  Attn a(2, 4, 300, 300, 32);
  Context ctx(2);
  std::vector<CallProfile> calls;
  {
    ProfileSession session(/*spans=*/true);
    a.run(ctx);
    a.run(ctx);
    calls = session.take();
  }
  ASSERT_EQ(calls.size(), 2u);
  const std::string path =
      ::testing::TempDir() + "cpuattn_trace_" + std::to_string(::getpid()) + ".json";
  write_chrome_trace(calls, path);
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);  // throws on invalid JSON
  std::remove(path.c_str());
  std::map<int, std::string> names;
  std::map<int, std::vector<std::pair<double, double>>> tasks;
  std::vector<nlohmann::json> phases;
  int call_spans = 0;
  for (const auto& e : j.at("traceEvents")) {
    const int tid = e.at("tid").get<int>();
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[tid] = e["args"]["name"];
    if (e.at("ph") != "X") continue;
    const std::string cat = e.at("cat");
    if (cat == "call") {
      ++call_spans;
      EXPECT_EQ(tid, 0);
    }
    if (cat == "task")
      tasks[tid].push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (cat == "phase") phases.push_back(e);
  }
  EXPECT_EQ(call_spans, 2);
  EXPECT_EQ(names[0], "calls");
  ASSERT_FALSE(tasks.empty());
  EXPECT_LE(tasks.size(), static_cast<std::size_t>(ctx.num_threads()));
  for (const auto& [tid, spans] : tasks) {
    EXPECT_GE(tid, 1);
    EXPECT_EQ(names[tid], "thread " + std::to_string(tid - 1));
  }
  std::set<std::string> seen;
  for (const auto& e : phases) {
    const int tid = e["tid"].get<int>();
    const double b = e["ts"].get<double>(), end = b + e["dur"].get<double>();
    seen.insert(e["name"].get<std::string>());
    // Printed to the ns: a phase may end one rounding step past its task.
    const auto& ts = tasks[tid];
    const bool inside = std::any_of(ts.begin(), ts.end(), [&](const auto& t) {
      return b >= t.first - 2e-3 && end <= t.second + 2e-3;
    });
    EXPECT_TRUE(inside) << e.dump();
    if (!inside) break;
  }
  for (const char* p : {"pack_q", "pack_kv", "scores", "softmax", "pv", "output"})
    EXPECT_TRUE(seen.count(p)) << p;
  EXPECT_THROW(write_chrome_trace(calls, "/nonexistent-dir/t.json"), Error);
  EXPECT_FALSE(write_trace());  // CPUATTN_TRACE is not set in this test
}

// CPUATTN_VERBOSE=2 in a fresh process (the variable is read once): 4 threads x 25 calls print
// 100 whole lines, never two interleaved. The child checks its own stderr and exits 0 if so.
TEST(ProfileDeathTest, VerboseEnvPrintsOneWholeLinePerCallFromManyThreads) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string log = ::testing::TempDir() + "cpuattn_verbose_" + std::to_string(::getpid());
  const auto child = [&log] {
    ::setenv("CPUATTN_VERBOSE", "2", 1);
    std::FILE* f = std::fopen(log.c_str(), "w");
    if (f == nullptr) std::_Exit(3);
    ::dup2(fileno(f), 2);
    {
      Context ctx(2);
      std::vector<std::thread> ts;
      for (int t = 0; t < 4; ++t) {
        ts.emplace_back([&ctx, t] {
          Attn a(1, 2, 17 + t, 40, 16);
          for (int r = 0; r < 25; ++r) a.run(ctx);
        });
      }
      for (auto& t : ts) t.join();
    }
    std::ifstream in(log);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      const auto kv = parse_line(line);
      if (kv.size() != std::size(kFieldOrder) + 1 || kv.back().first != "phases") std::_Exit(4);
      ++n;
    }
    std::_Exit(n == 100 ? 0 : 5);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
  std::remove(log.c_str());
}

}  // namespace
}  // namespace cpuattn
