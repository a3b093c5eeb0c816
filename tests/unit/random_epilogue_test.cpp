// The random epilogue generator of `evtc fuzz` (src/testing/random_epilogue): reproducible
// from its seed, covering every op, gated function, reduction kind and kernel kind, and making
// epilogues that parse and can be fused (so the GPU run tests fused kernels, not refusals).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/ops.hpp"
#include "evtc/passes.hpp"
#include "frontend/functions.hpp"
#include "testing/random_epilogue.hpp"

using namespace evtc;

namespace {

TEST(RandomEpilogue, SameSeedSameKernels) {
  evtc::testing::EpilogueGenerator a(42), b(42), c(43);
  std::string ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta += a.next().text();
    tb += b.next().text();
    tc += c.next().text();
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(RandomEpilogue, CoversTheOpTableAndEveryKernelKind) {
  evtc::testing::EpilogueGenerator gen(1);
  std::string all;
  std::set<evtc::testing::KernelKind> kinds;
  size_t fused = 0, kernels = 0;
  for (int i = 0; i < 3000; ++i) {
    const evtc::testing::RandomKernel k = gen.next();
    kinds.insert(k.kind);
    all += k.text();
    ParseOptions p;
    p.operand_dtype = k.kind == evtc::testing::KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
    const Graph g = run_pipeline(parse_expression(k.text(), p));
    ++kernels;
    fused += check_legality(g, k.gemm).fusable();
  }
  EXPECT_EQ(kinds.size(), 3u);
  EXPECT_EQ(fused, kernels) << "random epilogues should be fusable";
  for (const OpInfo& op : op_table()) {
    const std::string name(op.name);
    const bool infix = name == "add" || name == "sub" || name == "mul" || name == "div";
    if (op.comparison)
      EXPECT_NE(all.find(fmt::format(" {} ", op.infix)), std::string::npos) << name << " never generated";
    else if (!infix)
      EXPECT_NE(all.find(name + "("), std::string::npos) << name << " never generated";
  }
  for (const char* infix : {" + ", " - ", " * ", " / "}) EXPECT_NE(all.find(infix), std::string::npos) << infix;
  for (const auto& f : frontend::gated_function_table())
    if (f.name != "gate" && f.name != "up") EXPECT_NE(all.find(std::string(f.name) + "("), std::string::npos) << f.name;
  for (const char* r : {"row_sum(", "col_sum(", "col_amax(", "bf16(", "out o7"})
    EXPECT_NE(all.find(r), std::string::npos) << r;
}

// The index leaves and integer operands appear, declared where they are read: one-hot masks
// (n == t0[m]), triangular ones (m < n) and where() conditions on them; every output alone
// parses too, with the declarations it needs.
TEST(RandomEpilogue, GeneratesIndicesAndDeclaredIntegerOperands) {
  evtc::testing::EpilogueGenerator gen(11);
  std::string all;
  size_t declared = 0;
  for (int i = 0; i < 1000; ++i) {
    const evtc::testing::RandomKernel k = gen.next();
    all += k.text();
    ParseOptions p;
    p.operand_dtype = k.kind == evtc::testing::KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
    const Graph g = parse_expression(k.text(), p);
    for (const Node& n : g.nodes())
      if (n.kind == NodeKind::col_vec || n.kind == NodeKind::row_vec) {
        const bool label = n.name == "t0" || n.name == "t1";
        EXPECT_EQ(is_integer(n.dtype), label) << n.name << " in " << k.text();
        declared += label;
      }
    for (size_t o = 0; o < k.outputs.size(); ++o) EXPECT_NO_THROW(parse_expression(k.text_of(o), p)) << k.text_of(o);
  }
  EXPECT_GT(declared, 0u);
  for (const char* term : {"(n == t0[m])", "(m == t1[n])", "where((n ", "where((m ", "input t0[m]: i32\n",
                           "input t1[n]: i64\n", "(m * 0.01)"})
    EXPECT_NE(all.find(term), std::string::npos) << term << " never generated";
  bool triangular = false;
  for (const char* op : {"<", "<=", ">", ">=", "==", "!="})
    triangular |= all.find(fmt::format("(m {} n)", op)) != std::string::npos;
  EXPECT_TRUE(triangular);
}

// The integer mode uses only what the op table marks exact on integers, and integer constants.
TEST(RandomEpilogue, IntegerModeUsesOnlyOpsExactOnIntegers) {
  evtc::testing::GeneratorOptions o;
  o.integers = true;
  evtc::testing::EpilogueGenerator gen(3, o);
  std::set<Op> used;
  std::set<std::string> gated;
  for (int i = 0; i < 2000; ++i) {
    const evtc::testing::RandomKernel k = gen.next();
    ParseOptions p;
    p.operand_dtype = k.kind == evtc::testing::KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
    const Graph g = parse_expression(k.text(), p);
    for (const Node& n : g.nodes()) {
      if (n.kind == NodeKind::compute) {
        used.insert(n.op);
        EXPECT_TRUE(op_info(n.op).exact_on_integers) << op_info(n.op).name << " in " << k.text();
      }
      if (n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::constant)
        EXPECT_EQ(n.value, std::round(n.value)) << k.text();
    }
    for (const auto& f : frontend::gated_function_table())
      if (k.text().find(std::string(f.name) + "(") != std::string::npos) gated.insert(std::string(f.name));
  }
  size_t exact_ops = 0;
  for (const OpInfo& op : op_table()) exact_ops += op.exact_on_integers;
  EXPECT_EQ(used.size(), exact_ops);  // every exact op appears
  EXPECT_EQ(gated, (std::set<std::string>{"gate", "up", "reglu"}));
}

}  // namespace

namespace {
// expression_text writes a graph back in the expression language (the cache listing shows it):
// it parses to the same graph (after the passes, which share equal constants), for every kind of
// random epilogue, before and after the passes.
TEST(ExpressionText, RoundTripsRandomEpilogues) {
  evtc::testing::EpilogueGenerator gen(7);
  for (int i = 0; i < 500; ++i) {
    const evtc::testing::RandomKernel k = gen.next();
    ParseOptions p;
    p.operand_dtype = k.kind == evtc::testing::KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
    for (const Graph& g : {parse_expression(k.text(), p), run_pipeline(parse_expression(k.text(), p))}) {
      const std::string text = expression_text(g);
      ParseOptions back = p;
      Graph again;
      try {
        again = parse_expression(text, back);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what() << "\n" << text << "\nfrom\n" << k.text();
        continue;
      }
      // The same graph up to how constants are shared (one constant node, or one per use).
      EXPECT_EQ(print(run_pipeline(again)), print(run_pipeline(g))) << text << "\nfrom\n" << k.text();
    }
  }
}
}  // namespace
