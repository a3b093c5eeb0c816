// Element types and shape classes of epilogue values.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace evtc {

enum class DType : uint8_t { f32, f16, bf16, f8e4m3, f8e5m2 };

std::string_view dtype_name(DType t);
// The same element type's name in PyTorch (torch.<name>): "float32", "bfloat16",
// "float8_e4m3fn", ... The Python layer maps torch dtypes through it; parse_dtype accepts it.
std::string_view torch_dtype_name(DType t);
// Canonical names (f32, f16, bf16, f8e4m3, f8e5m2) and their aliases (float32, bfloat16, e4m3,
// float8_e4m3fn, ...: PyTorch's and NumPy's spellings).
std::optional<DType> parse_dtype(std::string_view name);
// The canonical names of every DType, in enum order (for help texts and messages).
const std::vector<std::string>& dtype_names();
int dtype_bits(DType t);
inline int dtype_bytes(DType t) { return dtype_bits(t) / 8; }
bool is_fp8(DType t);
// Largest finite value of the type.
double dtype_max(DType t);
// Rounds an fp64 value to the nearest value representable in `t` (round to nearest even),
// as a GPU conversion does: f16/bf16 overflow to infinity, fp8 saturates to its largest
// finite value (CUTLASS converts to fp8 with satfinite). NaN stays NaN.
double round_to(DType t, double x);
// True when every value of `from` is exactly representable in `to`.
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
