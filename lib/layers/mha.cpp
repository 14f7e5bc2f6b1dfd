// MultiHeadAttention and KvCache: Q, K and V projected by one packed matrix, heads by strides,
// the fused kernel.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/attention.h"
#include "api/call_scope.h"
#include "api/checks.h"
#include "api/context_impl.h"
#include "core/dtypes.h"
#include "core/problem.h"
#include "cpuattn/layers.h"
#include "kernels/gemm/gemm.h"
#include "layers/cache_rows.h"
#include "layers/f32_rows.h"
#include "layers/paged_cache.h"
#include "layers/qk_prep.h"

namespace cpuattn {

using detail::fail;
using detail::shape_str;

namespace {

std::string dims_str(std::initializer_list<std::int64_t> dims) {
  std::string s = "[";
  for (std::int64_t d : dims) {
    if (s.size() > 1) s += ',';
    s += std::to_string(d);
  }
  return s + "]";
}

// Describes a layer call in its record (include/cpuattn/profile.h).
// kv: the element type of the K/V the attention read (the cache's; f32 projections otherwise).
// `inputs` makes the inputs' description (a string), only when the call is recorded: a decode
// step that is not recorded allocates nothing.
template <class Inputs>
void describe(detail::CallScope& scope, const Inputs& inputs, const MhaConfig& c,
              const AttentionOptions& opts, DType kv = DType::f32) {
  scope.set_dtypes(DType::f32, kv, DType::f32);
  if (!scope.active()) return;
  scope.record().shapes =
      inputs() + ";d_model:" + std::to_string(c.d_model) + ";heads:" + std::to_string(c.heads) +
      ";kv_heads:" + std::to_string(c.kv_heads) + ";head_dim:" + std::to_string(c.head_dim);
  scope.record().mask = detail::mask_description(opts);
}

void check_f32(const char* name, const TensorView& t, int rank) {
  detail::check_view(name, t, rank, rank);
  detail::check_dtype(name, t, false);
  detail::extent_of(name, t);
}

// Tokens appended to a cache (converted to the cache's dtype), and a layer's x and out
// (f32_rows.h): f32, bf16 or f16.
void check_input(const char* name, const TensorView& t, int rank) {
  detail::check_view(name, t, rank, rank);
  if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16) {
    fail(std::string(name) + " " + shape_str(t) + " has dtype " + dtype_name(t.dtype) +
         "; expected float32, bfloat16 or float16");
  }
  if (reinterpret_cast<std::uintptr_t>(t.data) % dtype_size(t.dtype) != 0)
    fail(std::string(name) + " " + shape_str(t) + ": data is not aligned to its elements");
  detail::extent_of(name, t);
}

// Explicit positions for the rotary embedding, int32 or int64 [B, L] (or [L] for every sequence
// when `broadcast`), into dst[B * L], each checked in [0, 2^53) (exact in double, as apply_rope's
// positions). `against` names the tensor the shape comes from, for the messages.
void read_positions(const TensorView& pos, std::int64_t B, std::int64_t L, bool broadcast,
                    const std::string& against, std::int64_t* dst) {
  detail::check_view("positions", pos, 1, 2);
  if (pos.dtype != DType::i32 && pos.dtype != DType::i64)
    fail("positions " + shape_str(pos) + " has dtype " + dtype_name(pos.dtype) +
         "; expected int32 or int64");
  const bool per_seq = pos.rank == 2;
  const bool fits =
      per_seq ? pos.shape[0] == B && pos.shape[1] == L : pos.shape[0] == L && (broadcast || B == 1);
  if (!fits)
    fail("positions " + shape_str(pos) + " must be " +
         (broadcast ? dims_str({B, L}) + " or " + dims_str({L}) : dims_str({L})) + " (" + against +
         ")");
  if (reinterpret_cast<std::uintptr_t>(pos.data) % dtype_size(pos.dtype) != 0)
    fail("positions " + shape_str(pos) + ": data is not aligned to its elements");
  detail::extent_of("positions", pos);
  constexpr std::int64_t kMaxPosition = std::int64_t{1} << 53;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l) {
      const std::int64_t at = (per_seq ? b * pos.strides[0] : 0) + l * pos.strides[pos.rank - 1];
      const std::int64_t p = pos.dtype == DType::i32
                                 ? static_cast<const std::int32_t*>(pos.data)[at]
                                 : static_cast<const std::int64_t*>(pos.data)[at];
      if (p < 0 || p >= kMaxPosition)
        fail("positions" + (per_seq ? "[" + std::to_string(b) + "," : std::string("[")) +
             std::to_string(l) + "] = " + std::to_string(p) +
             " is outside [0, 2^53): positions must be exact in double precision");
      dst[b * L + l] = p;
    }
}

// The layer writes opts.lse / opts.weights during attention and `out` afterwards, from the heads'
// outputs: an optional output that overlaps `out` would be overwritten (or overwrite it), and one
// that overlaps an input would change what the projections read. Call after detail::validate(),
// which has checked the optional outputs' own shapes.
void check_optional_outputs(const AttentionOptions& opts, const detail::Extent& out,
                            const char* in1, const TensorView& x1, const char* in2,
                            const TensorView& x2) {
  const detail::Extent e1 = detail::extent_of(in1, x1), e2 = detail::extent_of(in2, x2);
  for (const auto& [name, view] :
       {std::pair<const char*, const std::optional<OutputView>*>{"opts.lse", &opts.lse},
        {"opts.weights", &opts.weights}}) {
    if (!view->has_value()) continue;
    const detail::Extent e = detail::extent_of(name, **view);
    detail::check_disjoint(name, e, {{"out", out}, {in1, e1}, {in2, e2}});
  }
}

}  // namespace

// ----------------------------------------------------------------------------------- KvCache

// Every size is checked before anything changes: capacity * B * Hkv * max(D, Dv) floats stay
// below kMaxFloats, so no index below overflows and a huge reserve() or append() is an Error that
// leaves the cache as it was (before, reserve(2^62) overflowed to a small allocation and the next
// append wrote past it).
constexpr std::int64_t kMaxFloats = std::int64_t{1} << 40;  // 4 TiB of K or of V

struct KvCache::Storage {
  std::int64_t B, Hkv, D, Dv;
  bool growable;
  DType dtype;
  // The token buffers: [B, Hkv, capacity, D] and [.., Dv] elements of `dtype`, as bytes; for a
  // scaled dtype without static scales, one f32 scale per token of each K/V head, [B, Hkv,
  // capacity] (quantize_row). A growing
  // step fills a new Tokens and swaps it in last, so that a step that fails changes nothing, and
  // an append may read views of the cache's own tokens (keys(), values()).
  struct Tokens {
    std::int64_t capacity = 0;
    std::vector<std::uint8_t> k, v;
    std::vector<float> k_scale, v_scale;
  };
  Tokens t;
  std::int64_t length = 0;
  // Static scales, one per K/V head (KvScales); empty: per token, in t.
  std::vector<float> k_static, v_static;
  bool per_token_scales() const { return needs_scales(dtype) && k_static.empty(); }
  std::int64_t esize() const { return static_cast<std::int64_t>(dtype_size(dtype)); }

  std::string dims() const {
    return "batch=" + std::to_string(B) + ", kv_heads=" + std::to_string(Hkv) +
           ", head_dim=" + std::to_string(D) + ", value_dim=" + std::to_string(Dv);
  }
  // The most tokens a cache of these dimensions may hold.
  std::int64_t max_capacity() const { return kMaxFloats / (B * Hkv * std::max(D, Dv)); }

  // New buffers of `cap` tokens holding the cached ones; allocated before anything changes (on
  // std::bad_alloc nothing did).
  Tokens grown(std::int64_t cap) const {
    if (cap > max_capacity()) {
      fail("KvCache: capacity " + std::to_string(cap) + " is too large for " + dims() +
           " (at most " + std::to_string(max_capacity()) + " tokens)");
    }
    const std::int64_t e = esize(), old = t.capacity;
    Tokens n;
    n.capacity = cap;
    n.k.resize(static_cast<std::size_t>(B * Hkv * cap * D * e));
    n.v.resize(static_cast<std::size_t>(B * Hkv * cap * Dv * e));
    const bool scaled = per_token_scales();
    n.k_scale.resize(scaled ? static_cast<std::size_t>(B * Hkv * cap) : 0);
    n.v_scale.resize(n.k_scale.size());
    for (std::int64_t bh = 0; bh < B * Hkv; ++bh) {
      std::copy_n(t.k.begin() + bh * old * D * e, length * D * e, n.k.begin() + bh * cap * D * e);
      std::copy_n(t.v.begin() + bh * old * Dv * e, length * Dv * e,
                  n.v.begin() + bh * cap * Dv * e);
      if (scaled) {
        std::copy_n(t.k_scale.begin() + bh * old, length, n.k_scale.begin() + bh * cap);
        std::copy_n(t.v_scale.begin() + bh * old, length, n.v_scale.begin() + bh * cap);
      }
    }
    return n;
  }

  // The buffers that n more tokens go into: the present ones when they have room, else grown
  // ones (not yet swapped in: commit() does), or an error that changes nothing.
  std::optional<Tokens> room_for(std::int64_t n) const {
    if (n <= t.capacity - length) return std::nullopt;
    if (!growable) {
      fail("KV cache is full: " + std::to_string(length) + " cached + " + std::to_string(n) +
           " new tokens > capacity " + std::to_string(t.capacity) +
           " (a fixed-capacity cache; construct it growable or reserve() more)");
    }
    const std::int64_t limit = max_capacity();
    if (n > limit - length) {
      fail("KvCache: " + std::to_string(length) + " cached + " + std::to_string(n) +
           " new tokens exceed the largest capacity for " + dims() + " (" + std::to_string(limit) +
           " tokens)");
    }
    // Doubling keeps appends amortized O(1); never past the limit (capacity <= limit, so 2 *
    // capacity does not overflow).
    return grown(std::max(std::min(2 * t.capacity, limit), length + n));
  }

  // The last step of a call that changes the cache: nothing after it throws.
  void commit(std::optional<Tokens>& g, std::int64_t new_length) noexcept {
    if (g) std::swap(t, *g);
    length = new_length;
  }

  // A cache of a scaled dtype holds finite values only: checked for every row before anything
  // is stored.
  void check_storable(const TensorView& x, const char* name) const {
    if (!needs_scales(dtype)) return;
    const std::int64_t n = x.shape[2], width = x.shape[3];
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t l = 0; l < n; ++l)
          for (std::int64_t d = 0; d < width; ++d) {
            const float v = detail::load_as_float(
                x.data, x.dtype, b * x.strides[0] + h * x.strides[1] + l * x.strides[2] + d);
            if (!std::isfinite(v))
              fail_not_storable("KvCache", name,
                                std::to_string(b) + "," + std::to_string(h) + "," +
                                    std::to_string(l) + "," + std::to_string(d),
                                v, dtype);
          }
  }

  // Converts token rows k and v [B, Hkv, n, width] (f32, bf16 or f16; strides over b, h, l) to
  // the cache's dtype at positions length.. of `dst` (int8: quantized per row, scales kept).
  void store(const TensorView& k, const TensorView& v, Tokens& dst) const {
    store_one(k, dst.k, dst.k_scale, k_static, D, dst.capacity);
    store_one(v, dst.v, dst.v_scale, v_static, Dv, dst.capacity);
  }
  void store_one(const TensorView& x, std::vector<std::uint8_t>& dst, std::vector<float>& scale,
                 const std::vector<float>& head_scale, std::int64_t width, std::int64_t cap) const {
    const std::int64_t n = x.shape[2], e = esize();
    std::vector<float>& row = conversion_row(x.dtype == dtype ? 0 : width);
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < Hkv; ++h) {
        for (std::int64_t l = 0; l < n; ++l) {
          const std::int64_t src = b * x.strides[0] + h * x.strides[1] + l * x.strides[2];
          const std::int64_t tok = (b * Hkv + h) * cap + length + l;
          std::uint8_t* out = dst.data() + tok * width * e;
          store_cache_row(x, src, out, dtype, width, scale.empty() ? nullptr : &scale[tok],
                          head_scale.empty() ? 1.0f : head_scale[static_cast<std::size_t>(h)], row);
        }
      }
    }
  }

  // Views of `len` tokens of buffers `in` (the cache's own by default).
  TensorView view(const Tokens& in, bool values, std::int64_t len) const {
    const std::int64_t width = values ? Dv : D, cap = in.capacity;
    TensorView x =
        TensorView::contiguous((values ? in.v : in.k).data(), dtype, {B, Hkv, len, width});
    x.strides = {Hkv * cap * width, cap * width, width, 1};
    return x;
  }
  std::optional<TensorView> scales(const Tokens& in, bool values, std::int64_t len) const {
    if (!needs_scales(dtype)) return std::nullopt;
    if (!per_token_scales()) return f32_view((values ? v_static : k_static).data(), {Hkv});
    TensorView x = f32_view((values ? in.v_scale : in.k_scale).data(), {B, Hkv, len});
    x.strides = {Hkv * in.capacity, in.capacity, 1};
    return x;
  }
};

namespace {
// A moved-from cache has no storage: destroying it or assigning to it is fine, anything else is
// an Error instead of a null dereference.
KvCache::Storage& live(const std::unique_ptr<KvCache::Storage>& s, const char* what) {
  if (!s) fail(std::string("KvCache::") + what + ": the cache was moved from");
  return *s;
}
}  // namespace

KvCache::KvCache(std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                 std::int64_t value_dim, std::int64_t capacity, bool growable, DType dtype,
                 const KvScales& scales) {
  check_cache_dtype("KvCache", dtype);
  const std::string dims =
      "batch=" + std::to_string(batch) + ", kv_heads=" + std::to_string(kv_heads) +
      ", head_dim=" + std::to_string(head_dim) + ", value_dim=" + std::to_string(value_dim) +
      ", capacity=" + std::to_string(capacity);
  if (batch < 1 || kv_heads < 1 || head_dim < 1 || value_dim < 1 || capacity < 1) {
    fail("KvCache: every size must be >= 1 (" + dims + ")");
  }
  std::int64_t bh = 0, per_token = 0, total = 0;
  if (__builtin_mul_overflow(batch, kv_heads, &bh) ||
      __builtin_mul_overflow(bh, std::max(head_dim, value_dim), &per_token) ||
      __builtin_mul_overflow(per_token, capacity, &total) || total > kMaxFloats) {
    fail("KvCache: too large (" + dims + "; at most 2^40 floats of K or of V)");
  }
  std::vector<float> k_static = cache_scales("KvCache", dtype, scales.k, "k", kv_heads);
  std::vector<float> v_static = cache_scales("KvCache", dtype, scales.v, "v", kv_heads);
  if (k_static.empty() != v_static.empty())
    fail(
        "KvCache: scales.k and scales.v must both be given (static scales) or both be empty "
        "(per-token scales)");
  auto s = std::make_unique<Storage>(Storage{batch,
                                             kv_heads,
                                             head_dim,
                                             value_dim,
                                             growable,
                                             dtype,
                                             {},
                                             0,
                                             std::move(k_static),
                                             std::move(v_static)});
  s->t = s->grown(capacity);
  s_ = std::move(s);
}

KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

std::int64_t KvCache::batch() const { return live(s_, "batch").B; }
std::int64_t KvCache::kv_heads() const { return live(s_, "kv_heads").Hkv; }
std::int64_t KvCache::head_dim() const { return live(s_, "head_dim").D; }
std::int64_t KvCache::value_dim() const { return live(s_, "value_dim").Dv; }
std::int64_t KvCache::length() const { return live(s_, "length").length; }
std::int64_t KvCache::capacity() const { return live(s_, "capacity").t.capacity; }
bool KvCache::growable() const { return live(s_, "growable").growable; }
DType KvCache::dtype() const { return live(s_, "dtype").dtype; }

void KvCache::reserve(std::int64_t capacity) {
  Storage& s = live(s_, "reserve");
  if (capacity <= s.t.capacity) return;
  if (!s.growable) {
    fail("KvCache::reserve(" + std::to_string(capacity) + "): the cache has a fixed capacity of " +
         std::to_string(s.t.capacity));
  }
  std::optional<Storage::Tokens> g = s.grown(capacity);
  s.commit(g, s.length);
}

void KvCache::clear() { live(s_, "clear").length = 0; }

void KvCache::truncate(std::int64_t length) {
  Storage& s = live(s_, "truncate");
  if (length < 0 || length > s.length) {
    fail("KvCache::truncate(" + std::to_string(length) + "): must be in [0, " +
         std::to_string(s.length) + "], the cached length");
  }
  s.length = length;
}

void KvCache::append(const TensorView& k, const TensorView& v) {
  Storage& s = live(s_, "append");
  check_input("k", k, 4);
  check_input("v", v, 4);
  const std::int64_t n = k.shape[2];
  if (k.shape[0] != s.B || k.shape[1] != s.Hkv || k.shape[3] != s.D || v.shape[0] != s.B ||
      v.shape[1] != s.Hkv || v.shape[2] != n || v.shape[3] != s.Dv) {
    fail("KvCache::append: k " + shape_str(k) + " and v " + shape_str(v) + " must be " +
         dims_str({s.B, s.Hkv, n, s.D}) + " and " + dims_str({s.B, s.Hkv, n, s.Dv}));
  }
  s.check_storable(k, "k");
  s.check_storable(v, "v");
  // k and v may be views of this cache's own tokens (keys(), values()): a growing append reads
  // them from the old buffers while it fills the new ones, and frees the old ones last.
  std::optional<Storage::Tokens> g = s.room_for(n);
  s.store(k, v, g ? *g : s.t);
  s.commit(g, s.length + n);
}

TensorView KvCache::keys() const {
  const Storage& s = live(s_, "keys");
  return s.view(s.t, false, s.length);
}
TensorView KvCache::values() const {
  const Storage& s = live(s_, "values");
  return s.view(s.t, true, s.length);
}
std::optional<TensorView> KvCache::key_scales() const {
  const Storage& s = live(s_, "key_scales");
  return s.scales(s.t, false, s.length);
}
std::optional<TensorView> KvCache::value_scales() const {
  const Storage& s = live(s_, "value_scales");
  return s.scales(s.t, true, s.length);
}

// ------------------------------------------------------------------------ MultiHeadAttention

struct MultiHeadAttention::Impl {
  MhaConfig cfg;
  // The Q, K and V projections packed as ONE matrix, each part starting on a panel: one product
  // over x gives all three (self-attention, decoding: x streams once, and a decode step's weights
  // in one pass), a panel range gives Q alone or K and V (cross-attention). A projected row holds
  // Q at column 0, K at k_col, V at v_col, `width` columns in all (zero columns between parts).
  std::shared_ptr<const detail::PackedMatrix> qkv;
  std::int64_t q_panels, k_col, v_col, width;
  Linear wo;
  detail::QkPrep prep;  // QK-norm and RoPE of the projected rows

  // Per-call intermediates in the context's per-thread layer scratch: projected rows of `stride`
  // (= width) floats, Q at q, K at k, V at v (one region for self-attention, where the rows of Q
  // and K/V are the same; a second for cross-attention's K/V rows), and A (the heads' outputs)
  // [rows_q, H*Dv]. `ints`: that many int64 slots after them (a paged step's lengths and tables).
  // `io`: that many floats before the ints, for f32 copies of 16-bit x and out (f32_rows.h).
  struct Buffers {
    float *q, *k, *v, *a, *io;
    std::int64_t stride;
    std::int64_t* ints;
  };
  // The caller holds a Lease on ctx's layer scratch of this thread for as long as it uses these.
  Buffers buffers(Context& ctx, std::int64_t rows_q, std::int64_t rows_kv, bool self,
                  std::int64_t ints = 0, std::int64_t io = 0) const {
    const auto pad = [](std::int64_t n) { return (n + 15) / 16 * 16; };
    const std::int64_t nq = pad(rows_q * width), nkv = self ? 0 : pad(rows_kv * width);
    const std::int64_t na = pad(rows_q * cfg.heads * cfg.value_dim);
    float* base = detail::ContextAccess::impl(ctx).layer_scratch.local().get(
        static_cast<std::size_t>(nq + nkv + na + io + 2 * ints));
    float* kv = self ? base : base + nq;
    float* a = base + nq + nkv;
    return {base,
            kv + k_col,
            kv + v_col,
            a,
            a + na,
            width,
            reinterpret_cast<std::int64_t*>(a + na + io)};
  }

  // Rows [B, L] of `stride` floats holding `heads` x `hw` values from p on, as the kernel's logical
  // [B, heads, L, hw].
  static OutputView heads_view(float* p, std::int64_t B, std::int64_t L, std::int64_t heads,
                               std::int64_t hw, std::int64_t stride) {
    OutputView v = OutputView::contiguous(p, DType::f32, {B, heads, L, hw});
    v.strides = {L * stride, hw, stride, 1};
    return v;
  }
  // The heads' outputs A, [B, L, heads, Dv] rows.
  OutputView a_view(const Buffers& buf, std::int64_t B, std::int64_t L) const {
    return OutputView::blhd(buf.a, DType::f32, B, L, cfg.heads, cfg.value_dim);
  }

  void check_io(const char* xname, const TensorView& x, const char* oname, const TensorView& out,
                std::int64_t B, std::int64_t L) const {
    check_input(xname, x, 3);
    if (x.shape[2] != cfg.d_model) {
      fail(std::string(xname) + " " + shape_str(x) +
           " must have d_model=" + std::to_string(cfg.d_model) + " features");
    }
    check_input(oname, out, 3);
    if (out.shape[0] != B || out.shape[1] != L || out.shape[2] != cfg.d_model) {
      fail(std::string(oname) + " " + shape_str(out) + " must be " + dims_str({B, L, cfg.d_model}) +
           " (" + xname + " " + shape_str(x) + ")");
    }
    detail::check_no_self_overlap(oname, out);
  }

  // The checks both decode() overloads start with: x [B, n, d_model], out alike and apart from x,
  // and options that decoding can honour. Returns the options it runs with (bottom-right causal).
  AttentionOptions check_decode(const TensorView& x, const OutputView& out,
                                const AttentionOptions& opts) const {
    check_io("x", x, "out", out, x.shape[0], x.shape[1]);
    detail::check_disjoint("out", detail::extent_of("out", out),
                           {{"x", detail::extent_of("x", x)}});
    if (opts.causal == Causal::top_left) {
      fail(
          "decode attends new tokens to the whole cache: opts.causal must be none or "
          "bottom_right, not top_left");
    }
    AttentionOptions o = opts;
    o.causal = Causal::bottom_right;
    return o;
  }

  // Q, K and V of the n new tokens of x [B, n, d_model] into buf: one product.
  void project_step(const TensorView& x, const Buffers& buf, Context& ctx) const {
    detail::run_linear_panels(*qkv, x, buf.q, buf.stride, 0, qkv->panels, ctx);
  }

  // QK-norm and RoPE of the n new tokens' rows in buf (project_step's), at positions `at`.
  void prepare_step(const Buffers& buf, std::int64_t B, std::int64_t n,
                    detail::QkPrep::Positions at, Context& ctx) const {
    prep.apply(detail::HeadRows{buf.q, buf.stride, cfg.heads},
               detail::HeadRows{buf.k, buf.stride, cfg.kv_heads}, B, n, at, ctx);
  }

  void forward(const TensorView& xq, const TensorView& xkv, const OutputView& out,
               const AttentionOptions& opts, Context& ctx, bool self,
               const TensorView* positions = nullptr) const;
  void forward_varlen(const TensorView& x, const TensorView& cu_seqlens,
                      const TensorView* positions, const OutputView& out,
                      const AttentionOptions& opts, Context& ctx) const;

  // Explicit positions are for the rotary embedding only.
  void check_rotates(const char* call) const {
    if (!prep.rotates())
      fail(std::string(call) +
           ": positions are given but this layer has no MhaConfig::rope (they place the rotary "
           "embedding only)");
  }

  // out = A Wo + bo for the rows of buf.a [rows, H * Dv].
  void output(const Buffers& buf, std::int64_t B, std::int64_t L, const OutputView& out,
              Context& ctx) const {
    wo.forward(f32_view(static_cast<const float*>(buf.a), {B, L, cfg.heads * cfg.value_dim}), out,
               &ctx);
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
  // Weights f32 or bf16 (Linear keeps bf16 packed as bf16); biases f32.
  auto expect = [](const char* name, const TensorView& t, std::int64_t rows, std::int64_t cols) {
    detail::check_view(name, t, 2, 2);
    if (t.dtype != DType::f32 && t.dtype != DType::bf16) {
      fail(std::string(name) + " " + shape_str(t) + " has dtype " + dtype_name(t.dtype) +
           "; expected float32 or bfloat16");
    }
    detail::extent_of(name, t);
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
  const std::int64_t nq = detail::checked_mul(c.heads, c.head_dim, "MhaConfig: heads x head_dim"),
                     nk = detail::checked_mul(c.kv_heads, c.head_dim,
                                              "MhaConfig: kv_heads x head_dim"),
                     nv = detail::checked_mul(c.kv_heads, c.value_dim,
                                              "MhaConfig: kv_heads x value_dim"),
                     na = detail::checked_mul(c.heads, c.value_dim, "MhaConfig: heads x value_dim");
  expect("wq", w.wq, c.d_model, nq);
  expect("wk", w.wk, c.d_model, nk);
  expect("wv", w.wv, c.d_model, nv);
  expect("wo", w.wo, na, c.d_model);
  expect_bias("bq", w.bq, nq);
  expect_bias("bk", w.bk, nk);
  expect_bias("bv", w.bv, nv);
  expect_bias("bo", w.bo, c.d_model);
  for (const auto& [name, t] : {std::pair{"wk", &w.wk}, std::pair{"wv", &w.wv}}) {
    if (t->dtype != w.wq.dtype) {
      fail(std::string(name) + " has dtype " + dtype_name(t->dtype) + " but wq has " +
           dtype_name(w.wq.dtype) +
           " (the Q, K and V projections are packed as one matrix: one dtype)");
    }
  }
  detail::QkPrep prep(c, w);
  constexpr std::int64_t P = detail::PackedMatrix::kPanel;
  const std::int64_t q_panels = (nq + P - 1) / P, k_panels = (nk + P - 1) / P;
  auto qkv = detail::pack_parts({w.wq, w.wk, w.wv}, {w.bq, w.bk, w.bv}, true);
  const std::int64_t width = qkv->panels * P;
  impl_ = std::make_unique<Impl>(Impl{c, std::move(qkv), q_panels, q_panels * P,
                                      (q_panels + k_panels) * P, width, Linear(w.wo, w.bo),
                                      std::move(prep)});
}

namespace {
const MultiHeadAttention::Impl& live(const std::unique_ptr<MultiHeadAttention::Impl>& m,
                                     const char* what) {
  if (!m) fail(std::string("MultiHeadAttention::") + what + ": the layer was moved from");
  return *m;
}
}  // namespace

MultiHeadAttention::~MultiHeadAttention() = default;
MultiHeadAttention::MultiHeadAttention(MultiHeadAttention&&) noexcept = default;
MultiHeadAttention& MultiHeadAttention::operator=(MultiHeadAttention&&) noexcept = default;

const MhaConfig& MultiHeadAttention::config() const { return live(impl_, "config").cfg; }

PagedKvCache MultiHeadAttention::make_paged_cache(std::int64_t num_pages, std::int64_t page_size,
                                                  DType dtype, const KvScales& scales) const {
  const MhaConfig& c = live(impl_, "make_paged_cache").cfg;
  return PagedKvCache(num_pages, page_size, c.kv_heads, c.head_dim, c.value_dim, dtype, scales);
}

KvCache MultiHeadAttention::make_cache(std::int64_t batch, std::int64_t capacity, bool growable,
                                       DType dtype, const KvScales& scales) const {
  const MhaConfig& c = live(impl_, "make_cache").cfg;
  return KvCache(batch, c.kv_heads, c.head_dim, c.value_dim, capacity, growable, dtype, scales);
}

namespace {

// The self-attention entries (forward, forward_varlen; with positions or not): the call's record
// and context around the layer's pass. cu_seqlens: packed sequences.
void self_attention(const std::unique_ptr<MultiHeadAttention::Impl>& impl, const char* name,
                    const TensorView& x, const TensorView* cu_seqlens, const TensorView* positions,
                    const OutputView& out, const AttentionOptions& opts, Context* context) {
  detail::CallScope scope(cu_seqlens != nullptr ? "mha.forward_varlen" : "mha.forward");
  const MultiHeadAttention::Impl& m = live(impl, name);
  if (positions != nullptr) m.check_rotates(name);
  Context& ctx = context != nullptr ? *context : default_context();
  if (cu_seqlens != nullptr) {
    m.forward_varlen(x, *cu_seqlens, positions, out, opts, ctx);
  } else {
    m.forward(x, x, out, opts, ctx, /*self=*/true, positions);
  }
  describe(
      scope,
      [&] {
        std::string s = "x:" + detail::dims_of(x);
        if (cu_seqlens != nullptr) s += ";sequences:" + std::to_string(cu_seqlens->shape[0] - 1);
        return positions != nullptr ? s + ";positions" : s;
      },
      m.cfg, opts);
  scope.finish(ctx);
}

}  // namespace

void MultiHeadAttention::forward(const TensorView& x, const OutputView& out,
                                 const AttentionOptions& opts, Context* context) const {
  self_attention(impl_, "forward", x, nullptr, nullptr, out, opts, context);
}

void MultiHeadAttention::forward(const TensorView& x, const TensorView& positions,
                                 const OutputView& out, const AttentionOptions& opts,
                                 Context* context) const {
  self_attention(impl_, "forward", x, nullptr, &positions, out, opts, context);
}

void MultiHeadAttention::forward_varlen(const TensorView& x, const TensorView& cu_seqlens,
                                        const OutputView& out, const AttentionOptions& opts,
                                        Context* context) const {
  self_attention(impl_, "forward_varlen", x, &cu_seqlens, nullptr, out, opts, context);
}

void MultiHeadAttention::forward_varlen(const TensorView& x, const TensorView& cu_seqlens,
                                        const TensorView& positions, const OutputView& out,
                                        const AttentionOptions& opts, Context* context) const {
  self_attention(impl_, "forward_varlen", x, &cu_seqlens, &positions, out, opts, context);
}

void MultiHeadAttention::forward_cross(const TensorView& xq, const TensorView& xkv,
                                       const OutputView& out, const AttentionOptions& opts,
                                       Context* context) const {
  detail::CallScope scope("mha.forward_cross");
  const Impl& m = live(impl_, "forward_cross");
  if (m.prep.rotates()) {
    fail(
        "forward_cross: this layer has MhaConfig::rope, which is for self-attention (queries and "
        "keys at positions of one sequence); use forward() or decode()");
  }
  Context& ctx = context != nullptr ? *context : default_context();
  m.forward(xq, xkv, out, opts, ctx, /*self=*/false);
  describe(
      scope, [&] { return "xq:" + detail::dims_of(xq) + ";xkv:" + detail::dims_of(xkv); }, m.cfg,
      opts);
  scope.finish(ctx);
}

// Both forward passes: self (xq = xkv; RoPE at `positions`, else 0 .. L-1) or cross.
void MultiHeadAttention::Impl::forward(const TensorView& xq, const TensorView& xkv,
                                       const OutputView& out, const AttentionOptions& opts,
                                       Context& ctx, bool self, const TensorView* positions) const {
  const MhaConfig& c = cfg;
  const char* const qname = self ? "x" : "xq";
  check_input(qname, xq, 3);
  const std::int64_t B = xq.shape[0], Lq = xq.shape[1];
  check_io(qname, xq, "out", out, B, Lq);
  check_input("xkv", xkv, 3);
  if (xkv.shape[0] != B || xkv.shape[2] != c.d_model) {
    fail("xkv " + shape_str(xkv) + " must be [" + std::to_string(B) + ",Lk," +
         std::to_string(c.d_model) + "] (xq " + shape_str(xq) + ")");
  }
  const std::int64_t Lk = xkv.shape[1];
  const detail::Extent oe = detail::extent_of("out", out);
  detail::check_disjoint(
      "out", oe, {{"xq", detail::extent_of("xq", xq)}, {"xkv", detail::extent_of("xkv", xkv)}});
  Context::Impl& ci = detail::ContextAccess::impl(ctx);
  const Context::Impl::Lease layer_lease{ci, ci.layer_scratch.local()};
  const std::int64_t io = detail::f32_rows_floats(xq) + (self ? 0 : detail::f32_rows_floats(xkv)) +
                          detail::f32_rows_floats(out);
  const Buffers buf = buffers(ctx, B * Lq, B * Lk, self, positions != nullptr ? B * Lq : 0, io);
  const OutputView q = heads_view(buf.q, B, Lq, c.heads, c.head_dim, buf.stride);
  const OutputView k = heads_view(buf.k, B, Lk, c.kv_heads, c.head_dim, buf.stride);
  const OutputView v = heads_view(buf.v, B, Lk, c.kv_heads, c.value_dim, buf.stride);
  const OutputView a = a_view(buf, B, Lq);
  // Every option (mask, key lengths, lse, weights) is checked against the shapes before anything
  // is computed, so a bad option leaves `out` untouched.
  const detail::Problem problem = detail::validate(q, k, v, a, opts, false);
  check_optional_outputs(opts, oe, "xq", xq, "xkv", xkv);
  if (positions != nullptr) read_positions(*positions, B, Lq, true, "x " + shape_str(xq), buf.ints);

  float* io_rows = buf.io;
  const TensorView xq32 = detail::f32_rows(xq, io_rows);
  const OutputView out32 = detail::f32_out(out, io_rows);
  if (self) {
    project_step(xq32, buf, ctx);
    prepare_step(buf, B, Lq, {.per_token = positions != nullptr ? buf.ints : nullptr}, ctx);
  } else {  // Q from xq, K and V from xkv: the two panel ranges of the fused matrix
    const TensorView xkv32 = detail::f32_rows(xkv, io_rows);
    detail::run_linear_panels(*qkv, xq32, buf.q, buf.stride, 0, q_panels, ctx);
    detail::run_linear_panels(*qkv, xkv32, buf.k, buf.stride, q_panels, qkv->panels, ctx);
    // QK-norm only (no rope: forward_cross refuses it); Q and K have their own lengths
    prep.apply(detail::HeadRows{buf.q, buf.stride, c.heads}, std::nullopt, B, Lq, {}, ctx);
    prep.apply(std::nullopt, detail::HeadRows{buf.k, buf.stride, c.kv_heads}, B, Lk, {}, ctx);
  }
  detail::run_attention(problem, ctx);
  output(buf, B, Lq, out32, ctx);
  detail::narrow_rows(out32, out);
}

// Packed sequences: the tokens as one [1, T] batch of rows for the projections, QK-norm/RoPE
// and the output projection, and as attention_varlen's [T, heads, d] for the attention.
void MultiHeadAttention::Impl::forward_varlen(const TensorView& x, const TensorView& cu_seqlens,
                                              const TensorView* positions, const OutputView& out,
                                              const AttentionOptions& opts, Context& ctx) const {
  const MhaConfig& c = cfg;
  check_input("x", x, 2);
  const std::int64_t T = x.shape[0];
  if (x.shape[1] != c.d_model)
    fail("x " + shape_str(x) + " must have d_model=" + std::to_string(c.d_model) + " features");
  check_input("out", out, 2);
  if (out.shape[0] != T || out.shape[1] != c.d_model)
    fail("out " + shape_str(out) + " must be " + dims_str({T, c.d_model}) + " (x " + shape_str(x) +
         ")");
  detail::check_no_self_overlap("out", out);
  const detail::Extent oe = detail::extent_of("out", out);
  detail::check_disjoint("out", oe, {{"x", detail::extent_of("x", x)}});
  Context::Impl& ci = detail::ContextAccess::impl(ctx);
  const Context::Impl::Lease layer_lease{ci, ci.layer_scratch.local()};
  const Buffers buf = buffers(ctx, T, T, true, prep.rotates() ? T : 0,
                              detail::f32_rows_floats(x) + detail::f32_rows_floats(out));
  const auto packed = [&](float* p, std::int64_t heads, std::int64_t hw) {
    OutputView v = OutputView::contiguous(p, DType::f32, {T, heads, hw});
    v.strides = {buf.stride, hw, 1};
    return v;
  };
  const OutputView a = OutputView::contiguous(buf.a, DType::f32, {T, c.heads, c.value_dim});
  const detail::Packed problems = detail::validate_varlen(
      packed(buf.q, c.heads, c.head_dim), packed(buf.k, c.kv_heads, c.head_dim),
      packed(buf.v, c.kv_heads, c.value_dim), a, cu_seqlens, cu_seqlens, opts, false, "cu_seqlens",
      "cu_seqlens");
  check_optional_outputs(opts, oe, "x", x, "x", x);
  if (positions != nullptr) {
    read_positions(*positions, 1, T, false, "x " + shape_str(x), buf.ints);
  } else if (prep.rotates()) {
    const std::vector<std::int64_t>& o = problems.offsets_q;
    for (std::size_t b = 0; b + 1 < o.size(); ++b)
      for (std::int64_t t = o[b]; t < o[b + 1]; ++t) buf.ints[t] = t - o[b];
  }

  float* io_rows = buf.io;
  TensorView x3 = detail::f32_rows(x, io_rows);  // [1, T, d_model]: one batch of T rows
  x3.rank = 3;
  x3.shape = {1, T, c.d_model};
  x3.strides = {T * x3.strides[0], x3.strides[0], x3.strides[1]};
  const OutputView out32 = detail::f32_out(out, io_rows);
  project_step(x3, buf, ctx);
  prepare_step(buf, 1, T, {.per_token = prep.rotates() ? buf.ints : nullptr}, ctx);
  detail::run_varlen(problems, ctx);
  wo.forward(f32_view(static_cast<const float*>(buf.a), {T, c.heads * c.value_dim}), out32, &ctx);
  detail::narrow_rows(out32, out);
}

void MultiHeadAttention::decode(const TensorView& x, KvCache& cache, const OutputView& out,
                                const AttentionOptions& opts_in, Context* context) const {
  detail::CallScope scope("mha.decode");
  const Impl& m = live(impl_, "decode");
  const MhaConfig& c = m.cfg;
  AttentionOptions opts = m.check_decode(x, out, opts_in);
  const std::int64_t B = x.shape[0], n = x.shape[1];
  KvCache::Storage& s = live(cache.s_, "decode (cache)");
  if (s.B != B || s.Hkv != c.kv_heads || s.D != c.head_dim || s.Dv != c.value_dim) {
    fail("cache (batch=" + std::to_string(s.B) + ", kv_heads=" + std::to_string(s.Hkv) +
         ", head_dim=" + std::to_string(s.D) + ", value_dim=" + std::to_string(s.Dv) +
         ") does not fit this layer and x " + shape_str(x) + " (batch=" + std::to_string(B) +
         ", kv_heads=" + std::to_string(c.kv_heads) + ", head_dim=" + std::to_string(c.head_dim) +
         ", value_dim=" + std::to_string(c.value_dim) + ")");
  }
  // Grown buffers if this step needs them, swapped in only once everything has passed.
  std::optional<KvCache::Storage::Tokens> g = s.room_for(n);
  KvCache::Storage::Tokens& dst = g ? *g : s.t;
  const std::int64_t len = s.length + n;

  Context& ctx = context != nullptr ? *context : default_context();
  Context::Impl& ci = detail::ContextAccess::impl(ctx);
  const Context::Impl::Lease layer_lease{ci, ci.layer_scratch.local()};
  const Impl::Buffers buf = m.buffers(ctx, B * n, B * n, true, 0,
                                      detail::f32_rows_floats(x) + detail::f32_rows_floats(out));
  const OutputView q = Impl::heads_view(buf.q, B, n, c.heads, c.head_dim, buf.stride);
  const OutputView a = m.a_view(buf, B, n);
  // Validated against the cache as it will be once this step's tokens are stored (the views
  // cache.keys() / values() return then): once, before anything changes.
  opts.k_scales = s.scales(dst, false, len);
  opts.v_scales = s.scales(dst, true, len);
  const detail::Problem problem =
      detail::validate(q, s.view(dst, false, len), s.view(dst, true, len), a, opts, false);
  check_optional_outputs(opts, detail::extent_of("out", out), "x", x, "x", x);

  // One entry into the arena for the whole step (docs/performance.md#dm-decode-one-entry).
  ci.run_for_caller([&] {
    float* io_rows = buf.io;
    const TensorView x32 = detail::f32_rows(x, io_rows);
    const OutputView out32 = detail::f32_out(out, io_rows);
    m.project_step(x32, buf, ctx);
    m.prepare_step(buf, B, n, {.first = s.length}, ctx);
    const TensorView new_k = Impl::heads_view(buf.k, B, n, c.kv_heads, c.head_dim, buf.stride);
    const TensorView new_v = Impl::heads_view(buf.v, B, n, c.kv_heads, c.value_dim, buf.stride);
    s.check_storable(new_k, "k (projected from x)");
    s.check_storable(new_v, "v (projected from x)");
    s.store(new_k, new_v, dst);
    s.commit(g, len);
    detail::run_attention(problem, ctx);
    m.output(buf, B, n, out32, ctx);
    detail::narrow_rows(out32, out);
  });
  describe(
      scope, [&] { return "x:" + detail::dims_of(x) + ";cache:" + std::to_string(len); }, c, opts,
      s.dtype);
  scope.finish(ctx);
}

void MultiHeadAttention::decode(const TensorView& x, PagedKvCache& cache,
                                const std::vector<std::int64_t>& seqs, const OutputView& out,
                                const AttentionOptions& opts_in, Context* context) const {
  detail::CallScope scope("mha.decode_paged");
  const Impl& m = live(impl_, "decode");
  const MhaConfig& c = m.cfg;
  const AttentionOptions opts = m.check_decode(x, out, opts_in);
  const std::int64_t B = x.shape[0], n = x.shape[1];
  PagedKvCache::Storage& s = PagedKvCache::Storage::live(cache.s_, "decode (cache)");
  if (s.Hkv != c.kv_heads || s.D != c.head_dim || s.Dv != c.value_dim) {
    fail("paged cache (kv_heads=" + std::to_string(s.Hkv) + ", head_dim=" + std::to_string(s.D) +
         ", value_dim=" + std::to_string(s.Dv) + ") does not fit this layer (kv_heads=" +
         std::to_string(c.kv_heads) + ", head_dim=" + std::to_string(c.head_dim) +
         ", value_dim=" + std::to_string(c.value_dim) + ")");
  }
  if (static_cast<std::int64_t>(seqs.size()) != B)
    fail("decode: x " + shape_str(x) + " has " + std::to_string(B) + " sequences but seqs has " +
         std::to_string(seqs.size()));
  std::int64_t need = 0;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    need += s.pages_needed(s.seq(seqs[b], "decode"), n);
    for (std::size_t a = 0; a < b; ++a)
      if (seqs[a] == seqs[b])
        fail("decode: sequence " + std::to_string(seqs[b]) + " appears twice in seqs (at " +
             std::to_string(a) + " and " + std::to_string(b) + ")");
  }
  if (need > static_cast<std::int64_t>(s.free_list.size()))
    fail("decode: this step needs " + std::to_string(need) + " free pages but " +
         std::to_string(s.free_list.size()) + " of " + std::to_string(s.NP) + " are free");
  Context& ctx = context != nullptr ? *context : default_context();
  Context::Impl& ci = detail::ContextAccess::impl(ctx);
  const Context::Impl::Lease layer_lease{ci, ci.layer_scratch.local()};
  // Scratch ints: B zero lengths, B zero table entries (int32, in B int64 slots), B positions.
  const Impl::Buffers buf = m.buffers(ctx, B * n, B * n, true, 3 * B,
                                      detail::f32_rows_floats(x) + detail::f32_rows_floats(out));
  const OutputView q = Impl::heads_view(buf.q, B, n, c.heads, c.head_dim, buf.stride);
  const OutputView a = m.a_view(buf, B, n);
  // The options against the pool, before anything changes: every sequence as if empty (lengths
  // do not enter the options' checks), in a table of this call's own, so that a failed step
  // leaves the cache's batch() table and lengths (which a caller may hold) as they were.
  {
    std::int64_t* lens = buf.ints;
    auto* table = reinterpret_cast<std::int32_t*>(buf.ints + B);
    std::fill(lens, lens + B, 0);
    std::fill(table, table + B, 0);
    PagedKv dry;
    dry.k_pages = cache.key_pages();
    dry.v_pages = cache.value_pages();
    dry.k_scales = cache.key_page_scales();
    dry.v_scales = cache.value_page_scales();
    dry.block_table = TensorView::contiguous(table, DType::i32, {B, 1});
    dry.seq_lens = TensorView::contiguous(lens, DType::i64, {B});
    detail::check_paged(q, dry, a, opts);
  }
  check_optional_outputs(opts, detail::extent_of("out", out), "x", x, "x", x);

  // One entry into the arena for the whole step (docs/performance.md#dm-decode-one-entry), with
  // this (the caller's) thread's paged lists: the step may run on another thread.
  detail::PagedProblems& lists = detail::paged_problems_of_this_thread();
  ci.run_for_caller([&] {
    float* io_rows = buf.io;
    const TensorView x32 = detail::f32_rows(x, io_rows);
    const OutputView out32 = detail::f32_out(out, io_rows);
    m.project_step(x32, buf, ctx);
    {
      std::int64_t* lengths = buf.ints + 2 * B;
      for (std::int64_t b = 0; b < B; ++b)
        lengths[b] = cache.length(seqs[static_cast<std::size_t>(b)]);
      m.prepare_step(buf, B, n, {.per_seq = lengths}, ctx);
    }
    // Sequence b's new tokens as [Hkv, n, d] views of the projected rows ([B, n] rows of
    // buf.stride floats, K or V as [Hkv, d] in each).
    const auto rows = [&](const void* base, std::int64_t b, std::int64_t d) {
      TensorView t = TensorView::contiguous(static_cast<const float*>(base) + b * n * buf.stride,
                                            DType::f32, {c.kv_heads, n, d});
      t.strides = {d, buf.stride, 1};
      return t;
    };
    for (std::int64_t b = 0; b < B; ++b) {
      s.check_input("k (projected from x)", rows(buf.k, b, c.head_dim), s.D);
      s.check_input("v (projected from x)", rows(buf.v, b, c.value_dim), s.Dv);
    }
    for (std::int64_t b = 0; b < B; ++b)
      s.append_checked(s.seq(seqs[static_cast<std::size_t>(b)], "decode"),
                       rows(buf.k, b, c.head_dim), rows(buf.v, b, c.value_dim));
    detail::run_paged(q, cache.batch(seqs), a, opts, ctx, lists);
    m.output(buf, B, n, out32, ctx);
    detail::narrow_rows(out32, out);
  });
  describe(
      scope, [&] { return "x:" + detail::dims_of(x) + ";paged"; }, c, opts, cache.dtype());
  scope.finish(ctx);
}

}  // namespace cpuattn
