// DLPack, the protocol by which torch, JAX, CuPy and NumPy (>= 1.22) hand tensors to each other
// without copies: another library's CPU tensor as a NumPy view of its memory, and a result handed
// back as a torch tensor over the NumPy array's memory. Only DLPack 0.x ("dltensor") capsules:
// what every producer gives when __dlpack__() is called without max_version.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "cpuattn/cpuattn.h"

namespace cpuattn_py {

namespace py = pybind11;

// A view of obj's memory when obj speaks DLPack (has __dlpack__, or is a "dltensor" capsule);
// std::nullopt when it does not, or when its __dlpack__ refuses a dtype that its __array__ can
// still give (torch 1.13's bool tensors). Errors name `name`: a tensor that requires grad, a
// device other than the CPU, a dtype cpuattn does not read, a capsule already consumed. bfloat16
// tensors become uint16 arrays whose dtype is marked (is_bf16_view); the view keeps the producer's
// tensor alive and is writable.
std::optional<py::array> dlpack_view(const py::handle& obj, const char* name);

// True for a dlpack_view of a bfloat16 tensor.
bool is_bf16_view(const py::array& a);

// `a` (elements of `dtype`; bf16 as uint16 bit patterns) as the type of `like`: a torch tensor
// sharing a's memory when like is a torch.Tensor, else a itself. Never imports torch: a torch
// tensor means torch is loaded.
py::object as_type_of(const py::array& a, cpuattn::DType dtype, const py::handle& like);

}  // namespace cpuattn_py
