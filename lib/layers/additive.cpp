// Additive (Bahdanau) and multiplicative (Luong) attention. Both are single-head attention over
// [B, Lq] decoder states and [B, Lk] encoder states; they reuse the core kernel's validation
// (masks, key lengths, weights) by viewing their [B, L, F] tensors as [B, 1, L, F].
#include "kernels/additive/additive.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "api/call_scope.h"
#include "api/checks.h"
#include "api/context_impl.h"
#include "core/problem.h"
#include "cpuattn/layers.h"

namespace cpuattn {

using detail::fail;
using detail::shape_str;

namespace {

// [d0, d1, d2] as [d0, 1, d1, d2]: one head.
template <class P>
BasicView<P> one_head(const BasicView<P>& t) {
  BasicView<P> r = t;
  r.rank = 4;
  r.shape = {t.shape[0], 1, t.shape[1], t.shape[2]};
  r.strides = {t.strides[0], 0, t.strides[1], t.strides[2]};
  return r;
}

// A mask broadcastable to [B, Lq, Lk] (rank 1..3) as one broadcastable to [B, 1, Lq, Lk].
TensorView mask_one_head(const TensorView& m) {
  if (m.rank < 1 || m.rank > 3) {
    fail("mask " + shape_str(m) + " must have rank 1..3 (broadcastable to [B, Lq, Lk]), got rank " +
         std::to_string(m.rank));
  }
  TensorView r3 = m;
  r3.rank = 3;
  const int pad = 3 - m.rank;
  for (int d = 2; d >= 0; --d) {
    r3.shape[d] = d >= pad ? m.shape[d - pad] : 1;
    r3.strides[d] = d >= pad ? m.strides[d - pad] : 0;
  }
  return one_head(r3);
}

// Checks h, s, values, context and the weights output against each other; returns the
// validated one-head problem (q and k are given one feature column: only their B and L matter
// to the checks, the features were checked here).
struct AlignCall {
  std::int64_t B, Lq, Lk, dv;
  TensorView values;
  detail::Problem p;
};

// The mask field of the call's record (include/cpuattn/profile.h).
std::string align_mask(const AlignOptions& o) {
  AttentionOptions a;
  a.mask = o.mask;
  a.key_lengths = o.key_lengths;
  return detail::mask_description(a);
}

void check_f32(const char* name, const TensorView& t, int rank) {
  detail::check_view(name, t, rank, rank);
  detail::check_dtype(name, t, false);
  detail::extent_of(name, t);
}

AlignCall prepare(const TensorView& h, std::int64_t d_dec, const TensorView& s, std::int64_t d_enc,
                  const OutputView& context, const AlignOptions& o) {
  check_f32("h", h, 3);
  check_f32("s", s, 3);
  AlignCall c;
  c.B = h.shape[0];
  c.Lq = h.shape[1];
  c.Lk = s.shape[1];
  const std::string shapes = "h " + shape_str(h) + ", s " + shape_str(s);
  if (h.shape[2] != d_dec) {
    fail("h's last dimension must be the decoder width " + std::to_string(d_dec) + " (" + shapes +
         ")");
  }
  if (s.shape[0] != c.B || s.shape[2] != d_enc) {
    fail("s must be [" + std::to_string(c.B) + ",Lk," + std::to_string(d_enc) + "] (" + shapes +
         ")");
  }
  c.values = o.values ? *o.values : s;
  check_f32("values", c.values, 3);
  if (c.values.shape[0] != c.B || c.values.shape[1] != c.Lk) {
    fail("values " + shape_str(c.values) + " must be [" + std::to_string(c.B) + "," +
         std::to_string(c.Lk) + ",dv] (" + shapes + ")");
  }
  c.dv = c.values.shape[2];
  const TensorView ctx_in = context;
  check_f32("context", ctx_in, 3);
  if (ctx_in.shape[0] != c.B || ctx_in.shape[1] != c.Lq || ctx_in.shape[2] != c.dv) {
    fail("context " + shape_str(ctx_in) + " must be [" + std::to_string(c.B) + "," +
         std::to_string(c.Lq) + "," + std::to_string(c.dv) + "] (" + shapes + ", values " +
         shape_str(c.values) + ")");
  }
  AttentionOptions opts;
  if (o.mask) opts.mask = mask_one_head(*o.mask);
  opts.key_lengths = o.key_lengths;
  if (o.weights) {
    const TensorView w = *o.weights;
    check_f32("weights", w, 3);
    opts.weights = one_head(*o.weights);
  }
  TensorView q1 = one_head(h), k1 = one_head(s);
  q1.shape[3] = k1.shape[3] = 1;
  c.p = detail::validate(q1, k1, one_head(c.values), one_head(context), opts, false);
  detail::check_disjoint("context", detail::extent_of("context", ctx_in),
                         {{"h", detail::extent_of("h", h)}, {"s", detail::extent_of("s", s)}});
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------- additive

namespace {
std::vector<float> padded_v(const AdditiveWeights& w) {
  detail::check_view("v", w.v, 1, 1);
  detail::check_dtype("v", w.v, false);
  if (w.v.shape[0] != w.w1.shape[1]) {
    fail("v " + shape_str(w.v) + " must have one entry per attention unit, w1 " + shape_str(w.w1) +
         " has " + std::to_string(w.w1.shape[1]));
  }
  std::vector<float> v(static_cast<std::size_t>((w.v.shape[0] + 15) / 16 * 16), 0.0f);
  for (std::int64_t a = 0; a < w.v.shape[0]; ++a) {
    v[a] = static_cast<const float*>(w.v.data)[a * w.v.strides[0]];
  }
  return v;
}
}  // namespace

AdditiveAttention::AdditiveAttention(const AdditiveWeights& w)
    : l1_(w.w1, w.b1), l2_(w.w2, w.b2), v_(padded_v(w)) {
  d_dec_ = l1_.in_features();
  d_enc_ = l2_.in_features();
  a_ = l1_.out_features();
  if (l2_.out_features() != a_) {
    fail("w2 " + shape_str(w.w2) + " must have as many attention units as w1 " + shape_str(w.w1));
  }
}

std::int64_t AdditiveAttention::decoder_dim() const { return d_dec_; }
std::int64_t AdditiveAttention::encoder_dim() const { return d_enc_; }
std::int64_t AdditiveAttention::attention_dim() const { return a_; }

void AdditiveAttention::forward(const TensorView& h, const TensorView& s, const OutputView& context,
                                const AlignOptions& opts, Context* context_threads) const {
  detail::CallScope scope("additive");
  const AlignCall c = prepare(h, d_dec_, s, d_enc_, context, opts);
  Context& ctx = context_threads != nullptr ? *context_threads : default_context();
  Context::Impl& ci = detail::ContextAccess::impl(ctx);
  // E1 = h W1 + b1 and E2 = s W2 + b2, rows padded to whole vectors with zeros.
  const std::int64_t ap = static_cast<std::int64_t>(v_.size());
  detail::Scratch& layer = ci.layer_scratch.local();
  const Context::Impl::Lease layer_lease{ci, layer};
  float* e1 = layer.get(static_cast<std::size_t>((c.B * (c.Lq + c.Lk)) * ap));
  float* e2 = e1 + c.B * c.Lq * ap;
  for (std::int64_t r = 0; r < c.B * (c.Lq + c.Lk); ++r)
    std::fill(e1 + r * ap + a_, e1 + (r + 1) * ap, 0.0f);
  OutputView e1v = f32_view(e1, {c.B, c.Lq, a_});
  e1v.strides = {c.Lq * ap, ap, 1, 0};
  OutputView e2v = f32_view(e2, {c.B, c.Lk, a_});
  e2v.strides = {c.Lk * ap, ap, 1, 0};
  l1_.forward(h, e1v, &ctx);
  l2_.forward(s, e2v, &ctx);

  detail::AdditiveProblem a;
  a.p = &c.p;
  a.e1 = e1;
  a.e2 = e2;
  a.v = v_.data();
  a.a_stride = ap;
  const detail::AdditiveKernels& ak = detail::additive_kernels(detail::choose(&ctx));
  detail::Recorder* rec = detail::current_recorder();
  if (rec != nullptr) {
    // Per (query, key) pair: A adds, tanh and FMAs for the score, 2 dv for the context.
    const double pairs = static_cast<double>(c.B * c.Lq * c.Lk);
    rec->add_work(pairs * (3.0 * static_cast<double>(a_) + 2.0 * static_cast<double>(c.dv)),
                  4.0 * static_cast<double>(c.B * (c.Lq + c.Lk) * ap + c.B * c.Lk * c.dv +
                                            c.B * c.Lq * c.dv));
    rec->add_tasks(c.B * c.Lq);
  }
  ci.run([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, c.B * c.Lq, 1),
                      [&](const tbb::blocked_range<std::int64_t>& r) {
                        detail::Scratch& sc = ci.task_scratch.local();
                        const Context::Impl::Lease lease{ci, sc};
                        for (std::int64_t t = r.begin(); t < r.end(); ++t) {
                          const detail::TaskTimer timer(rec, t, Phase::additive);
                          ak.task(a, t, sc);
                        }
                      });
  });
  if (scope.active()) {
    scope.record().shapes = "h:" + detail::dims_of(h) + ";s:" + detail::dims_of(s) +
                            ";context:" + detail::dims_of(context) + ";A:" + std::to_string(a_);
    scope.record().mask = align_mask(opts);
  }
  scope.finish(ctx);
}

// ---------------------------------------------------------------------------- multiplicative

MultiplicativeAttention::MultiplicativeAttention(const TensorView& w, bool scaled)
    : w_(w), scaled_(scaled) {}

std::int64_t MultiplicativeAttention::decoder_dim() const { return w_.in_features(); }
std::int64_t MultiplicativeAttention::encoder_dim() const { return w_.out_features(); }

void MultiplicativeAttention::forward(const TensorView& h, const TensorView& s,
                                      const OutputView& context, const AlignOptions& opts,
                                      Context* context_threads) const {
  detail::CallScope scope("multiplicative");
  const std::int64_t d_dec = w_.in_features(), d_enc = w_.out_features();
  const AlignCall c = prepare(h, d_dec, s, d_enc, context, opts);
  Context& ctx = context_threads != nullptr ? *context_threads : default_context();
  // score = (h W) s^T: one product of Lq rows, then the fused kernel with one head.
  Context::Impl& ci = detail::ContextAccess::impl(ctx);
  detail::Scratch& layer = ci.layer_scratch.local();
  const Context::Impl::Lease layer_lease{ci, layer};
  float* g = layer.get(static_cast<std::size_t>(c.B * c.Lq * d_enc));
  const OutputView gv = f32_view(g, {c.B, c.Lq, d_enc});
  w_.forward(h, gv, &ctx);
  AttentionOptions ao;
  ao.scale = scaled_ ? 1.0 / std::sqrt(static_cast<double>(d_dec)) : 1.0;
  if (opts.mask) ao.mask = mask_one_head(*opts.mask);
  ao.key_lengths = opts.key_lengths;
  if (opts.weights) ao.weights = one_head(*opts.weights);
  attention(one_head(TensorView(gv)), one_head(s), one_head(c.values), one_head(context), ao, &ctx);
  if (scope.active()) {
    scope.record().shapes = "h:" + detail::dims_of(h) + ";s:" + detail::dims_of(s) +
                            ";context:" + detail::dims_of(context);
    scope.record().mask = align_mask(opts);
  }
  scope.finish(ctx);
}

}  // namespace cpuattn
