// attention_varlen(): packed variable-length batches. The packed tensors are validated once as one
// [1, H, total, D] problem (shapes, dtypes, strides, overlaps, options), then cut into one problem
// per sequence by offsetting pointers: nothing is copied, and the kernels see ordinary problems.
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/attention.h"
#include "api/call_scope.h"
#include "api/checks.h"
#include "api/context_impl.h"
#include "core/dtypes.h"
#include "core/problem.h"
#include "core/softmax.h"

namespace cpuattn {
namespace detail {
namespace {

// A packed [total, heads, d] tensor as the [1, heads, total, d] view validate() reads.
template <class V>
V as_bhld(const V& t, const char* name) {
  if (t.rank != 3)
    fail(std::string(name) + " has rank " + std::to_string(t.rank) + " " + shape_str(t) +
         "; packed batches take [total, heads, d]");
  V r = t;
  r.rank = 4;
  r.shape = {1, t.shape[1], t.shape[0], t.shape[2]};
  r.strides = {0, t.strides[1], t.strides[0], t.strides[2]};
  return r;
}

// [heads, total] (lse, int8 scales; FlashAttention's lse layout) as the [1, heads, total] view
// validate() reads.
template <class V>
V as_bhl(const V& t, const char* name) {
  if (t.rank != 2)
    fail(std::string(name) + " has rank " + std::to_string(t.rank) + " " + shape_str(t) +
         "; packed batches take [heads, total]");
  V r = t;
  r.rank = 3;
  r.shape = {1, t.shape[0], t.shape[1], 0};
  r.strides = {0, t.strides[0], t.strides[1], 0};
  return r;
}

// The offsets of a cu_seqlens tensor, checked: int32/int64 [B + 1], 0 first, non-decreasing,
// `total` last.
std::vector<std::int64_t> offsets(const TensorView& cu, const char* name, std::int64_t total,
                                  const char* total_name) {
  if (cu.rank != 1 || cu.shape[0] < 2)
    fail(std::string(name) + " has shape " + shape_str(cu) + "; expected [B + 1] with B >= 1");
  if (cu.dtype != DType::i32 && cu.dtype != DType::i64)
    fail(std::string(name) + " " + shape_str(cu) + " has dtype " + dtype_name(cu.dtype) +
         "; expected int32 or int64");
  if (cu.data == nullptr) fail(std::string(name) + " " + shape_str(cu) + ": data is null");
  if (cu.strides[0] < 0) fail(std::string(name) + ": negative stride");
  // The same extent and alignment checks as every other tensor, before anything is read.
  extent_of(name, cu);
  if (reinterpret_cast<std::uintptr_t>(cu.data) % dtype_size(cu.dtype) != 0)
    fail(std::string(name) + " " + shape_str(cu) + ": data is not aligned to its " +
         std::to_string(dtype_size(cu.dtype)) + "-byte " + dtype_name(cu.dtype) + " elements");
  std::vector<std::int64_t> o(static_cast<std::size_t>(cu.shape[0]));
  for (std::size_t i = 0; i < o.size(); ++i) {
    const auto at = static_cast<std::int64_t>(i) * cu.strides[0];
    o[i] = cu.dtype == DType::i32 ? static_cast<const std::int32_t*>(cu.data)[at]
                                  : static_cast<const std::int64_t*>(cu.data)[at];
    if (i == 0 && o[0] != 0)
      fail(std::string(name) + "[0] = " + std::to_string(o[0]) + "; offsets start at 0");
    if (i > 0 && o[i] < o[i - 1])
      fail(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(o[i]) + " < " +
           name + "[" + std::to_string(i - 1) + "] = " + std::to_string(o[i - 1]) +
           "; offsets must be non-decreasing");
  }
  if (o.back() != total)
    fail(std::string(name) + "[" + std::to_string(o.size() - 1) +
         "] = " + std::to_string(o.back()) + " but " + total_name + " = " + std::to_string(total) +
         "; the last offset must be the total");
  return o;
}

}  // namespace

Packed validate_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const OutputView& out, const TensorView& cu_q, const TensorView& cu_k,
                       const AttentionOptions& opts, bool allow_f64, const char* cu_q_name,
                       const char* cu_k_name) {
  if (opts.mask)
    fail("mask is not supported with cu_seqlens (packed batches); use causal or a window");
  if (opts.key_lengths)
    fail(
        "key_lengths is not supported with cu_seqlens (packed batches): the offsets give each "
        "sequence's length");
  if (opts.weights) fail("weights is not supported with cu_seqlens (packed batches)");
  // The packed shapes against each other first, so that a mismatch is reported in the caller's
  // [total, heads, d] terms, not in those of the [1, heads, total, d] views validate() reads.
  const std::string shapes = " (q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v) +
                             ", out " + shape_str(out) + ")";
  for (const auto& [name, t] : {std::pair{"Q", &q}, {"K", &k}, {"V", &v}})
    if (t->rank != 3)
      fail(std::string(name) + " has rank " + std::to_string(t->rank) + " " + shape_str(*t) +
           "; packed batches take [total, heads, d]");
  if (out.rank != 3)
    fail("out has rank " + std::to_string(out.rank) + " " + shape_str(out) +
         "; packed batches take [total_q, H, Dv]");
  if (k.shape[0] != v.shape[0] || k.shape[1] != v.shape[1])
    fail("k and v must have the same total_k and Hkv" + shapes);
  if (k.shape[2] != q.shape[2]) fail("q and k must have the same head dimension D" + shapes);
  if (k.shape[1] < 1 || q.shape[1] % k.shape[1] != 0)
    fail("q's heads H must be a multiple of k's Hkv" + shapes);
  if (out.shape[0] != q.shape[0] || out.shape[1] != q.shape[1] || out.shape[2] != v.shape[2])
    fail("out must be [total_q, H, Dv] = [" + std::to_string(q.shape[0]) + "," +
         std::to_string(q.shape[1]) + "," + std::to_string(v.shape[2]) + "]" + shapes);
  AttentionOptions o = opts;
  // Slopes per sequence ([B, H]) are checked against the number of sequences, not Q's B = 1.
  if (opts.alibi_slopes && opts.alibi_slopes->rank == 2) o.alibi_slopes.reset();
  if (opts.lse) o.lse = as_bhl(*opts.lse, "lse");
  // Scales per token are [Hkv, total_k]; per head ([Hkv]) or tensor ([1]) as they are.
  if (opts.k_scales && opts.k_scales->rank != 1) o.k_scales = as_bhl(*opts.k_scales, "k_scales");
  if (opts.v_scales && opts.v_scales->rank != 1) o.v_scales = as_bhl(*opts.v_scales, "v_scales");
  Problem whole = validate(as_bhld(q, "Q"), as_bhld(k, "K"), as_bhld(v, "V"), as_bhld(out, "out"),
                           o, allow_f64);
  const std::vector<std::int64_t> oq = offsets(cu_q, cu_q_name, whole.Lq, "total_q");
  const std::vector<std::int64_t> ok = offsets(cu_k, cu_k_name, whole.Lk, "total_k");
  if (oq.size() != ok.size())
    fail(std::string(cu_q_name) + " has shape " + shape_str(cu_q) + " but " + cu_k_name +
         " has shape " + shape_str(cu_k) + "; both are [B + 1]");
  if (opts.alibi_slopes && !o.alibi_slopes) {
    check_alibi_slopes(*opts.alibi_slopes, static_cast<std::int64_t>(oq.size()) - 1, whole);
    const Extent es = extent_of("alibi_slopes", *opts.alibi_slopes);
    check_disjoint("out", extent_of("out", out), {{"alibi_slopes", es}});
    if (opts.lse) check_disjoint("lse", extent_of("lse", *opts.lse), {{"alibi_slopes", es}});
  }
  Packed packed;
  for (std::size_t b = 0; b + 1 < oq.size(); ++b) {
    Problem p = whole;
    p.Lq = oq[b + 1] - oq[b];
    p.Lk = ok[b + 1] - ok[b];
    if (p.Lq == 0) continue;
    p.q.data = advance(whole.q.data, whole.q.dtype, oq[b] * whole.q.s[2]);
    p.k.data = advance(whole.k.data, whole.k.dtype, ok[b] * whole.k.s[2]);
    p.v.data = advance(whole.v.data, whole.v.dtype, ok[b] * whole.v.s[2]);
    p.out = advance(whole.out, whole.out_dtype, oq[b] * whole.out_s[2]);
    if (whole.lse != nullptr) p.lse = advance(whole.lse, whole.lse_dtype, oq[b] * whole.lse_s[2]);
    if (whole.k_scale != nullptr) p.k_scale = whole.k_scale + ok[b] * whole.k_scale_s[2];
    if (whole.v_scale != nullptr) p.v_scale = whole.v_scale + ok[b] * whole.v_scale_s[2];
    if (whole.alibi != nullptr) p.alibi = whole.alibi + b * whole.alibi_bs;
    (p.Lk == 0 ? packed.empty : packed.run).push_back(p);
  }
  packed.offsets_q = oq;
  return packed;
}

void run_varlen(const Packed& packed, Context& ctx) {
  for (const Problem& p : packed.empty) write_empty(p);
  run_fast_set(packed.run.data(), packed.run.size(), ctx);
}

// Rows with no key: out 0, lse the sink's (or -inf), as every other row with every key masked.
void write_empty(const Problem& p) {
  for (std::int64_t h = 0; h < p.H; ++h) {
    const RowState st{-std::numeric_limits<float>::infinity(), 0.0f,
                      static_cast<float>(p.sink(h) * kLog2e)};
    for (std::int64_t i = 0; i < p.Lq; ++i) {
      const std::int64_t off = h * p.out_s[1] + i * p.out_s[2];
      for (std::int64_t d = 0; d < p.Dv; ++d) store_float(p.out, p.out_dtype, off + d, 0.0f);
      if (p.lse != nullptr)
        store_float(p.lse, p.lse_dtype, h * p.lse_s[1] + i * p.lse_s[2], st.lse());
    }
  }
}

}  // namespace detail

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const OutputView& out, const TensorView& cu_seqlens_q,
                      const TensorView& cu_seqlens_k, const AttentionOptions& opts,
                      Context* context) {
  detail::CallScope scope("attention_varlen");
  const detail::Packed packed =
      detail::validate_varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, opts, false);
  Context& ctx = context != nullptr ? *context : default_context();
  scope.set_dtypes(q.dtype, k.dtype, out.dtype);
  if (scope.active()) {
    scope.record().shapes = "q:" + detail::dims_of(q) + ";k:" + detail::dims_of(k) +
                            ";v:" + detail::dims_of(v) +
                            ";sequences:" + std::to_string(cu_seqlens_q.shape[0] - 1);
  }
  detail::run_varlen(packed, ctx);
  scope.finish(ctx);
}

void reference_attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                                const OutputView& out, const TensorView& cu_seqlens_q,
                                const TensorView& cu_seqlens_k, const AttentionOptions& opts) {
  const detail::Packed packed =
      detail::validate_varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, opts, true);
  for (const detail::Problem& p : packed.empty) detail::write_empty(p);
  for (const detail::Problem& p : packed.run) detail::run_reference(p);
}

}  // namespace cpuattn
