// The rotation frequencies of rotary position embedding, after a model's context scaling
// (RopeScaling in cpuattn/positional.h). Shared by apply_rope and the layers that rotate Q and K.
#pragma once

#include <cstdint>
#include <vector>

#include "cpuattn/positional.h"

namespace cpuattn::detail {

struct RopeFrequencies {
  std::vector<double> inv_freq;  // f'_j, j < R/2: the angle of pair j at position p is p f'_j
  double attention_factor = 1;   // m: cos and sin are multiplied by it (YaRN), else 1
};

// Throws cpuattn::Error naming `name`.<field> (e.g. "opts.scaling.factor") when a field the
// scaling type uses is out of its range.
void check_rope_scaling(const char* name, const RopeScaling& scaling);

// The frequencies of R rotated dimensions (R even, >= 2), in double precision. `opts` must have
// passed check_rope_scaling and the base check.
RopeFrequencies rope_frequencies(const RopeOptions& opts, std::int64_t R);

// m cos and m sin of every pair's angle at `position` (m: the attention factor), computed in
// double and rounded to float once: cosv, sinv [inv_freq.size()].
void rope_turns(const RopeFrequencies& f, double position, float* cosv, float* sinv);

// Turns the `half` pairs of one head in place: (j, j + half), or (2j, 2j + 1) when interleaved.
void rope_rotate(float* head, std::int64_t half, bool interleaved, const float* cosv,
                 const float* sinv);

}  // namespace cpuattn::detail
