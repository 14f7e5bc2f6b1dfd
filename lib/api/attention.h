// The fused attention of an already validated problem, for entry points that validate first and
// compute later (the layers).
#pragma once

#include <cstddef>
#include <vector>

#include "core/problem.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// Runs `p` (from validate()) on the context: the fused fast path, or the double-precision
// reference when p asks for the attention weights.
void run_attention(const Problem& p, Context& ctx);

// Runs n problems with the same dtypes and no weights output (the sequences of a packed batch) on
// the fast path as one set of tasks.
void run_fast_set(const Problem* ps, std::size_t n, Context& ctx);

// Writes the rows of a problem that has no keys (Lk = 0): out 0, lse the sink's (or -inf).
void write_empty(const Problem& p);

// Validates attention(q, kv, out, opts) over a paged cache without running it (for layers that
// must check a whole step before they change anything).
void check_paged(const TensorView& q, const PagedKv& kv, const OutputView& out,
                 const AttentionOptions& opts);

// A paged call cut into one problem per sequence: those with keys, and those without.
struct PagedProblems {
  std::vector<Problem> run, empty;
};

// The calling thread's lists for paged calls, reused (their capacity kept, so a steady decode
// step allocates nothing). A caller's lists must not change while its call waits for its tasks:
// code that may run on another thread than its caller's (Context::Impl::run_for_caller) takes
// them on the caller's thread first.
PagedProblems& paged_problems_of_this_thread();

// attention(q, kv, out, opts) over a paged cache on ctx, cut into `lists`.
void run_paged(const TensorView& q, const PagedKv& kv, const OutputView& out,
               const AttentionOptions& opts, Context& ctx, PagedProblems& lists);

// The double-precision reference of one validated problem.
void run_reference(const Problem& p);

}  // namespace cpuattn::detail
