// attention(): validate, choose the provider and target once, plan, run the tasks on the
// context's threads, merge split-key partial results.
#include "api/attention.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <type_traits>

#include "api/call_scope.h"
#include "api/context_impl.h"
#include "core/plan.h"
#include "core/recorder.h"
#include "kernels/flash/flash.h"

namespace cpuattn {
namespace detail {

void run_reference(const Problem& p);

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

// Runs problems that share dtypes (one call, or the sequences of a packed batch) as one set of
// tasks on the context's threads, then merges each problem's split keys.
void run_fast(const Problem* ps, std::size_t n, Context& ctx) {
  Context::Impl& c = ContextAccess::impl(ctx);
  Recorder* rec = current_recorder();
  // The one dispatch of the call: every task of it runs this provider's and target's kernels.
  const Choice& choice = choose(&ctx);
  const FlashKernels& fk = flash_kernels(choice);
  // The native bf16 unit for bf16 K/V on AVX512-BF16: with bf16 Q everywhere, and with other Q
  // dtypes for decoding steps of 2..kStreamRows query rows per K/V head (GQA, or a few positions),
  // whose scores and P V it runs on K/V in place; the other cases (one row per K/V head:
  // task-inl.h, native_pv) stay with the chosen provider.
  // The same decoding steps over int8 K/V run their P V on VNNI there (vpdpwssd: NativeBf16::
  // PvRunsI8 in bf16-inl.h; their scores are the f32 loop's, which VNNI did not speed up).
  const DType kv = ps[0].k.dtype;
  bool native_bf16 = choice.target == Target::avx512_bf16 && (kv == DType::bf16 || kv == DType::i8);
  for (std::size_t i = 0; i < n && native_bf16; ++i) {
    const std::int64_t rows = ps[i].Lq * ps[i].group;
    native_bf16 =
        (kv == DType::bf16 && ps[i].q.dtype == DType::bf16) || (rows >= 2 && rows <= kStreamRows);
  }
  const FlashTaskFn run_task = native_bf16 ? native_bf16_flash_task() : fk.run_task_f32;
  // The plans, the task offsets (problem i owns the tasks [first[i], first[i + 1])) and the
  // split-key partial results live in the call's scratch: a steady-state call does not allocate.
  static_assert(std::is_trivially_copyable_v<Plan> && alignof(Plan) <= 64);
  const auto floats_of = [](std::size_t bytes) { return (bytes + 63) / 64 * 16; };
  const std::size_t plan_floats = floats_of(n * sizeof(Plan));
  const std::size_t first_floats = floats_of((n + 1) * sizeof(std::int64_t));
  std::size_t partial_floats = 0;
  std::int64_t max_splits = 1;
  Plan local;  // sized before the scratch exists
  for (std::size_t i = 0; i < n; ++i) {
    local = make_plan(ps[i], fk.block_rows, fk.block_keys);
    if (local.k_splits > 1)
      partial_floats += static_cast<std::size_t>(ps[i].B * ps[i].H * ps[i].Lq * local.k_splits *
                                                 local.partial_row_floats);
    max_splits = std::max(max_splits, local.k_splits);
  }
  Scratch& call = c.call_scratch.local();
  const Context::Impl::Lease call_lease{c, call};
  float* base = call.get(plan_floats + first_floats + partial_floats);
  Plan* plans = reinterpret_cast<Plan*>(base);
  auto* first = reinterpret_cast<std::int64_t*>(base + plan_floats);
  float* partials = base + plan_floats + first_floats;
  first[0] = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Problem& p = ps[i];
    new (plans + i) Plan(make_plan(p, fk.block_rows, fk.block_keys));
    first[i + 1] = first[i] + plans[i].tasks;
    if (plans[i].k_splits > 1) {
      plans[i].partials = partials;
      partials += p.B * p.H * p.Lq * plans[i].k_splits * plans[i].partial_row_floats;
    }
  }
  if (rec != nullptr) {
    for (std::size_t i = 0; i < n; ++i) note_work(ps[i], *rec);
    rec->add_tasks(first[n]);
    rec->set_k_splits(max_splits);
  }
  c.run([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, first[n], 1),
        [&](const tbb::blocked_range<std::int64_t>& r) {
          Scratch& s = c.task_scratch.local();
          const Context::Impl::Lease lease{c, s};
          for (std::int64_t t = r.begin(); t < r.end(); ++t) {
            const auto i =
                static_cast<std::size_t>(std::upper_bound(first, first + n + 1, t) - first - 1);
            const TaskTimer timer(rec, t);
            run_task(ps[i], plans[i], t - first[i], s, timer.log());
          }
        },
        tbb::simple_partitioner());
    for (std::size_t i = 0; i < n; ++i)
      if (plans[i].k_splits > 1) merge_partials(ps[i], plans[i], rec);
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
