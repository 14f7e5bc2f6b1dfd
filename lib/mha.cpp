// MultiHeadAttention and KvCache: projections by Linear, heads by strides, the fused kernel.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "checks.h"
#include "context_impl.h"
#include "cpuattn/layers.h"
#include "problem.h"

namespace cpuattn {

using detail::fail;
using detail::shape_str;

namespace {

std::string dims_str(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  for (std::int64_t d : dims) s += (s.size() > 1 ? "," : "") + std::to_string(d);
  return s + "]";
}

void check_f32(const char* name, const TensorView& t, int rank) {
  detail::check_view(name, t, rank, rank);
  detail::check_dtype(name, t, false);
  detail::extent_of(name, t);
}

}  // namespace

// ----------------------------------------------------------------------------------- KvCache

struct KvCache::Storage {
  std::int64_t B, Hkv, D, Dv, capacity, length = 0;
  bool growable;
  std::vector<float> k, v;  // [B, Hkv, capacity, D] and [.., Dv]

  void grow_to(std::int64_t cap) {
    std::vector<float> nk(static_cast<std::size_t>(B * Hkv * cap * D));
    std::vector<float> nv(static_cast<std::size_t>(B * Hkv * cap * Dv));
    for (std::int64_t bh = 0; bh < B * Hkv; ++bh) {
      std::copy_n(k.begin() + bh * capacity * D, length * D, nk.begin() + bh * cap * D);
      std::copy_n(v.begin() + bh * capacity * Dv, length * Dv, nv.begin() + bh * cap * Dv);
    }
    k.swap(nk);
    v.swap(nv);
    capacity = cap;
  }

  // Room for n more tokens, or an error that changes nothing.
  void make_room(std::int64_t n) {
    if (n > capacity - length) {
      if (!growable) {
        fail("KV cache is full: " + std::to_string(length) + " cached + " + std::to_string(n) +
             " new tokens > capacity " + std::to_string(capacity) +
             " (a fixed-capacity cache; construct it growable or reserve() more)");
      }
      grow_to(std::max(2 * capacity, length + n));
    }
  }

  // Copies token rows [B, Hkv, n, width] (strides over b, h, l) to positions length.. of `dst`.
  void store(const TensorView& t, std::vector<float>& dst, std::int64_t width) {
    const auto* src = static_cast<const float*>(t.data);
    const std::int64_t n = t.shape[2];
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < Hkv; ++h) {
        for (std::int64_t l = 0; l < n; ++l) {
          std::memcpy(&dst[((b * Hkv + h) * capacity + length + l) * width],
                      src + b * t.strides[0] + h * t.strides[1] + l * t.strides[2],
                      sizeof(float) * width);
        }
      }
    }
  }

  TensorView view(const std::vector<float>& buf, std::int64_t width, std::int64_t len) const {
    TensorView t = f32_view(buf.data(), {B, Hkv, len, width});
    t.strides = {Hkv * capacity * width, capacity * width, width, 1};
    return t;
  }
};

KvCache::KvCache(std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                 std::int64_t value_dim, std::int64_t capacity, bool growable) {
  const std::string dims =
      "batch=" + std::to_string(batch) + ", kv_heads=" + std::to_string(kv_heads) +
      ", head_dim=" + std::to_string(head_dim) + ", value_dim=" + std::to_string(value_dim) +
      ", capacity=" + std::to_string(capacity);
  if (batch < 1 || kv_heads < 1 || head_dim < 1 || value_dim < 1 || capacity < 1) {
    fail("KvCache: every size must be >= 1 (" + dims + ")");
  }
  std::int64_t total = 0;
  if (__builtin_mul_overflow(batch * kv_heads, capacity * std::max(head_dim, value_dim), &total) ||
      total > (std::int64_t{1} << 40)) {
    fail("KvCache: too large (" + dims + ")");
  }
  s_ = std::make_unique<Storage>(
      Storage{batch, kv_heads, head_dim, value_dim, 0, 0, growable, {}, {}});
  s_->grow_to(capacity);
}

KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

std::int64_t KvCache::batch() const { return s_->B; }
std::int64_t KvCache::kv_heads() const { return s_->Hkv; }
std::int64_t KvCache::head_dim() const { return s_->D; }
std::int64_t KvCache::value_dim() const { return s_->Dv; }
std::int64_t KvCache::length() const { return s_->length; }
std::int64_t KvCache::capacity() const { return s_->capacity; }
bool KvCache::growable() const { return s_->growable; }

void KvCache::reserve(std::int64_t capacity) {
  if (capacity <= s_->capacity) return;
  if (!s_->growable) {
    fail("KvCache::reserve(" + std::to_string(capacity) + "): the cache has a fixed capacity of " +
         std::to_string(s_->capacity));
  }
  s_->grow_to(capacity);
}

void KvCache::clear() { s_->length = 0; }

void KvCache::truncate(std::int64_t length) {
  if (length < 0 || length > s_->length) {
    fail("KvCache::truncate(" + std::to_string(length) + "): must be in [0, " +
         std::to_string(s_->length) + "], the cached length");
  }
  s_->length = length;
}

void KvCache::append(const TensorView& k, const TensorView& v) {
  check_f32("k", k, 4);
  check_f32("v", v, 4);
  const Storage& s = *s_;
  const std::int64_t n = k.shape[2];
  if (k.shape[0] != s.B || k.shape[1] != s.Hkv || k.shape[3] != s.D || v.shape[0] != s.B ||
      v.shape[1] != s.Hkv || v.shape[2] != n || v.shape[3] != s.Dv) {
    fail("KvCache::append: k " + shape_str(k) + " and v " + shape_str(v) + " must be " +
         dims_str({s.B, s.Hkv, n, s.D}) + " and " + dims_str({s.B, s.Hkv, n, s.Dv}));
  }
  s_->make_room(n);
  s_->store(k, s_->k, s.D);
  s_->store(v, s_->v, s.Dv);
  s_->length += n;
}

TensorView KvCache::keys() const { return s_->view(s_->k, s_->D, s_->length); }
TensorView KvCache::values() const { return s_->view(s_->v, s_->Dv, s_->length); }

// ------------------------------------------------------------------------ MultiHeadAttention

struct MultiHeadAttention::Impl {
  MhaConfig cfg;
  Linear wq, wk, wv, wo;

  // Per-call intermediates in the context's per-thread layer scratch:
  // Q [rows_q, H*D], K [rows_kv, Hkv*D], V [rows_kv, Hkv*Dv], A (heads' outputs) [rows_q, H*Dv].
  struct Buffers {
    float *q, *k, *v, *a;
  };
  Buffers buffers(Context& ctx, std::int64_t rows_q, std::int64_t rows_kv) const {
    const auto pad = [](std::int64_t n) { return (n + 15) / 16 * 16; };
    const std::int64_t nq = pad(rows_q * cfg.heads * cfg.head_dim);
    const std::int64_t nk = pad(rows_kv * cfg.kv_heads * cfg.head_dim);
    const std::int64_t nv = pad(rows_kv * cfg.kv_heads * cfg.value_dim);
    const std::int64_t na = pad(rows_q * cfg.heads * cfg.value_dim);
    float* base = detail::ContextAccess::impl(ctx).layer_scratch.local().get(
        static_cast<std::size_t>(nq + nk + nv + na));
    return {base, base + nq, base + nq + nk, base + nq + nk + nv};
  }

  // A [B, L, heads, width] buffer as the kernel's logical [B, heads, L, width].
  static OutputView heads_view(float* p, std::int64_t B, std::int64_t L, std::int64_t heads,
                               std::int64_t width) {
    return OutputView::blhd(p, DType::f32, B, L, heads, width);
  }

  void check_io(const char* xname, const TensorView& x, const char* oname, const TensorView& out,
                std::int64_t B, std::int64_t L) const {
    check_f32(xname, x, 3);
    if (x.shape[2] != cfg.d_model) {
      fail(std::string(xname) + " " + shape_str(x) +
           " must have d_model=" + std::to_string(cfg.d_model) + " features");
    }
    check_f32(oname, out, 3);
    if (out.shape[0] != B || out.shape[1] != L || out.shape[2] != cfg.d_model) {
      fail(std::string(oname) + " " + shape_str(out) + " must be " + dims_str({B, L, cfg.d_model}) +
           " (" + xname + " " + shape_str(x) + ")");
    }
    detail::check_no_self_overlap(oname, out);
  }
};

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, const MhaWeights& w) {
  MhaConfig c = config;
  if (c.d_model < 1 || c.heads < 1) {
    fail("MhaConfig: d_model and heads must be >= 1, got d_model=" + std::to_string(c.d_model) +
         ", heads=" + std::to_string(c.heads));
  }
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  if (c.head_dim == 0) {
    if (c.d_model % c.heads != 0) {
      fail("MhaConfig: head_dim not given and d_model=" + std::to_string(c.d_model) +
           " is not a multiple of heads=" + std::to_string(c.heads));
    }
    c.head_dim = c.d_model / c.heads;
  }
  if (c.value_dim == 0) c.value_dim = c.head_dim;
  if (c.kv_heads < 1 || c.heads % c.kv_heads != 0 || c.head_dim < 1 || c.value_dim < 1) {
    fail("MhaConfig: heads=" + std::to_string(c.heads) + " must be a multiple of kv_heads=" +
         std::to_string(c.kv_heads) + ", and head_dim=" + std::to_string(c.head_dim) +
         ", value_dim=" + std::to_string(c.value_dim) + " must be >= 1");
  }
  auto expect = [](const char* name, const TensorView& t, std::int64_t rows, std::int64_t cols) {
    check_f32(name, t, 2);
    if (t.shape[0] != rows || t.shape[1] != cols) {
      fail(std::string(name) + " " + shape_str(t) + " must be " + dims_str({rows, cols}));
    }
  };
  auto expect_bias = [](const char* name, const std::optional<TensorView>& b, std::int64_t n) {
    if (!b) return;
    check_f32(name, *b, 1);
    if (b->shape[0] != n)
      fail(std::string(name) + " " + shape_str(*b) + " must be [" + std::to_string(n) + "]");
  };
  const std::int64_t nq = c.heads * c.head_dim, nk = c.kv_heads * c.head_dim,
                     nv = c.kv_heads * c.value_dim, na = c.heads * c.value_dim;
  expect("wq", w.wq, c.d_model, nq);
  expect("wk", w.wk, c.d_model, nk);
  expect("wv", w.wv, c.d_model, nv);
  expect("wo", w.wo, na, c.d_model);
  expect_bias("bq", w.bq, nq);
  expect_bias("bk", w.bk, nk);
  expect_bias("bv", w.bv, nv);
  expect_bias("bo", w.bo, c.d_model);
  impl_ = std::make_unique<Impl>(
      Impl{c, Linear(w.wq, w.bq), Linear(w.wk, w.bk), Linear(w.wv, w.bv), Linear(w.wo, w.bo)});
}

MultiHeadAttention::~MultiHeadAttention() = default;
MultiHeadAttention::MultiHeadAttention(MultiHeadAttention&&) noexcept = default;
MultiHeadAttention& MultiHeadAttention::operator=(MultiHeadAttention&&) noexcept = default;

const MhaConfig& MultiHeadAttention::config() const { return impl_->cfg; }

KvCache MultiHeadAttention::make_cache(std::int64_t batch, std::int64_t capacity,
                                       bool growable) const {
  const MhaConfig& c = impl_->cfg;
  return KvCache(batch, c.kv_heads, c.head_dim, c.value_dim, capacity, growable);
}

void MultiHeadAttention::forward(const TensorView& x, const OutputView& out,
                                 const AttentionOptions& opts, Context* context) const {
  forward_cross(x, x, out, opts, context);
}

void MultiHeadAttention::forward_cross(const TensorView& xq, const TensorView& xkv,
                                       const OutputView& out, const AttentionOptions& opts,
                                       Context* context) const {
  const Impl& m = *impl_;
  const MhaConfig& c = m.cfg;
  check_f32("xq", xq, 3);
  const std::int64_t B = xq.shape[0], Lq = xq.shape[1];
  m.check_io("xq", xq, "out", out, B, Lq);
  check_f32("xkv", xkv, 3);
  if (xkv.shape[0] != B || xkv.shape[2] != c.d_model) {
    fail("xkv " + shape_str(xkv) + " must be [" + std::to_string(B) + ",Lk," +
         std::to_string(c.d_model) + "] (xq " + shape_str(xq) + ")");
  }
  const std::int64_t Lk = xkv.shape[1];
  const detail::Extent oe = detail::extent_of("out", out);
  detail::check_disjoint(
      "out", oe, {{"xq", detail::extent_of("xq", xq)}, {"xkv", detail::extent_of("xkv", xkv)}});
  Context& ctx = context != nullptr ? *context : default_context();
  const Impl::Buffers buf = m.buffers(ctx, B * Lq, B * Lk);
  const OutputView q = Impl::heads_view(buf.q, B, Lq, c.heads, c.head_dim);
  const OutputView k = Impl::heads_view(buf.k, B, Lk, c.kv_heads, c.head_dim);
  const OutputView v = Impl::heads_view(buf.v, B, Lk, c.kv_heads, c.value_dim);
  const OutputView a = Impl::heads_view(buf.a, B, Lq, c.heads, c.value_dim);
  // Every option (mask, key lengths, lse, weights) is checked against the shapes before anything
  // is computed, so a bad option leaves `out` untouched.
  detail::validate(q, k, v, a, opts, false);

  m.wq.forward(xq, f32_view(buf.q, {B, Lq, c.heads * c.head_dim}), &ctx);
  m.wk.forward(xkv, f32_view(buf.k, {B, Lk, c.kv_heads * c.head_dim}), &ctx);
  m.wv.forward(xkv, f32_view(buf.v, {B, Lk, c.kv_heads * c.value_dim}), &ctx);
  attention(q, k, v, a, opts, &ctx);
  m.wo.forward(f32_view(static_cast<const float*>(buf.a), {B, Lq, c.heads * c.value_dim}), out,
               &ctx);
}

void MultiHeadAttention::decode(const TensorView& x, KvCache& cache, const OutputView& out,
                                const AttentionOptions& opts_in, Context* context) const {
  const Impl& m = *impl_;
  const MhaConfig& c = m.cfg;
  check_f32("x", x, 3);
  const std::int64_t B = x.shape[0], n = x.shape[1];
  m.check_io("x", x, "out", out, B, n);
  detail::check_disjoint("out", detail::extent_of("out", out), {{"x", detail::extent_of("x", x)}});
  KvCache::Storage& s = *cache.s_;
  if (s.B != B || s.Hkv != c.kv_heads || s.D != c.head_dim || s.Dv != c.value_dim) {
    fail("cache (batch=" + std::to_string(s.B) + ", kv_heads=" + std::to_string(s.Hkv) +
         ", head_dim=" + std::to_string(s.D) + ", value_dim=" + std::to_string(s.Dv) +
         ") does not fit this layer and x " + shape_str(x) + " (batch=" + std::to_string(B) +
         ", kv_heads=" + std::to_string(c.kv_heads) + ", head_dim=" + std::to_string(c.head_dim) +
         ", value_dim=" + std::to_string(c.value_dim) + ")");
  }
  if (opts_in.causal == Causal::top_left) {
    fail(
        "decode attends new tokens to the whole cache: opts.causal must be none or "
        "bottom_right, not top_left");
  }
  AttentionOptions opts = opts_in;
  opts.causal = Causal::bottom_right;
  s.make_room(n);  // may grow (contents kept), or throws before anything changes
  const std::int64_t len = s.length + n;

  Context& ctx = context != nullptr ? *context : default_context();
  const Impl::Buffers buf = m.buffers(ctx, B * n, B * n);
  const OutputView q = Impl::heads_view(buf.q, B, n, c.heads, c.head_dim);
  const OutputView a = Impl::heads_view(buf.a, B, n, c.heads, c.value_dim);
  detail::validate(q, s.view(s.k, s.D, len), s.view(s.v, s.Dv, len), a, opts, false);

  m.wq.forward(x, f32_view(buf.q, {B, n, c.heads * c.head_dim}), &ctx);
  m.wk.forward(x, f32_view(buf.k, {B, n, c.kv_heads * c.head_dim}), &ctx);
  m.wv.forward(x, f32_view(buf.v, {B, n, c.kv_heads * c.value_dim}), &ctx);
  s.store(Impl::heads_view(buf.k, B, n, c.kv_heads, c.head_dim), s.k, s.D);
  s.store(Impl::heads_view(buf.v, B, n, c.kv_heads, c.value_dim), s.v, s.Dv);
  s.length = len;
  attention(q, cache.keys(), cache.values(), a, opts, &ctx);
  m.wo.forward(f32_view(static_cast<const float*>(buf.a), {B, n, c.heads * c.value_dim}), out,
               &ctx);
}

}  // namespace cpuattn
