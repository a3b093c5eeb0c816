#include "frontend/source_file.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "evtc/expression.hpp"

namespace evtc::frontend {

bool invisible_code_point(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD || (cp >= 0x2000 && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x2060 && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF;
}

std::pair<uint32_t, size_t> decode_utf8(std::string_view s) {
  if (s.empty()) return {0, 0};
  const auto lead = static_cast<unsigned char>(s[0]);
  const size_t n = lead < 0x80 ? 1 : (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || n > s.size()) return {0, 0};
  uint32_t cp = n == 1 ? lead : lead & (0xFFu >> (n + 1));
  for (size_t i = 1; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {cp, n};
}

SourceFile::SourceFile(std::string_view text, std::string_view filename)
    : text_(text.substr(text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0)), filename_(filename) {
  text = text_;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    std::string_view line = text.substr(start, end == std::string_view::npos ? end : end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines_.push_back(line);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
}

std::string_view SourceFile::line(int line) const {
  if (line < 1 || line > line_count()) return {};
  return lines_[static_cast<size_t>(line - 1)];
}

namespace {

// Characters that put the caret under byte `column` of `line`: a tab where the line has a
// tab (so the caret lines up however tabs are shown), one space per other character
// (UTF-8 continuation bytes take no room of their own).
std::string caret_padding(std::string_view line, int column) {
  std::string pad;
  for (size_t i = 0; i + 1 < static_cast<size_t>(column) && i < line.size(); ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c == '\t')
      pad += '\t';
    else if ((c & 0xC0) != 0x80)
      pad += ' ';
  }
  // A column just past the end of the line (a missing token at the end).
  if (static_cast<size_t>(column) > line.size() + 1)
    pad.append(static_cast<size_t>(column) - line.size() - 1, ' ');
  return pad;
}

// `line` as a diagnostic shows it: invisible characters (but tabs) and bytes that are not UTF-8
// become one '?' each (caret_padding counts characters, so the caret still lines up), and of a long line only the part
// around byte `column` is kept, between "..." marks. `column` becomes the error's column in the
// returned text.
std::string shown_line(std::string_view line, int& column) {
  constexpr size_t kMost = 160, kAround = 60;
  size_t from = 0, to = line.size();
  const size_t at = static_cast<size_t>(std::max(column, 1) - 1);
  if (line.size() > kMost) {
    from = at > kAround ? at - kAround : 0;
    to = std::min(line.size(), std::max(at, from) + kAround);
    // Whole UTF-8 characters only.
    while (from > 0 && (static_cast<unsigned char>(line[from]) & 0xC0) == 0x80) --from;
    while (to < line.size() && (static_cast<unsigned char>(line[to]) & 0xC0) == 0x80) ++to;
  }
  std::string out = from > 0 ? "..." : "";
  column = static_cast<int>(at >= from ? at - from : 0) + 1 + static_cast<int>(out.size());
  for (size_t i = from; i < to;) {
    const auto [cp, n] = decode_utf8(line.substr(i));
    if (n == 0 || (cp != '\t' && invisible_code_point(cp))) {
      out += '?';  // one for the character (or the byte that is not UTF-8)
      i += std::max<size_t>(n, 1);
    } else {
      out += line.substr(i, n);
      i += n;
    }
  }
  if (to < line.size()) out += "...";
  return out;
}

}  // namespace

void SourceFile::fail(Loc at, const std::string& message) const {
  int column = at.column;
  const std::string text = shown_line(line(at.line), column);
  throw ParseError(fmt::format("{}:{}:{}: error: {}\n  {}\n  {}^", filename_, at.line, at.column,
                               message, text, caret_padding(text, column)),
                   at.line, at.column);
}

}  // namespace evtc::frontend
