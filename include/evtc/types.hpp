// Element types and shape classes of epilogue values.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace evtc {

// i32 and i64 are index operands: legal only as [m] and [n] vectors (Graph refuses them
// anywhere else), read as the f32 value nearest each element (exact for |v| < 2^24).
enum class DType : uint8_t { f32, f16, bf16, f8e4m3, f8e5m2, i32, i64 };

std::string_view dtype_name(DType t);
// The same element type's name in PyTorch (torch.<name>): "float32", "bfloat16",
// "float8_e4m3fn", ... The Python layer maps torch dtypes through it; parse_dtype accepts it.
std::string_view torch_dtype_name(DType t);
// Canonical names (f32, f16, bf16, f8e4m3, f8e5m2, i32, i64) and their aliases (float32,
// bfloat16, e4m3, float8_e4m3fn, int32, int64, ...: PyTorch's and NumPy's spellings).
std::optional<DType> parse_dtype(std::string_view name);
// The canonical names of every DType, in enum order (for help texts and messages).
const std::vector<std::string>& dtype_names();
// The canonical names of the floating-point DTypes (all but i32 and i64): what A, B, outputs and
// the default operand dtype may be.
const std::vector<std::string>& float_dtype_names();
// A and B of fused kernels (what the tensor cores multiply): f16, bf16, f8e4m3 and f8e5m2; the
// Python layer's GEMM operand dtypes come from this too.
bool is_tensor_core_input(DType t);
// Their canonical names, in enum order.
const std::vector<std::string>& tensor_core_input_names();
// "a, b or c": a list of names for a message.
std::string or_list(const std::vector<std::string>& names);
int dtype_bits(DType t);
inline int dtype_bytes(DType t) { return dtype_bits(t) / 8; }
bool is_fp8(DType t);
// i32 and i64: the integer index operands.
bool is_integer(DType t);
// Integer operands are exact in f32 below this magnitude (2^24), and so are the row and column
// indices `m` and `n`: the limit that documentation and run-time checks name.
inline constexpr int64_t kExactF32Integer = int64_t(1) << 24;
// Largest finite value of the type.
double dtype_max(DType t);
// Rounds an fp64 value to the nearest value representable in `t` (round to nearest even),
// as a GPU conversion does: f16/bf16 overflow to infinity, fp8 saturates to its largest
// finite value (CUTLASS converts to fp8 with satfinite). NaN stays NaN. For the integer types:
// the nearest integer (ties to even), saturated to the type's range; NaN gives 0.
double round_to(DType t, double x);
// True when every value of `from` is exactly representable in `to`, and, the one exception,
// for an integer operand's dtype and f32: integer operands enter arithmetic as f32 values
// (exact for |v| < kExactF32Integer, the documented limit of integer operands), the way every
// other load widens to f32. This is the one place that rule lives.
bool widens_losslessly(DType from, DType to);

// Which part of the M×N output a value varies over.
//   scalar: one value; row: length N, broadcast over M (a bias[n]);
//   col: length M, broadcast over N (a scale[m]); full: M×N;
//   half: M×N/2, a gated value made from the interleaved (gate, up) column pairs of an M×N
//   value (gate(x) takes columns 0, 2, 4, ..., up(x) columns 1, 3, 5, ...).
enum class Shape : uint8_t { scalar, row, col, full, half };

std::string_view shape_name(Shape s);  // "", "[n]", "[m]", "[m,n]", "[m,n/2]"
// True when values of shapes a and b can meet in one elementwise op: anything broadcasts
// with a scalar or a column vector; a half-width value does not meet [n] or [m,n] values.
bool broadcastable(Shape a, Shape b);
// Shape of an elementwise result over operands of shapes a and b (broadcasting; a and b
// must be broadcastable).
Shape broadcast(Shape a, Shape b);

}  // namespace evtc
