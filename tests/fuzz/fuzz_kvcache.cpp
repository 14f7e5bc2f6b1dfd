// Sequences of KvCache operations (include/cpuattn/layers.h) on two cache slots, each mirrored
// by a plain shadow copy: construction with valid and absurd sizes, append (contiguous and
// strided, right and wrong shapes), truncate, clear, reserve (up to INT64_MAX), decode steps of a
// small MultiHeadAttention, appends of the cache's own keys()/values() views, move construction
// and move assignment, and calls on moved-from objects. After every operation the cache must match
// its shadow: sizes, length <= capacity, the keys()/values() views and every cached token bit for
// bit.
//
// The contract checked, from layers.h and the library's hardening (commit 3f38a77):
//  * an invalid argument, a full fixed cache, or a size beyond 2^40 floats of K or of V (or one
//    whose arithmetic overflows) throws cpuattn::Error and changes nothing;
//  * a growable cache that must grow for an append doubles its capacity, or grows to fit;
//  * a moved-from KvCache or MultiHeadAttention may be destroyed and assigned to; every other
//    call on it throws cpuattn::Error;
//  * decode appends the projections x Wk, x Wv of its tokens (checked against double precision)
//    and writes every element of out; on error, out and the cached tokens stay as they were.
// Only caches of at most 2^16 floats are created: sizes between that and the 2^40 limit are
// legal but would make the fuzzer allocate gigabytes, so they are skipped.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpuattn/layers.h"
#include "fuzz_util.h"

namespace cpuattn::fuzz {
namespace {

constexpr std::int64_t kMaxFloats = std::int64_t{1} << 40;   // the library's limit, K or V
constexpr std::int64_t kTestFloats = std::int64_t{1} << 16;  // what this target allocates

// A MultiHeadAttention with fixed weights, and the config it was built from.
struct Layer {
  MhaConfig cfg;
  std::vector<float> wq, wk, wv, wo, bk;
  std::optional<MultiHeadAttention> mha;

  explicit Layer(MhaConfig c) : cfg(c) {
    auto weights = [](std::int64_t n, float step) {
      std::vector<float> w(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(step * (i + 1));
      return w;
    };
    wq = weights(c.d_model * c.heads * c.head_dim, 0.7f);
    wk = weights(c.d_model * c.kv_heads * c.head_dim, 1.3f);
    wv = weights(c.d_model * c.kv_heads * c.value_dim, 2.1f);
    wo = weights(c.heads * c.value_dim * c.d_model, 0.9f);
    bk = weights(c.kv_heads * c.head_dim, 0.4f);
    mha.emplace(c, weights_view());
  }
  MhaWeights weights_view() const {
    MhaWeights w;
    w.wq = f32_view(wq.data(), {cfg.d_model, cfg.heads * cfg.head_dim});
    w.wk = f32_view(wk.data(), {cfg.d_model, cfg.kv_heads * cfg.head_dim});
    w.wv = f32_view(wv.data(), {cfg.d_model, cfg.kv_heads * cfg.value_dim});
    w.wo = f32_view(wo.data(), {cfg.heads * cfg.value_dim, cfg.d_model});
    w.bk = f32_view(bk.data(), {cfg.kv_heads * cfg.head_dim});
    return w;
  }
};

Layer& layer(int which) {
  // d_model, heads, kv_heads, head_dim, value_dim: GQA with D != Dv, and plain multi-head.
  static Layer layers[2] = {
      Layer(MhaConfig{.d_model = 8, .heads = 4, .kv_heads = 2, .head_dim = 3, .value_dim = 5}),
      Layer(MhaConfig{.d_model = 6, .heads = 2, .kv_heads = 2, .head_dim = 3, .value_dim = 3})};
  return layers[which];
}

// What a cache must hold: its sizes and its tokens, per (batch, head) row the cached tokens'
// K (D floats each) and V (Dv floats each) in order.
struct Shadow {
  enum State { none, live, moved_from } state = none;
  std::int64_t B = 0, Hkv = 0, D = 0, Dv = 0, capacity = 0, length = 0;
  bool growable = false;
  std::vector<std::vector<float>> k, v;

  void start(std::int64_t b, std::int64_t h, std::int64_t d, std::int64_t dv, std::int64_t cap,
             bool grow) {
    *this = Shadow{live, b, h, d, dv, cap, 0, grow, {}, {}};
    k.resize(static_cast<std::size_t>(B * Hkv));
    v.resize(static_cast<std::size_t>(B * Hkv));
  }
  void truncate(std::int64_t n) {
    for (auto& row : k) row.resize(static_cast<std::size_t>(n * D));
    for (auto& row : v) row.resize(static_cast<std::size_t>(n * Dv));
    length = n;
  }
  // The capacity after making room for n more tokens (layers.h: double, or more to fit).
  std::int64_t grown(std::int64_t n) const {
    return length + n <= capacity ? capacity : std::max(2 * capacity, length + n);
  }
  float key(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t d) const {
    return k[static_cast<std::size_t>(b * Hkv + h)][static_cast<std::size_t>(l * D + d)];
  }
  float value(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t d) const {
    return v[static_cast<std::size_t>(b * Hkv + h)][static_cast<std::size_t>(l * Dv + d)];
  }
};

// Calls f, which must throw cpuattn::Error; anything else escapes (and is reported).
template <class F>
bool throws_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
    return true;
  }
  return false;
}

// The cache must match its shadow exactly.
void check(const KvCache& c, const Shadow& s, int slot) {
  FUZZ_CHECK(c.batch() == s.B && c.kv_heads() == s.Hkv && c.head_dim() == s.D &&
                 c.value_dim() == s.Dv && c.growable() == s.growable,
             "slot %d: sizes changed", slot);
  FUZZ_CHECK(c.length() == s.length && c.capacity() == s.capacity,
             "slot %d: length %lld capacity %lld, expected %lld and %lld", slot,
             static_cast<long long>(c.length()), static_cast<long long>(c.capacity()),
             static_cast<long long>(s.length), static_cast<long long>(s.capacity));
  FUZZ_CHECK(c.length() <= c.capacity(), "slot %d: length > capacity", slot);
  for (int which = 0; which < 2; ++which) {
    const TensorView t = which == 0 ? c.keys() : c.values();
    const std::int64_t w = which == 0 ? s.D : s.Dv;
    FUZZ_CHECK(t.dtype == DType::f32 && t.rank == 4 && t.shape[0] == s.B && t.shape[1] == s.Hkv &&
                   t.shape[2] == s.length && t.shape[3] == w && t.strides[3] == 1,
               "slot %d: %s() view has the wrong shape", slot, which == 0 ? "keys" : "values");
    const auto* p = static_cast<const float*>(t.data);
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t h = 0; h < s.Hkv; ++h)
        for (std::int64_t l = 0; l < s.length; ++l)
          for (std::int64_t d = 0; d < w; ++d) {
            const float got = p[b * t.strides[0] + h * t.strides[1] + l * t.strides[2] + d];
            const float want = which == 0 ? s.key(b, h, l, d) : s.value(b, h, l, d);
            FUZZ_CHECK(std::memcmp(&got, &want, 4) == 0,
                       "slot %d: %s[%lld,%lld,%lld,%lld] = %g, appended %g", slot,
                       which == 0 ? "keys" : "values", static_cast<long long>(b),
                       static_cast<long long>(h), static_cast<long long>(l),
                       static_cast<long long>(d), got, want);
          }
  }
}

// Every call on a moved-from cache throws Error.
void check_moved_from(KvCache& c) {
  float x[1] = {0};
  const TensorView t = f32_view(x, {1, 1, 1, 1});
  FUZZ_CHECK(throws_error([&] { (void)c.batch(); }) && throws_error([&] { (void)c.length(); }) &&
                 throws_error([&] { (void)c.capacity(); }) &&
                 throws_error([&] { (void)c.growable(); }) &&
                 throws_error([&] { (void)c.keys(); }) && throws_error([&] { (void)c.values(); }) &&
                 throws_error([&] { c.clear(); }) && throws_error([&] { c.truncate(0); }) &&
                 throws_error([&] { c.reserve(1); }) && throws_error([&] { c.append(t, t); }),
             "a call on a moved-from KvCache did not throw cpuattn::Error");
}

std::int64_t pick_size(Reader& in) {
  static const std::int64_t kHuge[] = {0,
                                       -1,
                                       1 << 20,
                                       std::int64_t{1} << 31,
                                       std::int64_t{1} << 32,
                                       (std::int64_t{1} << 40) + 1,
                                       std::int64_t{1} << 62,
                                       std::numeric_limits<std::int64_t>::max(),
                                       std::numeric_limits<std::int64_t>::min()};
  return in.chance(15) ? in.pick(kHuge) : in.range(1, 4);
}

// floats of K or V per the library's rule: batch * kv_heads * max(D, Dv) * capacity, or -1 if
// that overflows.
std::int64_t cache_floats(std::int64_t B, std::int64_t H, std::int64_t D, std::int64_t Dv,
                          std::int64_t cap) {
  std::int64_t n = 0;
  if (__builtin_mul_overflow(B, H, &n) || __builtin_mul_overflow(n, std::max(D, Dv), &n) ||
      __builtin_mul_overflow(n, cap, &n)) {
    return -1;
  }
  return n;
}

}  // namespace
}  // namespace cpuattn::fuzz

using namespace cpuattn;
using namespace cpuattn::fuzz;

namespace {

// A 4-d f32 tensor for append(): contiguous, heads interleaved (blhd) or rows padded.
struct Tokens {
  std::vector<float> buf;
  TensorView view;
  Tokens(Reader& in, std::int64_t B, std::int64_t H, std::int64_t n, std::int64_t w, int rank,
         float& counter) {
    const int layout = static_cast<int>(in.range(0, 2));
    const std::int64_t row = layout == 2 ? w + 3 : w;
    buf.resize(static_cast<std::size_t>(std::max<std::int64_t>(B * H * n * row, 1)));
    for (float& x : buf) x = counter += 0.25f;  // distinct values: a misplaced token shows
    view = layout == 1 ? TensorView::blhd(buf.data(), DType::f32, B, n, H, w)
                       : TensorView::contiguous(buf.data(), DType::f32, {B, H, n, w});
    if (layout == 2) view.strides = {H * n * row, n * row, row, 1};
    view.rank = rank;
  }
  float at(std::int64_t b, std::int64_t h, std::int64_t l, std::int64_t d) const {
    const auto& s = view.strides;
    return buf[static_cast<std::size_t>(b * s[0] + h * s[1] + l * s[2] + d)];
  }
};

void op_construct(Reader& in, std::optional<KvCache>& slot, Shadow& s, bool via_layer) {
  const int which = static_cast<int>(in.range(0, 1));
  const MhaConfig& cfg = layer(which).cfg;
  const std::int64_t B = pick_size(in), cap = pick_size(in);
  const std::int64_t H = via_layer ? cfg.kv_heads : pick_size(in);
  const std::int64_t D = via_layer ? cfg.head_dim : pick_size(in);
  const std::int64_t Dv = via_layer ? cfg.value_dim : pick_size(in);
  const bool grow = in.chance(50);
  const std::int64_t floats = cache_floats(B, H, D, Dv, cap);
  const bool valid =
      B >= 1 && H >= 1 && D >= 1 && Dv >= 1 && cap >= 1 && floats >= 0 && floats <= kMaxFloats;
  if (valid && floats > kTestFloats) return;  // legal, but gigabytes
  std::optional<KvCache> made;
  const bool threw = throws_error([&] {
    if (via_layer) {
      made.emplace(layer(which).mha->make_cache(B, cap, grow));
    } else {
      made.emplace(B, H, D, Dv, cap, grow);
    }
  });
  FUZZ_CHECK(threw == !valid, "KvCache(%lld, %lld, %lld, %lld, capacity %lld) %s",
             static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(D),
             static_cast<long long>(Dv), static_cast<long long>(cap),
             threw ? "threw for valid sizes" : "accepted invalid or too large sizes");
  if (threw) return;
  slot = std::move(made);  // move-assigns over the old cache, or move-constructs
  s.start(B, H, D, Dv, cap, grow);
}

void op_append(Reader& in, KvCache& c, Shadow& s, float& counter) {
  std::int64_t kn[4] = {s.B, s.Hkv, in.range(1, 3), s.D}, vn[4] = {s.B, s.Hkv, kn[2], s.Dv};
  int krank = 4;
  const bool wrong = in.chance(15);
  if (wrong) {
    switch (in.range(0, 5)) {
      case 0:
        ++kn[0];
        break;
      case 1:
        ++kn[1];
        break;
      case 2:
        ++kn[3];
        break;
      case 3:
        ++vn[2];
        break;  // k and v disagree on n
      case 4:
        kn[2] = vn[2] = 0;
        break;
      default:
        krank = 3;
    }
  }
  const Tokens k(in, kn[0], kn[1], kn[2], kn[3], krank, counter);
  const Tokens v(in, vn[0], vn[1], vn[2], vn[3], 4, counter);
  const std::int64_t n = kn[2];
  const bool fits = wrong || s.growable || s.length + n <= s.capacity;
  const bool threw = throws_error([&] { c.append(k.view, v.view); });
  FUZZ_CHECK(threw == (wrong || !fits), "append of %lld tokens (length %lld, capacity %lld%s) %s",
             static_cast<long long>(n), static_cast<long long>(s.length),
             static_cast<long long>(s.capacity), wrong ? ", wrong shapes" : "",
             threw ? "threw" : "did not throw");
  if (threw) return;
  s.capacity = s.grown(n);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hkv; ++h)
      for (std::int64_t l = 0; l < n; ++l) {
        auto& kr = s.k[static_cast<std::size_t>(b * s.Hkv + h)];
        auto& vr = s.v[static_cast<std::size_t>(b * s.Hkv + h)];
        for (std::int64_t d = 0; d < s.D; ++d) kr.push_back(k.at(b, h, l, d));
        for (std::int64_t d = 0; d < s.Dv; ++d) vr.push_back(v.at(b, h, l, d));
      }
  s.length += n;
}

// Appends the cache's own first n tokens, read through its keys() / values() views: a growing
// append must read them before it frees the old buffers (issue 33, item 1).
void op_append_own(Reader& in, KvCache& c, Shadow& s) {
  if (s.length == 0) return;
  const std::int64_t n = in.range(1, s.length);
  TensorView k = c.keys(), v = c.values();
  k.shape[2] = v.shape[2] = n;
  const bool fits = s.growable || s.length + n <= s.capacity;
  const bool threw = throws_error([&] { c.append(k, v); });
  FUZZ_CHECK(threw == !fits,
             "append of the cache's own %lld tokens (length %lld, capacity %lld) %s",
             static_cast<long long>(n), static_cast<long long>(s.length),
             static_cast<long long>(s.capacity), threw ? "threw" : "did not throw");
  if (threw) return;
  s.capacity = s.grown(n);
  for (auto* rows : {&s.k, &s.v})
    for (auto& row : *rows) {
      const std::vector<float> head(row.begin(), row.begin() + n * (rows == &s.k ? s.D : s.Dv));
      row.insert(row.end(), head.begin(), head.end());
    }
  s.length += n;
}

void op_reserve(Reader& in, KvCache& c, Shadow& s) {
  const std::int64_t per_token = s.B * s.Hkv * std::max(s.D, s.Dv);
  const std::int64_t limit = kMaxFloats / per_token;  // the largest capacity allowed
  static const std::int64_t kAbsurd[] = {std::numeric_limits<std::int64_t>::max(),
                                         std::int64_t{1} << 62, kMaxFloats + 1, -5, 0};
  std::int64_t want = s.capacity + in.range(-2, 8);
  if (in.chance(20)) want = in.chance(50) ? limit + 1 : in.pick(kAbsurd);
  if (want > s.capacity && want <= limit && want * per_token > kTestFloats) return;  // gigabytes
  const bool valid = want <= s.capacity || (s.growable && want <= limit);
  const bool threw = throws_error([&] { c.reserve(want); });
  FUZZ_CHECK(threw == !valid, "reserve(%lld) on a %s cache of capacity %lld %s",
             static_cast<long long>(want), s.growable ? "growable" : "fixed",
             static_cast<long long>(s.capacity), threw ? "threw" : "did not throw");
  if (!threw) s.capacity = std::max(s.capacity, want);
}

// One decoding step of `which` layer for n tokens. The cache must fit the layer (else Error).
void op_decode(Reader& in, KvCache& c, Shadow& s, float& counter) {
  Layer& L = layer(static_cast<int>(in.range(0, 1)));
  const MhaConfig& cfg = L.cfg;
  const std::int64_t B = in.chance(85) ? s.B : s.B + 1, n = in.range(1, 3);
  std::vector<float> x(static_cast<std::size_t>(B * n * cfg.d_model));
  for (float& e : x) e = std::sin(counter += 0.37f);
  std::vector<float> out(static_cast<std::size_t>(B * n * cfg.d_model),
                         std::numeric_limits<float>::quiet_NaN());
  AttentionOptions opts;
  const int causal = static_cast<int>(in.range(0, 4));  // mostly none
  opts.causal = causal == 1 ? Causal::bottom_right : causal == 2 ? Causal::top_left : Causal::none;
  const bool fits_layer =
      B == s.B && s.Hkv == cfg.kv_heads && s.D == cfg.head_dim && s.Dv == cfg.value_dim;
  const bool valid =
      fits_layer && opts.causal != Causal::top_left && (s.growable || s.length + n <= s.capacity);
  const bool threw = throws_error([&] {
    L.mha->decode(f32_view(x.data(), {B, n, cfg.d_model}), c,
                  f32_view(out.data(), {B, n, cfg.d_model}), opts);
  });
  FUZZ_CHECK(threw == !valid, "decode of %lld tokens (batch %lld, layer %lld/%lld/%lld/%lld) %s",
             static_cast<long long>(n), static_cast<long long>(B),
             static_cast<long long>(cfg.kv_heads), static_cast<long long>(cfg.head_dim),
             static_cast<long long>(cfg.value_dim), static_cast<long long>(s.length),
             threw ? "threw" : "did not throw");
  if (threw) {
    // layers.h: on error neither out nor the cached tokens change; the capacity may have grown.
    for (float o : out) FUZZ_CHECK(std::isnan(o), "decode threw but wrote out");
    FUZZ_CHECK(c.capacity() >= s.capacity, "decode threw and shrank the cache");
    s.capacity = c.capacity();
    return;
  }
  for (float o : out) FUZZ_CHECK(std::isfinite(o), "decode left out unwritten or not finite");
  // The new tokens are x Wk + bk and x Wv, to the rounding of a d_model-long f32 dot product.
  const TensorView kv[2] = {c.keys(), c.values()};
  const std::int64_t old = s.length;
  s.capacity = s.grown(n);
  s.length += n;
  for (int which = 0; which < 2; ++which) {
    const std::int64_t w = which == 0 ? s.D : s.Dv;
    const std::vector<float>& W = which == 0 ? L.wk : L.wv;
    const std::int64_t cols = cfg.kv_heads * w;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < s.Hkv; ++h)
        for (std::int64_t t = 0; t < n; ++t)
          for (std::int64_t d = 0; d < w; ++d) {
            double want = which == 0 ? L.bk[static_cast<std::size_t>(h * w + d)] : 0.0, mag = 0;
            for (std::int64_t m = 0; m < cfg.d_model; ++m) {
              const double term =
                  double(x[static_cast<std::size_t>((b * n + t) * cfg.d_model + m)]) *
                  W[static_cast<std::size_t>(m * cols + h * w + d)];
              want += term;
              mag += std::fabs(term);
            }
            const auto* p = static_cast<const float*>(kv[which].data);
            const float got = p[b * kv[which].strides[0] + h * kv[which].strides[1] +
                                (old + t) * kv[which].strides[2] + d];
            const double tol = 8 * std::numeric_limits<float>::epsilon() *
                               (std::sqrt(double(cfg.d_model)) * mag + std::fabs(want));
            FUZZ_CHECK(std::fabs(got - want) <= tol, "decode cached %s %g, x W gives %g",
                       which == 0 ? "key" : "value", got, want);
            (which == 0 ? s.k : s.v)[static_cast<std::size_t>(b * s.Hkv + h)].push_back(got);
          }
  }
}

// A moved-from MultiHeadAttention throws on use and can be assigned to.
void op_moved_layer(KvCache* c) {
  Layer& L = layer(0);
  MultiHeadAttention a(L.cfg, L.weights_view());
  MultiHeadAttention b(std::move(a));
  float x[8] = {}, out[8] = {};
  FUZZ_CHECK(throws_error([&] { (void)a.config(); }) &&
                 throws_error([&] { (void)a.make_cache(1, 1); }) &&
                 (c == nullptr || throws_error([&] {
                    a.decode(f32_view(x, {1, 1, 8}), *c, f32_view(out, {1, 1, 8}));
                  })),
             "a call on a moved-from MultiHeadAttention did not throw cpuattn::Error");
  a = std::move(b);
  FUZZ_CHECK(a.config().d_model == L.cfg.d_model, "assigning to a moved-from layer failed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size);
  std::optional<KvCache> slot[2];
  Shadow sh[2];
  float counter = 0;
  for (int step = 0; step < 32 && !in.empty(); ++step) {
    const int i = static_cast<int>(in.range(0, 1)), j = 1 - i;
    const int op = static_cast<int>(in.range(0, 9));
    if (op == 0 || op == 9) {
      op_construct(in, slot[i], sh[i], op == 9);
    } else if (op == 6 || op == 7) {  // move slot i into slot j
      if (!slot[i] || (op == 7 && !slot[j])) continue;
      if (op == 6) {
        slot[j].emplace(std::move(*slot[i]));
      } else {
        *slot[j] = std::move(*slot[i]);
      }
      sh[j] = sh[i];
      sh[i].state = Shadow::moved_from;
      check_moved_from(*slot[i]);
    } else if (op == 8) {
      op_moved_layer(sh[i].state == Shadow::live ? &*slot[i] : nullptr);
    } else if (sh[i].state == Shadow::moved_from) {
      // Every call on a moved-from cache throws; decode too.
      float x[8] = {}, out[8] = {};
      FUZZ_CHECK(throws_error([&] {
                   layer(0).mha->decode(f32_view(x, {1, 1, 8}), *slot[i], f32_view(out, {1, 1, 8}));
                 }),
                 "decode into a moved-from KvCache did not throw cpuattn::Error");
      check_moved_from(*slot[i]);
    } else if (sh[i].state == Shadow::live) {
      KvCache& c = *slot[i];
      Shadow& s = sh[i];
      if (op == 1) {
        if (in.chance(15)) {
          op_append_own(in, c, s);
        } else {
          op_append(in, c, s, counter);
        }
      }
      if (op == 2) {
        const std::int64_t n =
            in.chance(10) ? std::numeric_limits<std::int64_t>::min() : in.range(-1, s.length + 1);
        const bool threw = throws_error([&] { c.truncate(n); });
        FUZZ_CHECK(threw == (n < 0 || n > s.length), "truncate(%lld) at length %lld %s",
                   static_cast<long long>(n), static_cast<long long>(s.length),
                   threw ? "threw" : "did not throw");
        if (!threw) s.truncate(n);
      }
      if (op == 3) {
        c.clear();
        s.truncate(0);
      }
      if (op == 4) op_reserve(in, c, s);
      if (op == 5) op_decode(in, c, s, counter);
    }
    for (int t = 0; t < 2; ++t) {
      if (sh[t].state == Shadow::live) check(*slot[t], sh[t], t);
    }
  }
  return 0;
}
