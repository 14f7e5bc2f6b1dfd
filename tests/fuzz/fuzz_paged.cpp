// attention() over a paged KV cache (cpuattn.h, PagedKv), three ways at once:
//  * validation, against an independent statement of the paged rules: the call throws
//    cpuattn::Error iff a rule below is broken, and then leaves every output byte untouched;
//  * addressing: the paged reference (f64) equals the dense reference run on each sequence's
//    keys gathered page by page into contiguous [1, Hkv, len, d] tensors (same dtype, same
//    scales), so a wrong page, row or head shows as a different output;
//  * the fast path (f32 out, every SIMD target, 1 or 2 threads) against the paged reference,
//    within the test suite's tolerance for inputs in [-1, 1]:
//      |got - want| <= max|V| (8 eps (sqrt(Lk) + sqrt(D) score_mag) + 1e-6)
//    score_mag = sqrt(D) (|scale q.k| <= sqrt(D)) plus max|sink| and, with ALiBi, Lk (the largest
//    slope is 1/2 or less times a distance below Lk).
// Small pools of pages of 1-32 tokens, shared between sequences as the fuzzer draws the block
// table, ragged last pages and empty sequences, f32/bf16/f16/int8 pages, with causal, window,
// soft-cap, ALiBi and sinks drawn alongside.
//
// The rules (cpuattn.h): P a power of two; v_pages with k_pages' num_pages and P; block_table
// int32 [B, max_pages]; seq_lens int32 or int64 [B], each in [0, max_pages * P]; the first
// ceil(len / P) table entries of each sequence in [0, num_pages) (the rest may hold anything);
// k_scales / v_scales given exactly when the pages are int8; no mask or key_lengths option; a
// soft-cap that is 0 or finite and positive; window sides >= -1.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "fuzz_contexts.h"
#include "fuzz_util.h"

namespace cpuattn::fuzz {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();

// Target caps scalar, sse4, avx2, avx512, avx512_vnni and avx512_bf16 (the last two run int8
// pages' decoding steps on a native VNNI unit where the CPU has it, the last bf16 pages on the
// native bf16 kernel).
constexpr Target kCaps[] = {Target::scalar, Target::sse4,        Target::avx2,
                            Target::avx512, Target::avx512_vnni, Target::avx512_bf16};
constexpr int kTargets = 6;
Context* context(int target, int threads) {
  return fuzz_context(Simd::highway, kCaps[target], threads);
}

void store(std::vector<unsigned char>& buf, DType dt, std::size_t i, float x) {
  switch (dt) {
    case DType::f32:
      std::memcpy(&buf[i * 4], &x, 4);
      break;
    case DType::bf16:
    case DType::f16: {
      const std::uint16_t h = dt == DType::bf16 ? to_bf16(x) : to_f16(x);
      std::memcpy(&buf[i * 2], &h, 2);
      break;
    }
    default:  // i8: x in [-1, 1] as a code in [-127, 127]
      buf[i] = static_cast<unsigned char>(static_cast<std::int8_t>(std::lround(x * 127)));
      break;
  }
}

// Largest |V| a sequence can see, as the kernels read it (scales applied).
double value_of(const std::vector<unsigned char>& buf, DType dt, std::size_t i, float scale) {
  switch (dt) {
    case DType::f32: {
      float x;
      std::memcpy(&x, &buf[i * 4], 4);
      return x;
    }
    case DType::bf16:
    case DType::f16: {
      std::uint16_t h;
      std::memcpy(&h, &buf[i * 2], 2);
      return dt == DType::bf16 ? from_bf16(h) : from_f16(h);
    }
    default:
      return static_cast<std::int8_t>(buf[i]) * static_cast<double>(scale);
  }
}

// One drawn call: shapes, pools, block table, lengths and options, and whether the call is valid.
struct PagedCase {
  std::int64_t B = 0, Hkv = 0, group = 0, H = 0, Lq = 0, D = 0, Dv = 0, P = 0;
  std::int64_t num_pages = 0, max_pages = 0, v_num = 0, bt_rows = 0, sl_rows = 0;
  DType dt = DType::f32;
  std::size_t es = 4;
  bool valid = true, scales = false, table_i64 = false, lens_f32 = false, lens_i32 = false;
  std::vector<unsigned char> kp, vp;
  std::vector<float> ks, vs, q, sinks;
  std::vector<std::int64_t> table_store, lens, key_lengths;  // table_store: room for i64
  std::vector<std::int32_t> lens32;
  AttentionOptions o;
  int target = 0, threads = 1;

  std::int32_t* table() { return reinterpret_cast<std::int32_t*>(table_store.data()); }
  std::int64_t page_of(std::int64_t b, std::int64_t j) { return table()[b * max_pages + j / P]; }
};

// Shapes, the pools (v_pages may get one page more: a mismatch), their scales and Q.
void draw_pools(Reader& in, PagedCase& c, std::mt19937& rng) {
  c.B = in.range(1, 3);
  c.Hkv = in.range(1, 3);
  c.group = in.range(1, 3);
  c.H = c.Hkv * c.group;
  c.Lq = in.range(1, 3);
  c.D = in.range(1, 9);
  c.Dv = in.range(1, 9);
  static const std::int64_t kPow2[] = {1, 2, 4, 8, 16, 32};
  static const std::int64_t kNotPow2[] = {3, 6, 12, 24};
  static const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i8};
  const bool bad_p = in.chance(5);
  c.P = bad_p ? in.pick(kNotPow2) : in.pick(kPow2);
  c.valid &= !bad_p;
  c.num_pages = in.range(1, 8);
  c.max_pages = in.range(1, 4);
  c.dt = in.pick(kDtypes);
  rng.seed(static_cast<std::uint32_t>(in.bits(4)));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const bool bad_vpages = in.chance(4);
  c.valid &= !bad_vpages;
  c.v_num = c.num_pages + (bad_vpages ? 1 : 0);
  c.es = dtype_size(c.dt);
  c.kp.resize(static_cast<std::size_t>(c.num_pages * c.Hkv * c.P * c.D) * c.es);
  c.vp.resize(static_cast<std::size_t>(c.v_num * c.Hkv * c.P * c.Dv) * c.es);
  for (std::size_t i = 0; i < c.kp.size() / c.es; ++i) store(c.kp, c.dt, i, unit(rng));
  for (std::size_t i = 0; i < c.vp.size() / c.es; ++i) store(c.vp, c.dt, i, unit(rng));
  c.ks.resize(static_cast<std::size_t>(c.v_num * c.Hkv * c.P));
  c.vs.resize(c.ks.size());
  // int8 scales in [0.5, 1] / 127, so the values stay in [-1, 1] as for the other dtypes.
  for (float& s : c.ks) s = (0.75f + 0.25f * unit(rng)) / 127;
  for (float& s : c.vs) s = (0.75f + 0.25f * unit(rng)) / 127;
  const bool scales_wrong = in.chance(4);  // missing for int8, present for the others
  c.valid &= !scales_wrong;
  c.scales = (c.dt == DType::i8) != scales_wrong;
  c.q.resize(static_cast<std::size_t>(c.B * c.H * c.Lq * c.D));
  for (float& x : c.q) x = unit(rng);
}

// Block table and lengths: a row or a length too many, a wrong dtype, a length out of range, a
// used entry out of range; unused entries hold junk.
void draw_table(Reader& in, PagedCase& c) {
  const bool bad_table_rows = in.chance(3), bad_lens_rows = in.chance(3);
  c.table_i64 = in.chance(3);
  c.lens_f32 = in.chance(3);
  c.valid &= !bad_table_rows && !bad_lens_rows && !c.table_i64 && !c.lens_f32;
  c.bt_rows = c.B + (bad_table_rows ? 1 : 0);
  c.sl_rows = c.B + (bad_lens_rows ? 1 : 0);
  c.table_store.resize(static_cast<std::size_t>(c.bt_rows * c.max_pages));
  c.lens.resize(static_cast<std::size_t>(c.sl_rows));
  c.lens_i32 = in.chance(50);
  const std::int64_t cap = c.max_pages * c.P;
  for (std::int64_t b = 0; b < c.sl_rows; ++b) {
    std::int64_t len = in.range(0, cap);
    if (b < c.B && in.chance(3)) {
      len = in.chance(50) ? -1 : cap + 1;
      c.valid = false;
    }
    c.lens[b] = len;
  }
  for (std::int64_t b = 0; b < c.bt_rows; ++b) {
    const std::int64_t used = b < c.B && c.lens[b] > 0 ? (c.lens[b] + c.P - 1) / c.P : 0;
    for (std::int64_t i = 0; i < c.max_pages; ++i) {
      std::int64_t page = in.range(0, c.num_pages - 1);
      if (i >= used && in.chance(30)) page = in.chance(50) ? -1 : 1 << 30;  // never read
      if (i < used && b < c.B && c.lens[b] <= cap && in.chance(3)) {
        page = in.chance(50) ? -1 : c.num_pages;
        c.valid = false;
      }
      c.table()[b * c.max_pages + i] = static_cast<std::int32_t>(page);
    }
  }
  c.lens32.assign(c.lens.begin(), c.lens.end());
}

// Masks and score options (some out of range), the SIMD target and the thread count.
void draw_options(Reader& in, PagedCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  AttentionOptions& o = c.o;
  if (in.chance(40)) o.causal = Causal::bottom_right;
  if (in.chance(40)) {
    o.window_left = in.range(-1, 5);
    o.window_right = in.range(-1, 5);
  }
  if (in.chance(4)) {
    o.window_left = -2;
    c.valid = false;
  }
  if (in.chance(25)) o.softcap = 0.5 + in.range(0, 20);
  if (in.chance(4)) {
    o.softcap = in.chance(50) ? -1.0 : std::numeric_limits<double>::infinity();
    c.valid = false;
  }
  o.alibi = in.chance(25);
  c.sinks.resize(static_cast<std::size_t>(c.H));
  for (float& s : c.sinks) s = 4 * unit(rng);
  if (in.chance(25)) o.sinks = TensorView::contiguous(c.sinks.data(), DType::f32, {c.H});
  c.key_lengths.assign(static_cast<std::size_t>(c.B), 1);
  if (in.chance(3)) {
    o.key_lengths = TensorView::contiguous(c.key_lengths.data(), DType::i64, {c.B});
    c.valid = false;
  }
  c.target = static_cast<int>(in.range(0, kTargets - 1));
  c.threads = static_cast<int>(in.range(1, 2));
}

// Pool rows that no query of any sequence attends (past every length, in unused pages, or left
// of every row's window) get NaN or +-inf, as recycled pages hold; int8 rows through their
// scales. No output may change for them (docs/guarantees.md, "Excluded keys").
void poison_unread_rows(Reader& in, PagedCase& c) {
  static const float kPoisons[] = {std::numeric_limits<float>::quiet_NaN(),
                                   std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity()};
  const float poison = in.pick(kPoisons);
  std::vector<bool> live(static_cast<std::size_t>(c.num_pages * c.P), false);
  for (std::int64_t b = 0; b < c.B; ++b) {
    // Query 0 sits at position len - Lq and sees the earliest keys: from pos - window_left.
    const std::int64_t first =
        c.o.window_left >= 0 ? std::max<std::int64_t>(0, c.lens[b] - c.Lq - c.o.window_left) : 0;
    for (std::int64_t j = first; j < c.lens[b]; ++j)
      live[static_cast<std::size_t>(c.page_of(b, j) * c.P + j % c.P)] = true;
  }
  for (std::int64_t page = 0; page < c.num_pages; ++page)
    for (std::int64_t slot = 0; slot < c.P; ++slot) {
      if (live[static_cast<std::size_t>(page * c.P + slot)]) continue;
      for (std::int64_t h = 0; h < c.Hkv; ++h) {
        const std::int64_t row = (page * c.Hkv + h) * c.P + slot;
        if (c.dt == DType::i8) {
          c.ks[static_cast<std::size_t>(row)] = c.vs[static_cast<std::size_t>(row)] = poison;
          continue;
        }
        for (std::int64_t d = 0; d < c.D; ++d)
          store(c.kp, c.dt, static_cast<std::size_t>(row * c.D + d), poison);
        for (std::int64_t d = 0; d < c.Dv; ++d)
          store(c.vp, c.dt, static_cast<std::size_t>(row * c.Dv + d), poison);
      }
    }
}

PagedKv paged_views(PagedCase& c) {
  PagedKv kv;
  kv.k_pages = TensorView::contiguous(c.kp.data(), c.dt, {c.num_pages, c.Hkv, c.P, c.D});
  kv.v_pages = TensorView::contiguous(c.vp.data(), c.dt, {c.v_num, c.Hkv, c.P, c.Dv});
  kv.block_table = TensorView::contiguous(
      c.table_store.data(), c.table_i64 ? DType::i64 : DType::i32, {c.bt_rows, c.max_pages});
  kv.seq_lens = c.lens_f32   ? TensorView::contiguous(c.lens32.data(), DType::f32, {c.sl_rows})
                : c.lens_i32 ? TensorView::contiguous(c.lens32.data(), DType::i32, {c.sl_rows})
                             : TensorView::contiguous(c.lens.data(), DType::i64, {c.sl_rows});
  if (c.scales) {
    kv.k_scales = TensorView::contiguous(c.ks.data(), DType::f32, {c.num_pages, c.Hkv, c.P});
    kv.v_scales = TensorView::contiguous(c.vs.data(), DType::f32, {c.v_num, c.Hkv, c.P});
  }
  return kv;
}

// Sequence b's keys gathered page by page into dense [1, Hkv, len, d] tensors, with their
// scales, and the largest finite |V| among them (as the kernels read it).
struct Gathered {
  std::vector<unsigned char> k, v;
  std::vector<float> ks, vs;
  double vmax = 0;
};
Gathered gather_sequence(PagedCase& c, std::int64_t b) {
  const std::int64_t len = c.lens[b];
  Gathered g;
  g.k.resize(static_cast<std::size_t>(c.Hkv * len * c.D) * c.es);
  g.v.resize(static_cast<std::size_t>(c.Hkv * len * c.Dv) * c.es);
  g.ks.resize(static_cast<std::size_t>(c.Hkv * len));
  g.vs.resize(g.ks.size());
  for (std::int64_t h = 0; h < c.Hkv; ++h) {
    for (std::int64_t j = 0; j < len; ++j) {
      const std::int64_t src = (c.page_of(b, j) * c.Hkv + h) * c.P + j % c.P, dst = h * len + j;
      std::memcpy(&g.k[static_cast<std::size_t>(dst * c.D) * c.es],
                  &c.kp[static_cast<std::size_t>(src * c.D) * c.es],
                  static_cast<std::size_t>(c.D) * c.es);
      std::memcpy(&g.v[static_cast<std::size_t>(dst * c.Dv) * c.es],
                  &c.vp[static_cast<std::size_t>(src * c.Dv) * c.es],
                  static_cast<std::size_t>(c.Dv) * c.es);
      g.ks[dst] = c.ks[src];
      g.vs[dst] = c.vs[src];
      for (std::int64_t d = 0; d < c.Dv; ++d) {
        const double x = std::fabs(value_of(c.vp, c.dt, src * c.Dv + d, c.vs[src]));
        if (std::isfinite(x)) g.vmax = std::fmax(g.vmax, x);  // not the poisoned rows
      }
    }
  }
  return g;
}

// Sequence b of a valid call: the paged reference (want) against the dense reference on the
// gathered keys, and the fast path (out) against the paged reference. p_native: the extra
// relative error of the native bf16 / int8 units, when the call ran there.
void check_sequence(PagedCase& c, std::int64_t b, const float* out, const double* want,
                    double p_native) {
  const std::int64_t len = c.lens[b];
  const std::size_t n = static_cast<std::size_t>(c.H * c.Lq * c.Dv);
  if (len == 0) {  // out 0 (cpuattn.h), from both paths
    for (std::size_t i = 0; i < n; ++i)
      FUZZ_CHECK(out[i] == 0.0f && want[i] == 0.0,
                 "sequence %lld of length 0: out[%zu] = %g, reference %g, not 0", (long long)b, i,
                 out[i], want[i]);
    return;
  }
  const Gathered g = gather_sequence(c, b);
  AttentionOptions od = c.o;
  if (c.scales) {
    od.k_scales = TensorView::contiguous(g.ks.data(), DType::f32, {1, c.Hkv, len});
    od.v_scales = TensorView::contiguous(g.vs.data(), DType::f32, {1, c.Hkv, len});
  }
  std::vector<double> dense(n);
  reference_attention(
      TensorView::contiguous(c.q.data() + b * c.H * c.Lq * c.D, DType::f32, {1, c.H, c.Lq, c.D}),
      TensorView::contiguous(g.k.data(), c.dt, {1, c.Hkv, len, c.D}),
      TensorView::contiguous(g.v.data(), c.dt, {1, c.Hkv, len, c.Dv}),
      OutputView::contiguous(dense.data(), DType::f64, {1, c.H, c.Lq, c.Dv}), od);
  double smax = 0;
  for (float s : c.sinks) smax = std::fmax(smax, std::fabs(s));
  const double D = static_cast<double>(c.D);
  const double score_mag = std::sqrt(D) + (c.o.sinks ? smax : 0) + (c.o.alibi ? len : 0);
  const double atol =
      g.vmax * (8 * kEps * (std::sqrt(double(len)) + std::sqrt(D) * score_mag) + 1e-6 + p_native);
  for (std::size_t i = 0; i < n; ++i) {
    const double w = want[i], d = dense[i], got = out[i];
    FUZZ_CHECK(std::fabs(w - d) <= 1e-12 * (1 + std::fabs(d)),
               "sequence %lld (len %lld, P %lld): paged reference out[%zu] = %.17g, dense "
               "reference on the gathered keys %.17g",
               (long long)b, (long long)len, (long long)c.P, i, w, d);
    FUZZ_CHECK(std::fabs(got - w) <= atol,
               "sequence %lld (len %lld, P %lld, target %d, %d threads, dtype %d): out[%zu] = "
               "%.9g, reference %.9g, |diff| %.3g > %.3g",
               (long long)b, (long long)len, (long long)c.P, c.target, c.threads,
               static_cast<int>(c.dt), i, got, w, std::fabs(got - w), atol);
  }
}

// bf16 pages on the native kernel (docs/precision.md): P rounded to bf16 (2^-8) and, in decoding
// steps, Q split into bf16 hi + lo (2^-15 D scale max|q| max|k|, both <= 1 here). int8 pages
// there: decoding steps' P V on VNNI, weights quantized per block of 128 keys, out off by 2^-9
// max_j(127 vscale_j), which is at most 2^-8 max|v| with these scales in [0.5, 1] / 127 (vmax >=
// max|code| 0.5 / 127, and the error scales with max|code| too).
double native_error(const PagedCase& c) {
  const Context* ctx = context(c.target, c.threads);
  if (c.dt == DType::i8) {
    const Target t = active_target(ctx);
    return t == Target::avx512_vnni || t == Target::avx512_bf16 ? 0x1p-8 : 0.0;
  }
  const bool native_unit = std::string(active_bf16_path(ctx)) != "f32";
  if (!native_unit) return 0.0;
  const double scale = c.o.scale ? *c.o.scale : 1.0 / std::sqrt(double(c.D));
  return c.dt == DType::bf16 ? 0x1p-8 + 0x1p-15 * double(c.D) * scale : 0.0;
}

}  // namespace
}  // namespace cpuattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace cpuattn;
  using namespace cpuattn::fuzz;
  Reader in(data, size);
  PagedCase c;
  std::mt19937 rng;
  draw_pools(in, c, rng);
  draw_table(in, c);
  draw_options(in, c, rng);
  if (c.valid && in.chance(50)) poison_unread_rows(in, c);

  const PagedKv kv = paged_views(c);
  const TensorView qv = TensorView::contiguous(c.q.data(), DType::f32, {c.B, c.H, c.Lq, c.D});
  const std::size_t n_out = static_cast<std::size_t>(c.B * c.H * c.Lq * c.Dv);
  std::vector<float> out(n_out);
  std::memset(out.data(), 0xFF, n_out * 4);  // NaN, which no finite computation here gives
  bool threw = false;
  try {
    attention(qv, kv, OutputView::contiguous(out.data(), DType::f32, {c.B, c.H, c.Lq, c.Dv}), c.o,
              context(c.target, c.threads));
  } catch (const Error&) {
    threw = true;
  }
  FUZZ_CHECK(threw == !c.valid, "attention() %s, but the call is %s (B %lld P %lld dtype %d)",
             threw ? "threw" : "returned", c.valid ? "valid" : "invalid", (long long)c.B,
             (long long)c.P, static_cast<int>(c.dt));
  if (threw) {
    for (std::size_t i = 0; i < n_out; ++i) {
      std::uint32_t u;
      std::memcpy(&u, &out[i], 4);
      FUZZ_CHECK(u == 0xFFFFFFFFu, "out[%zu] was written by a call that threw", i);
    }
    return 0;
  }
  std::vector<double> want(n_out);
  reference_attention(qv, kv,
                      OutputView::contiguous(want.data(), DType::f64, {c.B, c.H, c.Lq, c.Dv}), c.o);
  const double p_native = native_error(c);
  const std::size_t per_seq = n_out / static_cast<std::size_t>(c.B);
  for (std::int64_t b = 0; b < c.B; ++b)
    check_sequence(c, b, out.data() + b * per_seq, want.data() + b * per_seq, p_native);
  return 0;
}
