// The expression language: the textual way to write an epilogue (see docs/expressions.md).
//
//   f = acc + bias[n]          # named intermediate; bias is a row vector
//   out preact: bf16 = f       # an extra output
//   out D: bf16 = gelu(f)      # the main output
#pragma once
#include <string>
#include <string_view>

#include "evtc/error.hpp"
#include "evtc/graph.hpp"

namespace evtc {

struct ParseOptions {
  // dtype of vector/aux operands and of C when the expression does not declare one.
  DType operand_dtype = DType::bf16;
  // dtype of [m,n] outputs written without `: dtype`. Reductions default to f32.
  DType output_dtype = DType::bf16;
};

// A syntax or semantic error in an expression, located at line:column (1-based).
// what() is the full diagnostic: "expr:1:12: error: ...", the source line and a caret.
class ParseError : public UserError {
 public:
  ParseError(const std::string& message, int line, int column)
      : UserError(message), line_(line), column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_;
  int column_;
};

Graph parse_expression(std::string_view source, const ParseOptions& options = {},
                       std::string_view filename = "expr");

}  // namespace evtc
