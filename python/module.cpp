// The Python module `cpuattn`: NumPy arrays in, the library's views over their memory (no
// copies), the computation with the GIL released, cpuattn::Error as ValueError.
//
// Conventions are torch.nn.functional.scaled_dot_product_attention's: q [B, H, Lq, D],
// k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (or rank 3 without B), a bool mask is True where a query
// may attend, a float mask is added to the scaled scores, is_causal=True is top-left aligned.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"

#ifndef CPUATTN_VERSION
#define CPUATTN_VERSION "0.1.0"
#endif

namespace py = pybind11;
using namespace pybind11::literals;
using cpuattn::DType;

namespace {

using namespace cpuattn_py;

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
  if (out_obj.is_none()) {
    std::vector<py::ssize_t> shape = lead;
    shape.push_back(v.shape(rank - 1));
    out = new_array(reference ? DType::f64 : qt, shape);
  } else {
    out = writable(out_obj, "out");
  }
  const DType ot = dtype_of(out, "out", bf16);
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
  if (return_lse) return py::make_tuple(out, lse);
  return out;
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
  const auto ov = make_view<cpuattn::OutputView>(out, dtype_of(out, "out", false), "out");
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
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

// Copies a library view (any strides) into a new C-contiguous array of its dtype.
py::array copy_view(const cpuattn::TensorView& t) {
  std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.begin() + t.rank);
  py::array a = new_array(t.dtype, shape);
  const std::size_t item = cpuattn::dtype_size(t.dtype);
  auto* dst = static_cast<char*>(a.mutable_data());
  const auto* src = static_cast<const char*>(t.data);
  std::array<std::int64_t, cpuattn::kMaxRank> n{1, 1, 1, 1}, s{0, 0, 0, 0};
  const int off = cpuattn::kMaxRank - t.rank;
  for (int d = 0; d < t.rank; ++d) {
    n[off + d] = t.shape[d];
    s[off + d] = t.strides[d];
  }
  for (std::int64_t i0 = 0; i0 < n[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < n[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < n[2]; ++i2) {
        const char* row = src + (i0 * s[0] + i1 * s[1] + i2 * s[2]) * item;
        if (s[3] == 1) {
          std::memcpy(dst, row, n[3] * item);
          dst += n[3] * item;
        } else {
          for (std::int64_t i3 = 0; i3 < n[3]; ++i3, dst += item)
            std::memcpy(dst, row + i3 * s[3] * item, item);
        }
      }
  return a;
}

// A KvCache with a lock: append/decode mutate it with the GIL released, so two Python threads
// using one cache are serialized instead of racing.
struct PyKvCache {
  cpuattn::KvCache cache;
  std::mutex mu;
  explicit PyKvCache(cpuattn::KvCache c) : cache(std::move(c)) {}
};

cpuattn::TensorView input_view(Call& call, const py::handle& obj, const char* name,
                               bool bf16 = false) {
  py::array a = as_array(obj, name);
  call.keep.push_back(a);
  return make_view<cpuattn::TensorView>(a, dtype_of(a, name, bf16), name);
}

std::optional<cpuattn::TensorView> optional_input(Call& call, const py::object& obj,
                                                  const char* name) {
  if (obj.is_none()) return std::nullopt;
  return input_view(call, obj, name);
}

// [B, L, d_model] output of a layer: the caller's array or a new float32 one.
std::pair<py::array, cpuattn::OutputView> layer_out(Call& call, const py::object& out_obj,
                                                    std::vector<py::ssize_t> shape) {
  py::array out = out_obj.is_none() ? new_array(DType::f32, shape) : writable(out_obj, "out");
  call.keep.push_back(out);
  return {out, make_view<cpuattn::OutputView>(out, dtype_of(out, "out", false), "out")};
}

std::vector<py::ssize_t> leading_shape(const py::array& x, py::ssize_t last) {
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  if (!shape.empty()) shape.back() = last;
  return shape;
}

const char* const kAttentionDoc = R"doc(
Fused attention, softmax(scale * q k^T + mask) v, in the conventions of
torch.nn.functional.scaled_dot_product_attention.

q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] (or all rank 3, without B); H must be a
multiple of Hkv (grouped-query attention). Arrays are read in place through their strides (any
strided view, e.g. x.transpose(0, 2, 1, 3) of a [B, L, H, D] array; the last dimension must be
contiguous): float32 or float16, or bfloat16 bit patterns in uint16 with bf16=True.

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

Returns out, or (out, lse). Raises cpuattn.Error (a ValueError) naming the bad argument; out is
then untouched. The GIL is released while computing.
)doc";

}  // namespace

PYBIND11_MODULE(cpuattn, m) {
  m.doc() = "cpuattn: fast, multithreaded CPU attention (NumPy arrays in place, GIL released)";
  m.attr("__version__") = CPUATTN_VERSION;
  py::register_exception<cpuattn::Error>(m, "Error", PyExc_ValueError);

  py::class_<CtxHandle>(
      m, "Context",
      "Threads (0 = the caller's oneTBB arena), SIMD target cap and scratch "
      "memory, reused across calls. May be shared by threads: every method may "
      "run while calls run on it, except trim() and retained_scratch_bytes(), "
      "which wait until none does (and calls that start meanwhile wait for them).")
      .def(py::init<int>(), "threads"_a = 0)
      .def_property_readonly("threads", &cpuattn::Context::num_threads)
      .def_property(
          "max_target",
          [](const CtxHandle& c) { return std::string(cpuattn::target_name(c.max_target())); },
          [](CtxHandle& c, const std::string& t) { c.set_max_target(cpuattn::parse_target(t)); },
          "Cap on the SIMD target: scalar, sse4, avx2, avx512, avx512_bf16 or best")
      .def_property(
          "simd", [](const CtxHandle& c) { return std::string(cpuattn::simd_name(c.simd())); },
          [](CtxHandle& c, const std::string& s) { c.set_simd(cpuattn::parse_simd(s)); },
          "SIMD provider: highway or xsimd")
      .def_property("scratch_limit", &cpuattn::Context::scratch_limit,
                    &cpuattn::Context::set_scratch_limit)
      .def_property_readonly("active_target",
                             [](const CtxHandle& c) {
                               return std::string(cpuattn::target_name(cpuattn::active_target(&c)));
                             })
      .def(
          "trim",
          [](CtxHandle& c) {
            py::gil_scoped_release nogil;
            c.alone([&] { c.trim(); });
          },
          "Frees the scratch memory every thread keeps, once no call runs on this context.")
      .def_property_readonly("retained_scratch_bytes",
                             [](CtxHandle& c) {
                               py::gil_scoped_release nogil;
                               return c.alone([&] { return c.retained_scratch_bytes(); });
                             })
      .def("__repr__", [](const CtxHandle& c) {
        return "cpuattn.Context(threads=" + std::to_string(c.num_threads()) + ", max_target='" +
               cpuattn::target_name(c.max_target()) + "')";
      });
  m.def("release_thread_contexts", &release_thread_contexts,
        "Drops the contexts that threads=N calls cache (one per effective thread count, at most "
        "the cores + 1), with their threads and scratch; calls running on one finish first. "
        "Returns how many were dropped.");

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
      "(out, lse [H, total_q]).",
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

  m.def(
      "active_target",
      [](std::optional<int> threads, CtxHandle* context) {
        return std::string(
            cpuattn::target_name(cpuattn::active_target(pick_context(threads, context))));
      },
      "The SIMD target the fast path runs on (with the default context, threads=N or context).",
      "threads"_a = py::none(), py::kw_only(), "context"_a = static_cast<CtxHandle*>(nullptr));
  m.def(
      "kv_dtypes",
      [] {
        py::list out;
        for (int i = 0; i < cpuattn::kNumDTypes; ++i) {
          const auto d = static_cast<DType>(i);
          if (!cpuattn::is_kv_dtype(d)) continue;
          py::dict e;
          e["name"] = cpuattn::dtype_short_name(d);
          e["bytes"] = cpuattn::dtype_size(d);
          e["scaled"] = cpuattn::needs_scales(d);
          out.append(e);
        }
        return out;
      },
      "The K/V element types of the library's dtype list (cpuattn.h): [{'name', 'bytes', "
      "'scaled'}], the names KvCache and PagedKvCache take as dtype.");
  m.def(
      "supported_targets",
      [] {
        std::vector<std::string> out;
        const std::string s = cpuattn::supported_targets();
        std::size_t start = 0;
        while (start < s.size()) {
          std::size_t end = s.find(',', start);
          if (end == std::string::npos) end = s.size();
          out.push_back(s.substr(start, end - start));
          start = end + 1;
        }
        return out;
      },
      "The targets this CPU and build support, best first.");
  m.def(
      "active_simd",
      [](std::optional<int> threads, CtxHandle* context) {
        return std::string(
            cpuattn::simd_name(cpuattn::active_simd(pick_context(threads, context))));
      },
      "threads"_a = py::none(), py::kw_only(), "context"_a = static_cast<CtxHandle*>(nullptr));

  m.def(
      "to_bf16",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        py::array_t<std::uint16_t> r(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
        const float* s = x.data();
        std::uint16_t* d = r.mutable_data();
        for (py::ssize_t i = 0; i < x.size(); ++i) d[i] = cpuattn::to_bf16(s[i]);
        return r;
      },
      "float32 -> bfloat16 bit patterns (uint16), rounded to nearest even, as the library does.",
      "x"_a);
  m.def(
      "from_bf16",
      [](py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast> x) {
        py::array_t<float> r(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
        const std::uint16_t* s = x.data();
        float* d = r.mutable_data();
        for (py::ssize_t i = 0; i < x.size(); ++i) d[i] = cpuattn::from_bf16(s[i]);
        return r;
      },
      "bfloat16 bit patterns (uint16) -> float32 (exact).", "x"_a);

  py::class_<PyKvCache>(m, "KvCache",
                        "Keys and values of past tokens, [batch, kv_heads, capacity, head_dim], "
                        "stored as any K/V dtype (f32, bf16, f16, int8, ...). A scaled dtype "
                        "(int8) keeps one scale per token, or static scales: k_scale and v_scale "
                        "a float (every head) or one per K/V head.")
      .def(py::init([](std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                       std::optional<std::int64_t> value_dim, std::int64_t capacity, bool growable,
                       const std::string& dtype, const py::object& k_scale,
                       const py::object& v_scale) {
             return std::make_unique<PyKvCache>(cpuattn::KvCache(
                 batch, kv_heads, head_dim, value_dim.value_or(head_dim), capacity, growable,
                 parse_dtype(dtype), {scale_list(k_scale), scale_list(v_scale)}));
           }),
           "batch"_a, "kv_heads"_a, "head_dim"_a, "value_dim"_a = py::none(), py::kw_only(),
           "capacity"_a, "growable"_a = false, "dtype"_a = "f32", "k_scale"_a = py::none(),
           "v_scale"_a = py::none())
      .def_property_readonly("length", [](PyKvCache& c) { return c.cache.length(); })
      .def_property_readonly("capacity", [](PyKvCache& c) { return c.cache.capacity(); })
      .def_property_readonly("batch", [](PyKvCache& c) { return c.cache.batch(); })
      .def_property_readonly("kv_heads", [](PyKvCache& c) { return c.cache.kv_heads(); })
      .def_property_readonly("head_dim", [](PyKvCache& c) { return c.cache.head_dim(); })
      .def_property_readonly("value_dim", [](PyKvCache& c) { return c.cache.value_dim(); })
      .def_property_readonly("growable", [](PyKvCache& c) { return c.cache.growable(); })
      .def_property_readonly(
          "dtype", [](PyKvCache& c) { return std::string(cpuattn::dtype_name(c.cache.dtype())); })
      .def("__len__", [](PyKvCache& c) { return c.cache.length(); })
      .def(
          "append",
          [](PyKvCache& c, const py::handle& k, const py::handle& v) {
            Call call;
            const auto kv = input_view(call, k, "k"), vv = input_view(call, v, "v");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(c.mu);
            c.cache.append(kv, vv);
          },
          "Appends n tokens: k [batch, kv_heads, n, head_dim], v [.., value_dim] (float32/16).",
          "k"_a, "v"_a)
      .def("clear",
           [](PyKvCache& c) {
             py::gil_scoped_release nogil;
             std::lock_guard<std::mutex> lock(c.mu);
             c.cache.clear();
           })
      .def(
          "truncate",
          [](PyKvCache& c, std::int64_t n) {
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(c.mu);
            c.cache.truncate(n);
          },
          "Keeps the first n tokens (rolls back speculative tokens).", "n"_a)
      .def(
          "reserve",
          [](PyKvCache& c, std::int64_t n) {
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(c.mu);
            c.cache.reserve(n);
          },
          "n"_a)
      .def(
          "keys",
          [](PyKvCache& c) {
            std::lock_guard<std::mutex> lock(c.mu);
            return copy_view(c.cache.keys());
          },
          "A copy of the cached keys [batch, kv_heads, length, head_dim] in the stored dtype "
          "(bf16 as uint16).")
      .def(
          "values",
          [](PyKvCache& c) {
            std::lock_guard<std::mutex> lock(c.mu);
            return copy_view(c.cache.values());
          },
          "A copy of the cached values [batch, kv_heads, length, value_dim].")
      .def(
          "key_scales",
          [](PyKvCache& c) -> py::object {
            std::lock_guard<std::mutex> lock(c.mu);
            const auto s = c.cache.key_scales();
            return s ? py::object(copy_view(*s)) : py::object(py::none());
          },
          "A copy of the keys' scales of a scaled dtype (int8): float32 [batch, kv_heads, length] "
          "per token, or [kv_heads] static; None for other dtypes.")
      .def(
          "value_scales",
          [](PyKvCache& c) -> py::object {
            std::lock_guard<std::mutex> lock(c.mu);
            const auto s = c.cache.value_scales();
            return s ? py::object(copy_view(*s)) : py::object(py::none());
          },
          "The values' scales, as key_scales.")
      .def("__repr__", [](PyKvCache& c) {
        return "cpuattn.KvCache(batch=" + std::to_string(c.cache.batch()) +
               ", kv_heads=" + std::to_string(c.cache.kv_heads()) +
               ", head_dim=" + std::to_string(c.cache.head_dim()) +
               ", value_dim=" + std::to_string(c.cache.value_dim()) +
               ", length=" + std::to_string(c.cache.length()) +
               ", capacity=" + std::to_string(c.cache.capacity()) + ", dtype='" +
               cpuattn::dtype_name(c.cache.dtype()) + "')";
      });

  using Mha = cpuattn::MultiHeadAttention;
  py::class_<Mha>(m, "MultiHeadAttention",
                  "Multi-head attention, weights in the x W convention (W [in, out]); the "
                  "weights are copied (packed) at construction.")
      .def(py::init([](std::int64_t d_model, std::int64_t heads, const py::handle& wq,
                       const py::handle& wk, const py::handle& wv, const py::handle& wo,
                       std::int64_t kv_heads, std::int64_t head_dim, std::int64_t value_dim,
                       const py::object& bq, const py::object& bk, const py::object& bv,
                       const py::object& bo, bool bf16) {
             Call call;
             cpuattn::MhaWeights w;
             w.wq = input_view(call, wq, "wq", bf16);
             w.wk = input_view(call, wk, "wk", bf16);
             w.wv = input_view(call, wv, "wv", bf16);
             w.wo = input_view(call, wo, "wo", bf16);
             w.bq = optional_input(call, bq, "bq");
             w.bk = optional_input(call, bk, "bk");
             w.bv = optional_input(call, bv, "bv");
             w.bo = optional_input(call, bo, "bo");
             return std::make_unique<Mha>(
                 cpuattn::MhaConfig{d_model, heads, kv_heads, head_dim, value_dim}, w);
           }),
           "d_model"_a, "heads"_a, "wq"_a, "wk"_a, "wv"_a, "wo"_a, py::kw_only(), "kv_heads"_a = 0,
           "head_dim"_a = 0, "value_dim"_a = 0, "bq"_a = py::none(), "bk"_a = py::none(),
           "bv"_a = py::none(), "bo"_a = py::none(), "bf16"_a = false)
      .def_property_readonly("d_model", [](const Mha& l) { return l.config().d_model; })
      .def_property_readonly("heads", [](const Mha& l) { return l.config().heads; })
      .def_property_readonly("kv_heads", [](const Mha& l) { return l.config().kv_heads; })
      .def_property_readonly("head_dim", [](const Mha& l) { return l.config().head_dim; })
      .def_property_readonly("value_dim", [](const Mha& l) { return l.config().value_dim; })
      .def(
          "forward",
          [](const Mha& l, const py::handle& x, const py::handle& is_causal,
             const py::object& attn_mask, const py::object& key_lengths,
             std::optional<double> scale, const py::object& out, std::optional<int> threads,
             CtxHandle* context) {
            Call call;
            const auto xv = input_view(call, x, "x");
            call.set_masks(attn_mask, key_lengths, scale);
            call.opts.causal = parse_causal(is_causal);
            auto [o, ov] = layer_out(call, out, leading_shape(call.keep[0], l.config().d_model));
            const ContextUse ctx = pick_context(threads, context);
            {
              py::gil_scoped_release nogil;
              l.forward(xv, ov, call.opts, ctx);
            }
            return o;
          },
          "Self-attention: x [B, L, d_model] -> [B, L, d_model] (float32).", "x"_a, py::kw_only(),
          "is_causal"_a = false, "attn_mask"_a = py::none(), "key_lengths"_a = py::none(),
          "scale"_a = py::none(), "out"_a = py::none(), "threads"_a = py::none(),
          "context"_a = static_cast<CtxHandle*>(nullptr))
      .def(
          "forward_cross",
          [](const Mha& l, const py::handle& xq, const py::handle& xkv, const py::object& attn_mask,
             const py::object& key_lengths, std::optional<double> scale, const py::object& out,
             std::optional<int> threads, CtxHandle* context) {
            Call call;
            const auto qv = input_view(call, xq, "xq");
            const auto kv = input_view(call, xkv, "xkv");
            call.set_masks(attn_mask, key_lengths, scale);
            auto [o, ov] = layer_out(call, out, leading_shape(call.keep[0], l.config().d_model));
            const ContextUse ctx = pick_context(threads, context);
            {
              py::gil_scoped_release nogil;
              l.forward_cross(qv, kv, ov, call.opts, ctx);
            }
            return o;
          },
          "Encoder-decoder attention: xq [B, Lq, d_model], xkv [B, Lk, d_model].", "xq"_a, "xkv"_a,
          py::kw_only(), "attn_mask"_a = py::none(), "key_lengths"_a = py::none(),
          "scale"_a = py::none(), "out"_a = py::none(), "threads"_a = py::none(),
          "context"_a = static_cast<CtxHandle*>(nullptr))
      .def(
          "decode",
          [](const Mha& l, const py::handle& x, PyKvCache& cache, const py::object& attn_mask,
             const py::object& key_lengths, std::optional<double> scale, const py::object& out,
             std::optional<int> threads, CtxHandle* context) {
            Call call;
            const auto xv = input_view(call, x, "x");
            call.set_masks(attn_mask, key_lengths, scale);
            auto [o, ov] = layer_out(call, out, leading_shape(call.keep[0], l.config().d_model));
            const ContextUse ctx = pick_context(threads, context);
            {
              py::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(cache.mu);
              l.decode(xv, cache.cache, ov, call.opts, ctx);
            }
            return o;
          },
          "One decoding step: appends the K/V of x [B, n, d_model] to cache, attends the n new "
          "queries to every cached token (bottom-right causal); returns [B, n, d_model].",
          "x"_a, "cache"_a, py::kw_only(), "attn_mask"_a = py::none(), "key_lengths"_a = py::none(),
          "scale"_a = py::none(), "out"_a = py::none(), "threads"_a = py::none(),
          "context"_a = static_cast<CtxHandle*>(nullptr))
      .def(
          "make_cache",
          [](const Mha& l, std::int64_t batch, std::int64_t capacity, bool growable,
             const std::string& dtype) {
            return std::make_unique<PyKvCache>(
                l.make_cache(batch, capacity, growable, parse_dtype(dtype)));
          },
          "A KvCache shaped for this layer.", "batch"_a, "capacity"_a, "growable"_a = false,
          "dtype"_a = "f32");

  cpuattn_py::bind_paged(m);
}
