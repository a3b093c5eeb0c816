// Recursive-descent parser of the expression language: tokens in, one Statement at a time
// out. It checks syntax only; src/frontend/lower_to_graph.* gives the statements meaning.
//
//   program   := { [statement] (NEWLINE | ';') }
//   statement := 'input' NAME ['[' dims ']'] [':' DTYPE {'ptr' | LAYOUT}]
//              | 'out' NAME [':' DTYPE [LAYOUT]] '=' expr
//              | NAME '=' expr
//   expr      := term { ('+' | '-') term }
//   term      := unary { ('*' | '/') unary }
//   unary     := ('-' | '+') unary | power
//   power     := primary ['**' unary]          (so ** is right-associative)
//   primary   := NUMBER | NAME | NAME '[' dims ']' | NAME '(' [arg {',' arg}] ')'
//              | '(' expr ')'
//   arg       := [NAME '='] expr
//   dims      := 'm' | 'n' | 'm' ',' 'n'
//
// Inside parentheses and brackets newlines are ignored, so long expressions can be split
// across lines there.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "frontend/ast.hpp"
#include "frontend/lexer.hpp"

namespace evtc::frontend {

class Parser {
 public:
  Parser(const SourceFile& source, std::vector<Token> tokens);

  // The next statement, or nullopt at the end of the input.
  std::optional<Statement> next_statement();
  // Just past the last token of the input (1:1 when there is none).
  Loc end_loc() const { return last_end_; }

 private:
  const Token& peek();
  const Token& peek_second();  // the token after peek(), at statement level
  const Token& advance();
  bool accept(std::string_view punct);
  // Where a missing token is reported: at the current token if it is on the line of the
  // previous one, else just past the previous token (so "expected ')'" points at the end
  // of the line that lacks it, not at the start of the next statement).
  Loc missing_loc();
  [[noreturn]] void expected(const std::string& what);

  Statement parse_input();
  Statement parse_output();
  Statement parse_assignment();
  void parse_type(Statement& s, bool allow_pointer);
  void expect_statement_end(const char* after);

  ExprPtr parse_expr(const std::string& context);
  ExprPtr parse_sum(const std::string& context);
  ExprPtr parse_term(const std::string& context);
  ExprPtr parse_unary(const std::string& context);
  ExprPtr parse_power(const std::string& context);
  ExprPtr parse_primary(const std::string& context);
  ExprPtr parse_call(const Token& name);
  // Attaches an operand or argument to e, keeping e->height up to date and bounded.
  void add_arg(Expr& e, Argument a);
  Shape parse_dims(std::string_view name);

  const SourceFile& src_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;      // open parentheses and brackets: newlines inside them are skipped
  int recursion_ = 0;  // nested parse_unary calls, which every recursive path goes through
  Loc last_end_;    // just past the last consumed token
  bool consumed_any_ = false;
};

}  // namespace evtc::frontend
