#include <fmt/format.h>

#include "evtc/gemm.hpp"

namespace evtc {

std::string fp8_blockwise_refusal(const GemmDesc& gemm) {
  if (!gemm.fp8_blockwise) return "";
  std::string why;
  if (!is_fp8(gemm.a_dtype) || !is_fp8(gemm.b_dtype))
    why += fmt::format("; A is {} and B is {}: block scales apply to fp8 operands (f8e4m3, f8e5m2) only",
                       dtype_name(gemm.a_dtype), dtype_name(gemm.b_dtype));
  if (gemm.fp8_fast_accum)
    why += "; fast accumulation cannot be combined with them (the block-scaled main loop adds every "
           "128-wide K block into fp32 registers)";
  if (why.empty()) return "";
  return "fp8 block scales (fp8_blockwise): " + why.substr(2);
}

}  // namespace evtc
