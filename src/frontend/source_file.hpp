// The text of an expression being parsed, split into lines, and the one place that formats
// diagnostics against it.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

namespace evtc::frontend {

// A position in the source: 1-based line and column (the column counts bytes).
struct Loc {
  int line = 1;
  int column = 1;
};

// Code points that show nothing of their own (controls, byte order marks, zero-width and
// unusual spaces): diagnostics name them by number and show them as '?'.
bool invisible_code_point(uint32_t cp);
// The code point of the UTF-8 character at `s[0]` and its length, or length 0 where the bytes
// are not UTF-8.
std::pair<uint32_t, size_t> decode_utf8(std::string_view s);

class SourceFile {
 public:
  // A UTF-8 byte order mark at the start of `text` (an editor's) is not part of the source.
  SourceFile(std::string_view text, std::string_view filename);

  std::string_view text() const { return text_; }
  const std::string& filename() const { return filename_; }
  // Line `line` (1-based) without its line terminator; empty past the end.
  std::string_view line(int line) const;
  int line_count() const { return static_cast<int>(lines_.size()); }

  // Throws a ParseError whose what() is
  //   FILE:LINE:COL: error: MESSAGE
  //     SOURCE_LINE
  //     ^          (under the column)
  // SOURCE_LINE shows control characters and bytes that are not UTF-8 as '?', and of a line
  // longer than 160 characters the 60 before the column and the 60 from it, between "...".
  [[noreturn]] void fail(Loc at, const std::string& message) const;

 private:
  std::string_view text_;
  std::string filename_;
  std::vector<std::string_view> lines_;
};

}  // namespace evtc::frontend
