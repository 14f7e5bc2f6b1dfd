// KvCache: the keys and values of past tokens, appended to and read back from Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "common.h"
#include "cpuattn/cpuattn.h"
#include "cpuattn/layers.h"

namespace cpuattn_py {
namespace {

using namespace pybind11::literals;

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

// A read-only NumPy view of a library view of `owner`'s memory (kept alive by the array).
py::array share_view(const cpuattn::TensorView& t, const py::handle& owner) {
  const auto item = static_cast<py::ssize_t>(cpuattn::dtype_size(t.dtype));
  std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.begin() + t.rank), strides;
  for (int d = 0; d < t.rank; ++d) strides.push_back(t.strides[d] * item);
  py::array a(numpy_dtype(t.dtype), shape, strides, t.data, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// The cache's keys (or values, or their scales) as a copy, or with copy=False as a view of the
// cache's own memory: only a fixed cache's memory stays where it is (a growable one moves when
// it grows), so only a fixed cache gives views.
py::object cache_part(PyKvCache& c, const py::handle& self, bool copy, const char* what,
                      const std::optional<cpuattn::TensorView>& t) {
  if (!t) return py::none();
  if (copy) return copy_view(*t);
  if (c.cache.growable()) {
    fail(std::string(what) +
         "(copy=False): a growable cache moves its memory when it grows, so it gives no views; "
         "make the cache with growable=False, or take a copy");
  }
  return share_view(*t, self);
}

}  // namespace

void bind_kv_cache(py::module_& m) {
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
          [](py::object self, bool copy) {
            PyKvCache& c = self.cast<PyKvCache&>();
            std::lock_guard<std::mutex> lock(c.mu);
            return cache_part(c, self, copy, "keys", c.cache.keys());
          },
          "The cached keys [batch, kv_heads, length, head_dim] in the stored dtype (bf16 as "
          "uint16): a copy, or with copy=False a read-only view of the cache's memory (fixed "
          "caches only; it shows later changes to those tokens, e.g. truncate then append).",
          "copy"_a = true)
      .def(
          "values",
          [](py::object self, bool copy) {
            PyKvCache& c = self.cast<PyKvCache&>();
            std::lock_guard<std::mutex> lock(c.mu);
            return cache_part(c, self, copy, "values", c.cache.values());
          },
          "The cached values [batch, kv_heads, length, value_dim], as keys().", "copy"_a = true)
      .def(
          "key_scales",
          [](py::object self, bool copy) {
            PyKvCache& c = self.cast<PyKvCache&>();
            std::lock_guard<std::mutex> lock(c.mu);
            return cache_part(c, self, copy, "key_scales", c.cache.key_scales());
          },
          "The keys' scales of a scaled dtype (int8): float32 [batch, kv_heads, length] per "
          "token, or [kv_heads] static; None for other dtypes. copy as for keys().",
          "copy"_a = true)
      .def(
          "value_scales",
          [](py::object self, bool copy) {
            PyKvCache& c = self.cast<PyKvCache&>();
            std::lock_guard<std::mutex> lock(c.mu);
            return cache_part(c, self, copy, "value_scales", c.cache.value_scales());
          },
          "The values' scales, as key_scales.", "copy"_a = true)
      .def("__repr__", [](PyKvCache& c) {
        return "cpuattn.KvCache(batch=" + std::to_string(c.cache.batch()) +
               ", kv_heads=" + std::to_string(c.cache.kv_heads()) +
               ", head_dim=" + std::to_string(c.cache.head_dim()) +
               ", value_dim=" + std::to_string(c.cache.value_dim()) +
               ", length=" + std::to_string(c.cache.length()) +
               ", capacity=" + std::to_string(c.cache.capacity()) + ", dtype='" +
               cpuattn::dtype_name(c.cache.dtype()) + "')";
      });
}

}  // namespace cpuattn_py
