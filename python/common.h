// Helpers shared by the Python module's units (module.cpp, paged.cpp): NumPy arrays as the
// library's views (no copies), argument parsing, cached contexts, and one call's kept arrays.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"

namespace cpuattn_py {

namespace py = pybind11;
using cpuattn::DType;

[[noreturn]] inline void fail(const std::string& msg) { throw cpuattn::Error("cpuattn: " + msg); }

// Any object NumPy can view (a NumPy array, a CPU torch tensor, ...) as an array, without a
// copy where NumPy can avoid one.
inline py::array as_array(const py::handle& obj, const char* name) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  try {
    return py::module_::import("numpy").attr("asarray")(obj).cast<py::array>();
  } catch (py::error_already_set& e) {
    fail(std::string(name) + " is not an array (" + std::string(py::str(obj.get_type())) +
         "): " + e.what());
  }
}

inline std::string numpy_dtype_name(const py::array& a) {
  return py::str(a.dtype()).cast<std::string>();
}

// The library dtype of a NumPy array. uint16/int16 hold bfloat16 bit patterns when `bf16`.
inline DType dtype_of(const py::array& a, const char* name, bool bf16) {
  const py::dtype dt = a.dtype();
  if (dt.byteorder() == '>') fail(std::string(name) + " is big-endian; use a native-order array");
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'b' && size == 1) return DType::boolean;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'i' && size == 1) return DType::i8;
  if ((kind == 'u' || kind == 'i') && size == 2) {
    if (bf16) return DType::bf16;
    fail(std::string(name) + " has dtype " + numpy_dtype_name(a) +
         "; pass bf16=True to read 16-bit integers as bfloat16 bit patterns");
  }
  fail(std::string(name) + " has unsupported dtype " + numpy_dtype_name(a));
}

inline std::string shape_str(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ",";
    s += std::to_string(a.shape(i));
  }
  return s + "]";
}

// A view of the array's memory: shape as is, strides converted from bytes to elements.
// `lead1` prepends a dimension of size 1 (rank-3 [H, L, D] inputs as [1, H, L, D]).
template <class View>
View make_view(const py::array& a, DType dtype, const char* name, bool lead1 = false) {
  const int nd = static_cast<int>(a.ndim()) + (lead1 ? 1 : 0);
  if (a.ndim() < 1 || nd > cpuattn::kMaxRank)
    fail(std::string(name) + " has rank " + std::to_string(a.ndim()) + " " + shape_str(a) +
         "; expected rank 1 to " + std::to_string(cpuattn::kMaxRank - (lead1 ? 1 : 0)));
  const auto item = static_cast<py::ssize_t>(cpuattn::dtype_size(dtype));
  View v;
  v.data = const_cast<void*>(a.data());
  v.dtype = dtype;
  v.rank = nd;
  int d = 0;
  if (lead1) {
    v.shape[0] = 1;
    v.strides[0] = 0;
    d = 1;
  }
  for (py::ssize_t i = 0; i < a.ndim(); ++i, ++d) {
    const py::ssize_t s = a.strides(i);
    if (s % item != 0)
      fail(std::string(name) + " has a stride of " + std::to_string(s) + " bytes in dimension " +
           std::to_string(i) + ", not a multiple of its " + std::to_string(item) +
           "-byte elements " + shape_str(a));
    v.shape[d] = a.shape(i);
    v.strides[d] = a.shape(i) == 1 ? 0 : s / item;
  }
  if (lead1 && nd > 1) v.strides[0] = v.shape[1] * v.strides[1];
  return v;
}

// A writable output array: checks writability and dtype.
inline py::array writable(const py::handle& obj, const char* name) {
  py::array a = as_array(obj, name);
  if (!a.writeable()) fail(std::string(name) + " is read-only");
  return a;
}

inline py::array new_array(DType dtype, const std::vector<py::ssize_t>& shape) {
  switch (dtype) {
    case DType::f32:
      return py::array_t<float>(shape);
    case DType::f64:
      return py::array_t<double>(shape);
    case DType::f16:
      return py::array(py::dtype("float16"), shape);
    case DType::bf16:
      return py::array_t<std::uint16_t>(shape);
    case DType::i8:
      return py::array_t<std::int8_t>(shape);
    default:
      fail("internal: no array for dtype");
  }
}

// Cached contexts, one per thread count, so repeated calls with threads=N reuse arenas and scratch.
inline cpuattn::Context* context_for_threads(int n) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<cpuattn::Context>> contexts;
  if (n < 0) fail("threads must be >= 0 (got " + std::to_string(n) + ")");
  std::lock_guard<std::mutex> lock(mu);
  auto& c = contexts[n];
  if (!c) c = std::make_unique<cpuattn::Context>(n);
  return c.get();
}

inline cpuattn::Context* pick_context(const std::optional<int>& threads,
                                      cpuattn::Context* context) {
  if (threads && context) fail("pass threads or context, not both");
  if (context) return context;
  if (threads) return context_for_threads(*threads);
  return nullptr;  // the library's default context
}

inline cpuattn::Causal parse_causal(const py::handle& is_causal) {
  if (py::isinstance<py::str>(is_causal)) {
    const auto s = is_causal.cast<std::string>();
    if (s == "top_left") return cpuattn::Causal::top_left;
    if (s == "bottom_right") return cpuattn::Causal::bottom_right;
    if (s == "none") return cpuattn::Causal::none;
    fail("is_causal must be a bool, \"top_left\", \"bottom_right\" or \"none\" (got \"" + s +
         "\")");
  }
  return is_causal.cast<bool>() ? cpuattn::Causal::top_left : cpuattn::Causal::none;
}

inline DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16") return DType::f16;
  if (s == "i8" || s == "int8") return DType::i8;
  fail("dtype must be \"f32\", \"bf16\", \"f16\" or \"i8\" (got \"" + s + "\")");
}

// The arrays of one call (held, so their memory lives while the GIL is released) and the
// options that point into them.
struct Call {
  std::vector<py::array> keep;
  cpuattn::AttentionOptions opts;

  // Masks and key lengths, common to attention, reference_attention and the layers.
  void set_masks(const py::object& attn_mask, const py::object& key_lengths,
                 const std::optional<double>& scale) {
    opts.scale = scale;
    if (!attn_mask.is_none()) {
      py::array m = as_array(attn_mask, "attn_mask");
      const DType dt = dtype_of(m, "attn_mask", false);
      if (dt != DType::boolean && dt != DType::f32)
        fail("attn_mask has dtype " + numpy_dtype_name(m) +
             "; expected bool (True = may attend) or float32 (added to the scores)");
      keep.push_back(m);
      opts.mask = make_view<cpuattn::TensorView>(m, dt, "attn_mask");
    }
    if (!key_lengths.is_none()) {
      py::array l = as_array(key_lengths, "key_lengths");
      DType dt = dtype_of(l, "key_lengths", false);
      if (dt != DType::i32 && dt != DType::i64) {
        if (l.dtype().kind() != 'i' && l.dtype().kind() != 'u')
          fail("key_lengths has dtype " + numpy_dtype_name(l) + "; expected integers");
        l = py::array_t<std::int64_t, py::array::forcecast>(l);
        dt = DType::i64;
      }
      keep.push_back(l);
      opts.key_lengths = make_view<cpuattn::TensorView>(l, dt, "key_lengths");
    }
  }
};

// The variants of AttentionOptions, as attention()'s keyword arguments (FlashAttention's names
// where it has them).
struct VariantArgs {
  py::object window_size, alibi_slopes, sinks;
  double softcap = 0;
  bool alibi = false;

  void apply(Call& call) const {
    if (!window_size.is_none()) {
      const auto w = window_size.cast<std::vector<std::int64_t>>();
      if (w.size() != 2)
        fail("window_size must be (left, right), got " + std::to_string(w.size()) + " values");
      call.opts.window_left = w[0];
      call.opts.window_right = w[1];
    }
    call.opts.softcap = softcap;
    call.opts.alibi = alibi;
    const auto per_head = [&](const py::object& obj, const char* name) {
      py::array a = as_array(obj, name);
      if (a.dtype().kind() != 'f')
        fail(std::string(name) + " has dtype " + numpy_dtype_name(a) + "; expected floats");
      a = py::array_t<float, py::array::c_style | py::array::forcecast>(a);
      call.keep.push_back(a);
      return make_view<cpuattn::TensorView>(a, DType::f32, name);
    };
    if (!alibi_slopes.is_none()) call.opts.alibi_slopes = per_head(alibi_slopes, "alibi_slopes");
    if (!sinks.is_none()) call.opts.sinks = per_head(sinks, "sinks");
  }
};

// python/paged.cpp: PagedKvCache, attention_paged, reference_attention_paged.
void bind_paged(py::module_& m);

}  // namespace cpuattn_py
