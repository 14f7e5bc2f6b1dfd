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

// Target caps scalar, sse4, avx2, avx512 and avx512_bf16 (the last runs bf16 pages on the native
// kernel where the CPU has it).
constexpr int kTargets = 5;
Context* context(int target, int threads) {
  return fuzz_context(Simd::highway, static_cast<Target>(target), threads);
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

}  // namespace
}  // namespace cpuattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace cpuattn;
  using namespace cpuattn::fuzz;
  Reader in(data, size);
  const std::int64_t B = in.range(1, 3), Hkv = in.range(1, 3), group = in.range(1, 3);
  const std::int64_t H = Hkv * group, Lq = in.range(1, 3), D = in.range(1, 9), Dv = in.range(1, 9);
  static const std::int64_t kPow2[] = {1, 2, 4, 8, 16, 32};
  static const std::int64_t kNotPow2[] = {3, 6, 12, 24};
  static const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i8};
  bool valid = true;
  const bool bad_p = in.chance(5);
  const std::int64_t P = bad_p ? in.pick(kNotPow2) : in.pick(kPow2);
  valid &= !bad_p;
  const std::int64_t num_pages = in.range(1, 8), max_pages = in.range(1, 4);
  const DType dt = in.pick(kDtypes);
  std::mt19937 rng(static_cast<std::uint32_t>(in.bits(4)));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);

  // Pools (v_pages may get one page more: a mismatch), scales, Q.
  const bool bad_vpages = in.chance(4);
  valid &= !bad_vpages;
  const std::int64_t v_num = num_pages + (bad_vpages ? 1 : 0);
  const std::size_t es = dtype_size(dt);
  std::vector<unsigned char> kp(static_cast<std::size_t>(num_pages * Hkv * P * D) * es),
      vp(static_cast<std::size_t>(v_num * Hkv * P * Dv) * es);
  for (std::size_t i = 0; i < kp.size() / es; ++i) store(kp, dt, i, unit(rng));
  for (std::size_t i = 0; i < vp.size() / es; ++i) store(vp, dt, i, unit(rng));
  std::vector<float> ks(static_cast<std::size_t>(v_num * Hkv * P)), vs(ks.size());
  // int8 scales in [0.5, 1] / 127, so the values stay in [-1, 1] as for the other dtypes.
  for (float& s : ks) s = (0.75f + 0.25f * unit(rng)) / 127;
  for (float& s : vs) s = (0.75f + 0.25f * unit(rng)) / 127;
  const bool scales_wrong = in.chance(4);  // missing for int8, present for the others
  valid &= !scales_wrong;
  const bool scales = (dt == DType::i8) != scales_wrong;
  std::vector<float> q(static_cast<std::size_t>(B * H * Lq * D));
  for (float& x : q) x = unit(rng);

  // Block table and lengths: a row or a length too many, a wrong dtype, a length out of range, a
  // used entry out of range; unused entries hold junk.
  const bool bad_table_rows = in.chance(3), bad_lens_rows = in.chance(3);
  const bool table_i64 = in.chance(3), lens_f32 = in.chance(3);
  valid &= !bad_table_rows && !bad_lens_rows && !table_i64 && !lens_f32;
  const std::int64_t bt_rows = B + (bad_table_rows ? 1 : 0), sl_rows = B + (bad_lens_rows ? 1 : 0);
  std::vector<std::int64_t> table_store(static_cast<std::size_t>(bt_rows * max_pages));
  auto* table = reinterpret_cast<std::int32_t*>(table_store.data());  // int32 view; room for i64
  std::vector<std::int64_t> lens(static_cast<std::size_t>(sl_rows));
  const bool lens_i32 = in.chance(50);
  for (std::int64_t b = 0; b < sl_rows; ++b) {
    std::int64_t len = in.range(0, max_pages * P);
    if (b < B && in.chance(3)) {
      len = in.chance(50) ? -1 : max_pages * P + 1;
      valid = false;
    }
    lens[b] = len;
  }
  for (std::int64_t b = 0; b < bt_rows; ++b) {
    const std::int64_t used = b < B && lens[b] > 0 ? (lens[b] + P - 1) / P : 0;
    for (std::int64_t i = 0; i < max_pages; ++i) {
      std::int64_t page = in.range(0, num_pages - 1);
      if (i >= used && in.chance(30)) page = in.chance(50) ? -1 : 1 << 30;  // never read
      if (i < used && b < B && lens[b] <= max_pages * P && in.chance(3)) {
        page = in.chance(50) ? -1 : num_pages;
        valid = false;
      }
      table[b * max_pages + i] = static_cast<std::int32_t>(page);
    }
  }
  std::vector<std::int32_t> lens32(lens.begin(), lens.end());

  // Options.
  AttentionOptions o;
  if (in.chance(40)) o.causal = Causal::bottom_right;
  if (in.chance(40)) {
    o.window_left = in.range(-1, 5);
    o.window_right = in.range(-1, 5);
  }
  if (in.chance(4)) {
    o.window_left = -2;
    valid = false;
  }
  if (in.chance(25)) o.softcap = 0.5 + in.range(0, 20);
  if (in.chance(4)) {
    o.softcap = in.chance(50) ? -1.0 : std::numeric_limits<double>::infinity();
    valid = false;
  }
  o.alibi = in.chance(25);
  std::vector<float> sinks(static_cast<std::size_t>(H));
  for (float& s : sinks) s = 4 * unit(rng);
  if (in.chance(25)) o.sinks = TensorView::contiguous(sinks.data(), DType::f32, {H});
  std::vector<std::int64_t> key_lengths(static_cast<std::size_t>(B), 1);
  if (in.chance(3)) {
    o.key_lengths = TensorView::contiguous(key_lengths.data(), DType::i64, {B});
    valid = false;
  }
  const int target = static_cast<int>(in.range(0, kTargets - 1)),
            threads = static_cast<int>(in.range(1, 2));
  // bf16 pages on the native kernel (docs/precision.md): P rounded to bf16 (2^-8) and,
  // in decoding steps, Q split into bf16 hi + lo (2^-15 D scale max|q| max|k|, both <= 1 here).
  // int8 pages there: decoding steps' P V on VNNI, weights quantized per block of 128 keys, out
  // off by 2^-9 max_j(127 vscale_j), which is at most 2^-8 max|v| with these scales in [0.5, 1]
  // / 127 (vmax >= max|code| 0.5 / 127, and the error scales with max|code| too).
  // Pool rows that no query of any sequence attends (past every length, in unused pages, or left
  // of every row's window) hold NaN or +-inf, as recycled pages do; int8 rows through their
  // scales. No output may change for them (docs/guarantees.md, "Excluded keys").
  if (valid && in.chance(50)) {
    static const float kPoisons[] = {std::numeric_limits<float>::quiet_NaN(),
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity()};
    const float poison = in.pick(kPoisons);
    std::vector<bool> live(static_cast<std::size_t>(num_pages * P), false);
    for (std::int64_t b = 0; b < B; ++b) {
      // Query 0 sits at position len - Lq and sees the earliest keys: from pos - window_left.
      const std::int64_t first =
          o.window_left >= 0 ? std::max<std::int64_t>(0, lens[b] - Lq - o.window_left) : 0;
      for (std::int64_t j = first; j < lens[b]; ++j)
        live[static_cast<std::size_t>(table[b * max_pages + j / P] * P + j % P)] = true;
    }
    for (std::int64_t page = 0; page < num_pages; ++page)
      for (std::int64_t slot = 0; slot < P; ++slot) {
        if (live[static_cast<std::size_t>(page * P + slot)]) continue;
        for (std::int64_t h = 0; h < Hkv; ++h) {
          const std::int64_t row = (page * Hkv + h) * P + slot;
          if (dt == DType::i8) {
            ks[static_cast<std::size_t>(row)] = vs[static_cast<std::size_t>(row)] = poison;
            continue;
          }
          for (std::int64_t d = 0; d < D; ++d)
            store(kp, dt, static_cast<std::size_t>(row * D + d), poison);
          for (std::int64_t d = 0; d < Dv; ++d)
            store(vp, dt, static_cast<std::size_t>(row * Dv + d), poison);
        }
      }
  }
  const bool native_unit = std::string(active_bf16_path(context(target, threads))) == "avx512_bf16";
  const bool native = dt == DType::bf16 && native_unit;
  const bool native_i8 = dt == DType::i8 && native_unit;

  PagedKv kv;
  kv.k_pages = TensorView::contiguous(kp.data(), dt, {num_pages, Hkv, P, D});
  kv.v_pages = TensorView::contiguous(vp.data(), dt, {v_num, Hkv, P, Dv});
  kv.block_table = TensorView::contiguous(table_store.data(), table_i64 ? DType::i64 : DType::i32,
                                          {bt_rows, max_pages});
  kv.seq_lens = lens_f32   ? TensorView::contiguous(lens32.data(), DType::f32, {sl_rows})
                : lens_i32 ? TensorView::contiguous(lens32.data(), DType::i32, {sl_rows})
                           : TensorView::contiguous(lens.data(), DType::i64, {sl_rows});
  if (scales) {
    kv.k_scales = TensorView::contiguous(ks.data(), DType::f32, {num_pages, Hkv, P});
    kv.v_scales = TensorView::contiguous(vs.data(), DType::f32, {v_num, Hkv, P});
  }
  const TensorView qv = TensorView::contiguous(q.data(), DType::f32, {B, H, Lq, D});
  const std::size_t n_out = static_cast<std::size_t>(B * H * Lq * Dv);
  std::vector<float> out(n_out);
  std::memset(out.data(), 0xFF, n_out * 4);  // NaN, which no finite computation here gives
  bool threw = false;
  try {
    attention(qv, kv, OutputView::contiguous(out.data(), DType::f32, {B, H, Lq, Dv}), o,
              context(target, threads));
  } catch (const Error&) {
    threw = true;
  }
  FUZZ_CHECK(threw == !valid, "attention() %s, but the call is %s (B %lld P %lld dtype %d)",
             threw ? "threw" : "returned", valid ? "valid" : "invalid", (long long)B, (long long)P,
             static_cast<int>(dt));
  if (threw) {
    for (std::size_t i = 0; i < n_out; ++i) {
      std::uint32_t u;
      std::memcpy(&u, &out[i], 4);
      FUZZ_CHECK(u == 0xFFFFFFFFu, "out[%zu] was written by a call that threw", i);
    }
    return 0;
  }

  std::vector<double> want(n_out);
  reference_attention(qv, kv, OutputView::contiguous(want.data(), DType::f64, {B, H, Lq, Dv}), o);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = lens[b];
    const std::size_t off = static_cast<std::size_t>(b * H * Lq * Dv), n = n_out / B;
    if (len == 0) {  // out 0 (cpuattn.h), from both paths
      for (std::size_t i = off; i < off + n; ++i)
        FUZZ_CHECK(out[i] == 0.0f && want[i] == 0.0,
                   "sequence %lld of length 0: out[%zu] = %g, "
                   "reference %g, not 0",
                   (long long)b, i - off, out[i], want[i]);
      continue;
    }
    // The sequence's keys gathered page by page, with their scales.
    std::vector<unsigned char> kg(static_cast<std::size_t>(Hkv * len * D) * es),
        vg(static_cast<std::size_t>(Hkv * len * Dv) * es);
    std::vector<float> ksg(static_cast<std::size_t>(Hkv * len)), vsg(ksg.size());
    double vmax = 0;
    for (std::int64_t h = 0; h < Hkv; ++h) {
      for (std::int64_t j = 0; j < len; ++j) {
        const std::int64_t page = table[b * max_pages + j / P], row = j % P;
        const std::int64_t src = (page * Hkv + h) * P + row, dst = h * len + j;
        std::memcpy(&kg[static_cast<std::size_t>(dst * D) * es],
                    &kp[static_cast<std::size_t>(src * D) * es], static_cast<std::size_t>(D) * es);
        std::memcpy(&vg[static_cast<std::size_t>(dst * Dv) * es],
                    &vp[static_cast<std::size_t>(src * Dv) * es],
                    static_cast<std::size_t>(Dv) * es);
        ksg[dst] = ks[src];
        vsg[dst] = vs[src];
        for (std::int64_t d = 0; d < Dv; ++d) {
          const double x = std::fabs(value_of(vp, dt, src * Dv + d, vs[src]));
          if (std::isfinite(x)) vmax = std::fmax(vmax, x);  // not the poisoned rows
        }
      }
    }
    AttentionOptions od = o;
    if (scales) {
      od.k_scales = TensorView::contiguous(ksg.data(), DType::f32, {1, Hkv, len});
      od.v_scales = TensorView::contiguous(vsg.data(), DType::f32, {1, Hkv, len});
    }
    std::vector<double> dense(n);
    reference_attention(
        TensorView::contiguous(q.data() + b * H * Lq * D, DType::f32, {1, H, Lq, D}),
        TensorView::contiguous(kg.data(), dt, {1, Hkv, len, D}),
        TensorView::contiguous(vg.data(), dt, {1, Hkv, len, Dv}),
        OutputView::contiguous(dense.data(), DType::f64, {1, H, Lq, Dv}), od);
    double smax = 0;
    for (float s : sinks) smax = std::fmax(smax, std::fabs(s));
    const double score_mag = std::sqrt(double(D)) + (o.sinks ? smax : 0) + (o.alibi ? len : 0);
    const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(D));
    const double p_native = native      ? 0x1p-8 + 0x1p-15 * double(D) * scale
                            : native_i8 ? 0x1p-8
                                        : 0.0;
    const double atol =
        vmax *
        (8 * kEps * (std::sqrt(double(len)) + std::sqrt(double(D)) * score_mag) + 1e-6 + p_native);
    for (std::size_t i = 0; i < n; ++i) {
      const double w = want[off + i], d = dense[i], g = out[off + i];
      FUZZ_CHECK(std::fabs(w - d) <= 1e-12 * (1 + std::fabs(d)),
                 "sequence %lld (len %lld, P %lld): paged reference out[%zu] = %.17g, dense "
                 "reference on the gathered keys %.17g",
                 (long long)b, (long long)len, (long long)P, i, w, d);
      FUZZ_CHECK(std::fabs(g - w) <= atol,
                 "sequence %lld (len %lld, P %lld, target %d, %d threads, dtype %d): out[%zu] = "
                 "%.9g, reference %.9g, |diff| %.3g > %.3g",
                 (long long)b, (long long)len, (long long)P, target, threads, static_cast<int>(dt),
                 i, g, w, std::fabs(g - w), atol);
    }
  }
  return 0;
}
