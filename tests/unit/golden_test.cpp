// Golden tests of the expression language: every tests/golden/*.evt is parsed and its
// canonical IR and hash (or its diagnostic, for a file that should not parse) compared with
// tests/golden/NAME.expected. Set EVTC_UPDATE_GOLDEN=1 to rewrite the expected files after
// a deliberate change, and review the diff.
#include <gtest/gtest.h>

#include "golden_files.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"

namespace fs = std::filesystem;
using namespace evtc;

namespace {

const fs::path kGoldenDir = fs::path(EVTC_TEST_DATA_DIR) / "golden";

std::vector<std::string> golden_names() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(kGoldenDir))
    if (entry.is_regular_file() && entry.path().extension() == ".evt")
      names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

using evtc::test::read_file;

// What a golden file is compared against.
std::string explain(const std::string& name) {
  const std::string source = read_file(kGoldenDir / (name + ".evt"));
  try {
    const Graph g = parse_expression(source, {}, name + ".evt");
    return print(g) + "hash: " + graph_hash_hex(g) + "\n";
  } catch (const ParseError& e) {
    return std::string(e.what()) + "\n";
  }
}

class Golden : public testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesExpected) {
  const std::string name = GetParam();
  const std::string actual = explain(name);
  evtc::test::expect_matches_golden(kGoldenDir / (name + ".expected"), actual, name + ".evt");
}

TEST_P(Golden, CanonicalFormRoundTrips) {
  const std::string name = GetParam();
  const std::string source = read_file(kGoldenDir / (name + ".evt"));
  Graph g;
  try {
    g = parse_expression(source, {}, name + ".evt");
  } catch (const ParseError&) {
    GTEST_SKIP() << name << ".evt is a diagnostic test";
  }
  const std::string text = print(g);
  EXPECT_EQ(print(parse_canonical(text)), text);
}

INSTANTIATE_TEST_SUITE_P(Expressions, Golden, testing::ValuesIn(golden_names()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param;
                           for (char& c : id)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return id;
                         });

TEST(GoldenFiles, EveryExpectedFileHasAnInput) {
  for (const auto& entry : fs::directory_iterator(kGoldenDir))
    if (entry.path().extension() == ".expected") {
      fs::path input = entry.path();
      input.replace_extension(".evt");
      EXPECT_TRUE(fs::exists(input)) << entry.path() << " has no " << input.filename();
    }
}

}  // namespace
