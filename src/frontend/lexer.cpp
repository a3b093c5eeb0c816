#include "frontend/lexer.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <string>

namespace evtc::frontend {
namespace {

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// The message for an unexpected character at `s[0]`: shown as itself when it is visible, else by
// its code point (a control character, a byte order mark, a zero-width space), or as a byte
// where the text is not UTF-8.
std::string unexpected(std::string_view s) {
  const auto [cp, n] = decode_utf8(s);
  if (n == 0) return fmt::format("unexpected byte 0x{:02X} (the text is not UTF-8)", static_cast<unsigned char>(s[0]));
  if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) return fmt::format("unexpected control character U+{:04X}", cp);
  if (cp == 0xFEFF) return "unexpected invisible character U+FEFF (a byte order mark)";
  if (invisible_code_point(cp)) return fmt::format("unexpected invisible character U+{:04X}", cp);
  return fmt::format("unexpected character '{}'", s.substr(0, n));
}

class Lexer {
 public:
  explicit Lexer(const SourceFile& source) : src_(source), text_(source.text()) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    while (true) {
      skip_blanks_and_comment();
      if (pos_ >= text_.size()) break;
      out.push_back(next());
    }
    Token end;
    end.kind = TokenKind::end;
    end.loc = end.end = here();
    out.push_back(end);
    return out;
  }

 private:
  Loc here() const { return {line_, static_cast<int>(pos_ - line_start_) + 1}; }

  void skip_blanks_and_comment() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  Token next() {
    Token t;
    t.loc = here();
    const size_t begin = pos_;
    const char c = text_[pos_];
    if (c == '\n') {
      t.kind = TokenKind::newline;
      ++pos_;
      t.end = t.loc;
      ++line_;
      line_start_ = pos_;
      return t;
    }
    if (is_ident_start(c)) {
      while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
      t.kind = TokenKind::identifier;
    } else if (is_digit(c) || (c == '.' && pos_ + 1 < text_.size() && is_digit(text_[pos_ + 1]))) {
      lex_number(t);
    } else if (c == '*' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '*') {
      pos_ += 2;
      t.kind = TokenKind::punct;
    } else if ((c == '=' || c == '!' || c == '<' || c == '>') && pos_ + 1 < text_.size() &&
               text_[pos_ + 1] == '=') {
      pos_ += 2;  // == != <= >=
      t.kind = TokenKind::punct;
    } else if (c == '<' || c == '>') {
      ++pos_;
      t.kind = TokenKind::punct;
    } else if (std::string_view("()[],=:;+-*/").find(c) != std::string_view::npos) {
      ++pos_;
      t.kind = TokenKind::punct;
    } else if (c == '^') {
      src_.fail(t.loc, "unexpected character '^'; write a power as x ** y");
    } else {
      src_.fail(t.loc, unexpected(text_.substr(pos_)));
    }
    t.text = text_.substr(begin, pos_ - begin);
    t.end = here();
    return t;
  }

  // A number is the longest run of digits, letters, '_' and '.' (and a sign right after an
  // exponent 'e'), which must then read as a whole decimal number: so `2x` and `1.2.3` are
  // reported as malformed numbers rather than as two tokens.
  void lex_number(Token& t) {
    const size_t begin = pos_;
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (is_ident_char(c) || c == '.') {
        ++pos_;
      } else if ((c == '+' || c == '-') && (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E')) {
        ++pos_;
      } else {
        break;
      }
    }
    const std::string_view s = text_.substr(begin, pos_ - begin);
    double v = 0.0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v,
                                           std::chars_format::general);
    if (ec == std::errc::result_out_of_range)
      src_.fail(t.loc, fmt::format("the number '{}' is out of range", s));
    if (ec != std::errc() || ptr != s.data() + s.size())
      src_.fail(t.loc, fmt::format("malformed number '{}'", s));
    t.kind = TokenKind::number;
    t.number = v;
  }

  const SourceFile& src_;
  std::string_view text_;
  size_t pos_ = 0;
  size_t line_start_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(const SourceFile& source) { return Lexer(source).run(); }

}  // namespace evtc::frontend
