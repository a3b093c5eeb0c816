// OptionText: the one spelling of kernel options that the Python package and the PyTorch ops'
// specs share; bad values name the option.
#include <gtest/gtest.h>

#include "evtc/error.hpp"
#include "evtc/options.hpp"

namespace evtc {
namespace {

TEST(Options, FromJsonToCompileOptions) {
  const OptionText o = option_text_from_json(
      R"({"a_dtype": "f16", "b_dtype": "f16", "a_layout": "row", "b_layout": "row", "cast_mode": "fast",
          "config": "pingpong_128x128x64_c2x1_persistent"})");
  const CompileOptions c = compile_options(o);
  EXPECT_EQ(c.gemm.a_dtype, DType::f16);
  EXPECT_EQ(c.gemm.b_layout, Layout::row_major);
  EXPECT_EQ(c.cast_mode, CastMode::fast);
  ASSERT_TRUE(c.config.has_value());
  EXPECT_EQ(c.config->name(), "pingpong_128x128x64_c2x1_persistent");
  EXPECT_TRUE(c.wait_for_compile);  // the default
  EXPECT_FALSE(compile_options(option_text_from_json(R"({"wait_for_compile": false})")).wait_for_compile);
}

TEST(Options, ErrorsNameTheOption) {
  auto message = [](const char* json) {
    try {
      compile_options(option_text_from_json(json));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(R"({"a_dtype": "f64"})").find("a_dtype: unknown dtype 'f64'"), std::string::npos);
  EXPECT_NE(message(R"({"b_dtype": "int32"})").find("b_dtype: int32 is an integer dtype, allowed only for [m] and [n]"),
            std::string::npos);
  try {
    parse_options(option_text_from_json(R"({"operand_dtype": "i64"})"));
    ADD_FAILURE() << "an integer default operand dtype was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("operand_dtype: i64 is an integer dtype"), std::string::npos) << e.what();
  }
  EXPECT_NE(message(R"({"b_layout": "diagonal"})").find("b_layout: unknown layout"), std::string::npos);
  EXPECT_NE(message(R"({"cast_mode": 1})").find("option cast_mode: expected a string"), std::string::npos);
  EXPECT_NE(message(R"({"cast_mode": "slow"})").find("cast_mode: unknown mode 'slow' (expected one of 'eager', 'fast', "
                                                     "'compile')"),
            std::string::npos);
  EXPECT_EQ(compile_options(option_text_from_json(R"({"cast_mode": "compile"})")).cast_mode, CastMode::compile);
  EXPECT_NE(message(R"({"tile": "big"})").find("unknown kernel option 'tile'"), std::string::npos);
  EXPECT_NE(message(R"({"config": "fast"})").find("config: 'fast' is not a kernel configuration"),
            std::string::npos);
  EXPECT_NE(message("[1, 2]").find("must be a JSON object"), std::string::npos);
  EXPECT_NE(message(R"({"precise_math": "yes"})").find("option precise_math: expected true or false"),
            std::string::npos);
  EXPECT_NE(message(R"({"wait_for_compile": 0})").find("option wait_for_compile: expected true or false"),
            std::string::npos);
  EXPECT_NE(message("{").find("kernel options are not JSON"), std::string::npos);
  EXPECT_NE(message(R"({"visit_order": "diagonal"})")
                .find("visit_order: 'diagonal' is not a tile visiting order (heuristic, along_m or along_n"),
            std::string::npos);
  EXPECT_NE(message(R"({"visit_order": "along_n_s3"})").find("visit_order: 'along_n_s3'"), std::string::npos);
  EXPECT_NE(message(R"({"visit_order": 8})").find("option visit_order: expected a visiting order"), std::string::npos);
}

TEST(Options, VisitOrderIsARunTimeChoiceOfDenseKernels) {
  const CompileOptions c = compile_options(option_text_from_json(R"({"visit_order": "along_n_s8"})"));
  ASSERT_TRUE(c.visit_order.has_value());
  EXPECT_EQ(c.visit_order->raster, VisitOrder::Raster::along_n);
  EXPECT_EQ(c.visit_order->swizzle, 8);
  EXPECT_FALSE(compile_options(option_text_from_json(R"({"visit_order": null})")).visit_order.has_value());
  // It round-trips through the JSON spelling the PyTorch ops' specs use.
  OptionText o;
  o.visit_order = "along_m_s2";
  EXPECT_EQ(option_text_from_json(option_text_json(o)).visit_order, "along_m_s2");
  // It does not decide the kernel's code, so it is not among the options that name a kernel.
  EXPECT_FALSE(option_text(c.gemm, c.cast_mode, c.precise_math, c.config).visit_order.has_value());
}

// The UserError grouped_options raises for `o`; empty when it accepts them.
std::string grouped_options_error(const OptionText& o) {
  try {
    grouped_options(o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Options, GroupedKernelsNeedRowMajorTokensAndCutlassOrder) {
  OptionText o;
  o.a_layout = "col";
  EXPECT_NE(grouped_options_error(o).find("a_layout: a grouped kernel's token matrix x must be row-major"),
            std::string::npos)
      << "a column-major x: '" << grouped_options_error(o) << "'";
  o = OptionText{};
  o.visit_order = "heuristic";
  EXPECT_NE(grouped_options_error(o).find("visit_order: grouped kernels visit each group's tiles in CUTLASS's order"),
            std::string::npos)
      << "a visiting order: '" << grouped_options_error(o) << "'";
  EXPECT_EQ(grouped_options_error(OptionText{}), "");
}

}  // namespace
}  // namespace evtc
