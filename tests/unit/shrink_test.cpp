// Shrinking a failing epilogue (src/testing/shrink): the one-step simplifications of an
// epilogue, and the search that keeps the smallest one that still fails, with a stand-in for
// the GPU check (`evtc fuzz` runs the candidates there).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "testing/random_epilogue.hpp"
#include "testing/shrink.hpp"

using namespace evtc;
using evtc::testing::shrink;
using evtc::testing::shrink_candidates;

namespace {

GemmDesc bf16_gemm() {
  GemmDesc g;
  g.a_dtype = g.b_dtype = DType::bf16;
  return g;
}

bool has(const std::vector<std::string>& v, const std::string& expr) {
  const std::string want = expression_text(parse_expression(expr));
  return std::find(v.begin(), v.end(), want) != v.end();
}

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

TEST(Shrink, CandidatesDropOneOperationEach) {
  const std::string text = "out o: bf16 = silu(acc + r[n]) * s\n";
  const auto c = shrink_candidates(text, {}, bf16_gemm());
  EXPECT_TRUE(has(c, "out o: bf16 = silu(acc + r[n])")) << c.size();
  EXPECT_TRUE(has(c, "out o: bf16 = (acc + r[n]) * s"));
  EXPECT_TRUE(has(c, "out o: bf16 = silu(acc) * s"));
  // An output that no longer reads the accumulator (here an [n] value) is never offered.
  for (const std::string& e : c) EXPECT_NE(print(parse_expression(e)).find("accum"), std::string::npos) << e;
  // Smallest first, each parses and is smaller than the epilogue.
  const size_t whole = print(parse_expression(text)).size();
  for (size_t i = 0; i < c.size(); ++i) {
    const Graph g = parse_expression(c[i]);
    EXPECT_LT(print(g).size(), whole) << c[i];
    if (i) EXPECT_LE(lines(print(parse_expression(c[i - 1]))), lines(print(g))) << c[i];
  }
  EXPECT_TRUE(shrink_candidates("out o: bf16 = acc\n", {}, bf16_gemm()).empty());
}

// With a check that fails whenever the epilogue still takes a tanh of something added to a row
// operand, the search ends at the smallest such epilogue, trying batches of two.
TEST(Shrink, KeepsTheSmallestEpilogueThatStillFails) {
  const std::string text =
      "v = acc * 2\n"
      "out o: bf16 = clamp(exp(tanh(v + r[n]) * s) + v, -4, 4)\n"
      "out q = row_sum(v)\n";
  int calls = 0;
  auto failing = [&](const std::vector<std::string>& batch) {
    ++calls;
    EXPECT_LE(batch.size(), 2u);
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::string p = print(parse_expression(batch[i]));
      if (p.find("tanh") != std::string::npos && p.find("row_vec r") != std::string::npos) return int(i);
    }
    return -1;
  };
  const auto r = shrink(text, {}, bf16_gemm(), failing, 100, 2);
  const std::string p = print(parse_expression(r.text));
  EXPECT_NE(p.find("tanh"), std::string::npos) << r.text;
  EXPECT_NE(p.find("row_vec r"), std::string::npos) << r.text;
  EXPECT_EQ(p.find("exp"), std::string::npos) << r.text;
  EXPECT_EQ(r.text.find("row_sum"), std::string::npos) << r.text;  // the other output is gone
  EXPECT_EQ(p.find("clamp"), std::string::npos) << r.text;
  EXPECT_EQ(r.rounds, calls);
  // Nothing smaller fails: every candidate of the result passes the check.
  EXPECT_EQ(failing(shrink_candidates(r.text, {}, bf16_gemm(), 1000)), -1) << r.text;
  // The round limit holds; with none left the epilogue is returned as it was.
  calls = 0;
  const auto none = shrink(text, {}, bf16_gemm(), failing, 0, 2);
  EXPECT_EQ(none.text, text);
  EXPECT_EQ(calls, 0);
}

// Random epilogues of `evtc fuzz` shrink to valid, fusable epilogues.
TEST(Shrink, RandomEpiloguesGiveValidCandidates) {
  evtc::testing::EpilogueGenerator gen(7);
  for (int i = 0; i < 30; ++i) {
    const auto k = gen.next();
    ParseOptions p;
    p.operand_dtype = k.kind == evtc::testing::KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
    p.output_dtype = DType::bf16;
    for (size_t o = 0; o < k.outputs.size(); ++o)
      for (const std::string& c : shrink_candidates(k.text_of(o), p, k.gemm, 8))
        EXPECT_NO_THROW(parse_expression(c, p)) << c;
  }
}

}  // namespace
