#include "frontend/source_file.hpp"

#include <fmt/format.h>

#include "evtc/expression.hpp"

namespace evtc::frontend {

SourceFile::SourceFile(std::string_view text, std::string_view filename)
    : text_(text), filename_(filename) {
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

}  // namespace

void SourceFile::fail(Loc at, const std::string& message) const {
  const std::string_view text = line(at.line);
  throw ParseError(fmt::format("{}:{}:{}: error: {}\n  {}\n  {}^", filename_, at.line, at.column,
                               message, text, caret_padding(text, at.column)),
                   at.line, at.column);
}

}  // namespace evtc::frontend
