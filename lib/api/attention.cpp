// attention(): validate, choose the provider and target once, plan, run the tasks on the
// context's threads, merge split-key partial results.
#include "api/attention.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "api/call_scope.h"
#include "api/context_impl.h"
#include "core/recorder.h"
#include "kernels/flash/flash.h"

namespace cpuattn {
namespace detail {

namespace {

// The work of a call for its record: 2 (D + Dv) flops per visible (query, key) pair and head
// (the causal, key-length and window limits; element masks count as visible), and every input read
// and output written once.
void note_work(const Problem& p, Recorder& rec) {
  double pairs = 0;
  for (std::int64_t b = 0; b < p.B; ++b) {
    if (p.causal == Causal::none && p.window_left < 0 && p.window_right < 0) {
      pairs += static_cast<double>(p.Lq) * static_cast<double>(std::min(p.Lk, p.key_end(b, 0)));
      continue;
    }
    for (std::int64_t i = 0; i < p.Lq; ++i)
      pairs += static_cast<double>(std::max<std::int64_t>(0, p.key_end(b, i) - p.key_begin(i)));
  }
  const double flops = 2.0 * static_cast<double>(p.D + p.Dv) * static_cast<double>(p.H) * pairs;
  // Bytes at each tensor's own dtype (an int8 cache reads a quarter of an f32 one, plus its
  // per-token scales), so profile's roofline and GB/s describe what the kernel really moves.
  const auto size = [](DType t) { return static_cast<double>(dtype_size(t)); };
  const double B = static_cast<double>(p.B);
  const double q_rows = B * static_cast<double>(p.H * p.Lq);
  const double kv_rows = B * static_cast<double>(p.Hkv * p.Lk);
  double bytes = q_rows * (static_cast<double>(p.D) * size(p.q.dtype) +
                           static_cast<double>(p.Dv) * size(p.out_dtype)) +
                 kv_rows * (static_cast<double>(p.D) * size(p.k.dtype) +
                            static_cast<double>(p.Dv) * size(p.v.dtype));
  if (p.k_scale != nullptr) bytes += 4.0 * kv_rows;
  if (p.v_scale != nullptr) bytes += 4.0 * kv_rows;
  rec.add_work(flops, bytes);
}

// The plans of a set of problems and where their tasks and split-key partials live, all in the
// call's scratch, so that a steady-state call does not allocate: problem i owns the tasks
// [first[i], first[i + 1]).
struct PlanSet {
  Plan* plans;
  std::int64_t* first;
  std::size_t n;
};

PlanSet plan_set(const Problem* ps, std::size_t n, const Choice& choice, void (*tweak)(Plan&),
                 Scratch& call) {
  static_assert(std::is_trivially_copyable_v<Plan> && alignof(Plan) <= 64);
  const auto floats_of = [](std::size_t bytes) { return (bytes + 63) / 64 * 16; };
  const std::size_t plan_floats = floats_of(n * sizeof(Plan));
  const std::size_t first_floats = floats_of((n + 1) * sizeof(std::int64_t));
  const auto partial_floats = [&](const Plan& pl, const Problem& p) {
    return pl.k_splits > 1
               ? static_cast<std::size_t>(p.B * p.H * p.Lq * pl.k_splits * pl.partial_row_floats)
               : 0;
  };
  // The set's tasks are shared by work (plan_flash), so that a batch cut into sequences is
  // split as one problem would be.
  const auto work = [](const Problem& p) {
    return static_cast<double>(p.B * p.H * p.Lq) * static_cast<double>(p.Lk) *
           static_cast<double>(p.D + p.Dv);
  };
  double total_work = 0;
  for (std::size_t i = 0; i < n; ++i) total_work += work(ps[i]);
  // Each problem is planned once, into the scratch; the partials' size follows from the plans.
  Plan* plans = reinterpret_cast<Plan*>(call.get(plan_floats + first_floats));
  std::size_t partials = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double share = total_work > 0 ? work(ps[i]) / total_work : 1.0;
    Plan* pl = new (plans + i) Plan(plan_flash(ps[i], choice, share));
    if (tweak != nullptr) tweak(*pl);
    partials += partial_floats(*pl, ps[i]);
  }
  const std::size_t total = plan_floats + first_floats + partials;
  if (total > call.capacity()) {
    // Growing drops the buffer's contents: the plans move out and back (a call that grows its
    // scratch allocates anyway).
    const std::vector<Plan> kept(plans, plans + n);
    plans = reinterpret_cast<Plan*>(call.get(total));
    std::copy(kept.begin(), kept.end(), plans);
  }
  float* base = reinterpret_cast<float*>(plans);
  PlanSet set{plans, reinterpret_cast<std::int64_t*>(base + plan_floats), n};
  float* next_partial = base + plan_floats + first_floats;
  set.first[0] = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Plan* pl = set.plans + i;
    set.first[i + 1] = set.first[i] + pl->tasks;
    if (pl->k_splits > 1) {
      pl->partials = next_partial;
      next_partial += partial_floats(*pl, ps[i]);
    }
  }
  return set;
}

// The call's work, tasks, key splits and path for its record.
void record_set(const Problem* ps, const PlanSet& set, Recorder& rec) {
  std::int64_t max_splits = 1;
  std::string path = path_name(set.plans[0].path);
  for (std::size_t i = 0; i < set.n; ++i) {
    note_work(ps[i], rec);
    max_splits = std::max(max_splits, set.plans[i].k_splits);
    const std::string other = path_name(set.plans[i].path);
    if (path.find(other) == std::string::npos) path += "|" + other;
  }
  rec.add_tasks(set.first[set.n]);
  rec.set_k_splits(max_splits);
  rec.set_path(path);
}

// Runs problems that share dtypes (one call, or the sequences of a packed batch) as one set of
// tasks on the context's threads, each with the unit its plan chose, then merges each problem's
// split keys (64 rows per task, timed as the merge).
void run_fast(const Problem* ps, std::size_t n, Context& ctx) {
  Context::Impl& c = ContextAccess::impl(ctx);
  Recorder* rec = current_recorder();
  // The one dispatch of the call: every task of it runs this provider's and target's kernels.
  const Choice& choice = choose(&ctx);
  Scratch& call = c.call_scratch_now();
  const Context::Impl::Lease call_lease{c, call};
  const PlanSet set = plan_set(ps, n, choice, c.plan_tweak.load(std::memory_order_relaxed), call);
  if (rec != nullptr) record_set(ps, set, *rec);
  const FlashKernels& portable = flash_kernels(choice);
  // A plan names a native unit only where the call's target has it (choose_unit), and a target
  // only where its unit is built (lib/CMakeLists.txt, dispatch.cpp).
  const FlashKernels* native = &portable;
#if CPUATTN_HAS_NATIVE_BF16_UNIT
  if (choice.target == Target::avx512_bf16) native = &native_flash_kernels();
#endif
#if CPUATTN_HAS_NATIVE_VNNI_UNIT
  if (choice.target == Target::avx512_vnni) native = &vnni_flash_kernels();
#endif
  const auto kernels = [&](std::size_t i) -> const FlashKernels& {
    return set.plans[i].path.unit != FlashUnit::portable ? *native : portable;
  };
  c.run([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, set.first[n], 1),
        [&](const tbb::blocked_range<std::int64_t>& r) {
          Scratch& s = c.task_scratch.local();
          const Context::Impl::Lease lease{c, s};
          for (std::int64_t t = r.begin(); t < r.end(); ++t) {
            const auto i = static_cast<std::size_t>(
                std::upper_bound(set.first, set.first + n + 1, t) - set.first - 1);
            const TaskTimer timer(rec, t);
            kernels(i).run_task(ps[i], set.plans[i], t - set.first[i], s, timer.log());
          }
        },
        tbb::simple_partitioner());
    for (std::size_t i = 0; i < n; ++i) {
      if (set.plans[i].k_splits == 1) continue;
      const Problem& p = ps[i];
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, p.B * p.H * p.Lq, 64),
                        [&](const tbb::blocked_range<std::int64_t>& r) {
                          Scratch& s = c.task_scratch.local();
                          const Context::Impl::Lease lease{c, s};
                          const TaskTimer timer(rec, r.begin() / 64, Phase::merge);
                          kernels(i).merge_rows(p, set.plans[i], r.begin(), r.end(), s);
                        });
    }
  });
}

}  // namespace

void run_fast_set(const Problem* ps, std::size_t n, Context& ctx) {
  if (n > 0) run_fast(ps, n, ctx);
}

void run_attention(const Problem& p, Context& ctx) {
  if (p.weights != nullptr) {
    // Materializing [B, H, Lq, Lk] defeats fusion anyway: the weights come from the reference,
    // which computes them in double precision and writes out/lse/weights as f32.
    Recorder* rec = current_recorder();
    if (rec != nullptr) note_work(p, *rec);
    ContextAccess::impl(ctx).run([&] {
      const TaskTimer timer(rec, 0, Phase::reference);
      run_reference(p);
    });
    return;
  }
  run_fast(&p, 1, ctx);
}

}  // namespace detail

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const OutputView& out,
               const AttentionOptions& opts, Context* context) {
  detail::CallScope scope("attention");
  const detail::Problem p = detail::validate(q, k, v, out, opts, /*allow_f64=*/false);
  Context& ctx = context != nullptr ? *context : default_context();
  scope.set_dtypes(q.dtype, k.dtype, out.dtype);
  if (scope.active()) {
    scope.record().shapes = "q:" + detail::dims_of(q) + ";k:" + detail::dims_of(k) +
                            ";v:" + detail::dims_of(v) + ";out:" + detail::dims_of(out);
    scope.record().mask = detail::mask_description(opts);
  }
  detail::run_attention(p, ctx);
  scope.finish(ctx);
}

}  // namespace cpuattn
