// Turning Python objects that speak DLPack (torch/cupy/jax arrays) into evtc::TensorRefs,
// without copying: a TensorRef is a view of the array's own device memory.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "evtc/grouped.hpp"
#include "evtc/runtime.hpp"

namespace evtc::python {

// Why an array on a device of DLPack type `device_type` cannot be an operand named `what`
// (empty for CUDA memory): the one check of where arrays live, which the Python layer also
// asks before it binds anything (so that a host array is named before a missing output is).
std::string device_refusal(int device_type, const std::string& what);

// A view of a 0-, 1- or 2-dimensional CUDA array as an evtc TensorRef. `what` names the
// operand in error messages ("operand 'bias'"). `dtype_override` gives the element type of a
// uint8 array that holds fp8 values (frameworks without fp8 in DLPack pass fp8 as bytes).
TensorRef tensor_ref(const nanobind::ndarray<>& array, const std::string& what,
                     const std::optional<std::string>& dtype_override);

// A view of a 3-dimensional CUDA array G×K×N holding a grouped GEMM's weights, as
// torch._grouped_mm takes its second operand. With `k_major` (the kernel reads G×N×K
// weights, each group's N×K K-major like a stack of nn.Linear weights, i.e. the array is
// such a stack transposed) the result is G×N×K; otherwise G×K×N as given. Strides are not
// checked here (GroupedKernel::run names what is wrong).
BatchedTensorRef batched_tensor_ref(const nanobind::ndarray<>& array, const std::string& what,
                                    bool k_major);

}  // namespace evtc::python
