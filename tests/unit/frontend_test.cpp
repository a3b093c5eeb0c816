// Tests of the expression language: the graphs it builds (compared with the same graphs
// built through the C++ builder), its precedence rules, and the exact text of every
// diagnostic it gives.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli_runner.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "frontend/functions.hpp"

using namespace evtc;
namespace fs = std::filesystem;

namespace {

std::string parsed(std::string_view source, const ParseOptions& options = {}) {
  return print(parse_expression(source, options));
}

// The builder's graph, printed. `build` adds the outputs.
template <typename F>
std::string built(F&& build) {
  Graph g;
  build(g);
  return print(g);
}

}  // namespace

// --- graphs -----------------------------------------------------------------------------

TEST(Expression, W1MatchesTheBuilder) {
  EXPECT_EQ(parsed("out D: bf16 = silu(acc + bias[n])"), built([](Graph& g) {
              g.store("D", silu(g.accum() + g.row_vec("bias", DType::bf16)), DType::bf16);
            }));
}

TEST(Expression, OperandKindsAndDefaultDtypes) {
  ParseOptions o;
  o.operand_dtype = DType::f16;
  o.output_dtype = DType::f32;
  EXPECT_EQ(parsed("out D = acc * alpha + bias[n] + scale[m] + res[m,n] + C + 0.5", o),
            built([](Graph& g) {
              auto v = g.accum() * g.param("alpha") + g.row_vec("bias", DType::f16) +
                       g.col_vec("scale", DType::f16) + g.aux("res", DType::f16) +
                       g.source(DType::f16) + 0.5;
              g.store("D", v, DType::f32);
            }));
}

TEST(Expression, DeclarationsSetDtypesPointersAndLayouts) {
  EXPECT_EQ(parsed("input bias[n]: f32\n"
                   "input res[m,n]: f16 col_major\n"
                   "input C: f8e4m3\n"
                   "input amax_scale: f32 ptr\n"
                   "input alpha: bf16\n"
                   "out D: f8e4m3 col_major = (acc + bias + res + C) * amax_scale * alpha"),
            built([](Graph& g) {
              auto v = (g.accum() + g.row_vec("bias", DType::f32) +
                        g.aux("res", DType::f16, Layout::col_major) + g.source(DType::f8e4m3)) *
                       g.param("amax_scale", DType::f32, ScalarKind::pointer) *
                       g.param("alpha", DType::bf16);
              g.store("D", v, DType::f8e4m3, Layout::col_major);
            }));
}

TEST(Expression, DeclaredOperandMayBeWrittenWithItsIndex) {
  EXPECT_EQ(parsed("input bias[n]: f32; out D = acc + bias[n] + bias"),
            parsed("input bias[n]: f32; out D = acc + bias + bias"));
}

TEST(Expression, DeclarationWithoutDtypeUsesTheDefaults) {
  EXPECT_EQ(parsed("input bias[n]\ninput alpha\nout D = acc * alpha + bias"),
            parsed("out D = acc * alpha + bias[n]"));
}

TEST(Expression, CommutativeOperandsAreNotReordered) {
  EXPECT_EQ(parsed("out D = bias[n] + acc"), built([](Graph& g) {
              g.store("D", g.row_vec("bias", DType::bf16) + g.accum(), DType::bf16);
            }));
  EXPECT_NE(parsed("out D = bias[n] + acc"), parsed("out D = acc + bias[n]"));
}

TEST(Expression, NamedIntermediatesAreSharedNodes) {
  EXPECT_EQ(parsed("f = acc + bias[n]\nout D = f * sigmoid(f)"), built([](Graph& g) {
              auto f = g.accum() + g.row_vec("bias", DType::bf16);
              g.store("D", f * sigmoid(f), DType::bf16);
            }));
}

TEST(Expression, OutputsAreUsableByNameWithTheirUnroundedValue) {
  EXPECT_EQ(parsed("out pre: bf16 = acc + bias[n]\nout D: f8e4m3 = relu(pre)\nout d_amax = amax(D)"),
            built([](Graph& g) {
              auto pre = g.accum() + g.row_vec("bias", DType::bf16);
              g.store("pre", pre, DType::bf16);
              auto d = relu(pre);
              g.store("D", d, DType::f8e4m3);
              g.store("d_amax", g.reduce(ReduceAxis::all, ReduceOp::amax, d), DType::f32);
            }));
}

TEST(Expression, IndexLeavesAndIntegerOperandsMatchTheBuilder) {
  EXPECT_EQ(parsed("input t[m]: i32\ninput q[n]: int64\nout D = where(n == t[m], acc, 0) + m * (n < q[n])"),
            built([](Graph& g) {
              auto n = g.index(IndexAxis::n);
              auto hit = g.compute(Op::eq, {n, g.col_vec("t", DType::i32)});
              auto picked = g.compute(Op::where, {hit, g.accum(), g.constant(0)});
              auto below = g.compute(Op::lt, {n, g.row_vec("q", DType::i64)});
              g.store("D", picked + g.index(IndexAxis::m) * below, DType::bf16);
            }));
  // `m` alone is the index, not a scalar parameter named m.
  EXPECT_EQ(parsed("out D = acc * m"), built([](Graph& g) {
              g.store("D", g.accum() * g.index(IndexAxis::m), DType::bf16);
            }));
}

TEST(Expression, ReductionsDefaultToF32Outputs) {
  EXPECT_EQ(parsed("out s = sum(acc); out r: bf16 = row_max(acc); out c = col_amax(acc)"),
            built([](Graph& g) {
              auto acc = g.accum();
              g.store("s", g.reduce(ReduceAxis::all, ReduceOp::sum, acc), DType::f32);
              g.store("r", g.reduce(ReduceAxis::row, ReduceOp::max, acc), DType::bf16);
              g.store("c", g.reduce(ReduceAxis::col, ReduceOp::amax, acc), DType::f32);
            }));
}

TEST(Expression, MaxAndMinWithOneArgumentReduceWithTwoCompare) {
  EXPECT_EQ(parsed("out a = max(acc); out b = min(acc); out D = max(acc, 0) + min(acc, 6)"),
            built([](Graph& g) {
              auto acc = g.accum();
              g.store("a", g.reduce(ReduceAxis::all, ReduceOp::max, acc), DType::f32);
              g.store("b", g.reduce(ReduceAxis::all, ReduceOp::min, acc), DType::f32);
              g.store("D", max(acc, g.constant(0)) + min(acc, g.constant(6)), DType::bf16);
            }));
}

TEST(Expression, Casts) {
  EXPECT_EQ(parsed("out D: f8e5m2 = f8e5m2(f32(f16(bf16(acc))) * 2)"), built([](Graph& g) {
              auto x = cast(cast(cast(g.accum(), DType::bf16), DType::f16), DType::f32);
              g.store("D", cast(x * 2.0, DType::f8e5m2), DType::f8e5m2);
            }));
}

TEST(Expression, OpParametersArePositionalOrNamed) {
  const std::string expected = built([](Graph& g) {
    g.store("D", g.compute(Op::leaky_relu, {g.accum()}, {0.2}), DType::bf16);
  });
  EXPECT_EQ(parsed("out D = leaky_relu(acc, 0.2)"), expected);
  EXPECT_EQ(parsed("out D = leaky_relu(acc, alpha=0.2)"), expected);
  EXPECT_EQ(parsed("out D = leaky_relu(acc)"), built([](Graph& g) {
              g.store("D", g.compute(Op::leaky_relu, {g.accum()}), DType::bf16);
            }));
  EXPECT_EQ(parsed("out D = leaky_relu(acc, -0.5)"), built([](Graph& g) {
              g.store("D", g.compute(Op::leaky_relu, {g.accum()}, {-0.5}), DType::bf16);
            }));
}

TEST(Expression, EveryOpIsCallableByNameOrWrittenWithItsOperator) {
  for (const OpInfo& info : op_table()) {
    std::string args = "acc";
    for (int k = 1; k < info.arity; ++k) args += ", acc";
    const std::string call = info.comparison ? fmt::format("acc {} 1", info.infix)
                                             : std::string(info.name) + "(" + args + ")";
    if (info.comparison)
      EXPECT_THROW(parse_expression("out D = " + std::string(info.name) + "(" + args + ")"), ParseError)
          << info.name << " is an operator, not a function";
    const Graph g = parse_expression("out D = " + call);
    const Node& value = g.node(g.node(g.outputs().at(0)).inputs.at(0));
    EXPECT_EQ(value.kind, NodeKind::compute) << info.name;
    EXPECT_EQ(value.op, info.op) << info.name;
  }
}

TEST(Expression, CommentsSemicolonsAndLinesInsideParentheses) {
  EXPECT_EQ(parsed("# a comment\n"
                   "f = acc + bias[n]; g = f * 2   # trailing comment\n"
                   "\n"
                   "out D = clamp(\n"
                   "    g,   # inside a call\n"
                   "    -7, (7\n"
                   "    ))\n"),
            built([](Graph& g) {
              auto f = g.accum() + g.row_vec("bias", DType::bf16);
              g.store("D", clamp(f * 2.0, -7, 7), DType::bf16);
            }));
}

TEST(Expression, NumberSpellings) {
  EXPECT_EQ(parsed("out D = acc * 0.5 + acc * .5 + acc * 5e-1 + acc * 5.E-1"),
            built([](Graph& g) {
              auto acc = g.accum();
              g.store("D", acc * 0.5 + acc * 0.5 + acc * 0.5 + acc * 0.5, DType::bf16);
            }));
  EXPECT_EQ(parsed("out D = acc * 2. + 2.5E+4"), built([](Graph& g) {
              g.store("D", g.accum() * 2.0 + 2.5e4, DType::bf16);
            }));
}

// The C++ equivalent given in docs/expressions.md.
TEST(Expression, DocumentedBuilderEquivalent) {
  const Graph parsed_graph = parse_expression(
      "input C: f16\n"
      "f = alpha * acc + beta * C\n"
      "out pre: bf16 = f\n"
      "out D: bf16 = gelu_tanh(f)\n"
      "out d_amax = amax(D)\n");
  evtc::Graph g;
  auto acc = g.accum();
  auto f = g.param("alpha") * acc + g.param("beta") * g.source(evtc::DType::f16);
  g.store("pre", f, evtc::DType::bf16);
  auto d = evtc::gelu_tanh(f);
  g.store("D", d, evtc::DType::bf16);
  g.store("d_amax", g.reduce(evtc::ReduceAxis::all, evtc::ReduceOp::amax, d), evtc::DType::f32);
  EXPECT_EQ(print(parsed_graph), print(g));
  EXPECT_EQ(graph_hash(parsed_graph), graph_hash(g));
}

TEST(Expression, W7BceLoss) {
  EXPECT_EQ(parsed("f = acc + bias[n]\n"
                   "out loss = sum((C - 1) * f + log(clamp(sigmoid(f), 1e-3, 0.999)))"),
            built([](Graph& g) {
              auto f = g.accum() + g.row_vec("bias", DType::bf16);
              auto c = g.source(DType::bf16);
              auto v = (c - 1.0) * f + log(clamp(sigmoid(f), 1e-3, 0.999));
              g.store("loss", g.reduce(ReduceAxis::all, ReduceOp::sum, v), DType::f32);
            }));
}

TEST(Expression, CanonicalFormRoundTrips) {
  const Graph g = parse_expression(
      "input amax_scale: f32 ptr\nf = gelu(acc * sa[m] * sb[n] + C)\n"
      "out D: f8e4m3 = f8e4m3(f * amax_scale)\nout r = row_amax(f)");
  EXPECT_EQ(print(parse_canonical(print(g))), print(g));
}

// --- precedence and associativity ---------------------------------------------------------

namespace {

// The accumulator and scalar parameters x and y, for precedence tests. The parameters are
// made on first use (later uses get the same node), so unused ones do not appear.
struct Operands {
  explicit Operands(Graph& graph) : g(graph), acc(graph.accum()) {}
  Value x() { return g.param("x"); }
  Value y() { return g.param("y"); }
  Graph& g;
  Value acc;
};

std::string built_d(Value (*f)(Operands&)) {
  return built([f](Graph& g) {
    Operands o(g);
    g.store("D", f(o), DType::bf16);
  });
}

Value pow(Value a, Value b) { return a.graph->compute(Op::pow, {a, b}); }

}  // namespace

TEST(Precedence, ProductBeforeSum) {
  EXPECT_EQ(parsed("out D = acc + x * y"), built_d([](Operands& o) { return o.acc + o.x() * o.y(); }));
  EXPECT_EQ(parsed("out D = acc * x + y"), built_d([](Operands& o) { return o.acc * o.x() + o.y(); }));
  EXPECT_EQ(parsed("out D = acc - x / y"), built_d([](Operands& o) { return o.acc - o.x() / o.y(); }));
}

TEST(Precedence, ParenthesesGroup) {
  EXPECT_EQ(parsed("out D = (acc + x) * y"),
            built_d([](Operands& o) { return (o.acc + o.x()) * o.y(); }));
  EXPECT_EQ(parsed("out D = acc - (x - y)"),
            built_d([](Operands& o) { return o.acc - (o.x() - o.y()); }));
}

TEST(Precedence, SubtractionAndDivisionAreLeftAssociative) {
  EXPECT_EQ(parsed("out D = acc - x - y"), built_d([](Operands& o) { return (o.acc - o.x()) - o.y(); }));
  EXPECT_EQ(parsed("out D = acc / x / y"), built_d([](Operands& o) { return (o.acc / o.x()) / o.y(); }));
  EXPECT_EQ(parsed("out D = acc / x * y"), built_d([](Operands& o) { return (o.acc / o.x()) * o.y(); }));
  EXPECT_EQ(parsed("out D = acc - x + y"), built_d([](Operands& o) { return (o.acc - o.x()) + o.y(); }));
}

TEST(Precedence, PowerIsRightAssociative) {
  EXPECT_EQ(parsed("out D = acc ** x ** y"),
            built_d([](Operands& o) { return pow(o.acc, pow(o.x(), o.y())); }));
}

TEST(Precedence, PowerBindsTighterThanUnaryMinus) {
  EXPECT_EQ(parsed("out D = -acc ** x"), built_d([](Operands& o) { return -pow(o.acc, o.x()); }));
  // A minus sign before a literal that is raised to a power is not part of the literal.
  EXPECT_EQ(parsed("out D = -2 ** acc"), built_d([](Operands& o) {
              return -pow(o.acc.graph->constant(2), o.acc);
            }));
}

TEST(Precedence, PowerBindsTighterThanProduct) {
  EXPECT_EQ(parsed("out D = x * acc ** y"), built_d([](Operands& o) { return o.x() * pow(o.acc, o.y()); }));
  EXPECT_EQ(parsed("out D = acc ** x * y"), built_d([](Operands& o) { return pow(o.acc, o.x()) * o.y(); }));
}

TEST(Precedence, UnaryMinusInExponentAndOperands) {
  EXPECT_EQ(parsed("out D = acc ** -x"), built_d([](Operands& o) { return pow(o.acc, -o.x()); }));
  EXPECT_EQ(parsed("out D = acc * -x"), built_d([](Operands& o) { return o.acc * -o.x(); }));
  EXPECT_EQ(parsed("out D = - -acc"), built_d([](Operands& o) { return -(-o.acc); }));
  EXPECT_EQ(parsed("out D = -acc * x"), built_d([](Operands& o) { return (-o.acc) * o.x(); }));
  EXPECT_EQ(parsed("out D = +acc"), built_d([](Operands& o) { return o.acc; }));
}

TEST(Precedence, MinusOnALiteralIsPartOfTheConstant) {
  EXPECT_EQ(parsed("out D = acc * -2"), built_d([](Operands& o) { return o.acc * -2.0; }));
  EXPECT_EQ(parsed("out D = acc - -2"), built_d([](Operands& o) { return o.acc - -2.0; }));
}

// --- diagnostics ------------------------------------------------------------------------

namespace {

struct ErrorCase {
  const char* name;
  const char* source;
  const char* message;  // the whole what(): location, message, source line and caret
};

// One case per diagnostic a user can meet.
const ErrorCase kErrorCases[] = {
    {"UnexpectedCharacter", "out D = acc @ b",
         "expr:1:13: error: unexpected character '@'\n"
         "  out D = acc @ b\n"
         "              ^"},
    {"CaretIsNotPower", "out D = acc ^ 2",
         "expr:1:13: error: unexpected character '^'; write a power as x ** y\n"
         "  out D = acc ^ 2\n"
         "              ^"},
    {"MalformedNumber", "out D = acc * 1.2.3",
         "expr:1:15: error: malformed number '1.2.3'\n"
         "  out D = acc * 1.2.3\n"
         "                ^"},
    {"NumberOutOfRange", "out D = acc * 1e999",
         "expr:1:15: error: the number '1e999' is out of range\n"
         "  out D = acc * 1e999\n"
         "                ^"},
    {"ConstantTooLargeForF32", "out D = acc * 1e39",
         "expr:1:15: error: the constant 1e39 is too large for f32\n"
         "  out D = acc * 1e39\n"
         "                ^"},
    {"UnexpectedTokenStartsStatement", "out D = acc\n) + 1",
         "expr:2:1: error: unexpected ')' at the start of a statement\n"
         "  ) + 1\n"
         "  ^"},
    {"OnlyNamesAreAssigned", "bias[n] = acc",
         "expr:1:9: error: only a name can be assigned to, as in `NAME = ...`\n"
         "  bias[n] = acc\n"
         "          ^"},
    {"ValueNotStored", "silu(acc)",
         "expr:1:1: error: this value is not stored anywhere: write `out D = ...` to make it an output, or `NAME = ...` to name it\n"
         "  silu(acc)\n"
         "  ^"},
    {"TextAfterExpression", "out D = acc bias",
         "expr:1:13: error: unexpected 'bias' after the expression: expected an operator, ';' or a new line\n"
         "  out D = acc bias\n"
         "              ^"},
    {"UnbalancedClosingParenthesis", "out D = acc)",
         "expr:1:12: error: unexpected ')' after the expression: expected an operator, ';' or a new line\n"
         "  out D = acc)\n"
         "             ^"},
    {"TextAfterDeclaration", "input bias[n]: f32 = 1",
         "expr:1:20: error: unexpected '=' after the declaration of an input: expected ';' or a new line\n"
         "  input bias[n]: f32 = 1\n"
         "                     ^"},
    {"InputWithoutName", "input [n]",
         "expr:1:7: error: expected an operand name after 'input'\n"
         "  input [n]\n"
         "        ^"},
    {"DeclarationIndexUnclosed", "input bias[n: f32",
         "expr:1:13: error: expected ']' after the index of 'bias'\n"
         "  input bias[n: f32\n"
         "              ^"},
    {"OutWithoutName", "out = acc",
         "expr:1:5: error: expected an output name after 'out'\n"
         "  out = acc\n"
         "      ^"},
    {"OutputWithoutValue", "out D: bf16\nout E = acc",
         "expr:1:12: error: expected '=' and the value of output 'D'\n"
         "  out D: bf16\n"
         "             ^"},
    {"NamedValueWithDtype", "D: bf16 = acc",
         "expr:1:2: error: a named value has no dtype: write `out D: DTYPE = ...` to make 'D' an output, or round the value with a cast such as bf16(...)\n"
         "  D: bf16 = acc\n"
         "   ^"},
    {"MissingDtype", "out D: = acc",
         "expr:1:8: error: expected a dtype after ':'\n"
         "  out D: = acc\n"
         "         ^"},
    {"UnknownDtype", "out D: bf61 = acc",
         "expr:1:8: error: unknown dtype 'bf61' (expected f32, f16, bf16, f8e4m3, f8e5m2, i32 or i64)\n"
         "  out D: bf61 = acc\n"
         "         ^"},
    {"IndexNameDeclared", "input m[n]: i32\nout D = acc",
         "expr:1:7: error: 'm' is the row index of the output element; choose another name\n"
         "  input m[n]: i32\n"
         "        ^"},
    {"IndexNameOutput", "out n = row_sum(acc)",
         "expr:1:5: error: 'n' is the column index of the output element; choose another name\n"
         "  out n = row_sum(acc)\n"
         "      ^"},
    {"IndexNameAssigned", "n = acc\nout D = n",
         "expr:1:1: error: 'n' is the column index of the output element; choose another name\n"
         "  n = acc\n"
         "  ^"},
    {"IndexWithIndex", "out D = acc + n[m]",
         "expr:1:15: error: 'n' takes no index: it is the column index of the output element, always [n]\n"
         "  out D = acc + n[m]\n"
         "                ^"},
    {"IndexAfterGate", "out y: bf16 = swiglu(acc) * (n < 5)",
         "expr:1:27: error: mul: 'mul(silu(gate(...)), up(acc))' is a gated [m,n/2] value but 'lt(n, 5)' is [n]: a gated "
         "value only combines with scalars, [m] vectors and other gated values (apply [n] and [m,n] operands before "
         "gate()/up())\n"
         "  out y: bf16 = swiglu(acc) * (n < 5)\n"
         "                            ^"},
    {"IntegerOutput", "out D: i32 = acc",
         "expr:1:14: error: i32 output 'D': integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors (such as `input t[m]: i32`), whose values are read as f32 numbers\n"
         "  out D: i32 = acc\n"
         "               ^"},
    {"IntegerCast", "out D = i64(acc)",
         "expr:1:9: error: i64 cast of 'acc': integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors (such as `input t[m]: i32`), whose values are read as f32 numbers\n"
         "  out D = i64(acc)\n"
         "          ^"},
    {"IntegerMatrixOperand", "input t[m,n]: i32\nout D = acc * t",
         "expr:2:15: error: i32 operand 't[m,n]': integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors (such as `input t[m]: i32`), whose values are read as f32 numbers\n"
         "  out D = acc * t\n"
         "                ^"},
    {"IntegerScalar", "input k: int64\nout D = acc * k",
         "expr:2:15: error: i64 scalar 'k': integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors (such as `input t[m]: i32`), whose values are read as f32 numbers\n"
         "  out D = acc * k\n"
         "                ^"},
    {"IntegerSource", "input C: int32\nout D = acc + C",
         "expr:2:15: error: i32 source matrix C: integer dtypes (i32, i64) are allowed only for [m] and [n] input vectors (such as `input t[m]: i32`), whose values are read as f32 numbers\n"
         "  out D = acc + C\n"
         "                ^"},
    {"ModifierGivenTwice", "input s: f32 ptr ptr",
         "expr:1:18: error: 'ptr' is given twice\n"
         "  input s: f32 ptr ptr\n"
         "                   ^"},
    {"UnknownDeclarationModifier", "input s: f32 pointer",
         "expr:1:14: error: unexpected 'pointer' after the dtype: expected 'ptr', 'col_major' or the end of the declaration\n"
         "  input s: f32 pointer\n"
         "               ^"},
    {"OutputByPointer", "out D: bf16 ptr = acc",
         "expr:1:13: error: an output cannot be passed by pointer: 'ptr' is for scalar inputs\n"
         "  out D: bf16 ptr = acc\n"
         "              ^"},
    {"UnknownOutputModifier", "out D: bf16 fast = acc",
         "expr:1:13: error: unexpected 'fast' after the dtype: expected 'col_major' or '='\n"
         "  out D: bf16 fast = acc\n"
         "              ^"},
    {"TabsKeepTheCaretAligned", "out D =\tacc\t@ b",
         "expr:1:13: error: unexpected character '@'\n"
         "  out D =\tacc\t@ b\n"
         "         \t   \t^"},
    {"CrlfLineEndings", "f = acc\r\nout D = f +\r\n",
         "expr:2:12: error: expected an expression after '+'\n"
         "  out D = f +\n"
         "             ^"},
    {"MissingOperandAtEndOfLine", "out D = acc +",
         "expr:1:14: error: expected an expression after '+'\n"
         "  out D = acc +\n"
         "               ^"},
    {"MissingOperandBeforeParenthesis", "out D = silu(acc * )",
         "expr:1:20: error: expected an expression after '*'\n"
         "  out D = silu(acc * )\n"
         "                     ^"},
    {"MissingArgument", "out D = clamp(acc, , 1)",
         "expr:1:20: error: expected an expression as argument 2 of clamp\n"
         "  out D = clamp(acc, , 1)\n"
         "                     ^"},
    {"MissingValueAfterEquals", "f =",
         "expr:1:4: error: expected an expression after '='\n"
         "  f =\n"
         "     ^"},
    {"KeywordInExpression", "out D = acc + out",
         "expr:1:15: error: 'out' is a keyword: it can only start a statement\n"
         "  out D = acc + out\n"
         "                ^"},
    {"UnclosedIndex", "out D = acc + bias[n",
         "expr:1:21: error: expected ']' after the index of 'bias'\n"
         "  out D = acc + bias[n\n"
         "                      ^"},
    {"UnclosedParenthesis", "out D = (acc + 1\nout E = acc",
         "expr:1:17: error: expected ')' to close the '(' at 1:9\n"
         "  out D = (acc + 1\n"
         "                  ^"},
    {"UnclosedCall", "out D = silu(acc + bias[n]",
         "expr:1:27: error: expected ')' after the arguments of silu\n"
         "  out D = silu(acc + bias[n]\n"
         "                            ^"},
    {"UnclosedCallAcrossLines", "out D = silu(acc\n  + bias[n]\nout E = acc",
         "expr:2:12: error: expected ')' after the arguments of silu\n"
         "    + bias[n]\n"
         "             ^"},
    {"BadIndex", "out D = bias[k]",
         "expr:1:14: error: expected m, n or m,n in the index of 'bias' (bias[n]: a row vector of length N, bias[m]: a column vector of length M, bias[m,n]: an M×N matrix)\n"
         "  out D = bias[k]\n"
         "               ^"},
    {"TransposedIndex", "out D = res[n,m]",
         "expr:1:13: error: write the index of an M×N operand as res[m,n]\n"
         "  out D = res[n,m]\n"
         "              ^"},
    {"IncompleteFullIndex", "out D = res[m,]",
         "expr:1:15: error: expected n after 'm,' in the index of 'res'\n"
         "  out D = res[m,]\n"
         "                ^"},
    {"NoOutput", "f = acc + bias[n]",
         "expr:1:18: error: the expression defines no output: add `out D = ...`\n"
         "  f = acc + bias[n]\n"
         "                   ^"},
    {"EmptySource", "",
         "expr:1:1: error: the expression defines no output: add `out D = ...`\n"
         "  \n"
         "  ^"},
    {"AccAsName", "acc = 1",
         "expr:1:1: error: 'acc' is the GEMM accumulator; choose another name\n"
         "  acc = 1\n"
         "  ^"},
    {"CAsOutputName", "out C = acc",
         "expr:1:5: error: 'C' is the GEMM's source matrix; choose another name\n"
         "  out C = acc\n"
         "      ^"},
    {"FunctionNameAsName", "silu = acc",
         "expr:1:1: error: 'silu' is the name of a function; choose another name\n"
         "  silu = acc\n"
         "  ^"},
    {"Redefinition", "f = acc\nf = acc * 2",
         "expr:2:1: error: 'f' is already defined at 1:1\n"
         "  f = acc * 2\n"
         "  ^"},
    {"OutputDefinedTwice", "out D = acc; out D = acc",
         "expr:1:18: error: 'D' is already defined at 1:5\n"
         "  out D = acc; out D = acc\n"
         "                   ^"},
    {"DeclaredTwice", "input bias[n]: f32\ninput bias[n]: f16",
         "expr:2:7: error: 'bias' is already declared as an input at 1:7\n"
         "  input bias[n]: f16\n"
         "        ^"},
    {"DeclaredAfterUse", "out D = acc + bias[n]\ninput bias[n]: f32",
         "expr:2:7: error: 'bias' is declared after its first use at 1:15: put `input` declarations before the statements that use them\n"
         "  input bias[n]: f32\n"
         "        ^"},
    {"NameAlreadyAnOperand", "out D = acc * s\ns = 2",
         "expr:2:1: error: 's' is already used as an input operand at 1:15; choose another name\n"
         "  s = 2\n"
         "  ^"},
    {"SelfReference", "s = acc * s",
         "expr:1:1: error: 's' is already used as an input operand at 1:11; choose another name\n"
         "  s = acc * s\n"
         "  ^"},
    {"SourceIsAlwaysFull", "input C[n]: f16",
         "expr:1:8: error: the source matrix C is always [m,n]\n"
         "  input C[n]: f16\n"
         "         ^"},
    {"PointerNeedsScalar", "input bias[n]: f32 ptr",
         "expr:1:20: error: only a scalar input can be passed by pointer, but 'bias' is [n]\n"
         "  input bias[n]: f32 ptr\n"
         "                     ^"},
    {"SourceHasNoLayout", "input C: f16 col_major",
         "expr:1:14: error: the layout of C is given when the kernel is run, not here\n"
         "  input C: f16 col_major\n"
         "               ^"},
    {"LayoutNeedsFullInput", "input bias[n]: f32 col_major",
         "expr:1:20: error: only an [m,n] input has a layout, but 'bias' is [n]\n"
         "  input bias[n]: f32 col_major\n"
         "                     ^"},
    {"ReductionOutputHasNoLayout", "out s: f32 col_major = sum(acc)",
         "expr:1:12: error: the output of a reduction has no layout\n"
         "  out s: f32 col_major = sum(acc)\n"
         "             ^"},
    {"OutputMustBeFull", "out D = bias[n] * 2",
         "expr:1:9: error: output 'D' would be [n] ('mul(bias[n], 2)'): an output must be an [m,n] value, a gated [m,n/2] value or a reduction\n"
         "  out D = bias[n] * 2\n"
         "          ^"},
    {"ReductionCallUsed", "out s = 2 * sum(acc)",
         "expr:1:13: error: sum(...) is a reduction: its result can only be written to an output (`out NAME = sum(...)`), since it is complete only after the whole kernel has run\n"
         "  out s = 2 * sum(acc)\n"
         "              ^"},
    {"ReductionNameUsed", "s = row_sum(acc)\nout D = acc / s",
         "expr:2:15: error: 's' is a reduction (row_sum): its result can only be written to an output, since it is complete only after the whole kernel has run\n"
         "  out D = acc / s\n"
         "                ^"},
    {"FunctionUsedAsValue", "out D = silu",
         "expr:1:9: error: 'silu' is a function: call it as silu(...)\n"
         "  out D = silu\n"
         "          ^"},
    {"AccIndexed", "out D = acc[m,n]",
         "expr:1:9: error: 'acc' takes no index: the accumulator is always [m,n]\n"
         "  out D = acc[m,n]\n"
         "          ^"},
    {"SourceIndexed", "out D = C[m,n]",
         "expr:1:9: error: 'C' takes no index: the source matrix is always [m,n]\n"
         "  out D = C[m,n]\n"
         "          ^"},
    {"NamedValueIndexed", "f = acc\nout D = f[m,n]",
         "expr:2:9: error: 'f' is a named value, not an input operand: write f without an index\n"
         "  out D = f[m,n]\n"
         "          ^"},
    {"DeclaredShapeMismatch", "input bias[n]: f32\nout D = acc + bias[m]",
         "expr:2:15: error: 'bias' is declared as bias[n] at 1:7, but used here as bias[m]\n"
         "  out D = acc + bias[m]\n"
         "                ^"},
    {"DeclaredScalarIndexed", "input alpha: f32\nout D = acc * alpha[m]",
         "expr:2:15: error: 'alpha' is declared as a scalar at 1:7, but used here as alpha[m]\n"
         "  out D = acc * alpha[m]\n"
         "                ^"},
    {"OperandUsedWithTwoShapes", "out D = acc + bias[n] * bias[m]",
         "expr:1:25: error: operand 'bias' is used as row_vec bf16[n] and as col_vec bf16[m]\n"
         "  out D = acc + bias[n] * bias[m]\n"
         "                          ^"},
    {"ScalarThenVector", "out D = acc * s + s[n]",
         "expr:1:19: error: operand 's' is used as scalar f32 and as row_vec bf16[n]\n"
         "  out D = acc * s + s[n]\n"
         "                    ^"},
    {"WrongArity", "out D = silu(acc, acc)",
         "expr:1:19: error: silu takes 1 argument, got 2\n"
         "  out D = silu(acc, acc)\n"
         "                    ^"},
    {"TooFewArguments", "out D = clamp(acc, 0)",
         "expr:1:21: error: clamp takes 3 arguments, got 2\n"
         "  out D = clamp(acc, 0)\n"
         "                      ^"},
    {"ArityWithParameter", "out D = leaky_relu(acc, 0.2, 1)",
         "expr:1:30: error: leaky_relu takes 1 argument and an optional parameter (alpha), got 3\n"
         "  out D = leaky_relu(acc, 0.2, 1)\n"
         "                               ^"},
    {"MaxArity", "out D = max(acc, 1, 2)",
         "expr:1:21: error: max takes 1 argument (a reduction over the whole matrix) or 2 (the elementwise maximum), got 3\n"
         "  out D = max(acc, 1, 2)\n"
         "                      ^"},
    {"ReductionArity", "out s = row_sum(acc, acc)",
         "expr:1:22: error: row_sum takes 1 argument, got 2\n"
         "  out s = row_sum(acc, acc)\n"
         "                       ^"},
    {"CastArity", "out D = bf16()",
         "expr:1:14: error: bf16 takes 1 argument, got 0\n"
         "  out D = bf16()\n"
         "               ^"},
    {"PositionalAfterNamed", "out D = leaky_relu(alpha=0.2, acc)",
         "expr:1:31: error: a positional argument cannot follow a named parameter\n"
         "  out D = leaky_relu(alpha=0.2, acc)\n"
         "                                ^"},
    {"UnknownFunctionSuggestion", "out D = slu(acc)",
         "expr:1:9: error: unknown function 'slu'; did you mean 'silu'?\n"
         "  out D = slu(acc)\n"
         "          ^"},
    {"UnknownFunctionNoSuggestion", "out D = frobnicate(acc)",
         "expr:1:9: error: unknown function 'frobnicate'\n"
         "  out D = frobnicate(acc)\n"
         "          ^"},
    {"ValueCalled", "f = acc\nout D = f(acc)",
         "expr:2:9: error: 'f' is a value, not a function\n"
         "  out D = f(acc)\n"
         "          ^"},
    {"NoParameters", "out D = silu(acc, alpha=1)",
         "expr:1:19: error: silu has no parameters\n"
         "  out D = silu(acc, alpha=1)\n"
         "                    ^"},
    {"UnknownParameter", "out D = leaky_relu(acc, beta=0.2)",
         "expr:1:25: error: leaky_relu has no parameter 'beta' (its parameter is alpha)\n"
         "  out D = leaky_relu(acc, beta=0.2)\n"
         "                          ^"},
    {"ParameterGivenTwice", "out D = leaky_relu(acc, 0.2, alpha=0.3)",
         "expr:1:30: error: the parameter alpha of leaky_relu is given twice\n"
         "  out D = leaky_relu(acc, 0.2, alpha=0.3)\n"
         "                               ^"},
    {"ParameterNotANumber", "out D = leaky_relu(acc, alpha=s)",
         "expr:1:31: error: the parameter alpha of leaky_relu must be a number\n"
         "  out D = leaky_relu(acc, alpha=s)\n"
         "                                ^"},
    {"ReductionOfVector", "out s = row_sum(bias[n])",
         "expr:1:9: error: row_sum reduces an [m,n] value, but its argument 'bias[n]' is [n]\n"
         "  out s = row_sum(bias[n])\n"
         "          ^"},
    {"ReductionHasNoParameters", "out s = sum(acc, axis=1)",
         "expr:1:18: error: sum has no parameters\n"
         "  out s = sum(acc, axis=1)\n"
         "                   ^"},
};

class Diagnostic : public testing::TestWithParam<ErrorCase> {};

}  // namespace

TEST_P(Diagnostic, HasExactText) {
  const ErrorCase& c = GetParam();
  try {
    parse_expression(c.source);
    FAIL() << "no error for: " << c.source;
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()), c.message);
  }
}

INSTANTIATE_TEST_SUITE_P(Expression, Diagnostic, testing::ValuesIn(kErrorCases),
                         [](const testing::TestParamInfo<ErrorCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(Diagnostics, NameTheFileAndCarryTheLocation) {
  try {
    parse_expression("f = acc\nout D = silu(f", {}, "epilogue.evt");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.column(), 15);
    EXPECT_EQ(std::string(e.what()).rfind("epilogue.evt:2:15: error: ", 0), 0u) << e.what();
  }
}

TEST(Diagnostics, DeepNestingIsRejectedNotOverflowed) {
  const std::string parens = "out D = " + std::string(1000, '(') + "acc" + std::string(1000, ')');
  const std::string chain = [] {
    std::string s = "out D = acc";
    for (int i = 0; i < 1000; ++i) s += " + acc";
    return s;
  }();
  const std::string minus = "out D = " + std::string(1000, '-') + "acc";
  for (const std::string& source : {parens, chain, minus}) {
    try {
      parse_expression(source);
      ADD_FAILURE() << "accepted " << source.substr(0, 40);
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "error: the expression nests more than 256 levels deep; split it into named "
                    "intermediates"),
                std::string::npos)
          << e.what();
    }
  }
  std::string ok = "out D = acc";
  for (int i = 0; i < 200; ++i) ok += " + acc";
  EXPECT_NO_THROW(parse_expression(ok));
}

TEST(Diagnostics, AreUserErrors) {
  EXPECT_THROW(parse_expression("out D = slu(acc)"), UserError);
}

TEST(Diagnostics, NonAsciiCharacterIsShownWhole) {
  try {
    parse_expression("out D = acc × 2");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()),
              "expr:1:13: error: unexpected character '×'\n"
              "  out D = acc × 2\n"
              "              ^");
  }
}

// The message of the ParseError parsing `text` throws.
std::string parse_error_of(const std::string& text) {
  try {
    parse_expression(text);
    ADD_FAILURE() << "parsed: " << text;
  } catch (const ParseError& e) {
    return e.what();
  }
  return {};
}

// A UTF-8 byte order mark that an editor put at the start of a file is skipped (it was an
// invisible "unexpected character"); elsewhere it, and any character that shows nothing, is
// named by its code point, and the line shown replaces it with '?' (control characters were
// echoed raw, bytes that are not UTF-8 too).
TEST(Diagnostics, InvisibleCharactersAreNamedNotEchoed) {
  EXPECT_NO_THROW(parse_expression("\xEF\xBB\xBFout D = acc + 1\n"));
  EXPECT_EQ(parse_error_of("out D = acc\xEF\xBB\xBF + 1"),
            "expr:1:12: error: unexpected invisible character U+FEFF (a byte order mark)\n"
            "  out D = acc? + 1\n"
            "             ^");
  EXPECT_EQ(parse_error_of("out D = acc \x1b[31m + 1"),
            "expr:1:13: error: unexpected control character U+001B\n"
            "  out D = acc ?[31m + 1\n"
            "              ^");
  EXPECT_EQ(parse_error_of("out D = acc \x07"),
            "expr:1:13: error: unexpected control character U+0007\n"
            "  out D = acc ?\n"
            "              ^");
  EXPECT_EQ(parse_error_of("out D = acc \xff\xfe"),
            "expr:1:13: error: unexpected byte 0xFF (the text is not UTF-8)\n"
            "  out D = acc ??\n"
            "              ^");
}

// An error on a very long line shows the part of the line around the error, not all of it (a
// 2 MB line was echoed whole).
TEST(Diagnostics, LongLinesAreShownAroundTheError) {
  std::string text = "out D = acc";
  for (int i = 0; i < 100000; ++i) text += " + 1";
  text += " @ 2";
  for (int i = 0; i < 100000; ++i) text += " + 1";
  const std::string message = parse_error_of(text);
  EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
  const size_t column = text.find('@') + 1;
  const std::string first = fmt::format("expr:1:{}: error: unexpected character '@'\n", column);
  EXPECT_EQ(message.substr(0, first.size()), first);
  // The shown part: "..." then the characters before and after the error; the caret under '@'.
  std::istringstream lines(message.substr(first.size()));
  std::string shown, caret;
  std::getline(lines, shown);
  std::getline(lines, caret);
  EXPECT_EQ(shown.substr(0, 5), "  ...") << shown;
  EXPECT_EQ(shown.substr(shown.size() - 3), "...") << shown;
  EXPECT_EQ(caret.back(), '^');
  EXPECT_EQ(shown[caret.size() - 1], '@') << shown << "\n" << caret;
}

TEST(Diagnostics, CaretCountsCharactersNotBytes) {
  try {
    parse_expression("out D = acc # é\nout E = slu(acc) # ü\n");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.column(), 9);
  }
  try {
    parse_expression("f = acc # é\nout D = f + ");
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), 2);
  }
}

TEST(Suggestions, EditDistanceCountsSwaps) {
  using frontend::edit_distance;
  EXPECT_EQ(edit_distance("silu", "silu"), 0u);
  EXPECT_EQ(edit_distance("slu", "silu"), 1u);
  EXPECT_EQ(edit_distance("sliu", "silu"), 1u);
  EXPECT_EQ(edit_distance("gleu", "gelu"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(Suggestions, NearestKnownName) {
  using frontend::function_names;
  using frontend::nearest_name;
  EXPECT_EQ(nearest_name("sigmod", function_names()), "sigmoid");
  EXPECT_EQ(nearest_name("row_summ", function_names()), "row_sum");
  EXPECT_EQ(nearest_name("quick_gleu", function_names()), "quick_gelu");
  EXPECT_EQ(nearest_name("bf61", function_names()), "bf16");  // casts are functions too
  EXPECT_EQ(nearest_name("frobnicate", function_names()), std::nullopt);
}

TEST(Examples, EveryExampleParses) {
  const fs::path dir = fs::path(EVTC_TEST_DATA_DIR) / ".." / "examples";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".evt") continue;
    std::ifstream f(entry.path());
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NO_THROW(parse_expression(text, {}, entry.path().filename().string()))
        << entry.path();
    ++count;
  }
  EXPECT_GE(count, 5);
}

// --- the CLI --------------------------------------------------------------------------

namespace {

using evtc::test::CliResult;
using evtc::test::run_cli;

// Writes `text` to a fresh file under the temporary directory and returns its path.
std::string temp_file(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("evtc_frontend_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

const char* kW1 = "out D: bf16 = silu(acc + bias[n])\n";

}  // namespace

TEST(ExplainCli, PrintsCanonicalFormAndHash) {
  const std::string path = temp_file("w1.evt", kW1);
  const Graph g = parse_expression(kW1);
  const CliResult r = run_cli("explain " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(print(g) + "hash: " + graph_hash_hex(g) + "\n", 0), 0u) << r.output;
}

TEST(ExplainCli, ParseErrorExitsWithTwoAndNamesTheFile) {
  const std::string path = temp_file("bad.evt", "out D = slu(acc)\n");
  const CliResult r = run_cli("explain " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, path + ":1:9: error: unknown function 'slu'; did you mean 'silu'?\n"
                             "  out D = slu(acc)\n"
                             "          ^\n");
}

TEST(ExplainCli, DtypeOptionSetsUndeclaredOperandsAndOutputs) {
  const CliResult r = run_cli("explain --dtype f16 " + temp_file("w1.evt", kW1) );
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("row_vec bias : f16[n]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("store D %3 : bf16[m,n]"), std::string::npos) << r.output;
  EXPECT_EQ(run_cli("explain --dtype f17 " + temp_file("w1.evt", kW1)).exit_code, 2);
}

TEST(ExplainCli, JsonCarriesTheHash) {
  const CliResult r = run_cli("explain --json " + temp_file("w1.evt", kW1));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j.at("hash"), graph_hash_hex(parse_expression(kW1)));
  EXPECT_EQ(j.at("nodes").size(), 5u);
  EXPECT_TRUE(j.at("legality").contains("fusable"));
}

TEST(ExplainCli, UnknownPassListsThePasses) {
  const CliResult r = run_cli("explain --pass no_such_pass " + temp_file("w1.evt", kW1));
  EXPECT_EQ(r.exit_code, 2);
  std::string names;
  for (const PassInfo& p : pipeline_passes()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  EXPECT_NE(r.output.find("unknown pass 'no_such_pass'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(names.empty() ? "(none)" : names), std::string::npos) << r.output;
}

TEST(ExplainCli, RunsOnePass) {
  if (pipeline_passes().empty()) GTEST_SKIP() << "the pipeline has no passes";
  const PassInfo& pass = pipeline_passes().front();
  const std::string path = temp_file("w1.evt", kW1);
  const CliResult r = run_cli("explain --pass " + std::string(pass.name) + " " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const Graph after = pass.run(parse_expression(kW1), PipelineOptions{});
  EXPECT_EQ(r.output.rfind(print(after) + "hash: " + graph_hash_hex(after) + "\n", 0), 0u)
      << r.output;
}

TEST(ExplainCli, PassesPrintsEveryPass) {
  const CliResult r = run_cli("explain --passes " + temp_file("w1.evt", kW1));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("== parsed ==\n" + parsed(kW1), 0), 0u) << r.output;
  for (const PassInfo& p : pipeline_passes())
    EXPECT_NE(r.output.find("== after " + std::string(p.name) + " ==\n"), std::string::npos)
        << r.output;
  const Graph final_graph = run_pipeline(parse_expression(kW1));
  EXPECT_NE(r.output.find("hash: " + graph_hash_hex(final_graph) + "\n"), std::string::npos)
      << r.output;
}

TEST(ExplainCli, ExpressionGivenInline) {
  const CliResult r = run_cli("explain 'out D = acc * 2'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("%1 = const 2 : f32"), std::string::npos) << r.output;
}
