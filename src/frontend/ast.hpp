// The syntax tree of one statement of the expression language. Names and number spellings
// are views into the source text, which outlives the tree.
#pragma once
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "evtc/graph.hpp"
#include "frontend/source_file.hpp"

namespace evtc::frontend {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  number,  // 2.5 (a leading '-' on a literal is folded into it: `-7` is the constant -7)
  name,    // acc, C, an intermediate, a declared operand, a scalar parameter
  index,   // bias[n], scale[m], res[m,n]
  call,    // silu(x), leaky_relu(x, alpha=0.2), sum(x), bf16(x)
  unary,   // -x
  binary,  // x + y, x - y, x * y, x / y, x ** y, and the comparisons x > y, ...
};

struct Argument {
  std::string_view keyword;  // `alpha` in leaky_relu(x, alpha=0.2); empty when positional
  Loc keyword_loc;
  ExprPtr value;
};

struct Expr {
  ExprKind kind = ExprKind::number;
  Loc start;  // its first character
  // Where diagnostics about this expression point: the operator of a unary or binary
  // expression, the name of a call or operand, the number itself.
  Loc loc;
  std::string_view text;  // number: its spelling; name/index/call: the name
  double number = 0.0;
  Shape index = Shape::full;    // index: [n] row, [m] col, [m,n] full
  Op op = Op::add;              // binary: the IR op the operator computes
  std::vector<Argument> args;   // call arguments; operands of unary and binary expressions
  Loc close;                    // call: the closing ')'
  int height = 1;               // 1 + the largest height of its arguments
};

// How deep an expression may nest (parentheses, calls, operators) or its tree grow. Far
// beyond any real epilogue; the limit keeps the recursive parser and lowering within a
// small stack whatever the input.
inline constexpr int kMaxExpressionDepth = 256;

enum class StatementKind {
  input,   // input NAME[dims]: dtype [ptr] [col_major]
  assign,  // NAME = expr
  output,  // out NAME[: dtype [col_major]] = expr
};

struct Statement {
  StatementKind kind = StatementKind::assign;
  std::string_view name;
  Loc name_loc;
  std::optional<Shape> shape;  // input: the declared dims (none: a scalar, or C)
  Loc shape_loc;
  std::optional<DType> dtype;  // input/output: the declared dtype
  Loc dtype_loc;
  bool by_pointer = false;  // input: `ptr`
  Loc pointer_loc;
  std::optional<Layout> layout;  // input/output: `col_major` / `row_major`
  Loc layout_loc;
  ExprPtr value;  // assign/output
};

}  // namespace evtc::frontend
