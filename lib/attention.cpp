// The fast path's driver: validate, pick the kernels once, cut the call into tasks, run them on
// the context's threads, merge split-key partial results.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>

#include "context_impl.h"
#include "kernel.h"

namespace cpuattn {
namespace detail {

void run_reference(const Problem& p);

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Enough tasks to balance this machine's cores (4 per hardware thread, at least 16). It depends on
// the machine, never on the thread count of a call, so results do not change with it.
std::int64_t target_tasks() {
  static const std::int64_t n = std::max<std::int64_t>(
      16, 4 * static_cast<std::int64_t>(std::thread::hardware_concurrency()));
  return n;
}

// Keys below which splitting the key range is not worth a merge.
constexpr std::int64_t kMinKeysPerSplit = 512;

// Outputs larger than this are written with non-temporal stores. An output 4x the 2 MiB L2 of a
// core cannot stay in L2 for whatever reads it next, and a plain store first reads each line
// for ownership: S1's 12.6 MB output costs 5% of its time that way (measured: 169-172 ->
// 179-181 GFLOP/s). Smaller outputs keep plain stores, so a consumer finds them in cache.
constexpr std::int64_t kStreamOutBytes = std::int64_t{8} << 20;

Plan make_plan(const Problem& p, const KernelInfo& ki) {
  Plan pl;
  pl.heads_per_block = std::min(p.group, ki.block_rows);
  pl.pos_per_block = std::max<std::int64_t>(1, ki.block_rows / pl.heads_per_block);
  pl.rows = pl.heads_per_block * pl.pos_per_block;
  pl.head_splits = ceil_div(p.group, pl.heads_per_block);
  pl.q_blocks = ceil_div(p.Lq, pl.pos_per_block);
  const std::int64_t units = p.B * p.Hkv * pl.head_splits;
  // Few tasks per head keep K/V packing amortized over many query blocks; more only to balance.
  const std::int64_t want_chunks =
      std::clamp(ceil_div(target_tasks(), units), std::int64_t{1}, pl.q_blocks);
  pl.blocks_per_chunk = ceil_div(pl.q_blocks, want_chunks);
  pl.q_chunks = ceil_div(pl.q_blocks, pl.blocks_per_chunk);
  // Short query ranges (decoding) leave too few tasks: split the keys and merge afterwards.
  std::int64_t splits = 1;
  if (units * pl.q_chunks < target_tasks()) {
    splits =
        std::min(ceil_div(target_tasks(), units * pl.q_chunks), ceil_div(p.Lk, kMinKeysPerSplit));
    splits = std::max<std::int64_t>(splits, 1);
  }
  pl.keys_per_split = ceil_div(ceil_div(p.Lk, splits), ki.block_keys) * ki.block_keys;
  pl.k_splits = ceil_div(p.Lk, pl.keys_per_split);
  pl.tasks = units * pl.q_chunks * pl.k_splits;
  pl.partial_row_floats = p.Dv + 2;
  pl.stream_out = pl.k_splits == 1 && p.B * p.H * p.Lq * p.Dv * 4 > kStreamOutBytes;
  return pl;
}

// Combines the k_splits partial results of each row in a fixed order (split 0, 1, ...).
void merge_partials(const Problem& p, const Plan& pl) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, p.B * p.H * p.Lq, 64),
      [&](const tbb::blocked_range<std::int64_t>& range) {
        for (std::int64_t row = range.begin(); row < range.end(); ++row) {
          const std::int64_t i = row % p.Lq, h = (row / p.Lq) % p.H, b = row / (p.Lq * p.H);
          float mx = neg_inf;
          for (std::int64_t s = 0; s < pl.k_splits; ++s) {
            const float m = partial_row(p, pl, b, h, i, s)[0];
            if (std::isnan(m) || std::isnan(mx)) {
              mx = std::numeric_limits<float>::quiet_NaN();
            } else {
              mx = std::max(mx, m);
            }
          }
          float* dst =
              static_cast<float*>(p.out) + b * p.out_s[0] + h * p.out_s[1] + i * p.out_s[2];
          if (mx == neg_inf) {
            std::fill(dst, dst + p.Dv, 0.0f);
            if (p.lse)
              static_cast<float*>(p.lse)[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] =
                  neg_inf;
            continue;
          }
          float l = 0;
          for (std::int64_t d = 0; d < p.Dv; ++d) dst[d] = 0.0f;
          for (std::int64_t s = 0; s < pl.k_splits; ++s) {
            const float* src = partial_row(p, pl, b, h, i, s);
            if (src[0] == neg_inf) continue;
            const float w = std::exp2(src[0] - mx);
            l += src[1] * w;
            for (std::int64_t d = 0; d < p.Dv; ++d) dst[d] += src[2 + d] * w;
          }
          const float inv = 1.0f / l;
          for (std::int64_t d = 0; d < p.Dv; ++d) dst[d] *= inv;
          if (p.lse) {
            static_cast<float*>(p.lse)[b * p.lse_s[0] + h * p.lse_s[1] + i * p.lse_s[2]] =
                (mx + std::log2(l)) * 0.6931471805599453f;
          }
        }
      });
}

}  // namespace

void run_fast(const Problem& p, Context& ctx) {
  Context::Impl& c = detail::ContextAccess::impl(ctx);
  // The one dispatch of the call: every task of it runs this target's kernels.
  const KernelInfo& ki = kernels_for(c.max_target.load());
  Plan pl = make_plan(p, ki);
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
          for (std::int64_t t = r.begin(); t < r.end(); ++t) ki.run_task(p, pl, t, s);
        },
        tbb::simple_partitioner());
    if (pl.k_splits > 1) merge_partials(p, pl);
  });
}

void run_unfused(const Problem& p, Context& ctx) {
  Context::Impl& c = detail::ContextAccess::impl(ctx);
  const KernelInfo& ki = kernels_for(c.max_target.load());
  c.run([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, p.B * p.H, 1),
                      [&](const tbb::blocked_range<std::int64_t>& r) {
                        Scratch& s = c.task_scratch.local();
                        const Context::Impl::Lease lease{c, s};
                        for (std::int64_t bh = r.begin(); bh < r.end(); ++bh) {
                          ki.run_unfused_head(p, bh / p.H, bh % p.H, s);
                        }
                      });
  });
}

}  // namespace detail

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const OutputView& out,
               const AttentionOptions& opts, Context* context) {
  const detail::Problem p = detail::validate(q, k, v, out, opts, /*allow_f64=*/false);
  Context& ctx = context != nullptr ? *context : default_context();
  if (p.weights != nullptr) {
    // Materializing [B, H, Lq, Lk] defeats fusion anyway: the weights come from the reference,
    // which computes them in double precision and writes out/lse/weights as f32.
    detail::ContextAccess::impl(ctx).run([&] { detail::run_reference(p); });
    return;
  }
  detail::run_fast(p, ctx);
}

}  // namespace cpuattn
