// Splits expression source into tokens. Newlines are tokens (they end statements); comments
// (`#` to the end of the line) and other whitespace are dropped.
#pragma once
#include <string_view>
#include <vector>

#include "frontend/source_file.hpp"

namespace evtc::frontend {

enum class TokenKind {
  identifier,  // [A-Za-z_][A-Za-z0-9_]*
  number,      // 2, 0.5, .5, 1e-3
  punct,       // ( ) [ ] , = : ; + - * / **
  newline,
  end,
};

struct Token {
  TokenKind kind = TokenKind::end;
  std::string_view text;  // the characters of the token (empty for newline and end)
  Loc loc;                // its first character
  Loc end;                // just past its last character
  double number = 0.0;    // the value of a number token

  bool is(std::string_view punct) const { return kind == TokenKind::punct && text == punct; }
};

// The tokens of `source`, always ending with one `end` token. Throws ParseError at the first
// character that starts no token.
std::vector<Token> tokenize(const SourceFile& source);

}  // namespace evtc::frontend
