// DLPack in and out (dlpack.h). The capsule protocol: a producer's capsule is named "dltensor"
// and frees its tensor when collected under that name; the consumer renames it "used_dltensor"
// and from then on owns the DLManagedTensor, whose deleter it calls when done.
#include "dlpack.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace cpuattn_py {
namespace {

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";
constexpr std::uint8_t kDLBoolCode = 6;  // kDLBool, DLPack 0.8 (Debian's header is 0.6)
constexpr const char* kBf16Mark = "cpuattn_dlpack_dtype";

std::string device_name(std::int64_t type, std::int64_t id) {
  const char* n = type == kDLCUDA          ? "cuda"
                  : type == kDLCUDAHost    ? "cuda_host"
                  : type == kDLOpenCL      ? "opencl"
                  : type == kDLVulkan      ? "vulkan"
                  : type == kDLMetal       ? "metal (mps)"
                  : type == kDLROCM        ? "rocm"
                  : type == kDLCUDAManaged ? "cuda_managed"
                                           : "device type";
  return std::string(n) + ":" + std::to_string(id) + " (DLPack device type " +
         std::to_string(type) + ")";
}

[[noreturn]] void fail_device(const char* name, std::int64_t type, std::int64_t id) {
  fail(std::string(name) + " is on " + device_name(type, id) + "; cpuattn runs on the CPU: pass " +
       name + ".cpu() (or a copy in host memory)");
}

std::string dl_dtype_str(const DLDataType& t) {
  const char* kind = t.code == kDLFloat      ? "float"
                     : t.code == kDLBfloat   ? "bfloat"
                     : t.code == kDLInt      ? "int"
                     : t.code == kDLUInt     ? "uint"
                     : t.code == kDLComplex  ? "complex"
                     : t.code == kDLBoolCode ? "bool"
                                             : "code ";
  std::string s = std::string(kind) + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

// The NumPy dtype viewing DLPack elements of type t (bfloat16: marked uint16), or fails.
py::dtype numpy_dtype_of(const DLDataType& t, const char* name) {
  const auto np = py::module_::import("numpy");
  const bool pow2 = t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) {
    py::dict mark;
    mark[kBf16Mark] = "bfloat16";
    return np.attr("dtype")("<u2", py::arg("metadata") = mark);
  }
  if (t.lanes == 1 && t.code == kDLBoolCode && t.bits == 8) return np.attr("dtype")("bool");
  if (t.lanes == 1 && pow2 &&
      (t.code == kDLInt || t.code == kDLUInt || (t.code == kDLFloat && t.bits > 8)))
    return np.attr("dtype")(dl_dtype_str(t));  // "float32", "int64", "uint8", ...
  fail(std::string(name) + " has dtype " + dl_dtype_str(t) +
       ", which cpuattn does not read (float32, float16, bfloat16 and the integer types)");
}

// Checks the producer side before asking for a capsule: autograd and device.
void check_exportable(const py::handle& obj, const char* name) {
  const py::object grad = py::getattr(obj, "requires_grad", py::none());
  if (!grad.is_none() && py::bool_(grad))
    fail(std::string(name) +
         " requires grad: cpuattn is inference-only (it computes no gradients); pass " + name +
         ".detach()");
  if (!py::hasattr(obj, "__dlpack_device__")) return;
  const py::tuple dev = obj.attr("__dlpack_device__")();
  const auto type = int64_of(dev[0], std::string(name) + ".__dlpack_device__()[0]");
  if (type != kDLCPU) fail_device(name, type, int64_of(dev[1], "device id"));
}

void delete_managed(void* p) {
  auto* t = static_cast<DLManagedTensor*>(p);
  if (t->deleter != nullptr) t->deleter(t);
}

// Reads a "dltensor" capsule: checks it, takes ownership, returns the view.
py::array from_capsule(const py::handle& capsule, const char* name) {
  const char* cname = PyCapsule_GetName(capsule.ptr());
  if (cname != nullptr && std::strcmp(cname, kUsedCapsule) == 0)
    fail(std::string(name) +
         " is a DLPack capsule that was already consumed (a capsule can be read once); pass the "
         "tensor itself, or a new capsule");
  if (cname == nullptr || std::strcmp(cname, kCapsule) != 0)
    fail(std::string(name) + " is a capsule named '" + (cname ? cname : "") +
         "', not a DLPack 0.x tensor ('dltensor')");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsule));
  if (m == nullptr) throw py::error_already_set();
  const DLTensor& t = m->dl_tensor;
  if (t.device.device_type != kDLCPU) fail_device(name, t.device.device_type, t.device.device_id);
  const py::dtype dt = numpy_dtype_of(t.dtype, name);
  if (t.ndim < 0 || t.ndim > 32)
    fail(std::string(name) + " has rank " + std::to_string(t.ndim) + " (DLPack)");
  const auto item = static_cast<py::ssize_t>(dt.itemsize());
  std::vector<py::ssize_t> shape(static_cast<std::size_t>(t.ndim)), strides(shape.size());
  py::ssize_t step = item;  // compact row-major when the producer gives no strides
  for (int d = t.ndim - 1; d >= 0; --d) {
    shape[d] = static_cast<py::ssize_t>(t.shape[d]);
    strides[d] = t.strides != nullptr ? static_cast<py::ssize_t>(t.strides[d]) * item : step;
    step *= std::max<py::ssize_t>(shape[d], 1);
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  // From here on the view owns the tensor: the producer's capsule must not free it.
  if (PyCapsule_SetName(capsule.ptr(), kUsedCapsule) != 0) throw py::error_already_set();
  py::capsule owner(m, delete_managed);
  return py::array(dt, shape, strides, data, owner);
}

// A result exported to torch: the DLManagedTensor, its shape and strides, and the array whose
// memory it describes (kept alive until torch calls the deleter).
struct Exported {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape, strides;
  py::object owner;
};

void delete_exported(DLManagedTensor* t) {
  const PyGILState_STATE gil = PyGILState_Ensure();  // torch may free from any thread
  delete static_cast<Exported*>(t->manager_ctx);
  PyGILState_Release(gil);
}

// A producer's capsule: frees the tensor unless a consumer took it (renamed the capsule).
void delete_unconsumed(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsule)) return;
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
  t->deleter(t);
}

DLDataType dl_dtype(cpuattn::DType d) {
  const auto bits = static_cast<std::uint8_t>(8 * cpuattn::dtype_size(d));
  switch (d) {
    case cpuattn::DType::f32:
    case cpuattn::DType::f64:
    case cpuattn::DType::f16:
      return {kDLFloat, bits, 1};
    case cpuattn::DType::bf16:
      return {kDLBfloat, bits, 1};
    case cpuattn::DType::i8:
    case cpuattn::DType::i32:
    case cpuattn::DType::i64:
      return {kDLInt, bits, 1};
    default:
      return {kDLUInt, bits, 1};  // bit patterns, as numpy_dtype() holds them
  }
}

bool is_torch_tensor(const py::handle& obj) {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
  if (torch == nullptr) return false;
  const py::object tensor = py::getattr(torch, "Tensor", py::none());
  return !tensor.is_none() && py::isinstance(obj, tensor);
}

}  // namespace

std::optional<py::array> dlpack_view(const py::handle& obj, const char* name) {
  if (PyCapsule_CheckExact(obj.ptr())) return from_capsule(obj, name);
  if (!py::hasattr(obj, "__dlpack__")) return std::nullopt;
  check_exportable(obj, name);
  py::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    if (py::hasattr(obj, "__array__")) return std::nullopt;
    fail(std::string(name) + " (" + std::string(py::str(obj.get_type())) +
         ") could not be exported through DLPack: " + e.what());
  }
  return from_capsule(capsule, name);
}

bool is_bf16_view(const py::array& a) {
  const py::object meta = a.dtype().attr("metadata");
  return !meta.is_none() && py::cast<py::dict>(meta).contains(kBf16Mark);
}

py::object as_type_of(const py::array& a, cpuattn::DType dtype, const py::handle& like) {
  if (!is_torch_tensor(like)) return a;
  auto* e = new Exported;
  e->owner = a;
  const auto item = static_cast<py::ssize_t>(cpuattn::dtype_size(dtype));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) {
    e->shape.push_back(a.shape(d));
    e->strides.push_back(a.strides(d) / item);
  }
  DLTensor& t = e->managed.dl_tensor;
  t.data = const_cast<void*>(a.data());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(a.ndim());
  t.dtype = dl_dtype(dtype);
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_exported;
  PyObject* raw = PyCapsule_New(&e->managed, kCapsule, delete_unconsumed);
  if (raw == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  const auto capsule = py::reinterpret_steal<py::object>(raw);
  return py::module_::import("torch.utils.dlpack").attr("from_dlpack")(capsule);
}

}  // namespace cpuattn_py
