#include "frontend/parser.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace evtc::frontend {
namespace {

// Adds one to a depth counter for as long as it lives (an open parenthesis, a recursion).
class Nesting {
 public:
  explicit Nesting(int& depth) : depth_(depth) { ++depth_; }
  ~Nesting() { --depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;

 private:
  int& depth_;
};

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::newline: return "the end of the line";
    case TokenKind::end: return "the end of the input";
    default: return fmt::format("'{}'", t.text);
  }
}

std::string too_deep() {
  return fmt::format("the expression nests more than {} levels deep; split it into named "
                     "intermediates",
                     kMaxExpressionDepth);
}

bool is_keyword(std::string_view s) { return s == "input" || s == "out"; }

ExprPtr make(ExprKind kind, Loc start, Loc loc) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->start = start;
  e->loc = loc;
  return e;
}

}  // namespace

Parser::Parser(const SourceFile& source, std::vector<Token> tokens)
    : src_(source), tokens_(std::move(tokens)) {}

// --- token access ---------------------------------------------------------------------

const Token& Parser::peek() {
  while (depth_ > 0 && tokens_[pos_].kind == TokenKind::newline) ++pos_;
  return tokens_[pos_];
}

const Token& Parser::peek_second() {
  peek();
  size_t p = std::min(pos_ + 1, tokens_.size() - 1);
  while (depth_ > 0 && tokens_[p].kind == TokenKind::newline) ++p;
  return tokens_[p];
}

const Token& Parser::advance() {
  const Token& t = peek();
  if (t.kind != TokenKind::end) ++pos_;
  if (t.kind != TokenKind::newline && t.kind != TokenKind::end) {
    last_end_ = t.end;
    consumed_any_ = true;
  }
  return t;
}

bool Parser::accept(std::string_view punct) {
  if (!peek().is(punct)) return false;
  advance();
  return true;
}

Loc Parser::missing_loc() {
  const Token& t = peek();
  if (!consumed_any_) return t.loc;
  if (t.kind == TokenKind::newline || t.kind == TokenKind::end || t.loc.line != last_end_.line)
    return last_end_;
  return t.loc;
}

void Parser::expected(const std::string& what) { src_.fail(missing_loc(), "expected " + what); }

// --- statements -----------------------------------------------------------------------

std::optional<Statement> Parser::next_statement() {
  while (peek().kind == TokenKind::newline || peek().is(";")) advance();
  const Token& t = peek();
  if (t.kind == TokenKind::end) return std::nullopt;
  if (t.kind == TokenKind::identifier && t.text == "input") {
    Statement s = parse_input();
    expect_statement_end("the declaration of an input: expected ';' or a new line");
    return s;
  }
  if (t.kind == TokenKind::identifier && t.text == "out") {
    Statement s = parse_output();
    expect_statement_end("the expression: expected an operator, ';' or a new line");
    return s;
  }
  if (t.kind == TokenKind::identifier && peek_second().is("=")) {
    Statement s = parse_assignment();
    expect_statement_end("the expression: expected an operator, ';' or a new line");
    return s;
  }
  if (t.kind == TokenKind::identifier && peek_second().is(":"))
    src_.fail(peek_second().loc,
              fmt::format("a named value has no dtype: write `out {0}: DTYPE = ...` to make '{0}' "
                          "an output, or round the value with a cast such as bf16(...)",
                          t.text));
  if (!(t.kind == TokenKind::identifier || t.kind == TokenKind::number || t.is("(") ||
        t.is("-") || t.is("+")))
    src_.fail(t.loc, fmt::format("unexpected {} at the start of a statement", describe(t)));
  ExprPtr e = parse_expr("");
  if (peek().is("="))
    src_.fail(peek().loc, "only a name can be assigned to, as in `NAME = ...`");
  if (peek().kind != TokenKind::newline && peek().kind != TokenKind::end && !peek().is(";"))
    expect_statement_end("the expression: expected an operator, ';' or a new line");
  src_.fail(e->start,
            "this value is not stored anywhere: write `out D = ...` to make it an output, or "
            "`NAME = ...` to name it");
}

void Parser::expect_statement_end(const char* after) {
  const Token& t = peek();
  if (t.kind == TokenKind::newline || t.kind == TokenKind::end || t.is(";")) return;
  src_.fail(t.loc, fmt::format("unexpected {} after {}", describe(t), after));
}

Statement Parser::parse_input() {
  advance();  // input
  Statement s;
  s.kind = StatementKind::input;
  if (peek().kind != TokenKind::identifier) expected("an operand name after 'input'");
  const Token& name = advance();
  s.name = name.text;
  s.name_loc = name.loc;
  if (peek().is("[")) {
    s.shape_loc = advance().loc;
    Nesting nest(depth_);
    s.shape = parse_dims(s.name);
    if (!accept("]")) expected(fmt::format("']' after the index of '{}'", s.name));
  }
  if (accept(":")) parse_type(s, true);
  return s;
}

Statement Parser::parse_output() {
  advance();  // out
  Statement s;
  s.kind = StatementKind::output;
  if (peek().kind != TokenKind::identifier) expected("an output name after 'out'");
  const Token& name = advance();
  s.name = name.text;
  s.name_loc = name.loc;
  if (accept(":")) parse_type(s, false);
  if (!accept("=")) expected(fmt::format("'=' and the value of output '{}'", s.name));
  s.value = parse_expr("after '='");
  return s;
}

Statement Parser::parse_assignment() {
  Statement s;
  s.kind = StatementKind::assign;
  const Token& name = advance();
  s.name = name.text;
  s.name_loc = name.loc;
  advance();  // =
  s.value = parse_expr("after '='");
  return s;
}

// DTYPE followed by modifiers: `ptr` (inputs only) and a layout.
void Parser::parse_type(Statement& s, bool allow_pointer) {
  if (peek().kind != TokenKind::identifier) expected("a dtype after ':'");
  const Token& t = advance();
  s.dtype = parse_dtype(t.text);
  s.dtype_loc = t.loc;
  if (!s.dtype)
    src_.fail(t.loc, fmt::format("unknown dtype '{}' (expected {})", t.text, or_list(dtype_names())));
  while (peek().kind == TokenKind::identifier) {
    const Token& w = peek();
    if (w.text == "ptr" && !allow_pointer)
      src_.fail(w.loc, "an output cannot be passed by pointer: 'ptr' is for scalar inputs");
    if (w.text == "ptr" && !s.by_pointer) {
      s.by_pointer = true;
      s.pointer_loc = w.loc;
    } else if ((w.text == "col_major" || w.text == "row_major") && !s.layout) {
      s.layout = w.text == "col_major" ? Layout::col_major : Layout::row_major;
      s.layout_loc = w.loc;
    } else if (w.text == "ptr" || w.text == "col_major" || w.text == "row_major") {
      src_.fail(w.loc, fmt::format("'{}' is given twice", w.text));
    } else {
      src_.fail(w.loc, allow_pointer
                           ? fmt::format("unexpected '{}' after the dtype: expected 'ptr', "
                                         "'col_major' or the end of the declaration",
                                         w.text)
                           : fmt::format("unexpected '{}' after the dtype: expected 'col_major' "
                                         "or '='",
                                         w.text));
    }
    advance();
  }
}

// --- expressions ----------------------------------------------------------------------

namespace {

// The comparison a token spells, from the op table's operators (OpInfo::infix).
std::optional<Op> comparison_op(const Token& t) {
  if (t.kind != TokenKind::punct) return std::nullopt;
  for (const OpInfo& info : op_table())
    if (info.comparison && t.is(info.infix)) return info.op;
  return std::nullopt;
}

}  // namespace

// A comparison binds loosest: `acc > 0` and `acc * s[m] >= bias[n] + 1` compare whole sums.
ExprPtr Parser::parse_expr(const std::string& context) {
  ExprPtr lhs = parse_sum(context);
  const auto op = comparison_op(peek());
  if (!op) return lhs;
  const Token& tok = advance();
  ExprPtr rhs = parse_sum(fmt::format("after '{}'", tok.text));
  if (comparison_op(peek()))
    src_.fail(peek().loc, fmt::format("comparisons do not chain: '{}' follows a comparison (write two comparisons "
                                      "and multiply them, e.g. (a < b) * (b < c))",
                                      peek().text));
  ExprPtr e = make(ExprKind::binary, lhs->start, tok.loc);
  e->op = *op;
  add_arg(*e, {{}, {}, std::move(lhs)});
  add_arg(*e, {{}, {}, std::move(rhs)});
  return e;
}

ExprPtr Parser::parse_sum(const std::string& context) {
  ExprPtr lhs = parse_term(context);
  while (peek().is("+") || peek().is("-")) {
    const Token& op = advance();
    ExprPtr rhs = parse_term(fmt::format("after '{}'", op.text));
    ExprPtr e = make(ExprKind::binary, lhs->start, op.loc);
    e->op = op.text == "+" ? Op::add : Op::sub;
    add_arg(*e, {{}, {}, std::move(lhs)});
    add_arg(*e, {{}, {}, std::move(rhs)});
    lhs = std::move(e);
  }
  return lhs;
}

ExprPtr Parser::parse_term(const std::string& context) {
  ExprPtr lhs = parse_unary(context);
  while (peek().is("*") || peek().is("/")) {
    const Token& op = advance();
    ExprPtr rhs = parse_unary(fmt::format("after '{}'", op.text));
    ExprPtr e = make(ExprKind::binary, lhs->start, op.loc);
    e->op = op.text == "*" ? Op::mul : Op::div;
    add_arg(*e, {{}, {}, std::move(lhs)});
    add_arg(*e, {{}, {}, std::move(rhs)});
    lhs = std::move(e);
  }
  return lhs;
}

ExprPtr Parser::parse_unary(const std::string& context) {
  if (recursion_ >= kMaxExpressionDepth)
    src_.fail(peek().loc, too_deep());
  Nesting recursion(recursion_);
  if (!peek().is("-") && !peek().is("+")) return parse_power(context);
  const Token& op = advance();
  // `-7` is the constant -7, but `-2 ** 2` is -(2 ** 2): ** binds tighter than unary minus.
  if (op.text == "-" && peek().kind == TokenKind::number && !peek_second().is("**")) {
    const Token& num = advance();
    ExprPtr e = make(ExprKind::number, op.loc, op.loc);
    e->number = -num.number;
    e->text = std::string_view(op.text.data(),
                               static_cast<size_t>(num.text.data() + num.text.size() - op.text.data()));
    return e;
  }
  ExprPtr operand = parse_unary(fmt::format("after unary '{}'", op.text));
  if (op.text == "+") {
    operand->start = op.loc;
    return operand;
  }
  ExprPtr e = make(ExprKind::unary, op.loc, op.loc);
  add_arg(*e, {{}, {}, std::move(operand)});
  return e;
}

ExprPtr Parser::parse_power(const std::string& context) {
  ExprPtr base = parse_primary(context);
  if (!peek().is("**")) return base;
  const Token& op = advance();
  ExprPtr exponent = parse_unary("after '**'");
  ExprPtr e = make(ExprKind::binary, base->start, op.loc);
  e->op = Op::pow;
  add_arg(*e, {{}, {}, std::move(base)});
  add_arg(*e, {{}, {}, std::move(exponent)});
  return e;
}

ExprPtr Parser::parse_primary(const std::string& context) {
  const Token& t = peek();
  if (t.kind == TokenKind::number) {
    advance();
    ExprPtr e = make(ExprKind::number, t.loc, t.loc);
    e->number = t.number;
    e->text = t.text;
    return e;
  }
  if (t.kind == TokenKind::identifier) {
    if (is_keyword(t.text))
      src_.fail(t.loc, fmt::format("'{}' is a keyword: it can only start a statement", t.text));
    const Token& name = advance();
    if (peek().is("(")) return parse_call(name);
    if (peek().is("[")) {
      advance();
      Nesting nest(depth_);
      ExprPtr e = make(ExprKind::index, name.loc, name.loc);
      e->text = name.text;
      e->index = parse_dims(name.text);
      if (!accept("]")) expected(fmt::format("']' after the index of '{}'", name.text));
      return e;
    }
    ExprPtr e = make(ExprKind::name, name.loc, name.loc);
    e->text = name.text;
    return e;
  }
  if (t.is("(")) {
    const Token& open = advance();
    Nesting nest(depth_);
    ExprPtr e = parse_expr("after '('");
    if (!accept(")"))
      expected(fmt::format("')' to close the '(' at {}:{}", open.loc.line, open.loc.column));
    e->start = open.loc;
    return e;
  }
  expected(context.empty() ? std::string("an expression") : "an expression " + context);
}

void Parser::add_arg(Expr& e, Argument a) {
  e.height = std::max(e.height, a.value->height + 1);
  if (e.height > kMaxExpressionDepth)
    src_.fail(e.loc, too_deep());
  e.args.push_back(std::move(a));
}

ExprPtr Parser::parse_call(const Token& name) {
  advance();  // (
  Nesting nest(depth_);
  ExprPtr e = make(ExprKind::call, name.loc, name.loc);
  e->text = name.text;
  if (!peek().is(")")) {
    while (true) {
      Argument a;
      if (peek().kind == TokenKind::identifier && peek_second().is("=")) {
        const Token& kw = advance();
        a.keyword = kw.text;
        a.keyword_loc = kw.loc;
        advance();  // =
      }
      a.value = parse_expr(a.keyword.empty()
                               ? fmt::format("as argument {} of {}", e->args.size() + 1, name.text)
                               : fmt::format("after '{}='", a.keyword));
      add_arg(*e, std::move(a));
      if (!accept(",")) break;
    }
  }
  if (!peek().is(")")) expected(fmt::format("')' after the arguments of {}", name.text));
  e->close = advance().loc;
  return e;
}

Shape Parser::parse_dims(std::string_view name) {
  const Token& t = peek();
  if (t.kind != TokenKind::identifier || (t.text != "m" && t.text != "n"))
    src_.fail(missing_loc(),
              fmt::format("expected m, n or m,n in the index of '{0}' ({0}[n]: a row vector of "
                          "length N, {0}[m]: a column vector of length M, {0}[m,n]: an M×N "
                          "matrix)",
                          name));
  advance();
  if (t.text == "n") {
    if (peek().is(","))
      src_.fail(t.loc, fmt::format("write the index of an M×N operand as {}[m,n]", name));
    return Shape::row;
  }
  if (!accept(",")) return Shape::col;
  if (peek().kind != TokenKind::identifier || peek().text != "n")
    expected(fmt::format("n after 'm,' in the index of '{}'", name));
  advance();
  return Shape::full;
}

}  // namespace evtc::frontend
