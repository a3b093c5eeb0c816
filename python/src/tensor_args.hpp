// Turning Python objects that speak DLPack (torch/cupy/jax arrays) into evtc::TensorRefs,
// without copying: a TensorRef is a view of the array's own device memory.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "evtc/runtime.hpp"

namespace evtc::python {

// A view of a 0-, 1- or 2-dimensional CUDA array as an evtc TensorRef. `what` names the
// operand in error messages ("operand 'bias'"). `dtype_override` gives the element type of a
// uint8 array that holds fp8 values (frameworks without fp8 in DLPack pass fp8 as bytes).
TensorRef tensor_ref(const nanobind::ndarray<>& array, const std::string& what,
                     const std::optional<std::string>& dtype_override);

}  // namespace evtc::python
