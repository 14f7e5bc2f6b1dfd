// The module's contexts and what the library reports about this machine and build: Context
// (threads, SIMD target cap, scratch), the cached threads=N contexts, the active and supported
// targets, the K/V dtypes of the library's list, and bfloat16 conversion.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "common.h"
#include "cpuattn/cpuattn.h"

namespace cpuattn_py {

using namespace pybind11::literals;

void bind_context(py::module_& m) {
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
          "Cap on the SIMD target: scalar, sse4, avx2, avx512, avx512_vnni, avx512_bf16 or best on "
          "x86-64; "
          "scalar, neon, sve or best on aarch64")
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
}

}  // namespace cpuattn_py
