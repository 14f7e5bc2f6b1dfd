// Helpers shared by the Python module's units (bindings.h): NumPy arrays as the library's views
// (no copies), argument parsing, cached contexts, one call's kept arrays, and the locked KvCache.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"
#include "dlpack.h"

namespace cpuattn_py {

namespace py = pybind11;
using cpuattn::DType;

[[noreturn]] inline void fail(const std::string& msg) { throw cpuattn::Error("cpuattn: " + msg); }

// Any array-like object as a NumPy array: a NumPy array as is, a DLPack tensor (torch, JAX, ...)
// as a view of its memory (dlpack_view), anything else NumPy can read through numpy.asarray,
// without a copy where NumPy can avoid one.
inline py::array as_array(const py::handle& obj, const char* name) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (std::optional<py::array> v = dlpack_view(obj, name)) return *std::move(v);
  try {
    return py::module_::import("numpy").attr("asarray")(obj).cast<py::array>();
  } catch (py::error_already_set& e) {
    fail(std::string(name) + " is not an array (" + std::string(py::str(obj.get_type())) +
         "): " + e.what());
  }
}

inline std::string numpy_dtype_name(const py::array& a) {
  return is_bf16_view(a) ? "bfloat16" : py::str(a.dtype()).cast<std::string>();
}

// The library dtype of an array: a bfloat16 tensor's view is bf16; uint16/int16 hold bfloat16 bit
// patterns when `bf16`.
inline DType dtype_of(const py::array& a, const char* name, bool bf16) {
  if (is_bf16_view(a)) return DType::bf16;
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

// A writable output array over obj's own memory. An object NumPy could only copy (a list) is
// an error: the results would go to the copy.
inline py::array writable(const py::handle& obj, const char* name) {
  py::array a = as_array(obj, name);
  if (!a.writeable()) fail(std::string(name) + " is read-only");
  if (!py::isinstance<py::array>(obj) && a.owndata())
    fail(std::string(name) + " is a " + std::string(py::str(obj.get_type())) +
         ", which cannot be written in place; pass an array or a tensor");
  return a;
}

// What a call returns for one output: the caller's out, written in place, when given; else the
// new array `made` (of `dtype`) as the type of `like` (a torch tensor when like is one).
inline py::object returned(const py::object& out_obj, const py::array& made, DType dtype,
                           const py::handle& like) {
  if (!out_obj.is_none()) return out_obj;
  return as_type_of(made, dtype, like);
}

// returned(), and with an `lse` (float32; return_lse) the tuple (out, lse), lse as the type of
// `like` too.
inline py::object returned(const py::object& out_obj, const py::array& made, DType dtype,
                           const py::array* lse, const py::handle& like) {
  py::object out = returned(out_obj, made, dtype, like);
  if (lse == nullptr) return out;
  return py::make_tuple(out, as_type_of(*lse, DType::f32, like));
}

// The NumPy dtype holding a library dtype: its own where NumPy has it, else its bit patterns
// (bf16 as uint16, 8-bit floats as uint8).
inline py::dtype numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return py::dtype::of<float>();
    case DType::f64:
      return py::dtype::of<double>();
    case DType::f16:
      return py::dtype("float16");
    case DType::i8:
      return py::dtype::of<std::int8_t>();
    case DType::i32:
      return py::dtype::of<std::int32_t>();
    case DType::i64:
      return py::dtype::of<std::int64_t>();
    case DType::boolean:
      return py::dtype::of<bool>();
    default:
      return cpuattn::dtype_size(dtype) == 1 ? py::dtype::of<std::uint8_t>()
                                             : py::dtype::of<std::uint16_t>();
  }
}

inline py::array new_array(DType dtype, const std::vector<py::ssize_t>& shape) {
  return py::array(numpy_dtype(dtype), shape);
}

// Any integer array (int8 .. int64, uint8 .. uint64) as a C-contiguous int64 one: the library's
// index type. Non-integers are an error naming `name`; uint64 values past INT64_MAX are rejected
// rather than wrapped to negatives.
inline py::array int64_array(const py::handle& obj, const char* name) {
  py::array a = as_array(obj, name);
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u')
    fail(std::string(name) + " has dtype " + numpy_dtype_name(a) + "; expected integers");
  if (kind == 'u' && a.dtype().itemsize() == 8) {
    const py::array_t<std::uint64_t, py::array::forcecast> u(a);
    for (py::ssize_t i = 0; i < u.size(); ++i)
      if (u.data()[i] > static_cast<std::uint64_t>(INT64_MAX))
        fail(std::string(name) + " holds " + std::to_string(u.data()[i]) + ", past int64");
  }
  return py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>(a);
}

// An int64 from a Python integer (operator.index: no floats, no strings), naming the argument.
inline std::int64_t int64_of(const py::handle& obj, const std::string& name) {
  if (!PyIndex_Check(obj.ptr()))
    fail(name + " must be an integer, got " + std::string(py::repr(obj)));
  int overflow = 0;
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) fail(name + " = " + std::string(py::repr(obj)) + " is outside int64");
  return v;
}

// A cpuattn.Context, and the calls running on it. The library's contract is that trim() and
// retained_scratch_bytes() do not overlap calls on the same context (trim frees the scratch the
// calls use); Python code cannot be trusted to keep it, so here they wait: trim() until no call
// runs, and a call that starts meanwhile until trim() is done. Every other method may overlap.
struct CtxHandle : cpuattn::Context {
  explicit CtxHandle(int threads) : cpuattn::Context(threads) {}
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  bool exclusive = false;  // trim() or retained_scratch_bytes() runs
  // Runs f() with no call on this context (call with the GIL released).
  template <class F>
  auto alone(F&& f) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return calls == 0 && !exclusive; });
    exclusive = true;
    lock.unlock();
    struct Done {
      CtxHandle& c;
      ~Done() {
        {
          std::lock_guard<std::mutex> l(c.mu);
          c.exclusive = false;
        }
        c.cv.notify_all();
      }
    } done{*this};
    return f();
  }
};

// The context of one call, held for as long as the call runs (it converts to the library's
// Context*; nullptr is the default context): counts the call on a CtxHandle, and keeps a cached
// threads=N context alive even if release_thread_contexts() drops it meanwhile.
class ContextUse {
 public:
  ContextUse(CtxHandle* py, std::shared_ptr<cpuattn::Context> cached)
      : py_(py), cached_(std::move(cached)), ctx_(py ? py : cached_.get()) {
    if (py_ == nullptr) return;
    py::gil_scoped_release nogil;  // trim() may be waiting for this thread's other calls
    std::unique_lock<std::mutex> lock(py_->mu);
    py_->cv.wait(lock, [&] { return !py_->exclusive; });
    ++py_->calls;
  }
  ~ContextUse() {
    if (py_ == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(py_->mu);
      --py_->calls;
    }
    py_->cv.notify_all();
  }
  ContextUse(const ContextUse&) = delete;
  ContextUse& operator=(const ContextUse&) = delete;
  operator cpuattn::Context*() const { return ctx_; }

 private:
  CtxHandle* py_;
  std::shared_ptr<cpuattn::Context> cached_;
  cpuattn::Context* ctx_;
};

// Cached contexts for threads=N, one per effective thread count (Context(N) runs on at most the
// cores oneTBB has, so larger N share one): at most cores + 1 of them, until
// release_thread_contexts() drops them.
inline std::map<int, std::shared_ptr<cpuattn::Context>>& thread_contexts(std::mutex*& mu) {
  static std::mutex m;
  static std::map<int, std::shared_ptr<cpuattn::Context>> contexts;
  mu = &m;
  return contexts;
}

inline std::shared_ptr<cpuattn::Context> context_for_threads(std::int64_t n) {
  if (n < 0) fail("threads must be >= 0 (got " + std::to_string(n) + ")");
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int key = static_cast<int>(std::min<std::int64_t>(n, cores));
  std::mutex* mu = nullptr;
  auto& contexts = thread_contexts(mu);
  std::lock_guard<std::mutex> lock(*mu);
  auto& c = contexts[key];
  if (!c) c = std::make_shared<cpuattn::Context>(key);
  return c;
}

// Drops the cached threads=N contexts (their threads and scratch); calls running on one finish
// first. Returns how many were dropped.
inline std::size_t release_thread_contexts() {
  std::mutex* mu = nullptr;
  auto& contexts = thread_contexts(mu);
  std::map<int, std::shared_ptr<cpuattn::Context>> dropped;
  {
    std::lock_guard<std::mutex> lock(*mu);
    dropped.swap(contexts);
  }
  return dropped.size();
}

inline ContextUse pick_context(const std::optional<std::int64_t>& threads, CtxHandle* context) {
  if (threads && context) fail("pass threads or context, not both");
  if (threads) return ContextUse(nullptr, context_for_threads(*threads));
  return ContextUse(context, nullptr);  // context, or the library's default one
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

// A cache dtype by name: any K/V dtype of cpuattn.h's list, by its short or long name ("int8",
// "float32") or its enumerator ("i8").
inline DType parse_dtype(const std::string& s) {
  DType d;
  if (cpuattn::parse_dtype(s, d) && cpuattn::is_kv_dtype(d)) return d;
  std::string names;
  for (int i = 0; i < cpuattn::kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    if (!cpuattn::is_kv_dtype(t)) continue;
    names += std::string(names.empty() ? "\"" : ", \"") + cpuattn::dtype_short_name(t) + "\"";
  }
  fail("dtype must be one of " + names + " (got \"" + s + "\")");
}

// Static cache scales (cpuattn::KvScales) from Python: None (per-token scales), a float (one for
// every head) or a sequence of one per K/V head.
inline std::vector<float> scale_list(const py::object& x) {
  if (x.is_none()) return {};
  if (py::isinstance<py::float_>(x) || py::isinstance<py::int_>(x)) return {x.cast<float>()};
  return x.cast<std::vector<float>>();
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
      const py::array l = int64_array(key_lengths, "key_lengths");
      keep.push_back(l);
      opts.key_lengths = make_view<cpuattn::TensorView>(l, DType::i64, "key_lengths");
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
      if (!py::isinstance<py::sequence>(window_size) || py::isinstance<py::str>(window_size) ||
          py::len(window_size) != 2)
        fail("window_size must be (left, right), got " + std::string(py::repr(window_size)));
      const py::sequence seq = window_size;
      const std::int64_t w[2] = {int64_of(seq[0], "window_size[0]"),
                                 int64_of(seq[1], "window_size[1]")};
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

// An input array held by `call`, viewed in its own dtype (uint16/int16 as bfloat16 when `bf16`).
inline cpuattn::TensorView input_view(Call& call, const py::handle& obj, const char* name,
                                      bool bf16 = false) {
  py::array a = as_array(obj, name);
  call.keep.push_back(a);
  return make_view<cpuattn::TensorView>(a, dtype_of(a, name, bf16), name);
}

// A KvCache with a lock: append/decode mutate it with the GIL released, so two Python threads
// using one cache are serialized instead of racing. KvCache (caches.cpp) owns it;
// MultiHeadAttention (layers.cpp) makes and decodes with it.
struct PyKvCache {
  cpuattn::KvCache cache;
  std::mutex mu;
  explicit PyKvCache(cpuattn::KvCache c) : cache(std::move(c)) {}
};

}  // namespace cpuattn_py
