// Interface between the additive-attention driver (additive.cpp) and its per-target kernel
// (layers-inl.h).
#pragma once

#include <cstdint>

#include "problem.h"

namespace cpuattn::detail {

// Bahdanau attention after both projections: E1 = h W1 + b1 [B*Lq rows], E2 = s W2 + b2
// [B*Lk rows], each row `a_stride` floats with zeros past A (so are v's), so the tanh-and-dot
// runs over whole vectors: the padding adds v 0 * tanh(0) = 0.
struct AdditiveProblem {
  const Problem* p = nullptr;  // H = 1: values, context, mask, key lengths, weights
  const float* e1 = nullptr;
  const float* e2 = nullptr;
  const float* v = nullptr;   // any alignment
  std::int64_t a_stride = 0;  // A rounded up to 16
};

}  // namespace cpuattn::detail
