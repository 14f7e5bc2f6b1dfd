// Additive (Bahdanau) attention after its projections: the problem the layer's driver
// (layers/additive.cpp) hands to its per-target kernel (additive-inl.h), and the kernel table.
#pragma once

#include <cstdint>

#include "core/problem.h"
#include "core/scratch.h"
#include "dispatch/dispatch.h"

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

struct AdditiveKernels {
  // Task t = one query row (b = t / Lq, i = t % Lq).
  void (*task)(const AdditiveProblem&, std::int64_t t, Scratch&);
};

const AdditiveKernels& additive_kernels(const Choice& choice);

}  // namespace cpuattn::detail

CPUATTN_DECLARE_UNIT_TABLES(AdditiveKernels, GetAdditiveKernels)
