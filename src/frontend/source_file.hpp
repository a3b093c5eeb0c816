// The text of an expression being parsed, split into lines, and the one place that formats
// diagnostics against it.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace evtc::frontend {

// A position in the source: 1-based line and column (the column counts bytes).
struct Loc {
  int line = 1;
  int column = 1;
};

class SourceFile {
 public:
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
  [[noreturn]] void fail(Loc at, const std::string& message) const;

 private:
  std::string_view text_;
  std::string filename_;
  std::vector<std::string_view> lines_;
};

}  // namespace evtc::frontend
