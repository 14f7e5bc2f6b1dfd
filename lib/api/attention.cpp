// attention(): validate, choose the provider and target once, plan, run the tasks on the
// context's threads, merge split-key partial results.
#include "api/attention.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <cstdint>

#include "api/context_impl.h"
#include "core/plan.h"
#include "kernels/flash/flash.h"

namespace cpuattn {
namespace detail {

void run_reference(const Problem& p);

namespace {

void run_fast(const Problem& p, Context& ctx) {
  Context::Impl& c = ContextAccess::impl(ctx);
  // The one dispatch of the call: every task of it runs this provider's and target's kernels.
  const FlashKernels& fk = flash_kernels(choose(&ctx));
  Plan pl = make_plan(p, fk.block_rows, fk.block_keys);
  Scratch& call = c.call_scratch.local();
  const Context::Impl::Lease call_lease{c, call};
  if (pl.k_splits > 1) {
    pl.partials =
        call.get(static_cast<std::size_t>(p.B * p.H * p.Lq * pl.k_splits * pl.partial_row_floats));
  }
  c.run([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, pl.tasks, 1),
        [&](const tbb::blocked_range<std::int64_t>& r) {
          Scratch& s = c.task_scratch.local();
          const Context::Impl::Lease lease{c, s};
          for (std::int64_t t = r.begin(); t < r.end(); ++t) fk.run_task_f32(p, pl, t, s);
        },
        tbb::simple_partitioner());
    if (pl.k_splits > 1) merge_partials(p, pl);
  });
}

}  // namespace

void run_attention(const Problem& p, Context& ctx) {
  if (p.weights != nullptr) {
    // Materializing [B, H, Lq, Lk] defeats fusion anyway: the weights come from the reference,
    // which computes them in double precision and writes out/lse/weights as f32.
    ContextAccess::impl(ctx).run([&] { run_reference(p); });
    return;
  }
  run_fast(p, ctx);
}

}  // namespace detail

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const OutputView& out,
               const AttentionOptions& opts, Context* context) {
  const detail::Problem p = detail::validate(q, k, v, out, opts, /*allow_f64=*/false);
  detail::run_attention(p, context != nullptr ? *context : default_context());
}

}  // namespace cpuattn
