#include "tensor_args.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "evtc/error.hpp"

namespace nb = nanobind;

namespace evtc::python {
namespace {

std::string dlpack_dtype_name(nb::dlpack::dtype t) {
  return fmt::format("DLPack type code {} with {} bits", int(t.code), int(t.bits));
}

// The evtc dtype of a DLPack element type, if evtc has one.
std::optional<DType> evtc_dtype(nb::dlpack::dtype t) {
  using code = nb::dlpack::dtype_code;
  if (t.lanes != 1) return std::nullopt;
  switch (static_cast<code>(t.code)) {
    case code::Float:
      if (t.bits == 32) return DType::f32;
      if (t.bits == 16) return DType::f16;
      return std::nullopt;
    case code::Bfloat:
      return t.bits == 16 ? std::optional(DType::bf16) : std::nullopt;
    case code::Float8_E4M3FN:
      return DType::f8e4m3;
    case code::Float8_E5M2:
      return DType::f8e5m2;
    case code::Int:
      if (t.bits == 32) return DType::i32;
      if (t.bits == 64) return DType::i64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

DType element_type(const nb::ndarray<>& array, const std::string& what,
                   const std::optional<std::string>& dtype_override) {
  const nb::dlpack::dtype t = array.dtype();
  const bool bytes = t.code == uint8_t(nb::dlpack::dtype_code::UInt) && t.bits == 8 && t.lanes == 1;
  if (dtype_override) {
    const auto d = parse_dtype(*dtype_override);
    if (!d) throw UserError(fmt::format("{}: unknown dtype '{}'", what, *dtype_override));
    if (bytes && is_fp8(*d)) return *d;
    if (auto own = evtc_dtype(t); own && *own == *d) return *d;
    throw UserError(fmt::format("{}: dtype {} was given for an array of {}; only a uint8 array "
                                "can stand for fp8 values",
                                what, *dtype_override, dlpack_dtype_name(t)));
  }
  if (auto d = evtc_dtype(t)) return *d;
  throw UserError(fmt::format("{}: {} is not an evtc element type ({})", what, dlpack_dtype_name(t),
                              fmt::join(dtype_names(), ", ")));
}

}  // namespace

std::string device_refusal(int device_type, const std::string& what) {
  if (device_type == nb::device::cuda::value) return "";
  return fmt::format("{} is not on a CUDA device (DLPack device type {}): evtc runs on CUDA tensors", what,
                     device_type);
}

TensorRef tensor_ref(const nb::ndarray<>& array, const std::string& what,
                     const std::optional<std::string>& dtype_override) {
  if (std::string why = device_refusal(int(array.device_type()), what); !why.empty()) throw UserError(why);
  TensorRef t;
  t.data = array.data();
  t.dtype = element_type(array, what, dtype_override);
  // Strides are in elements, as evtc's TensorRef wants them.
  switch (array.ndim()) {
    case 0:
      t.rows = t.cols = 1;
      t.row_stride = t.col_stride = 1;
      break;
    case 1:
      t.rows = 1;
      t.cols = int64_t(array.shape(0));
      t.col_stride = array.stride(0);
      t.row_stride = t.cols * t.col_stride;
      break;
    case 2:
      t.rows = int64_t(array.shape(0));
      t.cols = int64_t(array.shape(1));
      t.row_stride = array.stride(0);
      t.col_stride = array.stride(1);
      break;
    default:
      throw UserError(fmt::format("{} has {} dimensions; evtc takes matrices, vectors and scalars "
                                  "(flatten leading batch dimensions first)",
                                  what, array.ndim()));
  }
  return t;
}

BatchedTensorRef batched_tensor_ref(const nb::ndarray<>& array, const std::string& what, bool k_major) {
  if (std::string why = device_refusal(int(array.device_type()), what); !why.empty()) throw UserError(why);
  if (array.ndim() != 3)
    throw UserError(fmt::format("{} has {} dimensions; expected 3 (G × K × N, one K×N matrix per "
                                "group, as torch._grouped_mm takes its second operand)",
                                what, array.ndim()));
  BatchedTensorRef w;
  w.data = array.data();
  w.dtype = element_type(array, what, std::nullopt);
  w.batches = int64_t(array.shape(0));
  w.batch_stride = array.stride(0);
  // Dimension 1 is K and dimension 2 is N; a K-major kernel reads each group as N×K.
  const int rows = k_major ? 2 : 1, cols = k_major ? 1 : 2;
  w.rows = int64_t(array.shape(rows));
  w.cols = int64_t(array.shape(cols));
  w.row_stride = array.stride(rows);
  w.col_stride = array.stride(cols);
  return w;
}

}  // namespace evtc::python
