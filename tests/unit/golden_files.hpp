// Helpers shared by the tests that compare output with files under tests/golden.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace evtc::test {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Expects `actual` to equal the expected file; with EVTC_UPDATE_GOLDEN=1 in the environment,
// rewrites the file instead (review the diff before committing it).
inline void expect_matches_golden(const std::filesystem::path& expected_path, const std::string& actual,
                                  const std::string& what) {
  const char* update = std::getenv("EVTC_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(expected_path, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(std::filesystem::exists(expected_path))
      << expected_path << " is missing: run the tests with EVTC_UPDATE_GOLDEN=1 to create it";
  EXPECT_EQ(actual, read_file(expected_path)) << "for " << what;
}

}  // namespace evtc::test
