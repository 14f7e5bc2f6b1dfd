// QK-norm and RoPE of a layer's projected queries and keys.
//
// Precision: the squares are summed in sixteen float partial sums added in double (normalize);
// angles and their sines in double, rounded to float once (as apply_rope: positions up to 2^53 stay
// exact). Each token's rows are normalized, then rotated, in one pass while the projection has just
// written them.
//
// Threads: items are tokens; a chunk computes each token's sines and cosines (once for Q and K).
// Every element is computed by the same code from the same inputs whichever chunk holds it.
#include "layers/qk_prep.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "api/checks.h"
#include "layers/for_items.h"

namespace cpuattn::detail {
namespace {

// A double sine plus cosine costs about as much as this many element updates.
constexpr double kSinCosWork = 16;

std::vector<float> norm_weight(const char* name, const std::optional<TensorView>& w,
                               std::int64_t head_dim, std::int64_t width, QkNorm mode) {
  if (!w) {
    fail(std::string("MhaWeights: ") + name + " is required with MhaConfig::qk_norm " +
         (mode == QkNorm::head ? "head" : "projection"));
  }
  check_view(name, *w, 1, 1);
  check_dtype(name, *w, false);
  extent_of(name, *w);
  const std::int64_t want = mode == QkNorm::head ? head_dim : width;
  if (w->shape[0] != want) {
    fail(std::string(name) + " " + shape_str(*w) + " must be [" + std::to_string(want) +
         "] for qk_norm " + (mode == QkNorm::head ? "head (head_dim)" : "projection"));
  }
  std::vector<float> out(static_cast<std::size_t>(want));
  const auto* p = static_cast<const float*>(w->data);
  for (std::int64_t i = 0; i < want; ++i) out[static_cast<std::size_t>(i)] = p[i * w->strides[0]];
  return out;
}

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

QkPrep::QkPrep(const MhaConfig& c, const MhaWeights& w) : D_(c.head_dim), norm_(c.qk_norm) {
  if (norm_ != QkNorm::none && norm_ != QkNorm::head && norm_ != QkNorm::projection) {
    fail("MhaConfig: qk_norm has invalid value " + std::to_string(static_cast<int>(norm_)) +
         "; expected none, head or projection");
  }
  if (norm_ == QkNorm::none) {
    if (w.q_norm || w.k_norm)
      fail("MhaWeights: q_norm / k_norm given but MhaConfig::qk_norm is none");
  } else {
    if (!std::isfinite(c.qk_norm_eps) || c.qk_norm_eps <= 0)
      fail("MhaConfig: qk_norm_eps must be finite and > 0, got " + num_str(c.qk_norm_eps));
    eps_ = c.qk_norm_eps;
    q_w_ = norm_weight("q_norm", w.q_norm, c.head_dim, c.heads * c.head_dim, norm_);
    k_w_ = norm_weight("k_norm", w.k_norm, c.head_dim, c.kv_heads * c.head_dim, norm_);
  }
  if (!c.rope) return;
  const RopeOptions& r = *c.rope;
  if (!std::isfinite(r.base) || r.base <= 1)
    fail("MhaConfig: rope.base must be finite and > 1, got " + num_str(r.base));
  if (r.style != RopeStyle::half && r.style != RopeStyle::interleaved) {
    fail("MhaConfig: rope.style has invalid value " + std::to_string(static_cast<int>(r.style)) +
         "; expected RopeStyle::half or RopeStyle::interleaved");
  }
  R_ = r.rotary_dim == 0 ? c.head_dim : r.rotary_dim;
  if (r.rotary_dim < 0 || r.rotary_dim > c.head_dim || R_ % 2 != 0) {
    fail("MhaConfig: rope.rotary_dim must be even and in [0, head_dim=" +
         std::to_string(c.head_dim) + "] (0 = head_dim), got " + std::to_string(r.rotary_dim) +
         (r.rotary_dim == 0 ? " (head_dim is odd)" : ""));
  }
  check_rope_scaling("MhaConfig: rope.scaling", r.scaling);
  rope_ = true;
  interleaved_ = r.style == RopeStyle::interleaved;
  freq_ = rope_frequencies(r, R_);
}

void QkPrep::normalize(float* x, std::int64_t width, const float* w) const {
  // Sixteen float partial sums, a fixed order the compiler keeps in vector registers (a double
  // running sum would stay scalar); each holds width / 16 squares, so its rounding error stays
  // ~(width / 16) * 2^-24 relative, and the partial sums are added in double.
  constexpr int kParts = 16;
  float part[kParts] = {};
  std::int64_t i = 0;
  for (; i + kParts <= width; i += kParts) {
    for (int k = 0; k < kParts; ++k) part[k] += x[i + k] * x[i + k];
  }
  double ss = 0;
  for (; i < width; ++i) ss += static_cast<double>(x[i]) * x[i];
  for (float p : part) ss += p;
  const auto inv = static_cast<float>(1 / std::sqrt(ss / static_cast<double>(width) + eps_));
  for (std::int64_t i = 0; i < width; ++i) x[i] = x[i] * inv * w[i];
}

// One token's row of `heads` heads: norm (per head, or over the row), then rotation.
void QkPrep::token(float* row, std::int64_t heads, const std::vector<float>& w, const float* cosv,
                   const float* sinv) const {
  if (norm_ == QkNorm::projection) normalize(row, heads * D_, w.data());
  for (std::int64_t h = 0; h < heads; ++h) {
    float* const head = row + h * D_;
    if (norm_ == QkNorm::head) normalize(head, D_, w.data());
    if (rope_) rope_rotate(head, R_ / 2, interleaved_, cosv, sinv);
  }
}

void QkPrep::apply(const std::optional<HeadRows>& q, const std::optional<HeadRows>& k,
                   std::int64_t B, std::int64_t n, Positions at, Context& ctx) const {
  if (!active()) return;
  const std::int64_t half = R_ / 2;
  const std::int64_t heads = (q ? q->heads : 0) + (k ? k->heads : 0);
  const double per_token =
      static_cast<double>(heads * D_) * 2 + (rope_ ? static_cast<double>(half) * kSinCosWork : 0);
  for_items(&ctx, B * n, per_token, [&](std::int64_t begin, std::int64_t end, Scratch& s) {
    float* const cosv = rope_ ? s.get(static_cast<std::size_t>(2 * half)) : nullptr;
    float* const sinv = rope_ ? cosv + half : nullptr;
    for (std::int64_t t = begin; t < end; ++t) {
      if (rope_) {
        const std::int64_t b = t / n, i = t % n;
        const std::int64_t first = at.per_seq != nullptr ? at.per_seq[b] : at.first;
        const std::int64_t pos = at.per_token != nullptr ? at.per_token[t] : first + i;
        rope_turns(freq_, static_cast<double>(pos), cosv, sinv);
      }
      if (q) token(q->data + t * q->stride, q->heads, q_w_, cosv, sinv);
      if (k) token(k->data + t * k->stride, k->heads, k_w_, cosv, sinv);
    }
  });
}

}  // namespace cpuattn::detail
