// Benchmark cases shared by `cpuattn bench` and `cpuattn profile`: the named and custom attention
// shapes (bench/support/shapes.h) and the layer cases, each with its inputs made once.
#include "cases.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "cpuattn/layers.h"
#include "probes.h"

namespace cpuattn::cli {

using bench::named_shapes;

namespace {

std::atomic<bool> huge_pages{false};  // set_huge_page_buffers

// Attention inputs and outputs are 64-byte aligned, as frameworks allocate tensors (PyTorch's
// CPU allocator aligns to 64): std::vector's 16-byte alignment would keep the kernel off its
// aligned paths (the non-temporal output stores). With huge_pages, buffers of 2 MiB and more are
// whole 2 MiB pages, advised MADV_HUGEPAGE (set_huge_page_buffers).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  explicit Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (huge_pages.load() && bytes >= (std::size_t{2} << 20))
      return static_cast<T*>(alloc_huge_pages(bytes));
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
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

void set_huge_page_buffers(bool on) { huge_pages.store(on); }
bool huge_page_buffers() { return huge_pages.load(); }

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
                                  "': expected a name (S1,P1,P2,X1,D1,D2,W1,V1,G1,L1,M1,M2) or "
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

DType parse_dtype(const std::string& text, const char* flag, bool kv) {
  DType d;
  if (cpuattn::parse_dtype(text, d) &&
      (dtype_role(d) == DTypeRole::tensor || (kv && dtype_role(d) == DTypeRole::scaled)))
    return d;
  throw std::invalid_argument(std::string(flag) + " '" + text + "': expected " + dtype_choices(kv));
}

std::string dtype_choices(bool kv) {
  std::string names;
  for (const std::string& n : dtype_names(kv)) names += (names.empty() ? "" : ", ") + n;
  return names;
}

std::vector<std::string> dtype_names(bool kv) {
  std::vector<std::string> names;
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    if (dtype_role(d) == DTypeRole::tensor || (kv && dtype_role(d) == DTypeRole::scaled))
      names.push_back(dtype_short_name(d));
  }
  return names;
}

const char* short_dtype_name(DType t) { return dtype_short_name(t); }

namespace {

// A tensor's values stored as `dtype`, rows of `row` values, converted as a KvCache of that
// dtype stores them (a scaled dtype with one scale per row).
struct StoredTensor {
  DType dtype = DType::f32;
  AlignedFloats f32, scales;
  std::vector<std::uint8_t, Aligned64<std::uint8_t>> bytes;
  StoredTensor(AlignedFloats x, DType t, std::int64_t row) : dtype(t) {
    if (t == DType::f32) {
      f32 = std::move(x);
      return;
    }
    const auto rows = static_cast<std::int64_t>(x.size()) / row;
    KvCache c(1, 1, row, 1, rows, false, t);
    std::vector<float> unused(static_cast<std::size_t>(rows));
    c.append(f32_view(x.data(), {1, 1, rows, row}), f32_view(unused.data(), {1, 1, rows, 1}));
    const TensorView k = c.keys();
    const auto* p = static_cast<const std::uint8_t*>(k.data);
    bytes.assign(p, p + x.size() * dtype_size(t));
    if (const auto ks = c.key_scales()) {
      const auto* sp = static_cast<const float*>(ks->data);
      scales.assign(sp, sp + rows);
    }
  }
  const void* data() const {
    return dtype == DType::f32 ? static_cast<const void*>(f32.data())
                               : static_cast<const void*>(bytes.data());
  }
};

AlignedFloats filled(std::size_t n, std::uint32_t seed) {
  AlignedFloats x(n);
  fill(x, seed);
  return x;
}

}  // namespace

Layout parse_layout(const std::string& text) {
  for (Layout l : {Layout::bhld, Layout::blhd}) {
    if (text == layout_name(l)) return l;
  }
  throw std::invalid_argument("--layout '" + text + "': expected bhld or blhd");
}

const char* layout_name(Layout l) { return l == Layout::blhd ? "blhd" : "bhld"; }

ScoreVariant parse_variant(const std::string& text) {
  for (ScoreVariant v : {ScoreVariant::plain, ScoreVariant::softcap, ScoreVariant::alibi,
                         ScoreVariant::sinks, ScoreVariant::all}) {
    if (text == variant_name(v)) return v;
  }
  throw std::invalid_argument("--variant '" + text +
                              "': expected plain, softcap, alibi, sinks or all");
}

const char* variant_name(ScoreVariant v) {
  switch (v) {
    case ScoreVariant::softcap:
      return "softcap";
    case ScoreVariant::alibi:
      return "alibi";
    case ScoreVariant::sinks:
      return "sinks";
    case ScoreVariant::all:
      return "all";
    default:
      return "plain";
  }
}

Products products_of(const std::string& bf16_path) {
  return bf16_path == "amx_bf16"      ? Products::tiles
         : bf16_path == "avx512_bf16" ? Products::pairs
                                      : Products::f32;
}

double attention_fma_share(std::int64_t D, std::int64_t Dv, Products products) {
  const double n = static_cast<double>(D + Dv);
  const double per_product = products == Products::tiles   ? 0.0
                             : products == Products::pairs ? 0.5
                                                           : 1.0;
  return n / (per_product * n + kSoftmaxOpsPerScore);
}

namespace {

double share_of(const WorkPart& w, Products products) {
  return products == Products::tiles   ? w.fma_share_tiles
         : products == Products::pairs ? w.fma_share_native
                                       : w.fma_share;
}

}  // namespace

double limit_ms(const std::vector<WorkPart>& parts, double peak_gflops, double read_gbps,
                Products products) {
  double ms = 0;
  for (const WorkPart& w : parts) {
    const double share = share_of(w, products);
    ms +=
        std::max(w.flops / (peak_gflops * share), read_gbps > 0 ? w.bytes / read_gbps : 0.0) * 1e-6;
  }
  return ms;
}

std::string limit_kind(const std::vector<WorkPart>& parts, double peak_gflops, double read_gbps,
                       Products products) {
  bool fma = false, bw = false;
  for (const WorkPart& w : parts) {
    const double share = share_of(w, products);
    (w.flops / (peak_gflops * share) >= w.bytes / read_gbps ? fma : bw) = true;
  }
  return fma && bw ? "fma+bw" : fma ? "fma" : "bw";
}

Case attention_case(const Shape& s, DType dtype, DType kv_dtype, ScoreVariant variant,
                    Layout layout) {
  struct Data {
    StoredTensor q, k, v;
    std::vector<std::uint8_t, Aligned64<std::uint8_t>> out;
    std::vector<float> sinks;
  };
  auto d = std::make_shared<Data>(
      Data{StoredTensor(filled(s.B * s.H * s.Lq * s.D, 1), dtype, s.D),
           StoredTensor(filled(s.B * s.Hkv * s.Lk * s.D, 2), kv_dtype, s.D),
           StoredTensor(filled(s.B * s.Hkv * s.Lk * s.Dv, 3), kv_dtype, s.Dv),
           {},
           std::vector<float>(static_cast<std::size_t>(s.H), 1.0f)});
  d->out.resize(s.B * s.H * s.Lq * s.Dv * dtype_size(dtype));
  AttentionOptions opts;
  opts.causal = s.causal ? Causal::top_left : Causal::none;
  opts.window_left = s.window_left;
  opts.window_right = s.window_right;
  const bool all = variant == ScoreVariant::all;
  if (all || variant == ScoreVariant::softcap) opts.softcap = 30.0;
  opts.alibi = all || variant == ScoreVariant::alibi;
  if (all || variant == ScoreVariant::sinks) opts.sinks = f32_view(d->sinks.data(), {s.H});
  if (needs_scales(kv_dtype)) {
    opts.k_scales = f32_view(d->k.scales.data(), {s.B, s.Hkv, s.Lk});
    opts.v_scales = f32_view(d->v.scales.data(), {s.B, s.Hkv, s.Lk});
  }
  const double kv_bytes =
      double(s.B) * s.Hkv * s.Lk *
      (double(s.D + s.Dv) * dtype_size(kv_dtype) + (needs_scales(kv_dtype) ? 8.0 : 0.0));
  std::string dims = s.dims();
  if (variant != ScoreVariant::plain) dims += std::string(" +") + variant_name(variant);
  if (layout == Layout::blhd) dims += " [B,L,H,D]";
  Case c{s.name, dims, s.flops(), kv_bytes, s.decode(), {}, {}, layout_name(layout)};
  const bool pairs = dtype == DType::bf16 && kv_dtype == DType::bf16;
  c.parts = {{s.flops(), kv_bytes, attention_fma_share(s.D, s.Dv),
              attention_fma_share(s.D, s.Dv, pairs ? Products::pairs : Products::f32),
              attention_fma_share(s.D, s.Dv, pairs ? Products::tiles : Products::f32)}};
  c.run = [d, s, opts, dtype, kv_dtype, layout](Context& ctx) {
    // The same buffers either way: a [B, L, H, D] view reads them with other strides.
    const auto in = [&](const void* data, DType t, std::int64_t h, std::int64_t l, std::int64_t e) {
      return layout == Layout::blhd ? TensorView::blhd(data, t, s.B, l, h, e)
                                    : TensorView::contiguous(data, t, {s.B, h, l, e});
    };
    const OutputView out =
        layout == Layout::blhd
            ? OutputView::blhd(d->out.data(), dtype, s.B, s.Lq, s.H, s.Dv)
            : OutputView::contiguous(d->out.data(), dtype, {s.B, s.H, s.Lq, s.Dv});
    attention(in(d->q.data(), dtype, s.H, s.Lq, s.D), in(d->k.data(), kv_dtype, s.Hkv, s.Lk, s.D),
              in(d->v.data(), kv_dtype, s.Hkv, s.Lk, s.Dv), out, opts, &ctx);
  };
  return c;
}

// Layer cases (the named shapes of docs/api.md, "The `cpuattn` tool"): the dense product of a
// fused Q/K/V projection, a whole multi-head attention layer, and one decoding step against a
// 4096-token KV cache.
namespace {

// The layer's weights are f32, or bf16 (rounded to nearest even) with `weights` = bf16. A
// decoder layer adds Llama 3.1's rotary embedding and per-head QK-norm (the M1rope, M2rope shapes).
std::shared_ptr<MultiHeadAttention> bench_layer(DType weights = DType::f32, bool decoder = false) {
  std::vector<float> wq(kDm * kDm), wk(kDm * kDm), wv(kDm * kDm), wo(kDm * kDm), b(kDm);
  fill(wq, 4);
  fill(wk, 5);
  fill(wv, 6);
  fill(wo, 7);
  fill(b, 8);
  for (auto* w : {&wq, &wk, &wv, &wo})
    for (auto& x : *w) x *= 0.036f;  // ~ 1/sqrt(d_model): unit-sized activations
  std::vector<std::vector<std::uint16_t>> half;
  for (auto* w : {&wq, &wk, &wv, &wo}) {
    half.emplace_back(w->size());
    for (std::size_t i = 0; i < w->size(); ++i) half.back()[i] = to_bf16((*w)[i]);
  }
  int next = 0;  // MhaWeights{...} below evaluates its initializers in order
  const auto m = [&](const std::vector<float>& w) {
    if (weights == DType::bf16)
      return TensorView::contiguous(half[next++].data(), DType::bf16, {kDm, kDm});
    return f32_view(w.data(), {kDm, kDm});
  };
  const auto bv = f32_view(b.data(), {kDm});
  MhaConfig config{.d_model = kDm, .heads = kHeads};
  MhaWeights w{
      .wq = m(wq), .wk = m(wk), .wv = m(wv), .wo = m(wo), .bq = bv, .bk = bv, .bv = bv, .bo = bv};
  std::vector<float> norm(kDm / kHeads);
  if (decoder) {
    config.rope = llama31_rope();
    config.qk_norm = QkNorm::head;
    fill(norm, 14);
    for (float& x : norm) x = 1 + 0.5f * x;
    w.q_norm = w.k_norm = f32_view(norm.data(), {kDm / kHeads});
  }
  return std::make_shared<MultiHeadAttention>(config, w);
}

// A Llama-3-8B-shaped decoder layer (d_model 4096, 32 query heads, 8 K/V heads of 128, Llama 3.1
// rotary embedding, no biases) with bf16 weights, the LD1/LD8 decode steps' layer. The weights are
// made bf16 directly (84 MB): an f32 copy of them would double the case's set-up memory.
std::shared_ptr<MultiHeadAttention> llama_layer() {
  constexpr std::int64_t kD = 4096, kH = 32, kHkv = 8, kHd = 128;
  std::vector<std::vector<std::uint16_t>> w;
  const std::int64_t cols[4] = {kH * kHd, kHkv * kHd, kHkv * kHd, kD};
  for (int i = 0; i < 4; ++i) {
    std::vector<float> f(static_cast<std::size_t>(kD * cols[i]));
    fill(f, 20 + i);
    w.emplace_back(f.size());
    for (std::size_t j = 0; j < f.size(); ++j) w.back()[j] = to_bf16(f[j] * 0.016f);
  }
  const auto view = [&](int i) {
    return TensorView::contiguous(w[i].data(), DType::bf16, {i == 3 ? kH * kHd : kD, cols[i]});
  };
  MhaConfig config{.d_model = kD, .heads = kH, .kv_heads = kHkv};
  config.rope = llama31_rope();
  return std::make_shared<MultiHeadAttention>(
      config, MhaWeights{.wq = view(0), .wk = view(1), .wv = view(2), .wo = view(3)});
}

}  // namespace

// V1: 32 requests of 16..512 tokens (a fixed pseudo-random draw), self-attention with 12 heads of
// 64 (an embedding or reranking server's batch), three ways: packed (attention_varlen), padded to
// 512 with key lengths (one attention call; the padded query rows are computed and discarded),
// and one attention call per request. All count the packed batch's FLOPs.
std::optional<Case> packed_case(const std::string& name) {
  if (name != "V1" && name != "V1pad" && name != "V1seq") return std::nullopt;
  constexpr std::int64_t kB = 32, kH = 12, kD = 64, kMax = 512;
  struct Data {
    std::vector<std::int32_t> lens, cu;
    AlignedFloats q, k, v, out;
  };
  auto d = std::make_shared<Data>();
  std::uint32_t x = 2024;
  d->cu.push_back(0);
  double pairs = 0;
  for (std::int64_t b = 0; b < kB; ++b) {
    x = x * 1664525u + 1013904223u;
    const auto L = static_cast<std::int32_t>(16 + (x >> 8) % (kMax - 16 + 1));
    d->lens.push_back(L);
    d->cu.push_back(d->cu.back() + L);
    pairs += double(L) * L;
  }
  const std::int64_t total = d->cu.back();
  const bool padded = name == "V1pad";
  const std::int64_t rows = padded ? kB * kMax : total;
  d->q = filled(rows * kH * kD, 1);
  d->k = filled(rows * kH * kD, 2);
  d->v = filled(rows * kH * kD, 3);
  d->out.resize(rows * kH * kD);
  const double flops = 4.0 * kD * kH * pairs;
  const std::string dims = "32 requests of 16..512 tokens (" + std::to_string(total) +
                           ") H12 D64, " +
                           (padded         ? "padded to 512"
                            : name == "V1" ? "packed"
                                           : "one call each");
  Case c{name, dims, flops, 0, false, {}, {}};
  c.parts = {{flops, 0, attention_fma_share(kD, kD), attention_fma_share(kD, kD)}};
  if (name == "V1") {
    c.run = [d, total](Context& ctx) {
      const auto view = [&](const float* p) {
        return TensorView::contiguous(p, DType::f32, {total, kH, kD});
      };
      const TensorView cu = TensorView::contiguous(d->cu.data(), DType::i32, {kB + 1});
      attention_varlen(view(d->q.data()), view(d->k.data()), view(d->v.data()),
                       OutputView::contiguous(d->out.data(), DType::f32, {total, kH, kD}), cu, cu,
                       {}, &ctx);
    };
  } else if (padded) {
    c.run = [d](Context& ctx) {
      AttentionOptions o;
      o.key_lengths = TensorView::contiguous(d->lens.data(), DType::i32, {kB});
      const auto view = [&](const float* p) {
        return TensorView::blhd(p, DType::f32, kB, kMax, kH, kD);
      };
      attention(view(d->q.data()), view(d->k.data()), view(d->v.data()),
                OutputView::blhd(d->out.data(), DType::f32, kB, kMax, kH, kD), o, &ctx);
    };
  } else {
    c.run = [d](Context& ctx) {
      for (std::int64_t b = 0; b < kB; ++b) {
        const std::int64_t L = d->lens[b], off = d->cu[b] * kH * kD;
        const auto view = [&](const float* p) {
          return TensorView::blhd(p + off, DType::f32, 1, L, kH, kD);
        };
        attention(view(d->q.data()), view(d->k.data()), view(d->v.data()),
                  OutputView::blhd(d->out.data() + off, DType::f32, 1, L, kH, kD), {}, &ctx);
      }
    };
  }
  return c;
}

// A PagedKvCache (the library's own pool and page stride) of B sequences of L tokens, pages of P
// taken in turns (sequence b's page i is page i * B + b), holding K = filled(seed 2) and V =
// filled(seed 3) as [B, Hkv, L, D] converted to kv_dtype; with its batch() of every sequence.
struct LibraryPool {
  PagedKvCache cache;
  PagedKv kv;
};
std::shared_ptr<LibraryPool> library_pool(std::int64_t B, std::int64_t Hkv, std::int64_t L,
                                          std::int64_t D, std::int64_t P, DType kv_dtype) {
  auto pool = std::make_shared<LibraryPool>(
      LibraryPool{PagedKvCache(B * L / P, P, Hkv, D, D, kv_dtype), {}});
  const AlignedFloats k = filled(static_cast<std::size_t>(B * Hkv * L * D), 2),
                      v = filled(static_cast<std::size_t>(B * Hkv * L * D), 3);
  std::vector<std::int64_t> seqs;
  for (std::int64_t b = 0; b < B; ++b) seqs.push_back(pool->cache.add_sequence());
  for (std::int64_t j = 0; j < L; j += P)
    for (std::int64_t b = 0; b < B; ++b) {
      const auto page = [&](const AlignedFloats& x) {
        TensorView t = f32_view(x.data() + (b * Hkv * L + j) * D, {Hkv, P, D});
        t.strides[0] = L * D;
        return t;
      };
      pool->cache.append(seqs[static_cast<std::size_t>(b)], page(k), page(v));
    }
  pool->kv = pool->cache.batch(seqs);
  return pool;
}

// G1: D2's decode step (B8 H32 Hkv8 Lk16384 D128, K/V far larger than the caches) read from a
// paged KV cache in vLLM's layout, pages of 16 tokens (G1) or 128 (G1p128) dealt to the
// sequences in a shuffled order (a pool after many requests came and went); G1k the same step
// from a PagedKvCache, pages of 16 (the library's page stride: docs/performance.md
// #dm-page-stride); G1c from contiguous K/V, the baseline. The cache is stored as `kv_dtype`;
// bytes count K/V at their storage size.
std::optional<Case> paged_case(const std::string& name, DType kv_dtype) {
  if (name != "G1" && name != "G1p128" && name != "G1c" && name != "G1k") return std::nullopt;
  constexpr std::int64_t kB = 8, kH = 32, kHkv = 8, kL = 16384, kD = 128;
  const std::int64_t P = name == "G1p128" ? 128 : 16;
  const std::int64_t pages = kB * kL / P;
  struct Io {
    AlignedFloats q, out;
  };
  auto io = std::make_shared<Io>(Io{filled(kB * kH * kD, 1), AlignedFloats(kB * kH * kD)});
  const double kv_bytes =
      double(kB) * kHkv * kL * (2.0 * kD * dtype_size(kv_dtype) + (needs_scales(kv_dtype) ? 8 : 0));
  const std::string dims = "B8 H32 Hkv8 Lq1 Lk16384 D128, " +
                           (name == "G1c"   ? std::string("contiguous")
                            : name == "G1k" ? std::string("PagedKvCache, pages of 16")
                                            : "pages of " + std::to_string(P) + ", shuffled");
  Case c{name, dims, 4.0 * kD * kH * kB * kL, kv_bytes, true, {}, {}};
  c.parts = {{c.flops, kv_bytes, attention_fma_share(kD, kD), attention_fma_share(kD, kD)}};
  const TensorView q = f32_view(io->q.data(), {kB, kH, 1, kD});
  const OutputView out = f32_view(io->out.data(), {kB, kH, 1, kD});
  if (name == "G1k") {
    c.run = [pool = library_pool(kB, kHkv, kL, kD, P, kv_dtype), io, q, out](Context& ctx) {
      attention(q, pool->kv, out, {}, &ctx);
    };
    return c;
  }
  struct Data {
    StoredTensor k, v;
    std::vector<std::int32_t> table;
    std::vector<std::int64_t> lens;
  };
  auto d = std::make_shared<Data>(Data{StoredTensor(filled(kB * kHkv * kL * kD, 2), kv_dtype, kD),
                                       StoredTensor(filled(kB * kHkv * kL * kD, 3), kv_dtype, kD),
                                       std::vector<std::int32_t>(static_cast<std::size_t>(pages)),
                                       std::vector<std::int64_t>(kB, kL)});
  std::iota(d->table.begin(), d->table.end(), 0);
  std::shuffle(d->table.begin(), d->table.end(), std::mt19937(2026));
  if (name == "G1c") {
    c.run = [io, d, q, out, kv_dtype](Context& ctx) {
      AttentionOptions o;
      if (needs_scales(kv_dtype)) {
        o.k_scales = f32_view(d->k.scales.data(), {kB, kHkv, kL});
        o.v_scales = f32_view(d->v.scales.data(), {kB, kHkv, kL});
      }
      attention(q, TensorView::contiguous(d->k.data(), kv_dtype, {kB, kHkv, kL, kD}),
                TensorView::contiguous(d->v.data(), kv_dtype, {kB, kHkv, kL, kD}), out, o, &ctx);
    };
  } else {
    c.run = [io, d, q, out, kv_dtype, P, pages](Context& ctx) {
      PagedKv kv;
      kv.k_pages = TensorView::contiguous(d->k.data(), kv_dtype, {pages, kHkv, P, kD});
      kv.v_pages = TensorView::contiguous(d->v.data(), kv_dtype, {pages, kHkv, P, kD});
      kv.block_table = TensorView::contiguous(d->table.data(), DType::i32, {kB, kL / P});
      kv.seq_lens = TensorView::contiguous(d->lens.data(), DType::i64, {kB});
      if (needs_scales(kv_dtype)) {
        kv.k_scales = f32_view(d->k.scales.data(), {pages, kHkv, P});
        kv.v_scales = f32_view(d->v.scales.data(), {pages, kHkv, P});
      }
      attention(q, kv, out, {}, &ctx);
    };
  }
  return c;
}

// LD1, LD8: one decode step of the Llama-shaped layer for 1 or 8 sequences with 4096 cached
// tokens each (the K/V cache in --kv-dtype); bytes count the bf16 weights and the cache read.
Case llama_decode_case(const std::string& name, DType kv_dtype) {
  constexpr std::int64_t kD = 4096, kHkv = 8, kHd = 128, kCtx = 4096;
  const std::int64_t B = name == "LD8" ? 8 : 1;
  auto layer = llama_layer();
  auto cache = std::make_shared<KvCache>(layer->make_cache(B, kCtx + 1, false, kv_dtype));
  {
    std::vector<float> kv(static_cast<std::size_t>(B * kHkv * kCtx * kHd));
    fill(kv, 24);
    const TensorView kvv = f32_view(kv.data(), {B, kHkv, kCtx, kHd});
    cache->append(kvv, kvv);
  }
  auto x = std::make_shared<std::vector<float>>(B * kD);
  auto out = std::make_shared<std::vector<float>>(B * kD);
  fill(*x, 25);
  const double weights = double(kD) * (2 * kD + 2 * kHkv * kHd);
  const double proj = 2.0 * B * weights;
  const double attn = 4.0 * B * 32 * (kCtx + 1) * kHd;
  const double bytes =
      2.0 * weights + (double(dtype_size(kv_dtype)) * kHd + (needs_scales(kv_dtype) ? 4.0 : 0.0)) *
                          2.0 * kHkv * B * (kCtx + 1);
  Case c{name,
         "Llama decode B" + std::to_string(B) + " ctx4096 bf16 W",
         proj + attn,
         bytes,
         true,
         [=](Context& ctx) {
           layer->decode(f32_view(x->data(), {B, 1, kD}), *cache, f32_view(out->data(), {B, 1, kD}),
                         {}, &ctx);
           cache->truncate(kCtx);  // every run attends to 4097 tokens
         },
         {}};
  // The projections stream the weights, then the attention streams the cache.
  const double share = attention_fma_share(kHd, kHd);
  c.parts = {{proj, 2.0 * weights, 1, 1}, {attn, bytes - 2.0 * weights, share, share}};
  return c;
}

std::optional<Case> layer_case(const std::string& name, DType kv_dtype, DType weights) {
  if (auto pc = packed_case(name)) return pc;
  if (auto gc = paged_case(name, kv_dtype)) return gc;
  if (name == "L1") {  // x [4096, 768] times [Wq | Wk | Wv] [768, 2304]
    const std::int64_t M = 8 * 512, K = kDm, N = 3 * kDm;
    auto x = std::make_shared<std::vector<float>>(M * K);
    auto y = std::make_shared<std::vector<float>>(M * N);
    std::vector<float> w(K * N);
    fill(*x, 9);
    fill(w, 10);
    const bool half = weights == DType::bf16;
    std::vector<std::uint16_t> wh(half ? w.size() : 0);
    for (std::size_t i = 0; i < wh.size(); ++i) wh[i] = to_bf16(w[i]);
    auto lin = std::make_shared<Linear>(
        half ? TensorView::contiguous(wh.data(), DType::bf16, {K, N}) : f32_view(w.data(), {K, N}));
    Case c{"L1",
           std::string("Linear M4096 K768 N2304") + (half ? " bf16 weights" : ""),
           2.0 * M * K * N,
           0,
           false,
           [=](Context& ctx) {
             lin->forward(f32_view(x->data(), {M, K}), f32_view(y->data(), {M, N}), &ctx);
           },
           {}};
    c.parts = {{c.flops, 4.0 * (M * K + M * N) + (half ? 2.0 : 4.0) * K * N, 1, 1}};
    return c;
  }
  const bool decoder = name == "M1rope" || name == "M2rope";
  const std::string plus = decoder ? " +rope+qknorm" : "";
  if (name == "M1" || name == "M1rope") {  // self-attention layer, B 8, L 512
    const std::int64_t B = 8, L = 512;
    auto layer = bench_layer(weights, decoder);
    auto x = std::make_shared<std::vector<float>>(B * L * kDm);
    auto out = std::make_shared<std::vector<float>>(B * L * kDm);
    fill(*x, 11);
    const double proj = 2.0 * B * L * kDm * kDm * 4;  // Q, K, V and output projections
    const double attn = 4.0 * B * kHeads * L * L * (kDm / kHeads);
    Case c{name,
           "MHA B8 L512 d768 H12" + plus,
           proj + attn,
           0,
           false,
           [=](Context& ctx) {
             layer->forward(f32_view(x->data(), {B, L, kDm}), f32_view(out->data(), {B, L, kDm}),
                            {}, &ctx);
           },
           {}};
    const double share = attention_fma_share(kDm / kHeads, kDm / kHeads);
    c.parts = {{proj, 0, 1, 1}, {attn, 0, share, share}};
    return c;
  }
  if (name == "M2" || name == "M2rope") {  // one new token per sequence, 8 sequences, 4096 cached
    const std::int64_t B = 8;
    auto layer = bench_layer(weights, decoder);
    auto cache = std::make_shared<KvCache>(layer->make_cache(B, kTokens + 1, false, kv_dtype));
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
    const double bytes =
        (weights == DType::bf16 ? 2.0 : 4.0) * 4 * kDm * kDm +
        (double(dtype_size(kv_dtype)) * kDm + (needs_scales(kv_dtype) ? 4.0 * kHeads : 0.0)) * 2.0 *
            B * (kTokens + 1);
    Case c{name,
           "MHA decode B8 cache4096 d768 H12" + plus,
           proj + attn,
           bytes,
           true,
           [=](Context& ctx) {
             layer->decode(f32_view(x->data(), {B, 1, kDm}), *cache,
                           f32_view(out->data(), {B, 1, kDm}), {}, &ctx);
             cache->truncate(kTokens);  // drop the new token: every run sees 4097
           },
           {}};
    const double wbytes = (weights == DType::bf16 ? 2.0 : 4.0) * 4 * kDm * kDm;
    const double share = attention_fma_share(kDm / kHeads, kDm / kHeads);
    c.parts = {{proj, wbytes, 1, 1}, {attn, bytes - wbytes, share, share}};
    return c;
  }
  if (name == "LD1" || name == "LD8") return llama_decode_case(name, kv_dtype);
  return std::nullopt;
}

Case make_case(const std::string& name, bool causal, DType dtype, DType kv_dtype,
               ScoreVariant variant, Layout layout) {
  if (auto lc = layer_case(name, kv_dtype, dtype)) {
    if (variant != ScoreVariant::plain)
      throw std::invalid_argument("--variant " + std::string(variant_name(variant)) +
                                  " is for attention shapes, not the layer case " + name);
    if (layout != Layout::bhld)
      throw std::invalid_argument("--layout " + std::string(layout_name(layout)) +
                                  " is for attention shapes, not the layer case " + name);
    return std::move(*lc);
  }
  return attention_case(parse_shape(name, causal), dtype, kv_dtype, variant, layout);
}

}  // namespace cpuattn::cli
