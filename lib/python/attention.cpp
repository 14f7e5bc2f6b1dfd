// attention(), reference_attention(), attention_varlen() and reference_attention_varlen().
//
// Conventions are torch.nn.functional.scaled_dot_product_attention's: q [B, H, Lq, D],
// k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (or rank 3 without B), a bool mask is True where a query
// may attend, a float mask is added to the scaled scores, is_causal=True is top-left aligned.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "common.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn_py {
namespace {

using namespace pybind11::literals;

// attention() and reference_attention(): the same argument handling.
py::object run_attention(bool reference, const py::handle& q_obj, const py::handle& k_obj,
                         const py::handle& v_obj, const py::object& attn_mask,
                         const py::handle& is_causal, const std::optional<double>& scale,
                         const py::object& key_lengths, bool return_lse, const py::object& out_obj,
                         bool bf16, const VariantArgs& variants, cpuattn::Context* ctx) {
  Call call;
  py::array q = as_array(q_obj, "q"), k = as_array(k_obj, "k"), v = as_array(v_obj, "v");
  call.keep = {q, k, v};
  const auto rank = q.ndim();
  if (rank != 3 && rank != 4)
    fail("q has rank " + std::to_string(rank) + " " + shape_str(q) +
         "; expected [B, H, Lq, D] or [H, Lq, D]");
  if (k.ndim() != rank || v.ndim() != rank)
    fail("q, k and v must have the same rank (q " + shape_str(q) + ", k " + shape_str(k) + ", v " +
         shape_str(v) + ")");
  const bool lead1 = rank == 3;
  const DType qt = dtype_of(q, "q", bf16), kt = dtype_of(k, "k", bf16), vt = dtype_of(v, "v", bf16);
  auto check_input = [&](DType dt, const py::array& a, const char* name) {
    const bool ok =
        reference ? (dt == DType::f32 || dt == DType::f64 || dt == DType::f16 || dt == DType::bf16)
                  : (dt == DType::f32 || dt == DType::f16 || dt == DType::bf16);
    if (!ok)
      fail(std::string(name) + " has dtype " + numpy_dtype_name(a) +
           (reference ? "; expected float32, float64, float16 or bfloat16 (bf16=True)"
                      : "; expected float32, float16 or bfloat16 (bf16=True); "
                        "reference_attention() takes float64"));
  };
  check_input(qt, q, "q");
  check_input(kt, k, "k");
  check_input(vt, v, "v");
  const auto qv = make_view<cpuattn::TensorView>(q, qt, "q", lead1);
  const auto kv = make_view<cpuattn::TensorView>(k, kt, "k", lead1);
  const auto vv = make_view<cpuattn::TensorView>(v, vt, "v", lead1);
  call.set_masks(attn_mask, key_lengths, scale);
  call.opts.causal = parse_causal(is_causal);
  variants.apply(call);

  // out: the caller's array, written in place, or a new one ([.., Lq, Dv], q's dtype; float64
  // for the reference).
  std::vector<py::ssize_t> lead(q.shape(), q.shape() + rank - 1);  // [B,] H, Lq
  py::array out;
  DType ot;
  if (out_obj.is_none()) {
    std::vector<py::ssize_t> shape = lead;
    shape.push_back(v.shape(rank - 1));
    ot = reference ? DType::f64 : qt;
    out = new_array(ot, shape);
  } else {
    out = writable(out_obj, "out");
    ot = dtype_of(out, "out", bf16);
  }
  const bool out_ok = reference ? (ot == DType::f32 || ot == DType::f64)
                                : (ot == DType::f32 || ot == DType::f16 || ot == DType::bf16);
  if (!out_ok)
    fail("out has dtype " + numpy_dtype_name(out) +
         (reference ? "; expected float32 or float64" : "; expected float32, float16 or bfloat16"));
  call.keep.push_back(out);
  const auto ov = make_view<cpuattn::OutputView>(out, ot, "out", lead1);
  py::array lse;
  if (return_lse) {
    lse = new_array(DType::f32, lead);
    call.keep.push_back(lse);
    call.opts.lse = make_view<cpuattn::OutputView>(lse, DType::f32, "lse", lead1);
  }
  {
    py::gil_scoped_release nogil;
    if (reference)
      cpuattn::reference_attention(qv, kv, vv, ov, call.opts);
    else
      cpuattn::attention(qv, kv, vv, ov, call.opts, ctx);
  }
  return returned(out_obj, out, ot, return_lse ? &lse : nullptr, q_obj);
}

// attention_varlen() and reference_attention_varlen(): packed [total, heads, d] arrays.
py::object run_varlen(bool reference, const py::handle& q_obj, const py::handle& k_obj,
                      const py::handle& v_obj, const py::handle& cu_q_obj,
                      const py::handle& cu_k_obj, const py::handle& is_causal,
                      const std::optional<double>& scale, bool return_lse,
                      const py::object& out_obj, const VariantArgs& variants,
                      cpuattn::Context* ctx) {
  Call call;
  py::array q = as_array(q_obj, "q"), k = as_array(k_obj, "k"), v = as_array(v_obj, "v");
  call.keep = {q, k, v};
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3)
    fail("packed q, k and v are [total, heads, d] (rank 3); got q " + shape_str(q) + ", k " +
         shape_str(k) + ", v " + shape_str(v));
  const DType qt = dtype_of(q, "q", false), kt = dtype_of(k, "k", false),
              vt = dtype_of(v, "v", false);
  const auto offsets = [&](const py::handle& obj, const char* name) {
    const py::array a = int64_array(obj, name);
    call.keep.push_back(a);
    return make_view<cpuattn::TensorView>(a, DType::i64, name);
  };
  const auto cq = offsets(cu_q_obj, "cu_seqlens_q"), ck = offsets(cu_k_obj, "cu_seqlens_k");
  call.opts.scale = scale;
  call.opts.causal = parse_causal(is_causal);
  variants.apply(call);
  py::array out = out_obj.is_none()
                      ? new_array(reference ? DType::f64 : qt, {q.shape(0), q.shape(1), v.shape(2)})
                      : writable(out_obj, "out");
  call.keep.push_back(out);
  const DType ot = out_obj.is_none() ? (reference ? DType::f64 : qt) : dtype_of(out, "out", false);
  const auto ov = make_view<cpuattn::OutputView>(out, ot, "out");
  py::array lse;
  if (return_lse) {
    lse = new_array(DType::f32, {q.shape(1), q.shape(0)});  // [H, total_q]
    call.keep.push_back(lse);
    call.opts.lse = make_view<cpuattn::OutputView>(lse, DType::f32, "lse");
  }
  const auto qv = make_view<cpuattn::TensorView>(q, qt, "q");
  const auto kv = make_view<cpuattn::TensorView>(k, kt, "k");
  const auto vv = make_view<cpuattn::TensorView>(v, vt, "v");
  {
    py::gil_scoped_release nogil;
    if (reference)
      cpuattn::reference_attention_varlen(qv, kv, vv, ov, cq, ck, call.opts);
    else
      cpuattn::attention_varlen(qv, kv, vv, ov, cq, ck, call.opts, ctx);
  }
  return returned(out_obj, out, ot, return_lse ? &lse : nullptr, q_obj);
}

const char* const kAttentionDoc = R"doc(
Fused attention, softmax(scale * q k^T + mask) v, in the conventions of
torch.nn.functional.scaled_dot_product_attention.

q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (or all rank 3, without B); H must be a
multiple of Hkv (grouped-query attention). Arrays are read in place through their strides (any
strided view, e.g. x.transpose(0, 2, 1, 3) of a [B, L, H, D] array; the last dimension must be
contiguous): float32 or float16, or bfloat16 bit patterns in uint16 with bf16=True. torch tensors
and other DLPack tensors on the CPU are read the same way, bfloat16 included (no bf16=True).

attn_mask: bool (True = may attend) or float32 (added to the scaled scores), broadcastable to
  [B, H, Lq, Lk].
is_causal: True (top-left: query i sees keys j <= i, as torch), "bottom_right" (query i sees
  keys j <= i + Lk - Lq) or False.
scale: default 1/sqrt(D).
key_lengths: integers [B]; keys at positions >= key_lengths[b] are masked.
window_size: (left, right): query i (at position p = i + Lk - Lq) attends key j only if
  p - left <= j <= p + right; -1 = unbounded on that side (FlashAttention's convention).
softcap: C > 0 soft-caps the scaled scores, s <- C tanh(s / C); 0 = off.
alibi: True adds the standard ALiBi bias -slope_h |p - j| (after soft-capping); alibi_slopes:
  floats [H], or [B, H] per sequence (FlashAttention's), give the slopes.
sinks: floats [H], one logit per head added to the softmax denominator only (-inf: none).
return_lse: also return the float32 logsumexp [B, H, Lq].
out: a writable float32 / float16 (/ bf16) array [B, H, Lq, Dv], written in place and returned;
  default a new array of q's dtype.
threads: None = the default context (the caller's oneTBB arena); N = a cached context of N threads.
context: a cpuattn.Context (instead of threads).

Returns out, or (out, lse): out= as passed; a new array of q's type (a torch tensor sharing its
memory when q is a torch.Tensor, else NumPy, whatever k and v are). Raises cpuattn.Error (a ValueError) naming the bad argument; out is
then untouched. The GIL is released while computing.
)doc";

}  // namespace

void bind_attention(py::module_& m) {
  m.def(
      "attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::object& attn_mask,
         const py::handle& is_causal, std::optional<double> scale, const py::object& key_lengths,
         bool return_lse, const py::object& out, std::optional<int> threads, CtxHandle* context,
         bool bf16, const py::object& window_size, double softcap, bool alibi,
         const py::object& alibi_slopes, const py::object& sinks) {
        const VariantArgs va{window_size, alibi_slopes, sinks, softcap, alibi};
        return run_attention(false, q, k, v, attn_mask, is_causal, scale, key_lengths, return_lse,
                             out, bf16, va, pick_context(threads, context));
      },
      kAttentionDoc, "q"_a, "k"_a, "v"_a, py::kw_only(), "attn_mask"_a = py::none(),
      "is_causal"_a = false, "scale"_a = py::none(), "key_lengths"_a = py::none(),
      "return_lse"_a = false, "out"_a = py::none(), "threads"_a = py::none(),
      "context"_a = static_cast<CtxHandle*>(nullptr), "bf16"_a = false,
      "window_size"_a = py::none(), "softcap"_a = 0.0, "alibi"_a = false,
      "alibi_slopes"_a = py::none(), "sinks"_a = py::none());

  m.def(
      "reference_attention",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::object& attn_mask,
         const py::handle& is_causal, std::optional<double> scale, const py::object& key_lengths,
         bool return_lse, const py::object& out, bool bf16, const py::object& window_size,
         double softcap, bool alibi, const py::object& alibi_slopes, const py::object& sinks) {
        const VariantArgs va{window_size, alibi_slopes, sinks, softcap, alibi};
        return run_attention(true, q, k, v, attn_mask, is_causal, scale, key_lengths, return_lse,
                             out, bf16, va, nullptr);
      },
      "The double-precision oracle, with attention()'s arguments (no threads/context). Inputs may "
      "also be float64; out is float64 by default (or a float32/float64 out=).",
      "q"_a, "k"_a, "v"_a, py::kw_only(), "attn_mask"_a = py::none(), "is_causal"_a = false,
      "scale"_a = py::none(), "key_lengths"_a = py::none(), "return_lse"_a = false,
      "out"_a = py::none(), "bf16"_a = false, "window_size"_a = py::none(), "softcap"_a = 0.0,
      "alibi"_a = false, "alibi_slopes"_a = py::none(), "sinks"_a = py::none());

  m.def(
      "attention_varlen",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& cu_q,
         const py::handle& cu_k, const py::handle& is_causal, std::optional<double> scale,
         bool return_lse, const py::object& out, std::optional<int> threads, CtxHandle* context,
         const py::object& window_size, double softcap, bool alibi, const py::object& alibi_slopes,
         const py::object& sinks) {
        const VariantArgs va{window_size, alibi_slopes, sinks, softcap, alibi};
        return run_varlen(false, q, k, v, cu_q, cu_k, is_causal, scale, return_lse, out, va,
                          pick_context(threads, context));
      },
      "Packed variable-length batches (FlashAttention's varlen): q [total_q, H, D], k "
      "[total_k, Hkv, D], v [total_k, Hkv, Dv], cu_seqlens_q / cu_seqlens_k integer offsets "
      "[B + 1]; each sequence attends to its own keys; every keyword of attention() but "
      "attn_mask and key_lengths applies per sequence. Returns out [total_q, H, Dv], or "
      "(out, lse [H, total_q]), of q's type as attention() (a torch tensor for a torch q).",
      "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, py::kw_only(), "is_causal"_a = false,
      "scale"_a = py::none(), "return_lse"_a = false, "out"_a = py::none(),
      "threads"_a = py::none(), "context"_a = static_cast<CtxHandle*>(nullptr),
      "window_size"_a = py::none(), "softcap"_a = 0.0, "alibi"_a = false,
      "alibi_slopes"_a = py::none(), "sinks"_a = py::none());

  m.def(
      "reference_attention_varlen",
      [](const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& cu_q,
         const py::handle& cu_k, const py::handle& is_causal, std::optional<double> scale,
         bool return_lse, const py::object& out, const py::object& window_size, double softcap,
         bool alibi, const py::object& alibi_slopes, const py::object& sinks) {
        const VariantArgs va{window_size, alibi_slopes, sinks, softcap, alibi};
        return run_varlen(true, q, k, v, cu_q, cu_k, is_causal, scale, return_lse, out, va,
                          nullptr);
      },
      "The double-precision oracle of attention_varlen (float64 out by default).", "q"_a, "k"_a,
      "v"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, py::kw_only(), "is_causal"_a = false,
      "scale"_a = py::none(), "return_lse"_a = false, "out"_a = py::none(),
      "window_size"_a = py::none(), "softcap"_a = 0.0, "alibi"_a = false,
      "alibi_slopes"_a = py::none(), "sinks"_a = py::none());
}

}  // namespace cpuattn_py
