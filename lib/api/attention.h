// The fused attention of an already validated problem, for entry points that validate first and
// compute later (the layers).
#pragma once

#include <cstddef>

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

// The double-precision reference of one validated problem.
void run_reference(const Problem& p);

}  // namespace cpuattn::detail
