// The fused attention of an already validated problem, for entry points that validate first and
// compute later (the layers).
#pragma once

#include <cstddef>
#include <cstdint>
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

// A packed (varlen) call cut into one problem per sequence: those with queries and keys, those
// with queries but no keys; offsets_q are cu_seqlens_q's values.
struct Packed {
  std::vector<Problem> run, empty;
  std::vector<std::int64_t> offsets_q;
};

// Validates attention_varlen(q, k, v, out, cu_q, cu_k, opts) (f64 tensors with allow_f64, for the
// reference) without running it; the messages name the offsets cu_q_name and cu_k_name.
Packed validate_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const OutputView& out, const TensorView& cu_q, const TensorView& cu_k,
                       const AttentionOptions& opts, bool allow_f64,
                       const char* cu_q_name = "cu_seqlens_q",
                       const char* cu_k_name = "cu_seqlens_k");

// Runs a validated packed call on the fast path.
void run_varlen(const Packed& packed, Context& ctx);

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
