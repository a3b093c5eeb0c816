// libFuzzer target for the expression parser. Any input must either parse into a graph whose
// canonical form round-trips, or be rejected with a ParseError that carries a location; any
// other exception, a crash or a sanitizer report is a bug.
//
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DEVTC_FUZZ=ON
//   cmake --build build-fuzz --target evtc_parse_fuzz
//   build-fuzz/tests/evtc_parse_fuzz -max_len=512 tests/golden   # seeds: the golden inputs
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  evtc::Graph g;
  try {
    g = evtc::parse_expression(source, {}, "fuzz");
  } catch (const evtc::ParseError& e) {
    const std::string prefix = "fuzz:" + std::to_string(e.line()) + ":" +
                               std::to_string(e.column()) + ": error: ";
    if (std::string_view(e.what()).substr(0, prefix.size()) != prefix)
      fail("diagnostic without its location: " + std::string(e.what()));
    return 0;
  }
  if (g.outputs().empty()) fail("a graph without outputs was accepted");
  const std::string text = evtc::print(g);
  if (evtc::print(evtc::parse_canonical(text)) != text)
    fail("canonical form does not round-trip:\n" + text);
  return 0;
}
