// The fused fast path against the double-precision reference, on every SIMD target this machine
// supports: odd and tail sizes, both memory layouts, misaligned pointers, every mask kind and
// their combinations, GQA ratios; plus determinism across thread counts, concurrent callers,
// allocation-free steady state, plan tweaks that leave results bitwise equal, and the stated
// error of the vector exp2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "alloc_counter.h"
#include "attention_cases.h"
#include "cpuattn/profile.h"
#include "probes.h"
#include "test_util.h"
#include "tweaks.h"

namespace cpuattn::test {
namespace {

class FastPath : public ::testing::TestWithParam<Backend> {};

TEST_P(FastPath, SequenceLengths) {
  const std::int64_t Ls[] = {1, 2, 7, 64, 65, 127, 1000};
  for (std::int64_t Lq : Ls) {
    for (std::int64_t Lk : Ls) {
      Case c;
      c.Lq = Lq;
      c.Lk = Lk;
      c.D = 17;
      c.Dv = 16;
      check_case(c, GetParam());
    }
  }
}

TEST_P(FastPath, HeadDims) {
  const std::int64_t Ds[] = {1, 3, 16, 17, 63, 64, 65, 128, 256};
  for (std::int64_t D : Ds) {
    for (std::int64_t Dv : Ds) {
      Case c;
      c.Lq = 9;  // tiled path
      c.Lk = 70;
      c.D = D;
      c.Dv = Dv;
      check_case(c, GetParam());
      c.Lq = 1;  // streaming (decode) path: K/V read in place
      c.H = 4;
      c.Hkv = 2;
      c.Lk = 300;
      check_case(c, GetParam());
    }
  }
}

TEST_P(FastPath, MasksLayoutsAndGroups) {
  const MaskCase masks[] = {MaskCase::none,          MaskCase::causal_tl,    MaskCase::causal_br,
                            MaskCase::bool_full,     MaskCase::bool_2d,      MaskCase::bool_keys,
                            MaskCase::additive_full, MaskCase::additive_inf, MaskCase::key_lengths,
                            MaskCase::combo};
  const std::pair<std::int64_t, std::int64_t> lens[] = {{65, 130}, {130, 65}, {1, 300}, {37, 37}};
  int n = 0;
  for (MaskCase m : masks) {
    for (auto [Lq, Lk] : lens) {
      for (auto [H, Hkv] :
           {std::pair<std::int64_t, std::int64_t>{2, 2}, {4, 2}, {6, 2}, {8, 1}, {5, 1}}) {
        Case c;
        c.B = 3;
        c.H = H;
        c.Hkv = Hkv;
        c.Lq = Lq;
        c.Lk = Lk;
        c.D = n % 2 ? 64 : 33;
        c.Dv = n % 3 ? 64 : 20;
        c.mask = m;
        c.blhd = n % 2 == 1;
        c.misalign = n % 4;  // floats: 0, 4, 8, 12 bytes off the allocation
        // Thinned: every 7th (7 is coprime to the periods 2, 3, 4 and 5 above).
        if (grid_case_runs(n++, 7)) check_case(c, GetParam());
      }
    }
  }
}

TEST_P(FastPath, LargeGroupsAndDecodeSplits) {
  Case c;
  c.B = 2;
  c.H = 128;  // group 128 > rows per block: heads split across blocks
  c.Hkv = 1;
  c.Lq = 3;
  c.Lk = 200;
  c.D = c.Dv = 32;
  check_case(c, GetParam());
  // Decode against a long cache: few tasks, so the keys are split and merged.
  Case d;
  d.B = 1;
  d.H = 4;
  d.Hkv = 1;
  d.Lq = 1;
  d.Lk = 5000;
  d.D = d.Dv = 64;
  for (MaskCase m : {MaskCase::none, MaskCase::key_lengths, MaskCase::additive_inf}) {
    d.mask = m;
    check_case(d, GetParam());
  }
}

// Outputs above 8 MiB whose rows are whole aligned vectors are written with non-temporal
// stores; unaligned or ragged rows of such outputs are written plainly. Both layouts.
TEST_P(FastPath, LargeOutputs) {
  Case c;
  c.B = 1;
  c.H = 16;
  c.Lq = 2100;  // 16 x 2100 x 64 x 4 B = 8.6 MB
  c.Lk = 9;
  c.D = c.Dv = 64;
  for (bool blhd : {false, true}) {
    c.blhd = blhd;
    for (bool aligned : {true, false}) {
      c.out_aligned64 = aligned;
      c.mask = aligned ? MaskCase::causal_br : MaskCase::none;  // rows that see no key give 0
      check_case(c, GetParam());
    }
  }
  c.Dv = 65;  // rows are not whole vectors
  c.out_aligned64 = true;
  check_case(c, GetParam());
}

// Scores of tens (base 2) that grow along the keys: the online softmax must rescale l and Acc
// each time a row's max grows after probabilities were accumulated, on the tiled path, the decode
// path and across key splits; with the ramp reversed the max comes first and later blocks keep it.
TEST_P(FastPath, LargeScoresThatGrowAlongTheKeys) {
  Case c;
  c.H = 4;
  c.Hkv = 2;
  c.D = c.Dv = 16;
  c.scale = 4.0;
  c.key_ramp = 1;
  for (auto [Lq, Lk] : {std::pair<std::int64_t, std::int64_t>{70, 1000}, {1, 300}, {1, 5000}}) {
    c.Lq = Lq;
    c.Lk = Lk;
    for (MaskCase m : {MaskCase::none, MaskCase::causal_br}) {
      c.mask = m;
      check_case(c, GetParam());
    }
  }
  c.Lq = 70;
  c.Lk = 1000;
  c.mask = MaskCase::none;
  c.key_ramp = -1;
  check_case(c, GetParam());
}

TEST_P(FastPath, NanAndInfOnlyAffectTheirRows) {
  Case c;
  c.Lq = 70;
  c.Lk = 140;
  Inputs in(c);
  in.q.at(0, 0, 3, 0) = std::numeric_limits<float>::quiet_NaN();
  in.k.at(0, 0, 100, 0) = std::numeric_limits<float>::infinity();  // reaches every row of head 0
  Tensor4 out(c.B, c.H, c.Lq, c.Dv);
  Context ctx;
  GetParam().apply(ctx);
  in.opts.causal = Causal::top_left;  // rows < 100 never see key 100
  attention(in.q.view(), in.k.view(), in.v.view(), out.out_view(), in.opts, &ctx);
  for (std::int64_t h = 0; h < c.H; ++h) {
    for (std::int64_t i = 0; i < c.Lq; ++i) {
      for (std::int64_t d = 0; d < c.Dv; ++d) {
        const bool poisoned = h == 0 && i == 3;
        EXPECT_EQ(std::isnan(out.at(0, h, i, d)), poisoned)
            << "h " << h << " i " << i << " d " << d;
      }
    }
  }
}

// The benchmarks' unfused baseline must compute the same thing (no masks: it has none).
TEST_P(FastPath, UnfusedBaselineMatchesReference) {
  for (Case c : {Case{2, 4, 2, 33, 70, 17, 16}, Case{1, 2, 1, 1, 129, 64, 65}}) {
    Inputs in(c);
    Tensor4 got(c.B, c.H, c.Lq, c.Dv), want(c.B, c.H, c.Lq, c.Dv);
    Context ctx;
    GetParam().apply(ctx);
    unfused_attention(in.q.view(), in.k.view(), in.v.view(), got.out_view(), ctx);
    reference_attention(in.q.view(), in.k.view(), in.v.view(), want.out_view());
    const double atol =
        8 * std::numeric_limits<float>::epsilon() * (std::sqrt(double(c.Lk)) + 4 * c.D) + 1e-6;
    EXPECT_TRUE(all_close(got.data(), want.data(), got.buf.size(), atol, 0)) << c.str();
  }
}

// The read probe keeps its buffer from call to call and grows it when a call asks for more; a
// call with more threads or fewer bytes reads inside it (the sanitizer builds see any read past
// it).
TEST(Probes, ReadProbeKeepsAndGrowsItsBuffer) {
  for (const auto& [threads, bytes] :
       {std::pair{1, std::size_t{1} << 20}, std::pair{2, std::size_t{3} << 20},
        std::pair{1, std::size_t{3} << 20}, std::pair{2, std::size_t{1} << 19}}) {
    const double gbps = measure_read_bandwidth_gbps(threads, bytes);
    EXPECT_TRUE(std::isfinite(gbps) && gbps > 0)
        << threads << " threads, " << bytes << " bytes: " << gbps;
  }
}

// The flash-block probe runs the one-pass tiles and P V on its own buffer on every backend: it
// must not refuse its block (it would then have timed the two passes it does not count), and the
// sanitizer builds see any access past the buffer.
TEST_P(FastPath, BlockProbeRunsItsBlock) {
  Context ctx(1);
  GetParam().apply(ctx);
  const double gflops = measure_block_gflops(1, &ctx);
  EXPECT_TRUE(std::isfinite(gflops) && gflops > 0) << gflops;
}

// A plan tweak (bench/support/tweaks.h) changes how a call runs, never its result: every tweak's
// output and lse are bitwise the shipped plan's, on tiled and streamed blocks, whole-vector and
// ragged rows, and (the last case) misaligned output rows, with sinks, a causal mask and a NaN
// query and an inf key that send blocks through the exact rerun; and the tweak reaches the plan
// (stream_out, epilogue_out, v_in_place, key_runs, key_stream, v_ahead_l1, v_ahead_l2 and
// no_scores_k_ahead show in the call's path; runs_ahead_max and no_runs_ahead, which only blocks
// read in runs use: the paged test RunsAheadChangesOnlyPrefetches).
TEST_P(FastPath, PlanTweaksLeaveOutputsBitwiseEqual) {
  Case rerun{1, 4, 2, 40, 150, 32, 32};
  rerun.misalign = 1;
  rerun.sinks = true;
  rerun.mask = MaskCase::causal_tl;
  for (Case c : {Case{2, 4, 2, 70, 150, 64, 64}, Case{1, 3, 1, 33, 70, 17, 19},
                 Case{2, 8, 2, 1, 300, 32, 32}, Case{2, 4, 4, 1, 150, 24, 20},
                 Case{1, 2, 1, 40, 150, 48, 128}, rerun}) {
    Inputs in(c);
    if (c.misalign != 0) {
      in.q.at(0, 0, 3, 0) = std::numeric_limits<float>::quiet_NaN();
      in.k.at(0, 1, 20, 1) = std::numeric_limits<float>::infinity();
    }
    Tensor4 want(c.B, c.H, c.Lq, c.Dv, false, c.misalign);
    std::vector<float> want_lse(c.B * c.H * c.Lq);
    Context ctx(2);
    GetParam().apply(ctx);
    AttentionOptions opts = in.opts;
    opts.lse = f32_view(want_lse.data(), {c.B, c.H, c.Lq});
    attention(in.q.view(), in.k.view(), in.v.view(), want.out_view(), opts, &ctx);
    for (const std::string& name : plan_tweak_names()) {
      Tensor4 got(c.B, c.H, c.Lq, c.Dv, false, c.misalign);
      std::vector<float> got_lse(c.B * c.H * c.Lq);
      opts.lse = f32_view(got_lse.data(), {c.B, c.H, c.Lq});
      set_plan_tweak(ctx, name);
      std::vector<CallProfile> calls;
      {
        ProfileSession session;
        attention(in.q.view(), in.k.view(), in.v.view(), got.out_view(), opts, &ctx);
        calls = session.take();
      }
      EXPECT_EQ(std::memcmp(got.buf.data(), want.buf.data(), got.buf.size() * sizeof(float)), 0)
          << c.str() << ", tweak " << name;
      EXPECT_EQ(std::memcmp(got_lse.data(), want_lse.data(), got_lse.size() * sizeof(float)), 0)
          << c.str() << ", tweak " << name;
      ASSERT_EQ(calls.size(), 1u);
      const std::string line = verbose_line(calls[0], 1);
      if (name == "stream_out" && c.Lq > 1) {
        EXPECT_NE(line.find("/f32_stream"), std::string::npos) << line;
      } else if (name == "none") {
        EXPECT_EQ(line.find("/f32_stream"), std::string::npos) << line;
      }
      // V rows of 128 floats: read in place with v_in_place whether or not the plan packs them.
      if (name == "v_in_place" && c.Dv == 128) {
        EXPECT_NE(line.find("vin_tile_f32"), std::string::npos) << line;
      }
      // Streamed blocks (one query position, contiguous K/V) read K as one stream (the dot
      // unit, which prefetches V as told) or in runs (the vendor rule of choose_block, or
      // key_runs); one-row blocks of packed V (Dv 20, the MHA case) keep the one stream.
      if (c.Lq == 1) {
        const bool dot = line.find("=dot+") != std::string::npos;
        EXPECT_NE(dot, line.find("=dot_runs+") != std::string::npos) << line;
        if (name == "key_runs") {
          EXPECT_FALSE(dot) << line;
        } else if (name == "key_stream") {
          EXPECT_TRUE(dot) << line;
        } else if (c.H == c.Hkv && line.find("vpacked_") != std::string::npos) {
          EXPECT_TRUE(dot) << line;
        }
        if (dot && (name == "v_ahead_l1" || name == "v_ahead_l2")) {
          EXPECT_EQ(line.find("+v_l2") != std::string::npos, name == "v_ahead_l2") << line;
        }
        // f32 K: the scores ask again for the K rows P V asked for unless told not to.
        if (line.find("+k_ahead") != std::string::npos) {
          EXPECT_EQ(line.find("+k_once") != std::string::npos, name == "no_scores_k_ahead") << line;
        }
      }
      // The tiled blocks of whole-vector rows write their outputs from P V unless told not to.
      if (c.Lq > 1 && c.Dv % 16 == 0) {
        EXPECT_EQ(line.find("+out") != std::string::npos, name != "epilogue_out") << line;
      }
    }
    set_plan_tweak(ctx, "none");
  }
  Context ctx;
  EXPECT_THROW(set_plan_tweak(ctx, "faster"), Error);
}

// Short query ranges over K/V blocks that one query block reads (X1's shape) run keys as the
// tiles' rows (FlashPath::keys_as_rows, kernels/flash/keys_rows-inl.h): query tails in the lanes,
// key and Dv tails in the rows, both layouts, misaligned views, one key; scores that grow along
// the keys, so that the one-pass step after a task's first block (KeysAsRows::ProbBlock) takes
// some blocks and refuses others; NaN and inf inputs (the tiled units' rerun); enough batches
// that the plan splits no keys on this machine, and the plan must name the path.
TEST_P(FastPath, KeysAsRowsBlocks) {
  const auto hw = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t H = 4, B = std::max<std::int64_t>(16, 4 * hw) / H;
  struct Shape {
    std::int64_t Lq, Lk, D, Dv;
    bool blhd;
    int misalign;
    int key_ramp = 0;  // +1 with scale 1: scores that grow along the keys (KeysAsRows::ProbBlock
                       // refuses some blocks and takes others)
    bool specials = false;
  };
  for (const Shape& sh : {Shape{64, 300, 64, 64, false, 0}, Shape{33, 129, 32, 48, true, 1},
                          Shape{9, 5, 16, 16, false, 0}, Shape{64, 1, 128, 64, true, 0},
                          Shape{17, 257, 48, 80, false, 1}, Shape{40, 1000, 64, 64, false, 0, 1},
                          Shape{23, 700, 32, 32, true, 1, 0, true}}) {
    Case c;
    c.B = B, c.H = H, c.Hkv = H, c.Lq = sh.Lq, c.Lk = sh.Lk, c.D = sh.D, c.Dv = sh.Dv;
    c.blhd = sh.blhd;
    c.misalign = sh.misalign;
    c.key_ramp = sh.key_ramp;
    if (sh.key_ramp != 0) c.scale = 1.0;
    c.specials = sh.specials;
    c.lse = false;  // an lse output takes the tiled units
    ProfileSession session;
    check_case(c, GetParam());
    bool keys_rows = false;
    for (const CallProfile& call : session.take())
      keys_rows |= call.path.find(";keys_rows") != std::string::npos;
    EXPECT_TRUE(keys_rows) << c.str();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FastPath, ::testing::ValuesIn(machine_backends()),
                         [](const auto& info) { return info.param.name(); });

// Results must not depend on the thread count: the task split is fixed by the shape. Under
// CPUATTN_TEST_QUICK (emulated SVE) the largest case has a quarter of its batches: still many
// more tasks than threads.
TEST(Determinism, BitwiseAcrossThreadCounts) {
  const std::int64_t kr_batches = thin_grids() ? 4 : 16;
  for (Case c : {Case{2, 8, 2, 300, 300, 64, 64}, Case{1, 4, 1, 1, 5000, 64, 64},
                 Case{3, 4, 4, 65, 700, 17, 33, false, 0, MaskCase::causal_br},
                 Case{kr_batches, 4, 4, 64, 700, 64, 64}}) {  // keys as rows (X1's shape)
    Inputs in(c);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      Tensor4 out(c.B, c.H, c.Lq, c.Dv);
      Context ctx(threads);
      attention(in.q.view(), in.k.view(), in.v.view(), out.out_view(), in.opts, &ctx);
      outs.push_back(out.buf);
    }
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4)) << c.str();
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[2].data(), outs[0].size() * 4)) << c.str();
  }
}

// The same for bf16 Q, K and V (on AVX512-BF16 the native tiles, and on Intel's AMX-BF16 the AMX
// tiles, whose clean blocks take scores and softmax in one pass against the rows' max so far),
// with keys whose scores grow, so that some blocks fall back to the two passes. Under
// CPUATTN_TEST_QUICK one batch of 130 rows: three row blocks, the last a tail.
TEST(Determinism, Bf16BitwiseAcrossThreadCounts) {
  const std::int64_t B = thin_grids() ? 1 : 2, H = 8, Hkv = 2, Lq = thin_grids() ? 130 : 300,
                     Lk = 900, D = 64;
  const auto bits = [](std::int64_t n, std::uint32_t seed, bool ramp) {
    std::vector<std::uint16_t> out;
    const auto x = random_floats(n, seed);
    for (std::int64_t i = 0; i < n; ++i) {
      const double grow = ramp ? 0.2 + 3.0 * double(i / D % Lk) / double(Lk) : 1.0;
      out.push_back(to_bf16(static_cast<float>(x[i] * grow)));
    }
    return out;
  };
  const auto q = bits(B * H * Lq * D, 1, false), k = bits(B * Hkv * Lk * D, 2, true),
             v = bits(B * Hkv * Lk * D, 3, false);
  const TensorView qv = TensorView::contiguous(q.data(), DType::bf16, {B, H, Lq, D});
  const TensorView kv = TensorView::contiguous(k.data(), DType::bf16, {B, Hkv, Lk, D});
  const TensorView vv = TensorView::contiguous(v.data(), DType::bf16, {B, Hkv, Lk, D});
  for (bool causal : {false, true}) {
    AttentionOptions opts;
    opts.scale = 1.0;
    if (causal) opts.causal = Causal::bottom_right;
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      std::vector<float> out(B * H * Lq * D);
      Context ctx(threads);
      attention(qv, kv, vv, OutputView::contiguous(out.data(), DType::f32, {B, H, Lq, D}), opts,
                &ctx);
      outs.push_back(out);
    }
    EXPECT_EQ(outs[0], outs[1]) << "causal " << causal;
    EXPECT_EQ(outs[0], outs[2]) << "causal " << causal;
  }
}

TEST(Concurrency, EightCallersMatchSerial) {
  const Case c{2, 8, 2, 130, 257, 64, 64};
  Inputs in(c);
  Tensor4 serial(c.B, c.H, c.Lq, c.Dv);
  attention(in.q.view(), in.k.view(), in.v.view(), serial.out_view(), in.opts);
  Context shared(2);
  std::vector<Tensor4> outs(8, Tensor4(c.B, c.H, c.Lq, c.Dv));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        attention(in.q.view(), in.k.view(), in.v.view(), outs[t].out_view(), in.opts,
                  t % 2 ? &shared : nullptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t)
    EXPECT_EQ(0, std::memcmp(outs[t].buf.data(), serial.buf.data(), serial.buf.size() * 4)) << t;
}

TEST(Allocation, SteadyStateCallsDoNotAllocate) {
  CPUATTN_SKIP_WITHOUT_ALLOC_COUNTER();
  for (Case c : {Case{2, 8, 2, 300, 300, 64, 64}, Case{1, 4, 1, 1, 5000, 64, 64}}) {
    Inputs in(c);
    Tensor4 out(c.B, c.H, c.Lq, c.Dv);
    std::vector<float> lse(c.B * c.H * c.Lq);
    in.opts.lse = f32_view(lse.data(), {c.B, c.H, c.Lq});
    for (int threads : {1, 2}) {
      Context ctx(threads);
      for (int warm = 0; warm < 3; ++warm)
        attention(in.q.view(), in.k.view(), in.v.view(), out.out_view(), in.opts, &ctx);
      const Allocations news = allocations_during([&] {
        for (int rep = 0; rep < 5; ++rep)
          attention(in.q.view(), in.k.view(), in.v.view(), out.out_view(), in.opts, &ctx);
      });
      EXPECT_EQ(news.steady_state(threads), 0)
          << c.str() << ", " << threads << " threads: " << news.plain << " plain, " << news.aligned
          << " aligned";
    }
  }
}

// The count can fail: a call larger than any before grows the thread's scratch (aligned operator
// new), and the next one of that size reuses it.
TEST(Allocation, TheCounterSeesScratchGrow) {
  CPUATTN_SKIP_WITHOUT_ALLOC_COUNTER();
  Context ctx(1);
  const auto counted_call = [&](const Case& c) {
    Inputs in(c);
    Tensor4 out(c.B, c.H, c.Lq, c.Dv);
    return allocations_during(
        [&] { attention(in.q.view(), in.k.view(), in.v.view(), out.out_view(), in.opts, &ctx); });
  };
  (void)counted_call(Case{1, 2, 2, 17, 33, 32, 32});
  const Case big{1, 2, 2, 300, 900, 96, 96};
  EXPECT_GT(counted_call(big).aligned, 0) << "a call larger than any before grew no scratch";
  EXPECT_EQ(counted_call(big).all(), 0);
}

}  // namespace
}  // namespace cpuattn::test
