// The pass pipeline's check in `evtc fuzz --cpu` (src/testing/pass_check): a cancellation after a
// folded constant is not a mismatch, a pass that changes a value is, and a failing output's
// --json record says what reproduces it.
#include <gtest/gtest.h>

#include <string>

#include "evtc/expression.hpp"
#include "evtc/passes.hpp"
#include "evtc/reference.hpp"
#include "testing/pass_check.hpp"

using namespace evtc;

namespace {

ParseOptions bf16_operands() {
  ParseOptions p;
  p.operand_dtype = DType::bf16;
  p.output_dtype = DType::bf16;
  return p;
}

// `evtc fuzz --cpu --seed 11 --count 100000`, case seed 1610345821952135825: fold_constants
// makes erf(2) an f32 literal, 2.2e-8 from its fp64 value; erf(acc) - erf(2) cancels to about
// 4e-3 and relu_square doubles the relative error, so rel_l2 was 1.02e-5 against the f32 bound of
// 1e-5 although every element was within its tolerance.
TEST(PassCheck, AFoldedConstantInACancellationIsNotAMismatch) {
  const std::string text =
      "out o0: f32 = bf16((2 + acc))\n"
      "out o1: bf16 = acc\n"
      "out o2: f16 = acc\n"
      "out o3: f32 = relu_square((erf(acc) - erf(2)))\n"
      "out o4: bf16 = acc\n"
      "out o5: f32 = (reciprocal((abs(sigmoid(relu(-3))) + 0.25))) + acc\n"
      "out o6: bf16 = neg(pow((abs(where(c0[m], acc, acc)) + 0.25), (tanh(rsqrt((abs(c1[m]) + 0.25))) * 2)))\n";
  const Graph before = parse_expression(text, bf16_operands());
  const Graph after = run_pipeline(before);
  const ReferenceInputs in = random_reference_inputs(before, 5, 8, 8, DType::bf16, DType::bf16, 1610345821952135825ull);
  for (const evtc::testing::PassCheck& c : evtc::testing::check_pipeline(before, after, in))
    EXPECT_TRUE(c.comparison.pass) << c.output << ": " << c.comparison.describe();
}

// A pipeline that changes a value (here: a constant off by 1e-4) is still a mismatch, on the
// output that reads it and no other.
TEST(PassCheck, AChangedValueIsStillAMismatch) {
  const Graph before = parse_expression("out a: f32 = relu_square(erf(acc) - erf(2))\nout b: f32 = acc * 2\n",
                                        bf16_operands());
  const Graph after = run_pipeline(
      parse_expression("out a: f32 = relu_square(erf(acc) - 0.9954222)\nout b: f32 = acc * 2\n", bf16_operands()));
  const ReferenceInputs in = random_reference_inputs(before, 5, 8, 8, DType::bf16, DType::bf16, 7);
  const auto checks = evtc::testing::check_pipeline(before, after, in);
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_EQ(checks[0].output, "a");
  EXPECT_FALSE(checks[0].comparison.pass) << checks[0].comparison.describe();
  EXPECT_TRUE(checks[1].comparison.pass) << checks[1].comparison.describe();

  evtc::testing::CaseOrigin origin;
  origin.kernel = 3;
  origin.kernel_text = "out a: f32 = relu_square(erf(acc) - erf(2))\nout b: f32 = acc * 2\n";
  origin.expression = "out a: f32 = relu_square(erf(acc) - erf(2))\n";
  origin.m = 5;
  origin.n = 8;
  origin.k = 8;
  origin.seed = 18446744073709551557ull;  // seeds are 64-bit: kept exactly
  origin.options = "--dtype bf16";
  const nlohmann::json r = evtc::testing::failing_case_record(origin, checks[0]);
  EXPECT_EQ(r.at("kernel"), 3);
  EXPECT_EQ(r.at("output"), "a");
  EXPECT_EQ(r.at("expression"), origin.expression);
  EXPECT_EQ(r.at("kernel_text"), origin.kernel_text);
  EXPECT_EQ(r.at("m"), 5);
  EXPECT_EQ(r.at("n"), 8);
  EXPECT_EQ(r.at("k"), 8);
  EXPECT_EQ(r.at("seed").get<uint64_t>(), 18446744073709551557ull);
  EXPECT_EQ(r.at("options"), "--dtype bf16");
  EXPECT_EQ(r.at("rel_l2").get<double>(), checks[0].comparison.rel_l2);
  EXPECT_EQ(r.at("rel_l2_bound").get<double>(), checks[0].comparison.max_rel_l2);
  EXPECT_EQ(r.at("max_abs").get<double>(), checks[0].comparison.max_abs);
  EXPECT_EQ(r.at("outside_bound").get<size_t>(), checks[0].comparison.mismatches);
  EXPECT_EQ(r.at("what"), checks[0].comparison.describe());
}

}  // namespace
