// Argument validation of attention() and reference_attention(), against an independent statement
// of the rules in cpuattn.h and docs/api.md ("Errors"): the call must throw cpuattn::Error iff an
// argument breaks a rule, and then leave every output byte untouched; a call that succeeds must
// write every element of every output and nothing else.
//
// Each tensor lives in its own mapping between PROT_NONE pages (guarded.h), so a read or write
// outside what the view may touch faults; inputs are read-only, so a write into one faults too.
// Outputs start filled with 0xFF bytes, a NaN no computation on the finite inputs here produces.
// Shapes start valid and small (every size <= 8), then up to four mutations break them: dtypes
// (including bf16, f16 and values outside the enum), ranks (0, 5, negative), sizes and strides
// (0, negative, huge), null data, outputs that alias inputs or each other; scale, causal and key
// lengths are drawn from valid and invalid values alike.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "fuzz_contexts.h"
#include "fuzz_util.h"
#include "guarded.h"

namespace cpuattn::fuzz {
namespace {

constexpr std::uint64_t kDenseMax = 4 << 20;      // a view up to this many bytes is mapped whole
constexpr std::uint64_t kSparseMax = 1ULL << 45;  // larger ones: only their elements' pages
constexpr std::uint64_t kMaxElements = 1 << 16;   // views with more elements are not mapped
constexpr std::uint64_t kMaxWork = std::uint64_t{1} << 22;  // B*H*Lq*Lk*(D+Dv) of a valid call
constexpr unsigned char kSentinel = 0xFF;  // f32/f64 NaN with every payload bit set

enum ArgId { Q, K, V, OUT, MASK, LENGTHS, LSE, WEIGHTS, kArgs };
const char* const kNames[kArgs] = {"Q", "K", "V", "out", "mask", "key_lengths", "lse", "weights"};

// One tensor argument as the fuzzer built it, and the memory behind it.
struct Arg {
  bool present = false, null = false;
  DType dtype = DType::f32;
  int rank = 4;
  std::int64_t shape[kMaxRank] = {1, 1, 1, 1}, strides[kMaxRank] = {0, 0, 0, 0};
  int alias_of = -1;            // data points into that argument's memory instead of its own
  std::uint64_t alias_pos = 0;  // where: alias_pos / 256 of the way into the host's view
  bool guard_at_end = true;
  Extent ext;
  bool mapped = false;  // data is backed by accessible memory for the whole view
  Mapping mem;
  unsigned char* data = nullptr;

  // Element size for allocation: the dtype's, or 4 for values outside the enum.
  std::size_t esize() const { return dtype_size(dtype) ? dtype_size(dtype) : 4; }
  bool valid_view(int min_rank, int max_rank) const {
    return rank >= min_rank && rank <= max_rank && !null && ext.sane &&
           (shape[rank - 1] == 1 || strides[rank - 1] == 1);
  }
  template <class V>
  V view() const {
    V t;
    t.data = data;
    t.dtype = dtype;
    t.rank = rank;
    for (int d = 0; d < kMaxRank; ++d) t.shape[d] = shape[d], t.strides[d] = strides[d];
    return t;
  }
};

// A small deterministic generator for the input values (seeded from the fuzzer's bytes).
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (next() >> 11) * 0x1p-53; }
};

// Row-major strides in the dimension order `order` (outermost first), each outer stride padded
// by `pad` elements; the last dimension stays contiguous.
void set_strides(Arg& a, const int* order, int pad) {
  std::int64_t stride = 1;
  for (int i = a.rank - 1; i >= 0; --i) {
    a.strides[order[i]] = stride;
    stride = stride * a.shape[order[i]] + (i < a.rank - 1 ? pad : 0);
  }
}

void make_arg(Arg& a, Reader& in, bool output, const std::vector<std::int64_t>& shape,
              DType dtype) {
  a.present = true;
  a.dtype = dtype;
  a.rank = static_cast<int>(shape.size());
  for (int d = 0; d < a.rank; ++d) a.shape[d] = shape[d];
  static const int kOrders[4][kMaxRank] = {{0, 1, 2, 3}, {0, 2, 1, 3}, {1, 0, 2, 3}, {2, 1, 0, 3}};
  const int layout = static_cast<int>(in.range(0, 3));
  const int* order = a.rank == 4 ? kOrders[layout] : kOrders[0];
  set_strides(a, order, layout == 3 ? static_cast<int>(in.range(1, 3)) : 0);
  // Inputs may broadcast a dimension with stride 0 (valid unless it is a contiguous last one).
  if (!output && in.chance(15)) a.strides[in.range(0, a.rank - 1)] = 0;
  a.guard_at_end = !in.chance(30);
}

void mutate(Arg* args, Reader& in) {
  static const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::boolean,
                                  DType::i32, DType::i64, DType::i8,   DType{8},   DType{200}};
  static const int kRanks[] = {0, 1, 2, 3, 4, 5, -1, std::numeric_limits<int>::min()};
  static const std::int64_t kSizes[] = {0,
                                        -1,
                                        1,
                                        2,
                                        3,
                                        9,
                                        1 << 20,
                                        std::int64_t{1} << 31,
                                        (std::int64_t{1} << 32) + 1,
                                        std::int64_t{1} << 40,
                                        std::numeric_limits<std::int64_t>::max(),
                                        std::numeric_limits<std::int64_t>::min()};
  static const std::int64_t kStrides[] = {0,
                                          -1,
                                          1,
                                          2,
                                          7,
                                          1 << 20,
                                          std::int64_t{1} << 31,
                                          std::int64_t{1} << 36,
                                          std::int64_t{1} << 40,
                                          std::int64_t{1} << 61,
                                          std::int64_t{1} << 62,
                                          std::numeric_limits<std::int64_t>::max(),
                                          std::numeric_limits<std::int64_t>::min()};
  Arg& a = args[in.range(0, kArgs - 1)];
  switch (in.range(0, 7)) {
    case 0:
      a.dtype = in.pick(kDtypes);
      break;
    case 1:
      a.rank = in.pick(kRanks);
      break;
    case 2:
      a.shape[in.range(0, kMaxRank - 1)] = in.pick(kSizes);
      break;
    case 3:
      a.strides[in.range(0, kMaxRank - 1)] = in.pick(kStrides);
      break;
    case 4:
      a.null = true;
      break;
    case 5:
      a.alias_of = static_cast<int>(in.range(0, kArgs - 1));
      a.alias_pos = in.u8();
      break;
    case 6:
      a.present = !a.present;  // drops a required argument too: it then has no data
      if (!a.present && &a - args <= OUT) a.present = true, a.null = true;
      break;
    default:
      a.guard_at_end = !a.guard_at_end;
  }
}

// Gives every present argument memory: its own mapping, or a place inside its alias host.
// Views too large to map get a small buffer and stay !mapped: such a call must fail, or is
// skipped when the rules say it is valid (its memory cannot exist here).
void place(Arg* args) {
  for (int i = 0; i < kArgs; ++i) {
    Arg& a = args[i];
    a.ext = extent_of(a.rank, a.shape, a.strides, a.esize());
    if (!a.present || a.null || a.alias_of >= 0) continue;
    const bool small = a.ext.sane && !a.ext.overflow && a.ext.elements <= kMaxElements;
    if (small && a.ext.bytes <= kDenseMax) {
      a.data = a.mem.dense(a.ext.bytes, a.guard_at_end, kSentinel);
    } else if (small && a.ext.bytes <= kSparseMax) {
      std::vector<std::uint64_t> offsets;
      for_each_offset(a.rank, a.shape, a.strides, a.esize(),
                      [&](std::uint64_t o) { offsets.push_back(o); });
      a.data = a.mem.sparse(a.ext.bytes, offsets, a.esize(), kSentinel);
    }
    a.mapped = a.data != nullptr;
    if (!a.mapped) a.data = a.mem.dense(64, true, kSentinel);
  }
  for (int i = 0; i < kArgs; ++i) {
    Arg& a = args[i];
    if (!a.present || a.null || a.alias_of < 0) continue;
    const Arg& host = args[a.alias_of];
    if (&host == &a || !host.present || host.data == nullptr || host.mem.is_sparse() ||
        host.alias_of >= 0) {
      a.alias_of = -1;
      a.data = a.mem.dense(64, true, kSentinel);  // this alias is not possible: a small buffer
      a.mapped = false;
      continue;
    }
    // Inside the host's view (so the two always overlap), aligned for this dtype; mapped if the
    // whole view fits in the host's mapping.
    const std::uint64_t span = host.mapped ? host.ext.bytes : host.mem.hi() - host.data;
    const auto at = reinterpret_cast<std::uintptr_t>(host.data) + span * a.alias_pos / 256;
    a.data = reinterpret_cast<unsigned char*>(at / a.esize() * a.esize());
    a.mapped = a.ext.sane && !a.ext.overflow && a.ext.elements <= kMaxElements &&
               a.ext.bytes <= static_cast<std::uint64_t>(host.mem.hi() - a.data);
  }
}

// Whether two views share a byte, element by element (the library decides exactly too, so views
// that interleave without sharing a byte are valid). Views too large to enumerate count as
// disjoint: they are never mapped, so a call the other rules allow is not made.
bool overlap(const Arg& a, const Arg& b) {
  if (!a.present || !b.present || a.null || b.null) return false;
  if (!(a.data < b.data + b.ext.bytes && b.data < a.data + a.ext.bytes)) return false;
  for (const Arg* x : {&a, &b})
    if (!x->ext.sane || x->ext.overflow || x->ext.elements > kMaxElements) return false;
  std::vector<std::uint64_t> starts;  // a's elements, as byte addresses
  for_each_offset(a.rank, a.shape, a.strides, a.esize(), [&](std::uint64_t o) {
    starts.push_back(reinterpret_cast<std::uintptr_t>(a.data) + o);
  });
  std::sort(starts.begin(), starts.end());
  bool shared = false;
  for_each_offset(b.rank, b.shape, b.strides, b.esize(), [&](std::uint64_t o) {
    const std::uint64_t lo = reinterpret_cast<std::uintptr_t>(b.data) + o, hi = lo + b.esize();
    // An element of a starting before hi and ending after lo.
    const auto it = std::lower_bound(starts.begin(), starts.end(), hi);
    shared = shared || (it != starts.begin() && *(it - 1) + a.esize() > lo);
  });
  return shared;
}

bool self_overlap(const Arg& a) {
  std::vector<std::uint64_t> offs;
  for_each_offset(a.rank, a.shape, a.strides, 1, [&](std::uint64_t o) { offs.push_back(o); });
  std::sort(offs.begin(), offs.end());
  return std::adjacent_find(offs.begin(), offs.end()) != offs.end();
}

struct Call {
  bool reference = false;
  std::optional<double> scale;
  Causal causal = Causal::none;
  std::vector<std::int64_t> lengths;  // the key lengths to write, one per batch
  // The variants, drawn near their bounds: window sides up to INT64_MAX, soft-caps and per-head
  // values at float extremes (rows of sinks [H], slopes [H] or [B, H]: `slopes_rows` rows).
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  std::vector<float> sinks, slopes;
  std::int64_t slopes_rows = 0;
};

// The variants' rules (cpuattn.h, core/softmax.h), stated independently: window sides >= -1
// (any size up to INT64_MAX); a soft-cap of 0 or finite in [1e-30, 1e30]; sinks [H], each finite
// within +-5.89664e37 (2^126 / log2 e) or -inf; ALiBi slopes [H] or [B, H], finite within +-1e20.
std::string variant_broken(const Call& c, std::int64_t B, std::int64_t H) {
  if (c.window_left < -1 || c.window_right < -1) return "a window side below -1";
  if (c.softcap != 0 && !(std::isfinite(c.softcap) && c.softcap >= 1e-30 && c.softcap <= 1e30))
    return "softcap outside [1e-30, 1e30]";
  const double max_sink = 0x1p126 / 1.4426950408889634;
  if (!c.sinks.empty()) {
    if (static_cast<std::int64_t>(c.sinks.size()) != H) return "sinks not [H]";
    for (float x : c.sinks)
      if (!(x == -INFINITY || (std::isfinite(x) && std::fabs(x) <= max_sink)))
        return "a sink outside the log2 range";
  }
  if (c.slopes_rows > 0) {
    if (static_cast<std::int64_t>(c.slopes.size()) != c.slopes_rows * H ||
        (c.slopes_rows > 1 && c.slopes_rows != B) || c.slopes_rows > B)
      return "alibi_slopes not [H] or [B, H]";
    for (float x : c.slopes)
      if (!(std::isfinite(x) && std::fabs(x) <= 1e20)) return "a slope outside +-1e20";
  }
  return "";
}

// The key lengths the library will read: from memory, since an aliased view reads its host.
std::vector<std::int64_t> read_lengths(const Arg& l) {
  std::vector<std::int64_t> n;
  for (std::int64_t b = 0; l.mapped && b < l.shape[0]; ++b) {
    const unsigned char* p = l.data + b * l.strides[0] * l.esize();
    if (l.dtype == DType::i32) {
      std::int32_t v;
      std::memcpy(&v, p, 4);
      n.push_back(v);
    } else {
      std::int64_t v;
      std::memcpy(&v, p, 8);
      n.push_back(v);
    }
  }
  return n;
}

bool float_dtype_ok(const Arg& x, const Call& c) {
  return x.dtype == DType::f32 || (c.reference && x.dtype == DType::f64);
}

// Q, K, V, out: rank 4; f32, bf16 or f16 (f64 for the reference); K and V also int8, which needs
// scales this target never passes; the fast path wants one dtype for K and V. No extent
// overflows, and the shapes agree ([B, H, Lq, D], [B, Hkv, Lk, D], [B, Hkv, Lk, Dv], [B, H, Lq,
// Dv], H % Hkv == 0).
std::string tensors_broken(const Arg* a, const Call& c) {
  for (int i : {Q, K, V, OUT}) {
    if (!a[i].valid_view(4, 4)) return std::string(kNames[i]) + ": not a valid rank-4 view";
    if ((i == K || i == V) && a[i].dtype == DType::i8)
      return std::string(kNames[i]) + ": int8 without scales";
    if (!float_dtype_ok(a[i], c) && a[i].dtype != DType::bf16 && a[i].dtype != DType::f16)
      return std::string(kNames[i]) + ": dtype";
  }
  if (!c.reference && a[K].dtype != a[V].dtype) return "K and V dtypes differ";
  for (int i = 0; i < kArgs; ++i) {
    if (a[i].present && a[i].ext.overflow) return std::string(kNames[i]) + ": extent overflows";
  }
  const std::int64_t *q = a[Q].shape, *k = a[K].shape, *v = a[V].shape, *o = a[OUT].shape;
  const std::int64_t B = q[0], H = q[1], Lq = q[2], D = q[3], Hkv = k[1], Lk = k[2], Dv = v[3];
  if (k[0] != B || v[0] != B || k[3] != D || v[1] != Hkv || v[2] != Lk || H % Hkv != 0 ||
      o[0] != B || o[1] != H || o[2] != Lq || o[3] != Dv) {
    return "shapes disagree";
  }
  return "";
}

// The optional mask, key lengths, lse and weights, against dims = {B, H, Lq, Lk}.
std::string optional_args_broken(const Arg* a, const Call& c, const std::int64_t (&dims)[4]) {
  const std::int64_t B = dims[0], H = dims[1], Lq = dims[2], Lk = dims[3];
  if (const Arg& m = a[MASK]; m.present) {
    if (!m.valid_view(1, 4)) return "mask: not a valid rank 1..4 view";
    if (m.dtype != DType::boolean && !float_dtype_ok(m, c)) return "mask: dtype";
    for (int d = 0; d < m.rank; ++d) {
      const std::int64_t n = m.shape[d], want = dims[4 - m.rank + d];
      if (n != 1 && n != want) return "mask: does not broadcast";
    }
  }
  if (const Arg& l = a[LENGTHS]; l.present) {
    if (!l.valid_view(1, 1)) return "key_lengths: not a valid rank-1 view";
    if (l.dtype != DType::i32 && l.dtype != DType::i64) return "key_lengths: dtype";
    if (l.shape[0] != B) return "key_lengths: not [B]";
    for (std::int64_t n : read_lengths(l)) {
      if (n < 0 || n > Lk) return "key_lengths: value outside [0, Lk]";
    }
  }
  if (const Arg& l = a[LSE]; l.present) {
    if (!l.valid_view(3, 3) || !float_dtype_ok(l, c))
      return "lse: not a valid rank-3 view or dtype";
    if (l.shape[0] != B || l.shape[1] != H || l.shape[2] != Lq) return "lse: not [B,H,Lq]";
  }
  if (const Arg& w = a[WEIGHTS]; w.present) {
    if (!w.valid_view(4, 4) || !float_dtype_ok(w, c))
      return "weights: not a valid rank-4 view or dtype";
    const std::int64_t* s = w.shape;
    if (s[0] != B || s[1] != H || s[2] != Lq || s[3] != Lk) return "weights: not [B,H,Lq,Lk]";
  }
  return "";
}

// Outputs that overlap themselves or any other argument.
std::string overlap_broken(const Arg* a) {
  for (int out : {OUT, LSE, WEIGHTS}) {
    if (!a[out].present) continue;
    if (a[out].ext.elements <= kMaxElements && self_overlap(a[out]))
      return std::string(kNames[out]) + ": overlaps itself";
    for (int other = 0; other < kArgs; ++other) {
      if (other != out && overlap(a[out], a[other])) {
        return std::string(kNames[out]) + " overlaps " + kNames[other];
      }
    }
  }
  return "";
}

// Why the call must fail, or "" if every rule holds. Written from the documentation, not from
// lib/validate.cpp: null data, dtypes, ranks, sizes >= 1, shape agreement, H % Hkv, mask
// broadcasting, contiguous last dimension, strides >= 0, outputs that overlap themselves or any
// input, scale, key lengths in [0, Lk], 64-bit overflow of sizes and offsets.
std::string rule_broken(const Arg* a, const Call& c) {
  if (std::string r = tensors_broken(a, c); !r.empty()) return r;
  if (c.scale && !(*c.scale >= kMinScale && *c.scale <= kMaxScale)) return "scale";
  if (c.causal != Causal::none && c.causal != Causal::top_left &&
      c.causal != Causal::bottom_right) {
    return "causal is not a Causal value";
  }
  const std::int64_t dims[4] = {a[Q].shape[0], a[Q].shape[1], a[Q].shape[2], a[K].shape[2]};
  if (std::string r = optional_args_broken(a, c, dims); !r.empty()) return r;
  return overlap_broken(a);
}

// Input values: finite floats, mostly-true booleans, the chosen key lengths, random bytes for
// the dtypes the library must reject before reading them.
// writable: an output lives in this input's memory (between its elements, which the library allows
// when they share no byte), so the mapping cannot be read-only.
void fill_input(Arg& a, Rng& rng, const std::vector<std::int64_t>& lengths, int id, bool writable) {
  if (!a.present || a.null || a.alias_of >= 0) return;
  if (!a.mapped) {  // a placeholder the call must not read beyond
    for (unsigned char* p = a.mem.lo(); p < a.mem.hi(); ++p)
      *p = static_cast<unsigned char>(rng.next());
    a.mem.make_read_only();
    return;
  }
  // Bytes between the elements are zero (a finite value of every dtype): an input aliasing
  // this one may read them.
  if (!a.mem.is_sparse()) std::memset(a.mem.lo(), 0, a.mem.hi() - a.mem.lo());
  std::size_t n = 0;
  for_each_offset(a.rank, a.shape, a.strides, a.esize(), [&](std::uint64_t off) {
    unsigned char* p = a.data + off;
    const double x = id == MASK && rng.next() % 5 == 0 ? -INFINITY : rng.uniform(-2, 2);
    if (id == LENGTHS && a.dtype == DType::i32 && n < lengths.size()) {
      const auto v = static_cast<std::int32_t>(lengths[n]);
      std::memcpy(p, &v, 4);
    } else if (id == LENGTHS && a.dtype == DType::i64 && n < lengths.size()) {
      std::memcpy(p, &lengths[n], 8);
    } else if (a.dtype == DType::f32) {
      const auto f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
    } else if (a.dtype == DType::f64) {
      std::memcpy(p, &x, 8);
    } else if (a.dtype == DType::bf16 || a.dtype == DType::f16) {
      const std::uint16_t h =
          a.dtype == DType::bf16 ? to_bf16(static_cast<float>(x)) : to_f16(static_cast<float>(x));
      std::memcpy(p, &h, 2);
    } else if (a.dtype == DType::boolean) {
      *p = rng.next() % 4 != 0;
    } else {
      for (std::size_t b = 0; b < a.esize(); ++b) p[b] = static_cast<unsigned char>(rng.next());
    }
    ++n;
  });
  if (!writable) a.mem.make_read_only();
}

bool all_sentinel(const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != kSentinel) return false;
  }
  return true;
}

// The call in words, for reproducing a finding (printed when CPUATTN_FUZZ_VERBOSE is set).
void describe(const Arg* a, const Call& c, const Context* ctx, const std::string& broken) {
  std::fprintf(stderr, "%s, target %s, scale %s, causal %d; rules: %s\n",
               c.reference ? "reference_attention" : "attention",
               ctx ? target_name(ctx->max_target()) : "default",
               c.scale ? std::to_string(*c.scale).c_str() : "default", static_cast<int>(c.causal),
               broken.empty() ? "valid" : broken.c_str());
  for (int i = 0; i < kArgs; ++i) {
    if (!a[i].present) continue;
    std::string s;
    for (int d = 0; d < std::clamp(a[i].rank, 0, kMaxRank); ++d) {
      s += std::to_string(a[i].shape[d]) + ":" + std::to_string(a[i].strides[d]) + " ";
    }
    std::fprintf(stderr, "  %-11s dtype %d rank %d [size:stride] %s%s%s alias_of %d\n", kNames[i],
                 static_cast<int>(a[i].dtype), a[i].rank, s.c_str(), a[i].null ? "null " : "",
                 a[i].mapped ? "mapped" : "unmapped", a[i].alias_of);
  }
}

Context* pick_context(Reader& in) {
  const Target ts[] = {Target::scalar, Target::sse4, Target::avx2, Target::avx512, Target::best};
  const int i = static_cast<int>(in.range(0, 5));
  return i == 5 ? nullptr : fuzz_context(Simd::highway, ts[i], i == 4 ? 2 : 1);
}

// Q, K, V, out and the optional tensors, each made as the fuzzer chooses and then mutated.
// Returns {B, H} as drawn (the mutations may change the tensors' shapes, not these).
std::pair<std::int64_t, std::int64_t> draw_tensors(Reader& in, Call& c, Arg* a) {
  c.reference = in.chance(40);
  const std::int64_t B = in.range(1, 3), Hkv = in.range(1, 3);
  // Sometimes H is not a multiple of Hkv, consistently in Q and out (one shape mutation cannot
  // make that: it would also break the agreement of Q and out).
  const std::int64_t H = Hkv * in.range(1, 3) + (in.chance(5) ? 1 : 0);
  const std::int64_t Lq = in.range(1, 8), Lk = in.range(1, 8), D = in.range(1, 8),
                     Dv = in.range(1, 8);
  auto float_type = [&] { return c.reference && in.chance(30) ? DType::f64 : DType::f32; };
  make_arg(a[Q], in, false, {B, H, Lq, D}, float_type());
  make_arg(a[K], in, false, {B, Hkv, Lk, D}, float_type());
  make_arg(a[V], in, false, {B, Hkv, Lk, Dv}, float_type());
  make_arg(a[OUT], in, true, {B, H, Lq, Dv}, float_type());
  if (in.chance(40)) {  // a mask broadcast along some of [B, H, Lq, Lk]
    const int rank = static_cast<int>(in.range(1, 4));
    const std::int64_t full[4] = {B, H, Lq, Lk};
    std::int64_t s[4];
    for (int d = 0; d < rank; ++d) s[d] = in.chance(50) ? full[4 - rank + d] : 1;
    const DType t = in.chance(50) ? DType::boolean : float_type();
    make_arg(a[MASK], in, false, std::vector<std::int64_t>(s, s + rank), t);
  }
  if (in.chance(30)) {
    make_arg(a[LENGTHS], in, false, {B}, in.chance(50) ? DType::i32 : DType::i64);
    static const std::int64_t kBad[] = {-1, std::numeric_limits<std::int32_t>::min(),
                                        std::numeric_limits<std::int64_t>::max(),
                                        std::int64_t{1} << 32};
    for (std::int64_t b = 0; b < B; ++b) {
      c.lengths.push_back(in.chance(10) ? in.pick(kBad)
                                        : in.range(0, Lk + (in.chance(10) ? 1 : 0)));
    }
  }
  if (in.chance(30)) make_arg(a[LSE], in, true, {B, H, Lq}, float_type());
  if (in.chance(20)) make_arg(a[WEIGHTS], in, true, {B, H, Lq, Lk}, float_type());
  const int mutations = static_cast<int>(in.range(0, 4));
  for (int i = 0; i < mutations; ++i) mutate(a, in);
  return {B, H};
}

// Scale, causal and the variants (window, soft-cap, sinks, ALiBi slopes), drawn near their bounds.
void draw_options(Reader& in, Call& c, std::int64_t B, std::int64_t H) {
  // Valid: [kMinScale, kMaxScale]. The rest: zero, negative, NaN, inf, and finite doubles
  // outside float32's normal range (1e39, a denormal, 1e-300, DBL_MAX).
  static const double kScales[] = {
      1.0,  0.125,    kMinScale, kMaxScale, 2.3e38,   1.2e-38,
      0.0,  -0.0,     -1.0,      NAN,       INFINITY, -INFINITY,
      1e39, 4.9e-324, 1e-300,    1.17e-38,  2.36e38,  1.7976931348623157e308};
  if (in.chance(30)) c.scale = in.pick(kScales);
  static const Causal kCausal[] = {Causal::none, Causal::top_left, Causal::bottom_right, Causal{3},
                                   Causal{255}};
  c.causal = in.chance(40) ? in.pick(kCausal) : Causal::none;
  if (in.chance(20)) {
    static const std::int64_t kSides[] = {-1,
                                          0,
                                          3,
                                          std::numeric_limits<std::int64_t>::max(),
                                          std::numeric_limits<std::int64_t>::max() - 1,
                                          std::int64_t{1} << 62,
                                          -2,
                                          std::numeric_limits<std::int64_t>::min()};
    c.window_left = in.pick(kSides);
    c.window_right = in.pick(kSides);
  }
  if (in.chance(15)) {
    static const double kCaps[] = {1.0, 30.0, 1e30, 1e-30, 1e31, 1e-31, -1.0, NAN, INFINITY};
    c.softcap = in.pick(kCaps);
  }
  static const float kPerHead[] = {0.5f,       -2.0f,   -INFINITY, INFINITY, NAN,   3e38f,
                                   5.8966e37f, 5.9e37f, 1e20f,     1.1e20f,  1e-40f};
  if (in.chance(15)) {
    const std::int64_t n = H + (in.chance(10) ? 1 : 0);
    for (std::int64_t h = 0; h < n; ++h)
      c.sinks.push_back(in.chance(70) ? 0.25f : in.pick(kPerHead));
  }
  if (in.chance(15)) {
    c.slopes_rows = in.chance(50) ? 1 : B + (in.chance(10) ? 1 : 0);
    const std::int64_t n = c.slopes_rows * H + (c.slopes_rows == 1 && in.chance(10) ? 1 : 0);
    for (std::int64_t i = 0; i < n; ++i)
      c.slopes.push_back(in.chance(70) ? 0.1f : in.pick(kPerHead));
  }
}

// A value outside enum Target (or Simd) must be refused with cpuattn::Error, and the Context
// keeps its cap (it used to be stored and index the dispatch table out of bounds).
void check_enums_refused(Reader& in) {
  Context scratch(1);
  const auto refused = [](auto&& set) {
    try {
      set();
    } catch (const Error&) {
      return true;
    }
    return false;
  };
  FUZZ_CHECK(refused([&] { scratch.set_max_target(static_cast<Target>(in.range(9, 255))); }),
             "set_max_target accepted a value outside enum Target");
  FUZZ_CHECK(scratch.max_target() == Target::best, "a refused target changed the cap");
  FUZZ_CHECK(refused([&] { scratch.set_simd(static_cast<Simd>(in.range(2, 255))); }),
             "set_simd accepted a value outside enum Simd");
  FUZZ_CHECK(scratch.simd() == Simd::highway, "a refused provider changed the context");
}

AttentionOptions options_of(const Call& c, const Arg* a) {
  AttentionOptions opts;
  opts.scale = c.scale;
  opts.causal = c.causal;
  if (a[MASK].present) opts.mask = a[MASK].view<TensorView>();
  if (a[LENGTHS].present) opts.key_lengths = a[LENGTHS].view<TensorView>();
  if (a[LSE].present) opts.lse = a[LSE].view<OutputView>();
  if (a[WEIGHTS].present) opts.weights = a[WEIGHTS].view<OutputView>();
  opts.window_left = c.window_left;
  opts.window_right = c.window_right;
  opts.softcap = c.softcap;
  if (!c.sinks.empty())
    opts.sinks = f32_view(c.sinks.data(), {static_cast<std::int64_t>(c.sinks.size())});
  if (c.slopes_rows == 1 && !c.slopes.empty())
    opts.alibi_slopes = f32_view(c.slopes.data(), {static_cast<std::int64_t>(c.slopes.size())});
  if (c.slopes_rows > 1)
    opts.alibi_slopes =
        f32_view(c.slopes.data(),
                 {c.slopes_rows, static_cast<std::int64_t>(c.slopes.size()) / c.slopes_rows});
  return opts;
}

// The call; its cpuattn::Error's message, or "" if it returned. Any other exception is a finding.
std::string run_call(const Call& c, const Arg* a, Context* ctx) {
  const AttentionOptions opts = options_of(c, a);
  try {
    if (c.reference) {
      reference_attention(a[Q].view<TensorView>(), a[K].view<TensorView>(), a[V].view<TensorView>(),
                          a[OUT].view<OutputView>(), opts);
    } else {
      attention(a[Q].view<TensorView>(), a[K].view<TensorView>(), a[V].view<TensorView>(),
                a[OUT].view<OutputView>(), opts, ctx);
    }
  } catch (const Error& e) {
    const std::string error = e.what();
    FUZZ_CHECK(!error.empty(), "cpuattn::Error with an empty message");
    return error;
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, "%s threw a %s, not cpuattn::Error: %s",
               c.reference ? "reference_attention" : "attention", typeid(e).name(), e.what());
  }
  return "";
}

// A refused call: a rule was broken (or the refusal is one of the library's conservative ones),
// and no output byte changed.
void check_refused(const Arg* a, const std::string& broken, const std::string& error) {
  // The library's self-overlap test may reject layouts that do not overlap (it is a sufficient
  // condition on sorted strides), and its exact overlap test answers "may overlap" past its work
  // bound; such rejections are conservative, not bugs.
  FUZZ_CHECK(!broken.empty() || error.find("must not alias itself") != std::string::npos ||
                 error.find(" may overlap ") != std::string::npos,
             "rejected a valid call: %s", error.c_str());
  for (int i : {OUT, LSE, WEIGHTS}) {
    const Arg& o = a[i];
    if (!o.present || o.null || o.alias_of >= 0 || o.mem.is_sparse()) continue;
    FUZZ_CHECK(all_sentinel(o.mem.lo(), o.mem.hi() - o.mem.lo()),
               "%s was written by a call that threw: %s", kNames[i], error.c_str());
  }
}

// Output i of a call that returned: every element written; in a dense mapping, no other byte.
void check_written(const Arg* a, int i) {
  const Arg& o = a[i];
  std::vector<bool> mine(o.mem.is_sparse() ? 0 : o.mem.hi() - o.mem.lo());
  // An input placed in an output's memory, between its elements (valid: they share no byte),
  // reads the sentinel there: a NaN whose payload every output may carry, all-ones too.
  bool read_by_input = false;
  for (int in_id : {Q, K, V, MASK, LENGTHS})
    for (int out_id : {OUT, LSE, WEIGHTS}) read_by_input |= a[in_id].alias_of == out_id;
  for_each_offset(o.rank, o.shape, o.strides, o.esize(), [&](std::uint64_t off) {
    FUZZ_CHECK(read_by_input || !all_sentinel(o.data + off, o.esize()),
               "%s: element at byte %llu not written", kNames[i],
               static_cast<unsigned long long>(off));
    for (std::size_t b = 0; !mine.empty() && b < o.esize(); ++b)
      mine[o.data - o.mem.lo() + off + b] = true;
  });
  // Another output placed between this one's elements (valid: they share no byte) writes its
  // own elements there.
  for (int j : {OUT, LSE, WEIGHTS}) {
    const Arg& x = a[j];
    if (j == i || !x.present || x.alias_of != i || mine.empty()) continue;
    for_each_offset(x.rank, x.shape, x.strides, x.esize(), [&](std::uint64_t off) {
      for (std::size_t b = 0; b < x.esize(); ++b) {
        const std::ptrdiff_t at = x.data - o.mem.lo() + static_cast<std::ptrdiff_t>(off + b);
        if (at >= 0 && static_cast<std::size_t>(at) < mine.size()) mine[at] = true;
      }
    });
  }
  for (std::size_t b = 0; b < mine.size(); ++b) {
    FUZZ_CHECK(mine[b] || o.mem.lo()[b] == kSentinel, "%s: byte %zd outside the view written",
               kNames[i], static_cast<std::ptrdiff_t>(o.mem.lo() + b - o.data));
  }
}

}  // namespace
}  // namespace cpuattn::fuzz

using namespace cpuattn;
using namespace cpuattn::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size);
  Call c;
  Arg a[kArgs];
  const auto [B, H] = draw_tensors(in, c, a);
  draw_options(in, c, B, H);
  Context* ctx = pick_context(in);
  if (in.chance(3)) check_enums_refused(in);

  place(a);
  Rng rng{0x9E3779B97F4A7C15ULL ^ size};
  for (int i : {Q, K, V, MASK, LENGTHS}) {
    bool hosts_output = false;
    for (int o : {OUT, LSE, WEIGHTS}) hosts_output |= a[o].present && a[o].alias_of == i;
    fill_input(a[i], rng, c.lengths, i, hosts_output);
  }
  std::string broken = rule_broken(a, c);
  if (broken.empty()) broken = variant_broken(c, a[Q].shape[0], a[Q].shape[1]);
  if (broken.empty()) {
    for (const Arg& x : a) {
      if (x.present && !x.mapped) return 0;  // valid, but its memory cannot exist here
    }
    const std::uint64_t work = static_cast<std::uint64_t>(a[Q].shape[0] * a[Q].shape[1]) *
                               a[Q].shape[2] * a[K].shape[2] * (a[Q].shape[3] + a[V].shape[3]);
    if (work > kMaxWork) return 0;
  }
  if (std::getenv("CPUATTN_FUZZ_VERBOSE")) describe(a, c, ctx, broken);

  const std::string error = run_call(c, a, ctx);
  if (!error.empty()) {
    check_refused(a, broken, error);
    return 0;
  }
  FUZZ_CHECK(broken.empty(), "accepted an invalid call (%s)", broken.c_str());
  for (int i : {OUT, LSE, WEIGHTS}) {
    if (a[i].present) check_written(a, i);
  }
  return 0;
}
