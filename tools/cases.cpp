// Benchmark cases shared by `cpuattn bench` and `cpuattn profile`: the named and custom attention
// shapes (bench/support/shapes.h) and the layer cases, each with its inputs made once.
#include "cases.h"

#include <cstdlib>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "cpuattn/layers.h"

namespace cpuattn::cli {

using bench::named_shapes;

namespace {

// Attention inputs and outputs are 64-byte aligned, as frameworks allocate tensors (PyTorch's
// CPU allocator aligns to 64): std::vector's 16-byte alignment would keep the kernel off its
// aligned paths (the non-temporal output stores).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  explicit Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  bool operator==(const Aligned64&) const { return true; }
  bool operator!=(const Aligned64&) const { return false; }
};
using AlignedFloats = std::vector<float, Aligned64<float>>;

// Deterministic, cheap fill (a hash of the index): random enough for timing, never zeros.
template <class Vec>
void fill(Vec& x, std::uint32_t seed) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u + seed * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = (static_cast<float>(h & 0xFFFFFF) / float(0xFFFFFF)) * 2.0f - 1.0f;
  }
}

constexpr std::int64_t kDm = 768, kHeads = 12, kTokens = 4096;

}  // namespace

Shape parse_shape(const std::string& text, bool causal) {
  if (auto it = named_shapes().find(text); it != named_shapes().end()) {
    Shape s = it->second;
    s.causal = s.causal || causal;
    return s;
  }
  std::vector<std::int64_t> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size() || x < 1) throw std::invalid_argument("");
      v.push_back(x);
    } catch (const std::exception&) {
      throw std::invalid_argument("--shape '" + text +
                                  "': expected a name (S1,P1,P2,X1,D1,D2,L1,M1,M2) or "
                                  "B,H,Lq,Lk,D[,Hkv[,Dv]] of positive integers");
    }
  }
  if (v.size() < 5 || v.size() > 7) {
    throw std::invalid_argument("--shape '" + text + "': expected B,H,Lq,Lk,D[,Hkv[,Dv]]");
  }
  Shape s{
      text,  v[0], v[1], v[2], v[3], v[4], v.size() > 5 ? v[5] : v[1], v.size() > 6 ? v[6] : v[4],
      causal};
  return s;
}

Case attention_case(const Shape& s) {
  struct Data {
    AlignedFloats q, k, v, out;
  };
  auto d = std::make_shared<Data>();
  d->q.resize(s.B * s.H * s.Lq * s.D);
  d->k.resize(s.B * s.Hkv * s.Lk * s.D);
  d->v.resize(s.B * s.Hkv * s.Lk * s.Dv);
  d->out.resize(s.B * s.H * s.Lq * s.Dv);
  fill(d->q, 1);
  fill(d->k, 2);
  fill(d->v, 3);
  AttentionOptions opts;
  opts.causal = s.causal ? Causal::top_left : Causal::none;
  Case c{s.name, s.dims(), s.flops(), s.kv_bytes(), s.decode(), {}};
  c.run = [d, s, opts](Context& ctx) {
    attention(f32_view(d->q.data(), {s.B, s.H, s.Lq, s.D}),
              f32_view(d->k.data(), {s.B, s.Hkv, s.Lk, s.D}),
              f32_view(d->v.data(), {s.B, s.Hkv, s.Lk, s.Dv}),
              f32_view(d->out.data(), {s.B, s.H, s.Lq, s.Dv}), opts, &ctx);
  };
  return c;
}

// Layer cases (README, "Benchmarks"): the dense product of a fused Q/K/V projection, a whole
// multi-head attention layer, and one decoding step against a 4096-token KV cache.
namespace {

std::shared_ptr<MultiHeadAttention> bench_layer() {
  std::vector<float> wq(kDm * kDm), wk(kDm * kDm), wv(kDm * kDm), wo(kDm * kDm), b(kDm);
  fill(wq, 4);
  fill(wk, 5);
  fill(wv, 6);
  fill(wo, 7);
  fill(b, 8);
  for (auto* w : {&wq, &wk, &wv, &wo})
    for (auto& x : *w) x *= 0.036f;  // ~ 1/sqrt(d_model): unit-sized activations
  const auto m = [](const std::vector<float>& w) { return f32_view(w.data(), {kDm, kDm}); };
  const auto bv = f32_view(b.data(), {kDm});
  return std::make_shared<MultiHeadAttention>(
      MhaConfig{kDm, kHeads, 0, 0, 0}, MhaWeights{m(wq), m(wk), m(wv), m(wo), bv, bv, bv, bv});
}

}  // namespace

std::optional<Case> layer_case(const std::string& name) {
  if (name == "L1") {  // x [4096, 768] times [Wq | Wk | Wv] [768, 2304]
    const std::int64_t M = 8 * 512, K = kDm, N = 3 * kDm;
    auto x = std::make_shared<std::vector<float>>(M * K);
    auto y = std::make_shared<std::vector<float>>(M * N);
    std::vector<float> w(K * N);
    fill(*x, 9);
    fill(w, 10);
    auto lin = std::make_shared<Linear>(f32_view(w.data(), {K, N}));
    return Case{"L1", "Linear M4096 K768 N2304", 2.0 * M * K * N, 0, false, [=](Context& ctx) {
                  lin->forward(f32_view(x->data(), {M, K}), f32_view(y->data(), {M, N}), &ctx);
                }};
  }
  if (name == "M1") {  // self-attention layer, B 8, L 512
    const std::int64_t B = 8, L = 512;
    auto layer = bench_layer();
    auto x = std::make_shared<std::vector<float>>(B * L * kDm);
    auto out = std::make_shared<std::vector<float>>(B * L * kDm);
    fill(*x, 11);
    const double proj = 2.0 * B * L * kDm * kDm * 4;  // Q, K, V and output projections
    const double attn = 4.0 * B * kHeads * L * L * (kDm / kHeads);
    return Case{"M1", "MHA B8 L512 d768 H12", proj + attn, 0, false, [=](Context& ctx) {
                  layer->forward(f32_view(x->data(), {B, L, kDm}),
                                 f32_view(out->data(), {B, L, kDm}), {}, &ctx);
                }};
  }
  if (name == "M2") {  // one new token per sequence, 8 sequences, 4096 cached tokens each
    const std::int64_t B = 8;
    auto layer = bench_layer();
    auto cache = std::make_shared<KvCache>(layer->make_cache(B, kTokens + 1));
    // Fill the cache with kTokens tokens once; each timed step appends one and is then rolled
    // back, so every run attends to 4097 tokens.
    std::vector<float> kv(B * kHeads * kTokens * (kDm / kHeads));
    fill(kv, 12);
    const TensorView kvv = f32_view(kv.data(), {B, kHeads, kTokens, kDm / kHeads});
    cache->append(kvv, kvv);
    auto x = std::make_shared<std::vector<float>>(B * kDm);
    auto out = std::make_shared<std::vector<float>>(B * kDm);
    fill(*x, 13);
    const double proj = 2.0 * B * kDm * kDm * 4;
    const double attn = 4.0 * B * kHeads * (kTokens + 1) * (kDm / kHeads);
    const double bytes = 4.0 * (4 * kDm * kDm + 2.0 * B * (kTokens + 1) * kDm);
    return Case{
        "M2", "MHA decode B8 cache4096 d768 H12", proj + attn, bytes, true, [=](Context& ctx) {
          layer->decode(f32_view(x->data(), {B, 1, kDm}), *cache,
                        f32_view(out->data(), {B, 1, kDm}), {}, &ctx);
          cache->truncate(kTokens);  // drop the new token: every run sees 4097
        }};
  }
  return std::nullopt;
}

Case make_case(const std::string& name, bool causal) {
  if (auto lc = layer_case(name)) return std::move(*lc);
  return attention_case(parse_shape(name, causal));
}

}  // namespace cpuattn::cli
