// Random attention problems for fuzz_attention_diff, built from the fuzzer's bytes: shapes
// with GQA, causal alignments, boolean and additive masks with broadcasting, key lengths, views
// laid out in a fuzzed order inside padded buffers, and values scaled from sub-normal to 1e15
// with NaN, +-Inf, sub-normals, 1e30 and FLT_MAX planted where the bytes say.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "fuzz_util.h"

namespace cpuattn::fuzz {

inline const float kInf = std::numeric_limits<float>::infinity();

struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  }
  float uniform() { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1p-52 - 1); }
};

// A [n0, n1, n2, n3] f32 tensor in its own exact-size heap buffer (ASan sees any overread),
// laid out as a view into a larger buffer: dims in a fuzzed order, padded, at an offset.
struct Tensor {
  std::int64_t n[4] = {1, 1, 1, 1}, s[4] = {0, 0, 0, 0};
  int rank = 4;
  std::vector<float> buf;
  std::int64_t offset = 0;

  Tensor() = default;
  Tensor(Reader& in, std::initializer_list<std::int64_t> shape, bool may_broadcast) {
    rank = static_cast<int>(shape.size());
    int d = 0;
    for (std::int64_t x : shape) n[d++] = x;
    static const int kOrders[3][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}, {2, 0, 1, 3}};  // bhld, blhd
    const int* order = rank == 4 ? kOrders[in.range(0, 2)] : kOrders[0];
    const bool padded = in.chance(30);
    std::int64_t stride = 1;
    for (int i = rank - 1; i >= 0; --i) {
      s[order[i]] = stride;
      stride = stride * n[order[i]] + (padded && i < rank - 1 ? in.range(1, 5) : 0);
    }
    // An input may repeat itself along a dimension (stride 0), e.g. one K/V for every batch.
    if (may_broadcast && rank == 4 && in.chance(10)) s[in.range(0, 1)] = 0;
    offset = padded ? in.range(0, 15) : 0;
    std::int64_t last = offset;
    for (int i = 0; i < rank; ++i) last += (n[i] - 1) * s[i];
    buf.assign(static_cast<std::size_t>(last + 1), std::numeric_limits<float>::quiet_NaN());
  }
  float& at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
    return buf[static_cast<std::size_t>(offset + a * s[0] + b * s[1] + c * s[2] + d * s[3])];
  }
  template <class V, class P>
  V view(P* base) const {
    V t;
    t.data = base + offset;
    t.dtype = DType::f32;
    t.rank = rank;
    for (int i = 0; i < 4; ++i) t.shape[i] = n[i], t.strides[i] = s[i];
    return t;
  }
  TensorView in() const { return view<TensorView>(buf.data()); }
  OutputView out() { return view<OutputView>(buf.data()); }
  // Fills every element: uniform in [-amp, amp].
  void fill(Rng& rng, float amp) {
    for (std::int64_t a = 0; a < n[0]; ++a)
      for (std::int64_t b = 0; b < n[1]; ++b)
        for (std::int64_t c = 0; c < n[2]; ++c)
          for (std::int64_t d = 0; d < n[3]; ++d) at(a, b, c, d) = amp * rng.uniform();
  }
};

struct Problem {
  std::int64_t B, H, Hkv, Lq, Lk, D, Dv;
  double scale;
  Causal causal;
  Tensor q, k, v;
  int mask_kind = 0;  // 0 none, 1 boolean, 2 additive
  int mask_rank = 0;
  std::int64_t mask_n[4] = {1, 1, 1, 1}, mask_s[4] = {0, 0, 0, 0};
  std::vector<std::uint8_t> bmask;
  std::vector<float> amask;
  bool lengths_i64 = false;
  std::vector<std::int32_t> len32;
  std::vector<std::int64_t> len64;

  // Mask value for (b, h, i, j) through the broadcast strides: +1 (allowed) / 0 (masked) for a
  // boolean mask, the additive term otherwise.
  float mask_at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    const std::int64_t idx[4] = {b, h, i, j};
    std::int64_t off = 0;
    for (int d = 0; d < 4; ++d) {
      const int md = d - (4 - mask_rank);
      if (md >= 0 && mask_n[md] > 1) off += idx[d] * mask_s[md];
    }
    if (mask_kind == 1) return bmask[static_cast<std::size_t>(off)] ? 1.0f : 0.0f;
    return amask[static_cast<std::size_t>(off)];
  }
  std::int64_t key_length(std::int64_t b) const {
    if (!len32.empty()) return len32[static_cast<std::size_t>(b)];
    if (!len64.empty()) return len64[static_cast<std::size_t>(b)];
    return Lk;
  }
  // Whether query i of batch b may attend key j (a -inf additive term masks too).
  bool visible(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (j >= key_length(b)) return false;
    if (causal == Causal::top_left && j > i) return false;
    if (causal == Causal::bottom_right && j > i + Lk - Lq) return false;
    if (mask_kind == 1 && mask_at(b, h, i, j) == 0.0f) return false;
    if (mask_kind == 2 && mask_at(b, h, i, j) == -kInf) return false;
    return true;
  }
};

// Values the fuzzer can plant anywhere in Q, K, V or an additive mask.
inline const float kSpecials[] = {std::numeric_limits<float>::quiet_NaN(),
                                  kInf,
                                  -kInf,
                                  1e-40f,  // sub-normal
                                  -1.4e-45f,
                                  1e30f,
                                  -1e30f,
                                  0.0f,
                                  std::numeric_limits<float>::max(),
                                  1e-30f};
inline const float kAmplitudes[] = {1.0f, 4.0f, 1e-3f, 1e-20f, 1e15f, 1e-41f};

inline Problem make_problem(Reader& in) {
  Problem p;
  p.B = in.range(1, 2);
  p.Hkv = in.range(1, 3);
  p.H = p.Hkv * in.range(1, 3);
  if (in.chance(4)) {  // decoding against many keys: the key range is split and merged
    // Just past the 512 keys that make a split, and narrow rows: these cases cost the target
    // most of its time (every row's analysis and the reference loop over every key), and a
    // million executions of it in a long run is the goal.
    p.Lq = in.range(1, 3);
    p.Lk = in.range(513, 700);
    p.D = in.range(1, 5);
    p.Dv = in.range(1, 5);
  } else {
    // Mostly up to 8 (fast executions), sometimes up to 40 (several SIMD blocks and tails).
    auto size = [&] { return in.chance(15) ? in.range(9, 40) : in.range(1, 8); };
    p.Lq = size();
    p.Lk = size();
    p.D = size();
    p.Dv = size();
  }
  static const double kScales[] = {0.0 /* default */, 1.0, 0.5, 4.0, 1e-3, 30.0};
  p.scale = in.pick(kScales);
  static const Causal kCausal[] = {Causal::none, Causal::top_left, Causal::bottom_right};
  p.causal = in.pick(kCausal);
  p.q = Tensor(in, {p.B, p.H, p.Lq, p.D}, true);
  p.k = Tensor(in, {p.B, p.Hkv, p.Lk, p.D}, true);
  p.v = Tensor(in, {p.B, p.Hkv, p.Lk, p.Dv}, true);

  p.mask_kind = static_cast<int>(in.range(0, 2));
  if (p.mask_kind != 0) {
    p.mask_rank = static_cast<int>(in.range(1, 4));
    const std::int64_t full[4] = {p.B, p.H, p.Lq, p.Lk};
    std::int64_t size = 1;
    for (int d = p.mask_rank - 1; d >= 0; --d) {
      p.mask_n[d] = in.chance(60) ? full[4 - p.mask_rank + d] : 1;
      p.mask_s[d] = size;
      size *= p.mask_n[d];
    }
    p.bmask.resize(static_cast<std::size_t>(size));
    p.amask.resize(static_cast<std::size_t>(size));
  }
  if (in.chance(30)) {
    p.lengths_i64 = in.chance(50);
    for (std::int64_t b = 0; b < p.B; ++b) {
      const std::int64_t n = in.chance(20) ? p.Lk : in.range(0, p.Lk);
      if (p.lengths_i64) {
        p.len64.push_back(n);
      } else {
        p.len32.push_back(static_cast<std::int32_t>(n));
      }
    }
  }
  return p;
}

inline void fill_values(Problem& p, Reader& in, std::uint64_t seed) {
  Rng rng{seed | 1};
  const bool verbose = std::getenv("CPUATTN_FUZZ_VERBOSE") != nullptr;
  for (Tensor* t : {&p.q, &p.k, &p.v}) {
    const float amp = in.pick(kAmplitudes);
    t->fill(rng, amp);
    if (verbose) std::fprintf(stderr, "amplitude %g\n", amp);
  }
  const int allow = static_cast<int>(in.range(0, 3));  // 0: 25% allowed ... 3: all but 1/256
  for (auto& x : p.bmask) x = (rng.next() & 3) < static_cast<std::uint64_t>(allow) + 1;
  if (allow == 3)
    for (auto& x : p.bmask) x = (rng.next() & 255) != 0;
  const float mask_amp = in.pick(kAmplitudes);
  const int holes = static_cast<int>(in.range(0, 2));  // -inf in 0%, 25%, 50% of the additive mask
  for (auto& x : p.amask)
    x = (rng.next() & 3) < static_cast<std::uint64_t>(holes) ? -kInf : mask_amp * rng.uniform();

  const int specials = static_cast<int>(in.range(0, 6));
  for (int i = 0; i < specials; ++i) {
    const float value = in.pick(kSpecials);
    const auto where = in.range(0, 3);
    if (verbose) std::fprintf(stderr, "special %g in %s\n", value, &"QKVM"[where]);
    Tensor* t = where == 0 ? &p.q : where == 1 ? &p.k : where == 2 ? &p.v : nullptr;
    if (t == nullptr) {
      if (!p.amask.empty()) p.amask[static_cast<std::size_t>(in.bits(2)) % p.amask.size()] = value;
      continue;
    }
    const std::int64_t b = in.range(0, t->n[0] - 1), h = in.range(0, t->n[1] - 1);
    const auto l = static_cast<std::int64_t>(in.bits(2) % static_cast<std::uint64_t>(t->n[2]));
    const std::int64_t d = in.range(0, t->n[3] - 1);
    t->at(b, h, l, d) = value;
    if (verbose)
      std::fprintf(stderr, "  at [%lld,%lld,%lld,%lld]\n", static_cast<long long>(b),
                   static_cast<long long>(h), static_cast<long long>(l), static_cast<long long>(d));
  }
}

// Whole K and V rows of up to three keys that some query row does not attend (a mask, causality,
// key lengths) become NaN or +-inf, as batch padding, recycled pages and pre-allocated cache slots
// hold: the rows that exclude such a key must not see it (docs/guarantees.md); the rows that
// attend it propagate it, as the reference does.
inline void poison_excluded(Problem& p, Reader& in) {
  static const float kPoisons[] = {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf};
  const bool verbose = std::getenv("CPUATTN_FUZZ_VERBOSE") != nullptr;
  const auto n = in.range(0, 3);
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t b = in.range(0, p.B - 1), hk = in.range(0, p.Hkv - 1);
    const auto j = static_cast<std::int64_t>(in.bits(2) % static_cast<std::uint64_t>(p.Lk));
    const float value = in.pick(kPoisons);
    const auto which = in.range(0, 2);  // K, V or both
    bool excluded = false;
    for (std::int64_t h = hk * (p.H / p.Hkv); h < (hk + 1) * (p.H / p.Hkv); ++h)
      for (std::int64_t i = 0; i < p.Lq; ++i) excluded = excluded || !p.visible(b, h, i, j);
    if (!excluded) continue;
    if (verbose)
      std::fprintf(stderr, "poison %g in %s of key %lld (b %lld, hk %lld)\n", value,
                   which == 0   ? "K"
                   : which == 1 ? "V"
                                : "K and V",
                   static_cast<long long>(j), static_cast<long long>(b),
                   static_cast<long long>(hk));
    if (which != 1)
      for (std::int64_t d = 0; d < p.D; ++d) p.k.at(b, hk, j, d) = value;
    if (which != 0)
      for (std::int64_t d = 0; d < p.Dv; ++d) p.v.at(b, hk, j, d) = value;
  }
}

// The problem in words, for reproducing a finding (printed when CPUATTN_FUZZ_VERBOSE is set).
inline void describe(const Problem& p) {
  std::fprintf(stderr, "B%lld H%lld Hkv%lld Lq%lld Lk%lld D%lld Dv%lld scale %g causal %d mask %s",
               static_cast<long long>(p.B), static_cast<long long>(p.H),
               static_cast<long long>(p.Hkv), static_cast<long long>(p.Lq),
               static_cast<long long>(p.Lk), static_cast<long long>(p.D),
               static_cast<long long>(p.Dv), p.scale, static_cast<int>(p.causal),
               p.mask_kind == 0   ? "none"
               : p.mask_kind == 1 ? "bool"
                                  : "additive");
  if (p.mask_kind != 0) {
    std::fprintf(stderr, " [");
    for (int d = 0; d < p.mask_rank; ++d)
      std::fprintf(stderr, "%s%lld", d ? "," : "", static_cast<long long>(p.mask_n[d]));
    std::fprintf(stderr, "]");
  }
  std::fprintf(stderr, " key_lengths");
  for (std::int64_t b = 0; b < p.B && (!p.len32.empty() || !p.len64.empty()); ++b)
    std::fprintf(stderr, " %lld", static_cast<long long>(p.key_length(b)));
  std::fprintf(stderr, "\n");
  for (const Tensor* t : {&p.q, &p.k, &p.v}) {
    std::fprintf(stderr, "  %s strides %lld %lld %lld %lld offset %lld\n",
                 t == &p.q   ? "Q"
                 : t == &p.k ? "K"
                             : "V",
                 static_cast<long long>(t->s[0]), static_cast<long long>(t->s[1]),
                 static_cast<long long>(t->s[2]), static_cast<long long>(t->s[3]),
                 static_cast<long long>(t->offset));
  }
}

}  // namespace cpuattn::fuzz
