// Argument validation for every public entry point. Nothing here writes to an output: callers
// validate first and only then compute, so a throw leaves outputs untouched.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/checks.h"
#include "core/dtypes.h"
#include "core/problem.h"
#include "core/softmax.h"

namespace cpuattn {

namespace detail {

std::string join_dims(const TensorView& t, char sep) {
  std::string s;
  for (int d = 0; d < std::clamp(t.rank, 0, kMaxRank); ++d) {
    if (d > 0) s += sep;
    s += std::to_string(t.shape[d]);
  }
  return s;
}

std::string shape_str(const TensorView& t) {
  std::string s = "[";
  s += join_dims(t, ',');
  s += ']';
  return s;
}

// "Q [2,8,128,32], K [2,8,128,64]" for the message tail.
std::string shapes_of(std::initializer_list<std::pair<const char*, const TensorView*>> ts) {
  std::string s;
  for (const auto& [name, t] : ts) {
    if (!s.empty()) s += ", ";
    s += std::string(name) + " " + shape_str(*t);
  }
  return s;
}

[[noreturn]] void fail(const std::string& what) { throw Error("cpuattn: " + what); }

// A value in a message, %.9g (std::to_string spells 3e38 out in 39 digits).
std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    fail(std::string(what) + " = " + std::to_string(a) + " x " + std::to_string(b) +
         " overflows 64 bits");
  return r;
}

Extent extent_of(const char* name, const TensorView& t) {
  std::int64_t last = 0;  // largest element offset
  std::int64_t count = 1;
  for (int d = 0; d < t.rank; ++d) {
    std::int64_t term = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.strides[d], &term) ||
        __builtin_add_overflow(last, term, &last) ||
        __builtin_mul_overflow(count, t.shape[d], &count)) {
      fail(std::string(name) + " " + shape_str(t) + ": size or offsets overflow 64 bits");
    }
  }
  std::int64_t bytes = 0, elements = 0;
  const auto esize = static_cast<std::int64_t>(dtype_size(t.dtype));
  // last + 1 overflows when the largest offset is INT64_MAX (found by fuzz_validate).
  if (__builtin_add_overflow(last, 1, &elements) ||
      __builtin_mul_overflow(elements, esize, &bytes) ||
      static_cast<std::uint64_t>(bytes) >
          std::numeric_limits<std::uintptr_t>::max() - reinterpret_cast<std::uintptr_t>(t.data)) {
    fail(std::string(name) + " " + shape_str(t) + ": size or offsets overflow the address space");
  }
  const auto lo = reinterpret_cast<std::uintptr_t>(t.data);
  return {lo, lo + static_cast<std::uintptr_t>(bytes), t};
}

// Common checks of a tensor argument: present, known rank, positive sizes, strides >= 0
// (0 = broadcast, allowed for inputs), unit stride in the last dimension.
void check_view(const char* name, const TensorView& t, int min_rank, int max_rank) {
  if (t.rank < min_rank || t.rank > max_rank) {
    fail(std::string(name) + " must have rank " +
         (min_rank == max_rank ? std::to_string(min_rank)
                               : std::to_string(min_rank) + ".." + std::to_string(max_rank)) +
         ", got rank " + std::to_string(t.rank));
  }
  if (t.data == nullptr) fail(std::string(name) + " " + shape_str(t) + ": data is null");
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 1) {
      fail(std::string(name) + " " + shape_str(t) + ": dimension " + std::to_string(d) +
           " has size " + std::to_string(t.shape[d]) + " (every size must be >= 1)");
    }
    if (t.strides[d] < 0) {
      fail(std::string(name) + " " + shape_str(t) + ": stride " + std::to_string(t.strides[d]) +
           " of dimension " + std::to_string(d) + " is negative");
    }
  }
  if (t.shape[t.rank - 1] > 1 && t.strides[t.rank - 1] != 1) {
    fail(std::string(name) + " " + shape_str(t) + ": the last dimension must be contiguous " +
         "(stride 1), got stride " + std::to_string(t.strides[t.rank - 1]));
  }
}

void check_dtype(const char* name, const TensorView& t, bool allow_f64) {
  if (t.dtype == DType::f32 || (allow_f64 && t.dtype == DType::f64)) return;
  fail(std::string(name) + " " + shape_str(t) + " has dtype " + dtype_name(t.dtype) +
       (allow_f64 ? "; expected float32 or float64" : "; expected float32"));
}

// The dtypes a tensor of this kind may have, from cpuattn.h's list: Q and out the `tensor` role,
// K and V also the `scaled` one, the reference also f64.
bool allowed_dtype(DType d, bool kv, bool allow_f64) {
  const DTypeRole role = dtype_role(d);
  return role == DTypeRole::tensor || (kv && role == DTypeRole::scaled) ||
         (allow_f64 && d == DType::f64);
}

// "float32, bfloat16, float16 or int8": the names allowed_dtype() admits.
std::string allowed_names(bool kv, bool allow_f64) {
  std::string names;
  int n = 0;
  for (int i = 0; i < kNumDTypes; ++i) n += allowed_dtype(static_cast<DType>(i), kv, false);
  for (int i = 0, k = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    if (!allowed_dtype(d, kv, false)) continue;
    names += k == 0 ? "" : k + 1 == n ? " or " : ", ";
    names += dtype_name(d);
    ++k;
  }
  return names + (allow_f64 ? " (or float64 for the reference)" : "");
}

// Q, K, V and out: a dtype of their kind, the data pointer aligned to the element size (a float
// at an odd address is undefined behaviour).
void check_float_dtype(const char* name, const TensorView& t, bool allow_f64, bool kv) {
  const DType d = t.dtype;
  if (!allowed_dtype(d, kv, allow_f64))
    fail(std::string(name) + " " + shape_str(t) + " has dtype " + dtype_name(d) + "; expected " +
         allowed_names(kv, allow_f64));
  if (reinterpret_cast<std::uintptr_t>(t.data) % dtype_size(d) != 0) {
    fail(std::string(name) + " " + shape_str(t) + ": data is not aligned to its " +
         std::to_string(dtype_size(d)) + "-byte " + dtype_name(d) + " elements");
  }
}

// A per-query-head f32 vector [H] (sinks): shape, dtype, alignment, and every value finite or, when
// allowed, -inf (no sink for that head).
const float* check_per_head(const char* name, const TensorView& t, const Problem& p,
                            bool allow_neg_inf, std::int64_t& stride) {
  check_view(name, t, 1, 1);
  if (t.dtype != DType::f32)
    fail(std::string(name) + " " + shape_str(t) + " has dtype " + dtype_name(t.dtype) +
         "; expected float32");
  if (t.shape[0] != p.H)
    fail(std::string(name) + " has shape " + shape_str(t) + " but Q has H=" + std::to_string(p.H) +
         "; expected [" + std::to_string(p.H) + "]");
  if (reinterpret_cast<std::uintptr_t>(t.data) % 4 != 0)
    fail(std::string(name) + ": data is not aligned to its 4-byte float32 elements");
  extent_of(name, t);
  const auto* data = static_cast<const float*>(t.data);
  stride = t.strides[0];
  for (std::int64_t h = 0; h < p.H; ++h) {
    const float x = data[h * stride];
    if (!std::isfinite(x) && !(allow_neg_inf && x == -std::numeric_limits<float>::infinity()))
      fail(std::string(name) + "[" + std::to_string(h) + "] = " + std::to_string(x) +
           (allow_neg_inf ? " is not finite or -inf" : " is not finite"));
    if (std::isfinite(x) && std::abs(x) > kMaxNatural)
      fail(std::string(name) + "[" + std::to_string(h) + "] = " + number(x) + " is outside [-" +
           number(kMaxNatural) + ", " + number(kMaxNatural) +
           "], the range the kernels' log2 units carry");
  }
  return data;
}

void check_alibi_slopes(const TensorView& t, std::int64_t batches, Problem& p) {
  check_view("alibi_slopes", t, 1, 2);
  if (t.dtype != DType::f32)
    fail("alibi_slopes " + shape_str(t) + " has dtype " + dtype_name(t.dtype) +
         "; expected float32");
  const bool per_batch = t.rank == 2;
  if (t.shape[t.rank - 1] != p.H || (per_batch && t.shape[0] != batches))
    fail("alibi_slopes has shape " + shape_str(t) + " but Q has H=" + std::to_string(p.H) +
         (per_batch ? " and B=" + std::to_string(batches) : std::string()) + "; expected [" +
         std::to_string(p.H) + "] or [" + std::to_string(batches) + ", " + std::to_string(p.H) +
         "]");
  if (reinterpret_cast<std::uintptr_t>(t.data) % 4 != 0)
    fail("alibi_slopes: data is not aligned to its 4-byte float32 elements");
  extent_of("alibi_slopes", t);
  p.alibi = static_cast<const float*>(t.data);
  p.alibi_s = t.strides[t.rank - 1];
  p.alibi_bs = per_batch ? t.strides[0] : 0;
  for (std::int64_t b = 0; b < (per_batch ? batches : 1); ++b)
    for (std::int64_t h = 0; h < p.H; ++h) {
      const float x = p.alibi[b * p.alibi_bs + h * p.alibi_s];
      const std::string at = "alibi_slopes[" +
                             (per_batch ? std::to_string(b) + ", " : std::string()) +
                             std::to_string(h) + "] = " + number(x);
      if (!std::isfinite(x)) fail(at + " is not finite");
      if (std::abs(x) > kMaxAlibiSlope)
        fail(at +
             " is outside [-1e20, 1e20] (slope x distance must stay within the kernels' "
             "log2 range)");
    }
}

// The variants of AttentionOptions (window, softcap, ALiBi, sinks).
void check_variants(const AttentionOptions& opts, Problem& p) {
  for (const auto& [name, w] :
       {std::pair{"window_left", opts.window_left}, {"window_right", opts.window_right}}) {
    if (w < -1)
      fail(std::string(name) + " = " + std::to_string(w) +
           " must be >= 0, or -1 for no bound on that side");
  }
  p.window_left = opts.window_left;
  p.window_right = opts.window_right;
  if (opts.softcap != 0) {
    // The fast path divides by softcap * log2(e) in float: keep it a normal float.
    if (!std::isfinite(opts.softcap) || opts.softcap < 1e-30 || opts.softcap > 1e30) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "softcap = %.9g must be 0 (off) or finite in [1e-30, 1e30]",
                    opts.softcap);
      fail(buf);
    }
    p.softcap = opts.softcap;
  }
  p.alibi_default = opts.alibi && !opts.alibi_slopes;
  if (opts.alibi_slopes) check_alibi_slopes(*opts.alibi_slopes, p.B, p);
  if (opts.sinks) p.sinks = check_per_head("sinks", *opts.sinks, p, true, p.sinks_s);
}

// The scales of a scaled K or V (cpuattn.h's list: int8, fp8), required exactly for those:
// f32 [B, Hkv, Lk] (one per token of each K/V head), [Hkv] (one per head) or [1] (one for the
// tensor). Sets the problem's pointer and (b, h, j) strides, 0 where the scale is shared.
void check_scales(const char* name, const char* tensor, const TensorView& t,
                  const std::optional<TensorView>& scales, const Problem& p, const float*& data,
                  std::int64_t (&strides)[3]) {
  // Built only when a message needs it: a valid call must not allocate.
  const auto token_shape = [&] {
    return "[B,Hkv,Lk] = [" + std::to_string(p.B) + "," + std::to_string(p.Hkv) + "," +
           std::to_string(p.Lk) + "]";
  };
  if (!needs_scales(t.dtype)) {
    if (scales)
      fail(std::string(name) + " is given but " + tensor + " has dtype " + dtype_name(t.dtype) +
           " (scales are for scaled dtypes: int8 and the like)");
    return;
  }
  if (!scales)
    fail(std::string(tensor) + " " + shape_str(t) + " is " + dtype_name(t.dtype) + " but " + name +
         " is missing (f32 " + token_shape() + ", [Hkv] or [1])");
  const TensorView& s = *scales;
  check_view(name, s, 1, 3);
  if (s.dtype != DType::f32)
    fail(std::string(name) + " " + shape_str(s) + " has dtype " + dtype_name(s.dtype) +
         "; expected float32");
  if (reinterpret_cast<std::uintptr_t>(s.data) % 4 != 0)
    fail(std::string(name) + ": data is not aligned to its 4-byte float32 elements");
  const bool per_token =
      s.rank == 3 && s.shape[0] == p.B && s.shape[1] == p.Hkv && s.shape[2] == p.Lk;
  const bool shared = s.rank == 1 && (s.shape[0] == p.Hkv || s.shape[0] == 1);
  if (!per_token && !shared)
    fail(std::string(name) + " has shape " + shape_str(s) + "; expected " + token_shape() +
         " (per token), [" + std::to_string(p.Hkv) + "] (per K/V head) or [1] (per tensor)");
  extent_of(name, s);
  data = static_cast<const float*>(s.data);
  if (per_token) {
    for (int d = 0; d < 3; ++d) strides[d] = s.shape[d] == 1 ? 0 : s.strides[d];
  } else {
    strides[0] = strides[2] = 0;
    strides[1] = s.shape[0] == 1 ? 0 : s.strides[0];
  }
}

// Outputs must not write one element twice: with the dimensions of size > 1 sorted by stride,
// each stride must step over the whole extent of the dimensions inside it.
void check_no_self_overlap(const char* name, const TensorView& t) {
  std::array<std::pair<std::int64_t, std::int64_t>, kMaxRank> dims{};  // (stride, size)
  int n = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] > 1) dims[n++] = {t.strides[d], t.shape[d]};
  }
  for (int i = 1; i < n; ++i) {  // insertion sort of at most 4 (stride, size) pairs
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  std::int64_t span = 1;
  for (int i = 0; i < n; ++i) {
    const auto [stride, size] = dims[i];
    if (stride < span) {
      fail(std::string(name) + " " + shape_str(t) +
           ": strides make different elements overlap (an output must not alias itself)");
    }
    span = stride * size;
  }
}

namespace {

// Whether views a and b share a byte: yes, no, or not decided within the work bound. Element x of
// a occupies bytes [pa + sum_d x_d sa_d ea, + ea); the views share a byte iff some x, y give
// sum_d sa_d ea x_d - sum_d sb_d eb y_d in [pb - pa - ea + 1, pb - pa + eb - 1]. The terms are
// fixed largest stride first, each to the values that leave the interval reachable by the terms
// left (so strided layouts with nested strides take one or two values per term).
enum class Shared { no, yes, unknown };

Shared share_bytes(const TensorView& a, const TensorView& b) {
  struct Term {
    __int128 coef;   // signed: + for a's dimensions, - for b's
    std::int64_t n;  // values 0 .. n - 1
  };
  std::array<Term, 2 * kMaxRank> terms{};
  int nt = 0;
  const auto add = [&](const TensorView& t, int sign) {
    const auto e = static_cast<__int128>(dtype_size(t.dtype));
    for (int d = 0; d < t.rank; ++d)
      if (t.shape[d] > 1 && t.strides[d] != 0)
        terms[nt++] = {sign * static_cast<__int128>(t.strides[d]) * e, t.shape[d]};
  };
  add(a, 1);
  add(b, -1);
  // Insertion sort of at most 8 terms by |coef|, largest first.
  const auto mag = [](const Term& t) { return t.coef < 0 ? -t.coef : t.coef; };
  for (int x = 1; x < nt; ++x)
    for (int y = x; y > 0 && mag(terms[y]) > mag(terms[y - 1]); --y)
      std::swap(terms[y], terms[y - 1]);
  // Reach of terms k.. : [lo[k], hi[k]].
  std::array<__int128, 2 * kMaxRank + 1> lo{}, hi{};
  for (int k = nt - 1; k >= 0; --k) {
    const __int128 span = terms[k].coef * (terms[k].n - 1);
    lo[k] = lo[k + 1] + (span < 0 ? span : 0);
    hi[k] = hi[k + 1] + (span > 0 ? span : 0);
  }
  const __int128 base = static_cast<__int128>(reinterpret_cast<std::uintptr_t>(b.data)) -
                        static_cast<__int128>(reinterpret_cast<std::uintptr_t>(a.data));
  const __int128 want_lo = base - static_cast<__int128>(dtype_size(a.dtype)) + 1;
  const __int128 want_hi = base + static_cast<__int128>(dtype_size(b.dtype)) - 1;
  std::int64_t work = 1 << 20;
  // Whether terms k.. can sum into [wlo, whi].
  const auto search = [&](const auto& self, int k, __int128 wlo, __int128 whi) -> Shared {
    if (wlo > hi[k] || whi < lo[k]) return Shared::no;
    if (k == nt) return Shared::yes;
    if (--work < 0) return Shared::unknown;
    const __int128 c = terms[k].coef;
    // x with c x + (terms k+1..) in [wlo, whi]: c x in [wlo - hi[k+1], whi - lo[k+1]].
    __int128 xlo = 0, xhi = terms[k].n - 1;
    const __int128 r0 = wlo - hi[k + 1], r1 = whi - lo[k + 1];
    const auto floor_div = [](__int128 p, __int128 q) {
      return p / q - ((p % q != 0) && ((p < 0) != (q < 0)) ? 1 : 0);
    };
    const auto ceil_div = [&](__int128 p, __int128 q) { return -floor_div(-p, q); };
    if (c > 0) {
      xlo = std::max(xlo, ceil_div(r0, c));
      xhi = std::min(xhi, floor_div(r1, c));
    } else {
      xlo = std::max(xlo, ceil_div(r1, c));
      xhi = std::min(xhi, floor_div(r0, c));
    }
    Shared result = Shared::no;
    for (__int128 x = xlo; x <= xhi; ++x) {
      const Shared s = self(self, k + 1, wlo - c * x, whi - c * x);
      if (s == Shared::yes) return s;
      if (s == Shared::unknown) result = s;
    }
    return result;
  };
  return search(search, 0, want_lo, want_hi);
}

}  // namespace

void check_disjoint(const char* out_name, const Extent& o,
                    std::initializer_list<std::pair<const char*, Extent>> others) {
  for (const auto& [name, e] : others) {
    if (!(o.lo < e.hi && e.lo < o.hi)) continue;
    const Shared s =
        o.view.rank == 0 || e.view.rank == 0 ? Shared::yes : share_bytes(o.view, e.view);
    if (s == Shared::yes) {
      fail(std::string(out_name) + " overlaps " + name + " in memory (outputs must not alias " +
           "inputs or other outputs)");
    }
    if (s == Shared::unknown) {
      fail(std::string(out_name) + " may overlap " + name + ": their address ranges interleave " +
           "in a way too costly to resolve (outputs must not alias inputs or other outputs)");
    }
  }
}

namespace {

// A dimension of size 1 never steps to a second element, so its stride may be any value the
// caller left there (up to 2^62); the kernels get 0 instead, so that no product of a stride with
// an element size or a prefetch distance can overflow (fuzz_validate found stride 2^61 * 4).
Strided4 strided(const TensorView& t) {
  Strided4 s;
  s.data = t.data;
  s.dtype = t.dtype;
  for (int d = 0; d < 4; ++d) s.s[d] = d < t.rank && t.shape[d] == 1 ? 0 : t.strides[d];
  return s;
}

}  // namespace

// The four tensors of a call, with the rule each follows (rank 4, a dtype of its kind).
struct CallTensors {
  const TensorView &q, &k, &v, &out;
  // "Q [..], K [..], V [..], out [..]", built only when a message needs it: a valid call must
  // not allocate.
  std::string shapes() const { return shapes_of({{"Q", &q}, {"K", &k}, {"V", &v}, {"out", &out}}); }
};

void check_tensors(const CallTensors& t, bool allow_f64) {
  struct Rule {
    const char* name;
    const TensorView& view;
    bool kv;  // K or V: the scaled dtypes too
  };
  for (const Rule& r : {Rule{"Q", t.q, false}, Rule{"K", t.k, true}, Rule{"V", t.v, true},
                        Rule{"out", t.out, false}}) {
    check_view(r.name, r.view, 4, 4);
    check_float_dtype(r.name, r.view, allow_f64, r.kv);
  }
  // The fast path reads K and V with one element type; the reference reads each as it is.
  if (!allow_f64 && t.k.dtype != t.v.dtype) {
    fail("K has dtype " + std::string(dtype_name(t.k.dtype)) + " but V has dtype " +
         dtype_name(t.v.dtype) + " (K and V must share a dtype: K " + shape_str(t.k) + ", V " +
         shape_str(t.v) + ")");
  }
}

// B, H, Hkv, Lq, Lk, D and Dv, every one the same wherever it appears.
Problem problem_shape(const CallTensors& t) {
  Problem p;
  p.B = t.q.shape[0];
  p.H = t.q.shape[1];
  p.Lq = t.q.shape[2];
  p.D = t.q.shape[3];
  p.Hkv = t.k.shape[1];
  p.Lk = t.k.shape[2];
  p.Dv = t.v.shape[3];
  const auto mismatch = [&](const std::string& what) { fail(what + " (" + t.shapes() + ")"); };
  const auto n = [](std::int64_t x) { return std::to_string(x); };
  if (t.k.shape[0] != p.B) mismatch("K has B=" + n(t.k.shape[0]) + " but Q has B=" + n(p.B));
  if (t.v.shape[0] != p.B) mismatch("V has B=" + n(t.v.shape[0]) + " but Q has B=" + n(p.B));
  if (t.k.shape[3] != p.D) mismatch("K has D=" + n(t.k.shape[3]) + " but Q has D=" + n(p.D));
  if (t.v.shape[1] != p.Hkv) mismatch("V has " + n(t.v.shape[1]) + " heads but K has " + n(p.Hkv));
  if (t.v.shape[2] != p.Lk) mismatch("V has Lk=" + n(t.v.shape[2]) + " but K has Lk=" + n(p.Lk));
  if (p.H % p.Hkv != 0)
    mismatch("Q has H=" + n(p.H) + " heads, not a multiple of the " + n(p.Hkv) + " K/V heads");
  if (t.out.shape[0] != p.B || t.out.shape[1] != p.H || t.out.shape[2] != p.Lq ||
      t.out.shape[3] != p.Dv)
    mismatch("out must have shape [B,H,Lq,Dv] = [" + n(p.B) + "," + n(p.H) + "," + n(p.Lq) + "," +
             n(p.Dv) + "]");
  p.group = p.H / p.Hkv;
  return p;
}

// opts.scale: the reference computes in double, the fast path folds scale * log2(e) into one
// float: a scale outside float's normal range would be 0 or inf there (1e39 gave an all-NaN
// output while the reference gave finite numbers), so both reject it.
double check_scale(const std::optional<double>& scale, std::int64_t D) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(D));
  const double s = *scale;
  if (!(s >= kMinScale && s <= kMaxScale)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "scale must be in [%.9g, %.9g] (finite, > 0, and scale * log2(e) a normal "
                  "float32), got %.10g",
                  kMinScale, kMaxScale, s);
    fail(buf);
  }
  return s;
}

Causal check_causal(Causal c) {
  // Found by fuzz_validate: a value outside the enum was taken as `none`.
  if (c != Causal::none && c != Causal::top_left && c != Causal::bottom_right)
    fail("causal must be Causal::none, top_left or bottom_right, got the value " +
         std::to_string(static_cast<int>(c)));
  return c;
}

// opts.mask: bool or additive (f32, the reference also f64), broadcastable to [B, H, Lq, Lk].
void check_mask(const TensorView& m, bool allow_f64, Problem& p) {
  check_view("mask", m, 1, 4);
  if (m.dtype == DType::boolean) {
    p.mask_kind = MaskKind::boolean;
  } else if (m.dtype == DType::f32 || (allow_f64 && m.dtype == DType::f64)) {
    p.mask_kind = MaskKind::additive;
  } else {
    fail("mask " + shape_str(m) + " has dtype " + dtype_name(m.dtype) +
         "; expected bool or float32");
  }
  extent_of("mask", m);
  const std::int64_t target[4] = {p.B, p.H, p.Lq, p.Lk};
  p.mask.data = m.data;
  p.mask.dtype = m.dtype;
  const int off = 4 - m.rank;  // numpy broadcasting aligns trailing dimensions
  for (int d = 0; d < 4; ++d) {
    const std::int64_t n = d < off ? 1 : m.shape[d - off];
    if (n != 1 && n != target[d])
      fail("mask " + shape_str(m) + " does not broadcast to the scores [B,H,Lq,Lk] = [" +
           std::to_string(p.B) + "," + std::to_string(p.H) + "," + std::to_string(p.Lq) + "," +
           std::to_string(p.Lk) + "]");
    p.mask.s[d] = n == 1 ? 0 : m.strides[d - off];
  }
}

// opts.key_lengths: int32 or int64 [B], each in [0, Lk].
void check_key_lengths(const TensorView& kl, Problem& p) {
  check_view("key_lengths", kl, 1, 1);
  if (kl.dtype != DType::i32 && kl.dtype != DType::i64)
    fail("key_lengths " + shape_str(kl) + " has dtype " + dtype_name(kl.dtype) +
         "; expected int32 or int64");
  if (kl.shape[0] != p.B)
    fail("key_lengths has shape " + shape_str(kl) + " but Q has B=" + std::to_string(p.B) +
         "; expected [" + std::to_string(p.B) + "]");
  extent_of("key_lengths", kl);
  p.key_lengths = kl.data;
  p.key_lengths_dtype = kl.dtype;
  for (std::int64_t b = 0; b < p.B; ++b) {
    const std::int64_t n = p.key_length(b);
    if (n < 0 || n > p.Lk)
      fail("key_lengths[" + std::to_string(b) + "] = " + std::to_string(n) +
           " is outside [0, Lk=" + std::to_string(p.Lk) + "]");
  }
}

// An optional output of the call (lse [B, H, Lq], weights [B, H, Lq, Lk]): f32 (or f64), its
// shape, and no byte shared with Q, K, V, out or the outputs before it.
struct OutputRule {
  const char* name;
  int rank;
  std::int64_t shape[4];
  const char* shape_name;  // "[B,H,Lq]"
};

Extent check_output(const OutputRule& r, const TensorView& t, bool allow_f64,
                    std::initializer_list<std::pair<const char*, Extent>> earlier) {
  check_view(r.name, t, r.rank, r.rank);
  check_dtype(r.name, t, allow_f64);
  bool same = true;
  std::string want;
  for (int d = 0; d < r.rank; ++d) {
    same = same && t.shape[d] == r.shape[d];
    if (d > 0) want += ",";
    want += std::to_string(r.shape[d]);
  }
  if (!same)
    fail(std::string(r.name) + " has shape " + shape_str(t) + "; expected " + r.shape_name +
         " = [" + want + "]");
  const Extent e = extent_of(r.name, t);
  check_no_self_overlap(r.name, t);
  check_disjoint(r.name, e, earlier);
  return e;
}

// lse and weights, then every input that is read while the outputs are written (mask, key
// lengths, scales, slopes, sinks) against every output.
void check_outputs(const CallTensors& t, const AttentionOptions& opts, bool allow_f64, Problem& p) {
  const Extent eq = extent_of("Q", t.q), ek = extent_of("K", t.k), ev = extent_of("V", t.v);
  const Extent eo = extent_of("out", t.out);
  check_no_self_overlap("out", t.out);
  check_disjoint("out", eo, {{"Q", eq}, {"K", ek}, {"V", ev}});
  // Outputs written so far (fixed size: no allocation).
  std::array<std::pair<const char*, Extent>, 3> written{{{"out", eo}, {"out", eo}, {"out", eo}}};
  if (opts.lse) {
    const OutputRule r{"lse", 3, {p.B, p.H, p.Lq, 0}, "[B,H,Lq]"};
    written[1] = {"lse", check_output(r, *opts.lse, allow_f64,
                                      {{"Q", eq}, {"K", ek}, {"V", ev}, {"out", eo}})};
    p.lse = opts.lse->data;
    p.lse_dtype = opts.lse->dtype;
    for (int d = 0; d < 3; ++d) p.lse_s[d] = opts.lse->strides[d];
  }
  if (opts.weights) {
    const OutputRule r{"weights", 4, {p.B, p.H, p.Lq, p.Lk}, "[B,H,Lq,Lk]"};
    const Extent e =
        check_output(r, *opts.weights, allow_f64, {{"Q", eq}, {"K", ek}, {"V", ev}, {"out", eo}});
    for (const auto& [name, other] : written) check_disjoint("weights", e, {{name, other}});
    written[2] = {"weights", e};
    p.weights = opts.weights->data;
    p.weights_dtype = opts.weights->dtype;
    for (int d = 0; d < 4; ++d) p.weights_s[d] = opts.weights->strides[d];
  }
  for (const auto& [name, in] : {std::pair{"mask", &opts.mask},
                                 {"key_lengths", &opts.key_lengths},
                                 {"k_scales", &opts.k_scales},
                                 {"v_scales", &opts.v_scales},
                                 {"alibi_slopes", &opts.alibi_slopes},
                                 {"sinks", &opts.sinks}}) {
    if (!*in) continue;
    const Extent e = extent_of(name, **in);
    for (const auto& [out_name, out] : written) check_disjoint(out_name, out, {{name, e}});
  }
}

Problem validate(const TensorView& q, const TensorView& k, const TensorView& v,
                 const OutputView& out_view, const AttentionOptions& opts, bool allow_f64) {
  const TensorView out = out_view;
  const CallTensors t{q, k, v, out};
  check_tensors(t, allow_f64);
  Problem p = problem_shape(t);
  // Every argument in turn; each check names its argument and its shape on failure.
  p.scale = check_scale(opts.scale, p.D);
  p.causal = check_causal(opts.causal);
  if (opts.mask) check_mask(*opts.mask, allow_f64, p);
  if (opts.key_lengths) check_key_lengths(*opts.key_lengths, p);
  check_variants(opts, p);
  check_scales("k_scales", "K", k, opts.k_scales, p, p.k_scale, p.k_scale_s);
  check_scales("v_scales", "V", v, opts.v_scales, p, p.v_scale, p.v_scale_s);
  check_outputs(t, opts, allow_f64, p);
  p.q = strided(q);
  p.k = strided(k);
  p.v = strided(v);
  p.out = out_view.data;
  p.out_dtype = out.dtype;
  for (int d = 0; d < 3; ++d) p.out_s[d] = out.strides[d];
  return p;
}

}  // namespace detail
}  // namespace cpuattn

namespace cpuattn {

std::uint16_t to_bf16(float x) { return detail::f32_to_bf16(x); }
float from_bf16(std::uint16_t bits) { return detail::bf16_to_f32(bits); }
std::uint16_t to_f16(float x) { return detail::f32_to_f16(x); }
float from_f16(std::uint16_t bits) { return detail::f16_to_f32(bits); }

float quantize_int8(const float* x, std::int64_t n, std::int8_t* q) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      detail::fail("quantize_int8: element " + std::to_string(i) + " of " + std::to_string(n) +
                   " is " + std::to_string(x[i]) + " (int8 holds finite values only)");
    }
  }
  return detail::quantize_row(x, n, q);
}

}  // namespace cpuattn
