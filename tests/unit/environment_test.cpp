// The environment switches' one table (src/support/environment.*): what docs/backend.md lists
// is what evtc reads, and nothing outside that module reads the environment.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "support/environment.hpp"

namespace fs = std::filesystem;
using namespace evtc;

namespace {

const fs::path kRoot = fs::path(EVTC_TEST_DATA_DIR).parent_path();

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Environment, TheDocumentedSwitchesAreTheOnesRead) {
  const std::string doc = read(kRoot / "docs" / "backend.md");
  const size_t start = doc.find("\n## Environment switches");
  ASSERT_NE(start, std::string::npos);
  const size_t end = doc.find("\n## ", start + 1);
  const std::string section = doc.substr(start, end == std::string::npos ? std::string::npos : end - start);
  std::set<std::string> documented;
  const std::regex name(R"(`((?:EVTC_|CUDA|CUTLASS_)[A-Z_]*))");
  for (auto it = std::sregex_iterator(section.begin(), section.end(), name); it != std::sregex_iterator(); ++it)
    documented.insert((*it)[1]);
  std::set<std::string> read_here;
  for (const EnvVariable& v : env_variables())
    if (v.documented) read_here.insert(std::string(v.name));
  EXPECT_EQ(documented, read_here);
  for (const EnvVariable& v : env_variables()) EXPECT_EQ(env_name(v.id), v.name);
}

TEST(Environment, OnlyTheEnvironmentModuleCallsGetenv) {
  const std::regex getenv_call(R"(\b(secure_)?getenv\s*\()");
  int files = 0;
  for (const char* dir : {"src", "tools", "python/src"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      ++files;
      if (e.path() == kRoot / "src" / "support" / "environment.cpp") continue;
      // Comments may name it; code may not.
      std::istringstream lines(read(e.path()));
      int n = 0;
      for (std::string line; std::getline(lines, line);) {
        ++n;
        const std::string code = line.substr(0, line.find("//"));
        EXPECT_FALSE(std::regex_search(code, getenv_call))
            << e.path().string() << ":" << n << " reads the environment; add the variable to "
            << "src/support/environment.cpp's table and read it with env_text/env_flag/env_count";
      }
    }
  }
  EXPECT_GT(files, 50);
}

}  // namespace
