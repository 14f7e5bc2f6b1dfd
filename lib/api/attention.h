// The fused attention of an already validated problem, for entry points that validate first and
// compute later (the layers).
#pragma once

#include "core/problem.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// Runs `p` (from validate()) on the context: the fused fast path, or the double-precision
// reference when p asks for the attention weights.
void run_attention(const Problem& p, Context& ctx);

}  // namespace cpuattn::detail
