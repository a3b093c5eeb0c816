#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "evtc/error.hpp"
#include "evtc/graph.hpp"
#include "evtc/ir_text.hpp"

using namespace evtc;

namespace {

Graph w1_graph() {
  Graph g;
  auto acc = g.accum();
  auto bias = g.row_vec("bias", DType::bf16);
  g.store("D", silu(acc + bias), DType::bf16);
  return g;
}

}  // namespace

TEST(Types, RoundToBf16TiesToEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 in bf16: ties go to the even mantissa (1).
  EXPECT_EQ(round_to(DType::bf16, 1.0 + std::ldexp(1.0, -8)), 1.0);
  EXPECT_EQ(round_to(DType::bf16, 1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));
  EXPECT_EQ(round_to(DType::bf16, 3.0), 3.0);
}

TEST(Types, RoundToF16OverflowsAndSubnormals) {
  EXPECT_EQ(round_to(DType::f16, 65504.0), 65504.0);
  EXPECT_TRUE(std::isinf(round_to(DType::f16, 65520.0)));  // halfway to 2^16 rounds up
  EXPECT_EQ(round_to(DType::f16, 65519.0), 65504.0);
  EXPECT_EQ(round_to(DType::f16, std::ldexp(1.0, -24)), std::ldexp(1.0, -24));  // min subnormal
  EXPECT_EQ(round_to(DType::f16, std::ldexp(1.0, -26)), 0.0);
}

TEST(Types, RoundToFp8Saturates) {
  EXPECT_EQ(round_to(DType::f8e4m3, 1000.0), 448.0);
  EXPECT_EQ(round_to(DType::f8e4m3, -1000.0), -448.0);
  EXPECT_EQ(round_to(DType::f8e5m2, 1e9), 57344.0);
  EXPECT_EQ(round_to(DType::f8e4m3, 0.3), 0.3125);  // 0.3 = 1.2*2^-2 -> 1.25*2^-2
  EXPECT_EQ(round_to(DType::f8e4m3, std::ldexp(1.0, -9)), std::ldexp(1.0, -9));  // subnormal
  EXPECT_TRUE(std::isnan(round_to(DType::f8e4m3, std::nan(""))));
}

// The integer dtypes: names (evtc's and PyTorch's), widths, rounding to integers that saturate,
// and the one widening rule that lets them into f32 arithmetic.
TEST(Types, IntegerDtypes) {
  EXPECT_EQ(parse_dtype("i32"), DType::i32);
  EXPECT_EQ(parse_dtype("int64"), DType::i64);
  EXPECT_EQ(torch_dtype_name(DType::i32), "int32");
  EXPECT_EQ(dtype_bytes(DType::i64), 8);
  EXPECT_TRUE(is_integer(DType::i32) && !is_integer(DType::f32));
  EXPECT_EQ(dtype_names().back(), "i64");
  EXPECT_EQ(float_dtype_names(), (std::vector<std::string>{"f32", "f16", "bf16", "f8e4m3", "f8e5m2"}));
  EXPECT_EQ(round_to(DType::i32, 2.5), 2.0);  // ties to even
  EXPECT_EQ(round_to(DType::i32, -3.5), -4.0);
  EXPECT_EQ(round_to(DType::i32, 1e12), 2147483647.0);
  EXPECT_EQ(round_to(DType::i32, -1e12), -2147483648.0);
  EXPECT_EQ(round_to(DType::i64, 1e12), 1e12);
  EXPECT_TRUE(widens_losslessly(DType::i32, DType::f32));   // read as f32, exact below 2^24
  EXPECT_TRUE(widens_losslessly(DType::i64, DType::f32));
  EXPECT_FALSE(widens_losslessly(DType::i32, DType::bf16));
  EXPECT_FALSE(widens_losslessly(DType::f16, DType::i32));  // nothing computes in an integer type
  EXPECT_FALSE(widens_losslessly(DType::i32, DType::i64));
}

TEST(Types, Broadcast) {
  EXPECT_EQ(broadcast(Shape::row, Shape::col), Shape::full);
  EXPECT_EQ(broadcast(Shape::scalar, Shape::row), Shape::row);
  EXPECT_EQ(broadcast(Shape::full, Shape::scalar), Shape::full);
}

TEST(Graph, PrintsCanonicalForm) {
  EXPECT_EQ(print(w1_graph()),
            "%0 = accum : f32[m,n]\n"
            "%1 = row_vec bias : bf16[n]\n"
            "%2 = add %0, %1 : f32[m,n]\n"
            "%3 = silu %2 : f32[m,n]\n"
            "%4 = store D %3 : bf16[m,n]\n");
}

TEST(Graph, InsertionOrderDoesNotChangeThePrint) {
  Graph a;
  {
    auto acc = a.accum();
    auto s = a.col_vec("scale", DType::f32);
    auto b = a.row_vec("bias", DType::bf16);
    auto f = acc * s + b;
    a.store("pre", f, DType::bf16);
    a.store("D", relu(f), DType::bf16);
  }
  Graph b;
  {
    auto bias = b.row_vec("bias", DType::bf16);
    auto s = b.col_vec("scale", DType::f32);
    auto acc = b.accum();
    auto f = acc * s + bias;
    b.store("D", relu(f), DType::bf16);
    b.store("pre", f, DType::bf16);
  }
  EXPECT_EQ(print(a), print(b));
  EXPECT_EQ(graph_hash(a), graph_hash(b));
}

TEST(Graph, RoundTripsThroughTheParser) {
  Graph g;
  auto acc = g.accum();
  auto c = g.source(DType::f16);
  auto alpha = g.param("alpha");
  auto p = g.param("amax_scale", DType::f32, ScalarKind::pointer);
  auto r = g.aux("res", DType::bf16, Layout::col_major);
  auto x = g.compute(Op::leaky_relu, {acc * alpha + c}, {0.2});
  g.store("D", x * p + r, DType::f8e4m3, Layout::col_major);
  g.store("rmax", g.reduce(ReduceAxis::row, ReduceOp::amax, x), DType::f32);
  g.store("total", g.reduce(ReduceAxis::all, ReduceOp::sum, cast(x, DType::bf16)), DType::f32);
  const std::string text = print(g);
  EXPECT_EQ(print(parse_canonical(text)), text);
  EXPECT_NE(text.find("leaky_relu{alpha=0.2}"), std::string::npos);
  EXPECT_NE(text.find("aux res col_major"), std::string::npos);
}

TEST(Graph, HashIsStableAcrossRuns) {
  // Pinned: the hash is the graph part of the kernel cache key, so it must not drift.
  EXPECT_EQ(graph_hash_hex(w1_graph()), graph_hash_hex(parse_canonical(print(w1_graph()))));
  EXPECT_EQ(graph_hash_hex(w1_graph()).size(), 16u);
}

TEST(Graph, LoadsAreDeduplicatedByName) {
  Graph g;
  auto a = g.row_vec("bias", DType::bf16);
  auto b = g.row_vec("bias", DType::bf16);
  EXPECT_EQ(a.id, b.id);
}

TEST(GraphErrors, OperandUsedWithTwoShapes) {
  Graph g;
  g.row_vec("bias", DType::bf16);
  try {
    g.col_vec("bias", DType::bf16);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "operand 'bias' is used as row_vec bf16[n] and as col_vec bf16[m]");
  }
}

TEST(GraphErrors, NarrowingOperandNeedsACast) {
  Graph g;
  auto acc = g.accum();
  try {
    g.compute(Op::relu, {acc}, {}, DType::bf16);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "relu: operand 1 ('acc') is f32 but the op computes in bf16; cast it "
                 "explicitly to round it");
  }
}

TEST(GraphErrors, ReductionResultCannotBeUsed) {
  Graph g;
  auto s = g.reduce(ReduceAxis::all, ReduceOp::sum, g.accum());
  try {
    (void)(s * 2.0);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the reduction 'all_sum(acc)' can only be written to an output"),
              std::string::npos)
        << e.what();
  }
}

TEST(GraphErrors, ReductionNeedsAFullValue) {
  Graph g;
  auto b = g.row_vec("bias", DType::f32);
  try {
    g.reduce(ReduceAxis::row, ReduceOp::sum, b);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "row_sum of 'bias[n]': a reduction takes an [m,n] value, but this one is [n]");
  }
}

TEST(GraphErrors, BroadcastOutputRejected) {
  Graph g;
  auto b = g.row_vec("bias", DType::f32);
  try {
    g.store("D", b * 2.0, DType::bf16);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "output 'D' would be [n] ('mul(bias[n], 2)'): an output must be an [m,n] "
                 "value, a gated [m,n/2] value or a reduction");
  }
}

TEST(GraphErrors, DuplicateOutput) {
  Graph g;
  auto acc = g.accum();
  g.store("D", acc, DType::bf16);
  EXPECT_THROW(g.store("D", acc, DType::f32), UserError);
  EXPECT_THROW(g.row_vec("D", DType::f32), UserError);
}

// --- index leaves and integer operands --------------------------------------------------

TEST(Graph, IndexLeavesAreF32VectorsOnePerAxis) {
  Graph g;
  auto m = g.index(IndexAxis::m);
  auto n = g.index(IndexAxis::n);
  EXPECT_EQ(m.node().shape, Shape::col);
  EXPECT_EQ(n.node().shape, Shape::row);
  EXPECT_EQ(m.node().dtype, DType::f32);
  EXPECT_EQ(g.index(IndexAxis::m).id, m.id);  // like acc, one node per axis
  EXPECT_NE(m.id, n.id);
  auto mask = g.compute(Op::lt, {m, n});
  EXPECT_EQ(mask.node().shape, Shape::full);
  g.store("D", g.accum() * mask, DType::bf16);
  const std::string text = print(g);
  EXPECT_NE(text.find("= index m : f32[m]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("= index n : f32[n]\n"), std::string::npos) << text;
  EXPECT_EQ(print(parse_canonical(text)), text);
}

TEST(GraphErrors, IntegerDtypesOnlyForVectorOperands) {
  Graph g;
  auto acc = g.accum();
  EXPECT_EQ(g.col_vec("t", DType::i32).node().dtype, DType::i32);
  EXPECT_EQ(g.row_vec("q", DType::i64).node().dtype, DType::i64);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string allowed = "integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors";
  EXPECT_NE(message([&] { g.aux("x", DType::i32); }).find("i32 operand 'x[m,n]': " + allowed), std::string::npos);
  EXPECT_NE(message([&] { g.param("k", DType::i64); }).find("i64 scalar 'k': " + allowed), std::string::npos);
  EXPECT_NE(message([&] { g.source(DType::i32); }).find("i32 source matrix C: " + allowed), std::string::npos);
  EXPECT_NE(message([&] { g.store("D", acc, DType::i32); }).find("i32 output 'D': " + allowed), std::string::npos);
  EXPECT_NE(message([&] { g.cast(acc, DType::i64); }).find("i64 cast of 'acc': " + allowed), std::string::npos);
  EXPECT_NE(message([&] { g.compute(Op::add, {acc, acc}, {}, DType::i32); }).find("i32 computation add: " + allowed),
            std::string::npos);
  EXPECT_NE(message([&] { g.constant(3, DType::i32); }).find("i32 constant: " + allowed), std::string::npos);
}

TEST(GraphErrors, MAndNNameNoOperandOrOutput) {
  Graph g;
  auto acc = g.accum();
  try {
    g.col_vec("m", DType::f32);
    ADD_FAILURE() << "an operand named m was accepted";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "operand 'm': 'm' is the row index of the output element and cannot name an operand");
  }
  EXPECT_THROW(g.param("n"), UserError);
  EXPECT_THROW(g.aux("n", DType::bf16), UserError);
  try {
    g.store("n", acc, DType::bf16);
    ADD_FAILURE() << "an output named n was accepted";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "output 'n': 'n' is the column index of the output element and cannot name an output");
  }
  EXPECT_THROW(parse_canonical("%0 = accum : f32[m,n]\n%1 = row_vec m : f32[n]\n"), UserError);
}

TEST(CanonicalParser, IndexNeedsItsAxis) {
  try {
    parse_canonical("%0 = index k : f32[m]\n");
    ADD_FAILURE() << "index k was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("expected m or n after 'index', got 'k'"), std::string::npos) << e.what();
  }
  // The type must be the axis's: m is [m].
  EXPECT_THROW(parse_canonical("%0 = index m : f32[n]\n"), UserError);
}

TEST(CanonicalParser, ReportsLineAndColumn) {
  try {
    parse_canonical("%0 = accum : f32[m,n]\n%1 = frobnicate %0 : f32[m,n]\n");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "2:6: unknown operation 'frobnicate'\n"
                 "  %1 = frobnicate %0 : f32[m,n]\n"
                 "       ^");
  }
}

TEST(CanonicalParser, AnUnknownReductionListsTheTablesReductions) {
  for (const char* reduce : {"reduce.row.mean", "reduce.diag.sum"}) {
    try {
      (void)parse_canonical(std::string("%0 = accum : f32[m,n]\n%1 = ") + reduce + " %0 : f32[m]\n");
      ADD_FAILURE() << reduce << " parsed";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("expected reduce.{row,col,all}.{sum,max,min,amax,logsumexp}"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CanonicalParser, RejectsWrongType) {
  EXPECT_THROW(parse_canonical("%0 = accum : bf16[m,n]\n"), UserError);
  EXPECT_THROW(parse_canonical("%0 = accum : f32[m,n]\n%1 = relu %5 : f32[m,n]\n"), UserError);
}
