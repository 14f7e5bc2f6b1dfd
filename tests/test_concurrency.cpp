// Many threads sharing one Context, calling every entry point at once: serially-equal results
// (bitwise), no data race. CI runs these under ThreadSanitizer (`tools/check tsan`, against a
// oneTBB built with TSan by tools/scripts/tbb-tsan), and in every other build as ordinary tests.
//
// Each "job" is one call of one entry point on its own inputs and outputs; a run executes every
// job once serially to get the expected bytes, then many times from several threads at once.
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cpuattn/layers.h"
#include "cpuattn/positional.h"
#include "cpuattn/profile.h"
#include "test_util.h"

namespace cpuattn::test {
namespace {

// One call with owned inputs; run() writes `out` and returns nothing else.
struct Job {
  std::string name;
  std::function<void(Context*, std::vector<float>&)> run;
  std::size_t out_size;
};

std::vector<Job> make_jobs() {
  std::vector<Job> jobs;
  // attention: causal, GQA, key lengths, odd sizes; and a decode shape with split keys.
  {
    auto q = std::make_shared<std::vector<float>>(random_floats(2 * 4 * 37 * 24, 11));
    auto k = std::make_shared<std::vector<float>>(random_floats(2 * 2 * 53 * 24, 12));
    auto v = std::make_shared<std::vector<float>>(random_floats(2 * 2 * 53 * 20, 13));
    auto lens = std::make_shared<std::vector<std::int32_t>>(std::vector<std::int32_t>{53, 41});
    jobs.push_back({"attention",
                    [=](Context* c, std::vector<float>& out) {
                      AttentionOptions o;
                      o.causal = Causal::bottom_right;
                      o.key_lengths = TensorView::contiguous(lens->data(), DType::i32, {2});
                      attention(f32_view(q->data(), {2, 4, 37, 24}),
                                f32_view(k->data(), {2, 2, 53, 24}),
                                f32_view(v->data(), {2, 2, 53, 20}),
                                f32_view(out.data(), {2, 4, 37, 20}), o, c);
                    },
                    2 * 4 * 37 * 20});
    auto kd = std::make_shared<std::vector<float>>(random_floats(1 * 2 * 3000 * 16, 14));
    auto qd = std::make_shared<std::vector<float>>(random_floats(1 * 4 * 1 * 16, 15));
    jobs.push_back({"attention decode",
                    [=](Context* c, std::vector<float>& out) {
                      const TensorView kv = f32_view(kd->data(), {1, 2, 3000, 16});
                      attention(f32_view(qd->data(), {1, 4, 1, 16}), kv, kv,
                                f32_view(out.data(), {1, 4, 1, 16}), {}, c);
                    },
                    4 * 16});
  }
  // Linear.
  {
    auto w = std::make_shared<std::vector<float>>(random_floats(40 * 70, 21));
    auto x = std::make_shared<std::vector<float>>(random_floats(3 * 33 * 40, 22));
    auto lin = std::make_shared<Linear>(f32_view(w->data(), {40, 70}));
    jobs.push_back(
        {"linear",
         [=](Context* c, std::vector<float>& out) {
           lin->forward(f32_view(x->data(), {3, 33, 40}), f32_view(out.data(), {3, 33, 70}), c);
         },
         3 * 33 * 70});
  }
  // MultiHeadAttention: self (causal), cross, and decode with a cache per call.
  {
    const std::int64_t dm = 32;
    auto w = std::make_shared<std::vector<float>>(random_floats(4 * dm * dm, 31));
    auto x = std::make_shared<std::vector<float>>(random_floats(2 * 19 * dm, 32));
    auto xkv = std::make_shared<std::vector<float>>(random_floats(2 * 27 * dm, 33));
    const float* wp = w->data();
    auto mha = std::make_shared<MultiHeadAttention>(
        MhaConfig{dm, 4, 2, 8, 8},
        MhaWeights{f32_view(wp, {dm, 32}), f32_view(wp + dm * dm, {dm, 16}),
                   f32_view(wp + 2 * dm * dm, {dm, 16}), f32_view(wp + 3 * dm * dm, {32, dm})});
    jobs.push_back(
        {"mha forward",
         [=](Context* c, std::vector<float>& out) {
           AttentionOptions o;
           o.causal = Causal::top_left;
           mha->forward(f32_view(x->data(), {2, 19, dm}), f32_view(out.data(), {2, 19, dm}), o, c);
         },
         2 * 19 * dm});
    jobs.push_back({"mha cross",
                    [=](Context* c, std::vector<float>& out) {
                      mha->forward_cross(f32_view(x->data(), {2, 19, dm}),
                                         f32_view(xkv->data(), {2, 27, dm}),
                                         f32_view(out.data(), {2, 19, dm}), {}, c);
                    },
                    2 * 19 * dm});
    // The 19 tokens of x in steps of up to 5: step(x rows, out rows) for each.
    const auto in_steps = [=](std::vector<float>& out, const auto& step) {
      for (std::int64_t t = 0; t < 19; t += 5) {
        const std::int64_t n = std::min<std::int64_t>(5, 19 - t);
        TensorView xs = f32_view(x->data() + t * dm, {2, n, dm});
        xs.strides = {19 * dm, dm, 1, 0};
        OutputView os = f32_view(out.data() + t * dm, {2, n, dm});
        os.strides = {19 * dm, dm, 1, 0};
        step(xs, os);
      }
    };
    jobs.push_back({"mha decode",
                    [=](Context* c, std::vector<float>& out) {
                      // A cache per call (per thread): caches are not shared between threads.
                      KvCache cache = mha->make_cache(2, 4, /*growable=*/true);
                      in_steps(out, [&](const TensorView& xs, const OutputView& os) {
                        mha->decode(xs, cache, os, {}, c);
                      });
                    },
                    2 * 19 * dm});
    jobs.push_back(
        {"mha paged decode",
         [=](Context* c, std::vector<float>& out) {
           // A paged cache per call, two sequences of pages of 4 tokens; then the
           // pages of both as one paged attention() against the last step's queries.
           PagedKvCache cache = mha->make_paged_cache(16, 4);
           const std::vector<std::int64_t> seqs = {cache.add_sequence(), cache.add_sequence()};
           in_steps(out, [&](const TensorView& xs, const OutputView& os) {
             mha->decode(xs, cache, seqs, os, {}, c);
           });
           std::vector<float> q(2 * 4 * 1 * 8, 0.5f);
           attention(f32_view(q.data(), {2, 4, 1, 8}), cache.batch(seqs),
                     f32_view(out.data() + 2 * 19 * dm, {2, 4, 1, 8}), {}, c);
         },
         2 * 19 * dm + 2 * 4 * 8});
  }
  // Additive and multiplicative attention.
  {
    const std::int64_t dd = 12, de = 10, A = 9;
    auto w1 = std::make_shared<std::vector<float>>(random_floats(dd * A, 41));
    auto w2 = std::make_shared<std::vector<float>>(random_floats(de * A, 42));
    auto va = std::make_shared<std::vector<float>>(random_floats(A, 43));
    auto wm = std::make_shared<std::vector<float>>(random_floats(dd * de, 44));
    auto h = std::make_shared<std::vector<float>>(random_floats(2 * 7 * dd, 45));
    auto s = std::make_shared<std::vector<float>>(random_floats(2 * 15 * de, 46));
    auto add = std::make_shared<AdditiveAttention>(AdditiveWeights{
        f32_view(w1->data(), {dd, A}), f32_view(w2->data(), {de, A}), f32_view(va->data(), {A})});
    auto mul = std::make_shared<MultiplicativeAttention>(f32_view(wm->data(), {dd, de}));
    jobs.push_back({"additive",
                    [=](Context* c, std::vector<float>& out) {
                      add->forward(f32_view(h->data(), {2, 7, dd}),
                                   f32_view(s->data(), {2, 15, de}),
                                   f32_view(out.data(), {2, 7, de}), {}, c);
                    },
                    2 * 7 * de});
    jobs.push_back({"multiplicative",
                    [=](Context* c, std::vector<float>& out) {
                      mul->forward(f32_view(h->data(), {2, 7, dd}),
                                   f32_view(s->data(), {2, 15, de}),
                                   f32_view(out.data(), {2, 7, de}), {}, c);
                    },
                    2 * 7 * de});
  }
  // Positional encodings (in place on the output, from fixed inputs).
  {
    auto x = std::make_shared<std::vector<float>>(random_floats(2 * 3 * 41 * 16, 51));
    jobs.push_back({"rope + sinusoidal",
                    [=](Context* c, std::vector<float>& out) {
                      out = *x;
                      apply_rope(f32_view(out.data(), {2, 3, 41, 16}), 7, {}, c);
                      add_sinusoidal(f32_view(out.data(), {6, 41, 16}), 3, 10000.0, c);
                    },
                    2 * 3 * 41 * 16});
  }
  return jobs;
}

// Expected outputs: every job once, serially, on a fresh single-threaded context.
std::vector<std::vector<float>> serial_results(const std::vector<Job>& jobs) {
  Context serial(1);
  std::vector<std::vector<float>> want;
  for (const Job& j : jobs) {
    std::vector<float> out(j.out_size, 0.0f);
    j.run(&serial, out);
    want.push_back(std::move(out));
  }
  return want;
}

// `threads` std::threads each run every job `reps` times (in an order of their own) on `ctx`,
// and compare each result with the serial one.
void hammer(const std::vector<Job>& jobs, const std::vector<std::vector<float>>& want, Context* ctx,
            int threads, int reps) {
  std::atomic<int> mismatches{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int r = 0; r < reps; ++r) {
        for (std::size_t i = 0; i < jobs.size(); ++i) {
          const std::size_t j = (i + static_cast<std::size_t>(t) * 3) % jobs.size();
          std::vector<float> out(jobs[j].out_size, 0.0f);
          jobs[j].run(ctx, out);
          if (out != want[j]) ++mismatches;
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Concurrency, ThreadsShareAContextWithItsOwnArena) {
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  Context shared(2);
  hammer(jobs, want, &shared, 4, 2);
}

// More callers than the arena has slots: steps are handed to arena threads that may be waiting
// inside calls of their own (Context::Impl::run_for_caller).
TEST(Concurrency, ManyMoreCallersThanThreads) {
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  Context shared(2);
  hammer(jobs, want, &shared, 16, 3);
}

TEST(Concurrency, ThreadsShareAContextOnTheirOwnArenas) {
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  Context shared(0);
  hammer(jobs, want, &shared, 4, 2);
}

// Recording on (phases and spans) while threads share a context: every call is recorded once,
// and the per-thread logs of concurrent calls stay apart (TSan checks the rest).
TEST(Concurrency, CallsAreRecordedWhileThreadsShareAContext) {
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  // How many records one serial round makes (a decode job makes several calls; positional
  // encodings make none).
  std::size_t per_round = 0;
  {
    ProfileSession session;
    serial_results(jobs);
    per_round = session.take().size();
  }
  ASSERT_GT(per_round, jobs.size() / 2);
  for (int threads : {0, 2}) {
    Context shared(threads);
    std::vector<CallProfile> calls;
    {
      ProfileSession session(/*spans=*/true);
      hammer(jobs, want, &shared, 4, 2);
      calls = session.take();
    }
    EXPECT_EQ(calls.size(), 4 * 2 * per_round) << "threads " << threads;
    for (const CallProfile& c : calls) {
      EXPECT_TRUE(c.has_phases) << c.op;
      EXPECT_GT(c.wall_ms, 0) << c.op;
    }
  }
}

TEST(Concurrency, DefaultContextFirstUseFromManyThreads) {
  // The default context is created by whichever thread gets there first; all must agree on it.
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  std::vector<std::thread> pool;
  std::vector<Context*> seen(4, nullptr);
  for (int t = 0; t < 4; ++t) pool.emplace_back([&, t] { seen[t] = &default_context(); });
  for (std::thread& th : pool) th.join();
  for (Context* c : seen) EXPECT_EQ(c, &default_context());
  hammer(jobs, want, nullptr, 3, 1);
}

TEST(Concurrency, CallsFromInsideTheCallersParallelFor) {
  // A service's own parallel loop over requests, each request a call on the shared context: the
  // isolation in Context::Impl::run keeps a waiting thread from taking another request's call in
  // the middle of its own (which would reuse its per-call scratch underneath it).
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  for (int threads : {0, 2}) {
    Context shared(threads);
    std::atomic<int> mismatches{0};
    tbb::task_arena service(2);
    service.execute([&] {
      tbb::parallel_for(std::size_t{0}, 3 * jobs.size(), [&](std::size_t i) {
        const std::size_t j = i % jobs.size();
        std::vector<float> out(jobs[j].out_size, 0.0f);
        jobs[j].run(&shared, out);
        if (out != want[j]) ++mismatches;
      });
    });
    EXPECT_EQ(mismatches.load(), 0) << "threads " << threads;
  }
}

TEST(Concurrency, SetMaxTargetWhileOthersCall) {
  // Changing the cap concurrently is allowed: each call resolves its target once, at its start,
  // and every target gives a correct (if not bitwise equal) result. Compare with the reference's
  // tolerance instead of bytes.
  const auto q = random_floats(2 * 3 * 29 * 16, 61);
  std::vector<float> want(q.size());
  const TensorView qv = f32_view(q.data(), {2, 3, 29, 16});
  reference_attention(qv, qv, qv, f32_view(want.data(), {2, 3, 29, 16}));
  Context shared(2);
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    const auto targets = machine_targets();
    for (std::size_t i = 0; !stop.load(); ++i) shared.set_max_target(targets[i % targets.size()]);
  });
  std::vector<std::thread> pool;
  std::atomic<int> bad{0};
  for (int t = 0; t < 3; ++t) {
    pool.emplace_back([&] {
      for (int r = 0; r < 20; ++r) {
        std::vector<float> out(q.size());
        attention(qv, qv, qv, f32_view(out.data(), {2, 3, 29, 16}), {}, &shared);
        for (std::size_t i = 0; i < out.size(); ++i)
          if (!(std::abs(out[i] - want[i]) <= 1e-5f)) ++bad;
      }
    });
  }
  for (std::thread& th : pool) th.join();
  stop = true;
  flipper.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Concurrency, ScratchLimitChangesWhileOthersCall) {
  const auto jobs = make_jobs();
  const auto want = serial_results(jobs);
  Context shared(2);
  std::atomic<bool> stop{false};
  std::thread limiter([&] {
    for (std::size_t i = 0; !stop.load(); ++i) shared.set_scratch_limit(i % 2 ? 0 : SIZE_MAX);
  });
  hammer(jobs, want, &shared, 3, 1);
  stop = true;
  limiter.join();
}

}  // namespace
}  // namespace cpuattn::test
