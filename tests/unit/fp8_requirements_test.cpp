// require_runnable_fp8: the rules Hopper's fp8 GEMMs (fused and cuBLASLt) share, and the text
// of each refusal.
#include <gtest/gtest.h>

#include "evtc/error.hpp"
#include "runtime/cublaslt_gemm.hpp"

using evtc::DType;
using evtc::runtime::require_runnable_fp8;

namespace {
std::string refusal(DType a, DType b, bool a_row, bool b_row, int64_t k, int64_t lda, int64_t ldb) {
  try {
    require_runnable_fp8(a, b, a_row, b_row, k, lda, ldb);
  } catch (const evtc::UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Fp8Requirements, KMajorOperandsWithWholeRowsPass) {
  EXPECT_EQ(refusal(DType::f8e4m3, DType::f8e5m2, true, false, 4096, 4096, 4096), "");
  EXPECT_EQ(refusal(DType::f8e4m3, DType::f8e4m3, true, false, 0, 0, 0), "");  // sizes unknown
}

TEST(Fp8Requirements, SixteenBitOperandsAreNotChecked) {
  EXPECT_EQ(refusal(DType::bf16, DType::bf16, false, true, 1001, 1001, 3), "");
}

TEST(Fp8Requirements, EveryBrokenRuleIsNamed) {
  const std::string why = refusal(DType::f8e4m3, DType::f8e4m3, false, true, 1000, 1000, 1004);
  EXPECT_EQ(why.rfind("fp8 A and B must both be K-major with 16-byte rows", 0), 0u) << why;
  EXPECT_NE(why.find("A is column-major: pass A as a row-major M×K matrix"), std::string::npos) << why;
  EXPECT_NE(why.find("B is row-major K×N: pass B column-major, i.e. the N×K matrix transposed"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("K is 1000, not a multiple of 16"), std::string::npos) << why;
  EXPECT_NE(why.find("the leading dimension of A is 1000, not a multiple of 16"), std::string::npos)
      << why;
  EXPECT_NE(why.find("the leading dimension of B is 1004, not a multiple of 16"), std::string::npos)
      << why;
}
