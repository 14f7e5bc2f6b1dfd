// What a layer does to its projected queries and keys before attention: QK-norm (RMSNorm per
// head or over the projection) and the rotary embedding (MhaConfig::qk_norm, MhaConfig::rope).
// One pass over each token's rows while they are still in cache from the projection.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cpuattn/layers.h"
#include "layers/rope_frequencies.h"

namespace cpuattn::detail {

// Rows of one projected tensor: token t's `heads` heads of head_dim floats at data + t * stride.
struct HeadRows {
  float* data;
  std::int64_t stride, heads;
};

class QkPrep {
 public:
  QkPrep() = default;
  // Validates the configuration's rope and qk_norm and the norm weights (Errors name them).
  QkPrep(const MhaConfig& c, const MhaWeights& w);

  bool active() const { return norm_ != QkNorm::none || rope_; }
  bool rotates() const { return rope_; }

  // Where the tokens are: token t = b * n + i at position per_token[t] when given (explicit
  // position ids, checked < 2^53 by the caller), else (per_seq ? per_seq[b] : first) + i. Cache
  // lengths stay below 2^40 tokens (KvCache, PagedKvCache), so positions are exact in double.
  struct Positions {
    std::int64_t first = 0;
    const std::int64_t* per_seq = nullptr;
    const std::int64_t* per_token = nullptr;
  };

  // Normalizes and rotates the rows of q and k (either may be absent) of B x n tokens. Results
  // do not depend on the thread count.
  void apply(const std::optional<HeadRows>& q, const std::optional<HeadRows>& k, std::int64_t B,
             std::int64_t n, Positions at, Context& ctx) const;

 private:
  void token(float* row, std::int64_t heads, const std::vector<float>& w, const float* cosv,
             const float* sinv) const;
  void normalize(float* x, std::int64_t width, const float* w) const;

  std::int64_t D_ = 0;
  QkNorm norm_ = QkNorm::none;
  double eps_ = 0;
  std::vector<float> q_w_, k_w_;
  bool rope_ = false;
  bool interleaved_ = false;
  std::int64_t R_ = 0;
  RopeFrequencies freq_;
};

}  // namespace cpuattn::detail
